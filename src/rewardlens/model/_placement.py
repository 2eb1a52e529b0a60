"""Where a model's weights live and compute: accelerate's offloading and execution devices.

A `device_map` load may keep weights on the meta device between forwards; reading a head row or a
norm scale outside the forward must load them the same way accelerate does, and undo it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


def _offloaded(module: nn.Module) -> bool:
    """Whether accelerate keeps `module`'s own weights off-device (on 'meta') between forwards."""
    if getattr(module, "_hf_hook", None) is None:
        return False
    from accelerate.utils import has_offloaded_params

    return has_offloaded_params(module)


@contextlib.contextmanager
def onloaded(*modules: nn.Module) -> Iterator[None]:
    """Inside, the weights of every accelerate-offloaded module under `modules` are real tensors.

    A `device_map` load that offloads (to disk, or to the CPU next to GPUs) leaves those weights
    on the meta device and lets accelerate's hooks load them for each forward only; reading a head
    row or a norm scale outside the forward needs the same load, undone on exit. A no-op for
    models without offloaded weights.
    """
    subs = [sub for module in modules for sub in module.modules() if _offloaded(sub)]
    with contextlib.ExitStack() as stack:
        if subs:
            from accelerate.utils import align_module_device

            for sub in subs:
                stack.enter_context(align_module_device(sub))
        yield


def remove_dispatch_hooks(module: nn.Module, device: torch.device) -> None:
    """Free our copy `module` of the accelerate hooks it was copied with, leaving it fp32 on `device`.

    A copied offload hook would load the user's weights (their dtype) into the copy on every call
    and send them back to 'meta' after; detaching it may restore them, hence the cast after."""
    if any(getattr(sub, "_hf_hook", None) is not None for sub in module.modules()):
        from accelerate.hooks import remove_hook_from_module

        remove_hook_from_module(module, recurse=True)
        module.to(device=device, dtype=torch.float32)


def execution_device(model: nn.Module, module: nn.Module) -> torch.device:
    """Where `module` computes: accelerate's execution device when the model is dispatched with a
    `device_map` (its weights may sit on 'meta' when offloaded), else the device of its weights."""
    for candidate in (*module.modules(), model):
        device = getattr(getattr(candidate, "_hf_hook", None), "execution_device", None)
        if device is not None:
            return torch.device(device)
    for candidate in (module, model):
        param = next((p for p in candidate.parameters() if not p.is_meta), None)
        if param is not None:
            return param.device
    return torch.device("cpu")
