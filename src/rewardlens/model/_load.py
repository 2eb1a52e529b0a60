"""`rewardlens.load` and `wrap`: load through `from_pretrained` (local folders and hub ids take the same
path), then prove the map fits before any number."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from ..errors import HeadError, warn
from ..types import Readout, Truncation
from ._arch import ArchitectureMap, find_map, hf_config
from ._armorm import LlamaForRewardModelWithGating
from ._core import UNSET, RewardModel, Unset
from ._moe import check_moe_map
from ._verify import check_structure, verify

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Placement = str | int | torch.device
"""Where `device=` or one `device_map` entry puts weights: a device, an accelerator index, 'disk' or a strategy."""
DeviceMap = str | dict[str, Placement]
"""`device_map=`: a strategy such as 'auto', or a placement per module name."""

# Architectures whose published code does not import under transformers 5.x; we ship our own class.
_OWN_CLASSES = {"LlamaForRewardModelWithGating": LlamaForRewardModelWithGating}
# Gemma-2's soft-capped attention is only exact in the eager kernel.
_EAGER = {"gemma2"}


_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}


def _dtype(dtype: str | torch.dtype | None) -> torch.dtype | str | None:
    if isinstance(dtype, str) and dtype != "auto":
        if dtype not in _DTYPES:
            raise ValueError(f"dtype {dtype!r} is not one of {sorted(_DTYPES)} or 'auto'")
        return _DTYPES[dtype]
    return dtype


# Strategies accelerate understands for `device_map=`; anything else names a device per module.
_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


def _accelerators() -> tuple[str | None, int]:
    """(type, count) of this machine's accelerators, e.g. ('cuda', 2), or (None, 0)."""
    acc = getattr(torch, "accelerator", None)  # torch >= 2.6
    if acc is not None:
        return (acc.current_accelerator().type, acc.device_count()) if acc.is_available() else (None, 0)
    return ("cuda", torch.cuda.device_count()) if torch.cuda.is_available() else (None, 0)


def _check_placement(target: Placement, what: str) -> None:
    """Refuse a device no instrument can use ('meta': no weights at all) or one this machine lacks.

    from_pretrained would load onto 'meta' silently (every number then fails later) and names a
    missing GPU only by a bare assertion; strategies, 'cpu' and 'disk' always pass."""
    if isinstance(target, bool) or target in _STRATEGIES or target in ("cpu", "disk"):
        return
    kind, count = _accelerators()
    if isinstance(target, int):  # an accelerator index
        wanted, index = kind, target
    else:
        try:
            device = torch.device(target)
        except (RuntimeError, TypeError, ValueError):
            return  # not a device name: from_pretrained says what it accepts
        wanted, index = device.type, device.index or 0
    if wanted == "meta":
        raise ValueError(
            f"{what} places weights on 'meta', which holds no values, so nothing could be read or scored; "
            "use 'auto', an existing device such as 'cuda:0', 'cpu', or 'disk' (with offload_folder=)"
        )
    if wanted != "cpu" and (kind is None or wanted != kind or index >= count):
        have = f"{count} {kind} device(s)" if kind is not None else "no accelerator"
        raise ValueError(
            f"{what} asks for device {target!r} but this machine has {have}; use device_map='auto' "
            "(it spreads layers over what exists and offloads the rest to 'cpu', or to 'disk' with "
            "offload_folder=), or name an existing device"
        )


def _check_device_map(device_map: DeviceMap) -> None:
    if isinstance(device_map, dict):
        for module, target in device_map.items():
            _check_placement(target, f"device_map[{module!r}]")
    else:
        _check_placement(device_map, f"device_map={device_map!r}")


def _from_pretrained(
    path_or_id: str, dtype: str | torch.dtype | None, device_map: DeviceMap | None,
    attn_implementation: str | None, from_pretrained_kwargs: dict[str, Any], auto: Any = None,
) -> tuple[nn.Module, list[str]]:
    """The sequence-classification model through `from_pretrained` (our own class for ArmoRM), and the
    weights the folder lacked (transformers initialised those at random)."""
    config = AutoConfig.from_pretrained(path_or_id, **from_pretrained_kwargs)
    kwargs = dict(from_pretrained_kwargs)
    if dtype is not None:
        kwargs["dtype"] = _dtype(dtype)
    if device_map is not None:
        kwargs["device_map"] = device_map
    if attn_implementation is None and getattr(config, "model_type", None) in _EAGER:
        attn_implementation = "eager"
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    own = next((_OWN_CLASSES[a] for a in (getattr(config, "architectures", None) or ()) if a in _OWN_CLASSES), None)
    # With output_loading_info the typed return (the model alone) becomes (model, loading info).
    loaded = cast(tuple[nn.Module, dict[str, Any]], (own or auto or AutoModelForSequenceClassification).from_pretrained(
        path_or_id, output_loading_info=True, **kwargs))
    model, info = loaded
    return model, sorted(info.get("missing_keys") or ())


def _refuse_untrained_head(path_or_id: str, model: nn.Module, arch: ArchitectureMap, missing: list[str]) -> None:
    """A reward head (with its pooler or gate) whose weights the folder lacks is refused (`refuse_untrained`)."""
    heads = [p for p in (arch.head, arch.pooler if arch.head_kind == "pooler" else None,
                         arch.gate if arch.head_kind == "gated" else None) if p]
    refuse_untrained(path_or_id, model, heads, missing, "not as a trained reward model. Point at a folder saved "
                     "from the sequence-classification reward model itself, with its head weights")


def refuse_untrained(path_or_id: str, model: nn.Module, heads: list[str], missing: list[str], fix: str) -> None:
    """A head (module paths `heads`) whose weights the folder lacks was initialised at random by
    transformers: every score from it is noise that changes from run to run, so nothing may be
    measured on it. `fix` ends the message: what the folder is not, and what to point at instead."""
    untrained = [k for k in missing if any(k == h or k.startswith(h + ".") for h in heads)]
    if not untrained:
        return
    saved_as = getattr(hf_config(model), "architectures", None) or ["an unnamed architecture"]
    kind = ("a causal language model" if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in saved_as)
            else "a base model without a head" if any(a.endswith("Model") for a in saved_as) else "a model")
    raise HeadError(
        f"{path_or_id}: the weights {untrained[:4]} of the head rewardlens reads are not in the folder, so "
        f"transformers initialised them at random and every score would be noise. The folder was saved as "
        f"{saved_as[0]} ({kind}), {fix}")


def load_pretrained(
    path_or_id: str, dtype: str | torch.dtype | None, device: str | torch.device | None,
    device_map: DeviceMap | None, attn_implementation: str | None, from_pretrained_kwargs: dict[str, Any],
    auto: Any = None,
) -> tuple[nn.Module, PreTrainedTokenizerBase, list[str]]:
    """The model (class `auto`, a sequence classifier by default), its tokenizer and the weights the
    folder lacked (transformers initialised those at random), placed as asked."""
    if device is not None and device_map is not None:
        raise ValueError(f"pass device= or device_map=, not both (got device={device!r}, device_map={device_map!r})")
    if device_map is not None:
        _check_device_map(device_map)
    if device is not None:
        _check_placement(device, f"device={device!r}")
    model, missing = _from_pretrained(path_or_id, dtype, device_map, attn_implementation, from_pretrained_kwargs,
                                      auto)
    if device is not None and device_map is None:
        model = model.to(device)
    return model, AutoTokenizer.from_pretrained(path_or_id, **from_pretrained_kwargs), missing


def load(
    path_or_id: str,
    *,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device | None = None,
    device_map: DeviceMap | None = None,
    readout: Readout = None,
    attn_implementation: str | None = None,
    pad_token_id: int | None | Unset = UNSET,
    max_length: int | None = None,
    truncation: Truncation = "error",
    check: bool = True,
    **from_pretrained_kwargs: Any,
) -> RewardModel:
    """Load a sequence-classification reward model and its tokenizer from a folder or hub id.

    The user's model is never modified: rewardlens only adds hooks, always removed, and keeps
    fp32 copies of the head. `readout` picks the scalar of a multi-output head (an index, a label
    or a weight per output; ArmoRM's gate by default). `pad_token_id` overrides the id the read
    position is found by (default: the model's own, `config.pad_token_id`). `max_length` and
    `truncation` ('error' or 'left') govern long inputs. `check` proves on a check input that the
    architecture map's parts add up to the residual stream and the head matches the model's own.
    """
    model, tokenizer, missing = load_pretrained(path_or_id, dtype, device, device_map, attn_implementation,
                                                from_pretrained_kwargs)
    arch = find_map(model)
    _refuse_untrained_head(path_or_id, model, arch, missing)
    rm = RewardModel(
        model, tokenizer, arch, readout=readout, pad_token_id=pad_token_id,
        max_length=max_length, truncation=truncation, source=path_or_id,
    )
    check_structure(rm)
    check_moe_map(rm)
    if check:
        verify(rm)
    return rm


def wrap(
    model: nn.Module, tokenizer: PreTrainedTokenizerBase, *, arch: ArchitectureMap | None = None,
    readout: Readout = None, pad_token_id: int | None | Unset = UNSET, max_length: int | None = None,
    truncation: Truncation = "error",
) -> RewardModel:
    """Wrap an already loaded Hugging Face reward model (never modified) and prove its map fits.

    Takes the keyword options of `RewardModel` (`arch=`, `readout=`, `pad_token_id=`,
    `max_length=`, `truncation=`). Gemma-2 should have been loaded with
    `attn_implementation="eager"`.
    """
    config = hf_config(model)
    if getattr(config, "model_type", None) == "gemma2" and config._attn_implementation != "eager":
        warn("Gemma-2 is only exact with attn_implementation='eager'; reload the model with it")
    rm = RewardModel.from_model(model, tokenizer, arch=arch, readout=readout, pad_token_id=pad_token_id,
                                max_length=max_length, truncation=truncation)
    check_structure(rm)
    check_moe_map(rm)  # before the check input runs: a module inside a sparse block sees flattened states
    verify(rm)
    return rm
