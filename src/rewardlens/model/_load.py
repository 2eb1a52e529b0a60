"""`rewardlens.load` and `wrap`: load through `from_pretrained` (local folders and hub ids take the same
path), then prove the map fits before any number.

What is loaded is trusted only as far as it is checked (docs/scoring.md, *What loading guarantees*):
weights come from safetensors unless `allow_pickle=True`, custom code (`auto_map`) runs only with
`trust_remote_code=True` (never after a y/N prompt), and transformers' failures on either become one
`ModelLoadError` line naming the file and the fix.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer
from transformers import __version__ as transformers_version

from ..errors import HeadError, ModelLoadError, RewardLensError, UsageError, warn
from ..types import Readout, Truncation
from ._arch import ArchitectureMap, find_map, hf_config
from ._armorm import LlamaForRewardModelWithGating
from ._core import UNSET, RewardModel, Unset
from ._moe import check_moe_map
from ._verify import check_structure, verify
from ._vocab import pad_error

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
            raise UsageError(f"dtype {dtype!r} is not one of {sorted(_DTYPES)} or 'auto'", option="dtype")
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
        raise UsageError(
            f"{what} places weights on 'meta', which holds no values, so nothing could be read or scored; "
            "use 'auto', an existing device such as 'cuda:0', 'cpu', or 'disk' (with offload_folder=)",
            option="device_map"
        )
    if wanted != "cpu" and (kind is None or wanted != kind or index >= count):
        have = f"{count} {kind} device(s)" if kind is not None else "no accelerator"
        raise UsageError(
            f"{what} asks for device {target!r} but this machine has {have}; use device_map='auto' "
            "(it spreads layers over what exists and offloads the rest to 'cpu', or to 'disk' with "
            "offload_folder=), or name an existing device", option="device_map"
        )


def _check_device_map(device_map: DeviceMap) -> None:
    if isinstance(device_map, dict):
        for module, target in device_map.items():
            _check_placement(target, f"device_map[{module!r}]")
    else:
        _check_placement(device_map, f"device_map={device_map!r}")


# ---- trust: pickle weights, custom code, transformers' failures as one line ----------------------

# The weight files from_pretrained reads (a variant such as pytorch_model.fp16.bin included).
_SAFE_WEIGHTS = ("*.safetensors", "*.safetensors.index.json")
_PICKLE_WEIGHTS = ("pytorch_model*.bin", "pytorch_model*.bin.index.json")
_ALLOW = ("if you trust the file, pass allow_pickle=True; better, convert it once to safetensors (transformers' "
          "save_pretrained writes model.safetensors)")


def _local_folder(path_or_id: str, kwargs: dict[str, Any]) -> Path | None:
    """The local folder from_pretrained reads (with its `subfolder=`), or None for a hub id."""
    return Path(path_or_id) / kwargs.get("subfolder", "") if Path(path_or_id).is_dir() else None


def _local_config(path_or_id: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """config.json of a local folder as saved (for messages: no code runs to read it); {} otherwise."""
    folder = _local_folder(path_or_id, kwargs)
    try:
        return cast(dict[str, Any], json.loads((folder / "config.json").read_text())) if folder else {}
    except (OSError, ValueError):
        return {}


def _pickles(path_or_id: str, kwargs: dict[str, Any]) -> list[str]:
    """The pickle weight files of a local folder that has no safetensors weights (empty otherwise)."""
    folder = _local_folder(path_or_id, kwargs)
    if folder is None or any(next(folder.glob(p), None) for p in _SAFE_WEIGHTS):
        return []
    return sorted({f.name for p in _PICKLE_WEIGHTS for f in folder.glob(p)})


def _refuse_pickle(path_or_id: str, kwargs: dict[str, Any]) -> None:
    """Refuse, before from_pretrained runs, weights that only a pickle holds: unpickling runs whatever
    code the file names. A hub id cannot be listed in advance: `use_safetensors=True` refuses it there."""
    if kwargs.get("use_safetensors") is False:
        raise ModelLoadError("use_safetensors=False asks transformers for pickle weights, which run code when "
                             "loaded; pass allow_pickle=True instead (the one switch rewardlens reads)",
                             option="allow_pickle")
    pickles = _pickles(path_or_id, kwargs)
    if pickles:
        raise ModelLoadError(
            f"{_local_folder(path_or_id, kwargs)} is pickle-only: it holds {', '.join(pickles[:3])} and no "
            f"*.safetensors, and unpickling runs whatever code the file names (invariant: weights load from "
            f"safetensors unless pickle is allowed); {_ALLOW}", option="allow_pickle")


def _custom_code(config: dict[str, Any]) -> str:
    """The config's `auto_map` as 'AutoConfig → configuration_x.XConfig, ...' (empty without one)."""
    auto_map = config.get("auto_map") or {}
    return ", ".join(f"{k} → {v}" for k, v in auto_map.items()) if isinstance(auto_map, dict) else str(auto_map)


def _unpickling_reason(message: str) -> str:
    """The line of torch's weights_only message that says what it refused, without its boilerplate."""
    boilerplate = ("Weights only load failed", "Please file an issue", "Check the documentation")
    lines = [ln.strip() for ln in message.splitlines() if ln.strip() and not ln.strip().startswith(boilerplate)]
    return (lines[0] if lines else message[:200]).rstrip(".")


def _pickle_failure(exc: Exception, text: str, path_or_id: str, kwargs: dict[str, Any]) -> ModelLoadError | None:
    """torch's refusal of a pickle (or of a damaged one), or transformers' of a hub id without safetensors."""
    pickles = ", ".join(_pickles(path_or_id, kwargs)) or "its pickle weights"
    if isinstance(exc, pickle.UnpicklingError):
        return ModelLoadError(
            f"{path_or_id}: torch's safe unpickler (weights_only) refused {pickles}: {_unpickling_reason(text)}. A "
            "weights file needs no code, so the file may be malicious or hold objects beside its tensors: load a "
            "safetensors copy, or re-save the weights as safetensors from a source you trust")
    if isinstance(exc, EOFError) or text.startswith("PytorchStreamReader failed"):
        reason = text.split(". ")[0] or "it ends early"
        return ModelLoadError(f"{path_or_id}: {pickles} is not a readable torch checkpoint ({reason}): it is "
                              "damaged or truncated; download it again")
    if isinstance(exc, OSError) and "cannot be loaded with `safetensors`" in text:
        return ModelLoadError(f"{path_or_id} has no safetensors weights (model.safetensors or its index), so only "
                              f"pickle weights could load it, and unpickling runs code: refused by default; {_ALLOW}",
                              option="allow_pickle")
    return None


def _code_failure(exc: Exception, text: str, path_or_id: str, code: str) -> ModelLoadError | None:
    """transformers' failure on custom code (`code`: the folder's auto_map) or on a config it cannot read."""
    missing = re.search(r"does not appear to have a file named (\S+?\.py)\b", text)
    unknown = re.search(r"has model type `([^`]*)` but Transformers does not recognize", text)
    if isinstance(exc, OSError) and missing:
        return ModelLoadError(
            f"{path_or_id}: config.json's auto_map ({code or 'custom code'}) names {missing.group(1)}, which the "
            "folder lacks, so its custom code cannot run: copy the model's own .py files into the folder, or load "
            "without trust_remote_code=True to get transformers' stock class (if it has one for this model_type)")
    if not isinstance(exc, ValueError):
        return None
    if "contains custom code which must be executed" in text:
        return ModelLoadError(
            f"{path_or_id}: config.json's auto_map names custom code ({code or 'see the folder'}) and transformers "
            "has no class of its own for it, so that code must run to load the model: read it, then pass "
            "trust_remote_code=True")
    if unknown:
        return ModelLoadError(f"{path_or_id}: model type {unknown.group(1)!r} is not one transformers "
                              f"{transformers_version} knows, and config.json's auto_map names no custom code for "
                              "it: upgrade transformers, or check the folder's config.json")
    if text.startswith("Unrecognized configuration class"):
        return ModelLoadError(
            f"{path_or_id}: {text.splitlines()[0].rstrip('.')}: no transformers class is registered for this config "
            f"(custom code: {code or 'none'}). rewardlens loads sequence classifiers (load), token classifiers and "
            "causal LMs (load_prm, load_judge, load_dpo): point at a model saved as one of those, whose custom code "
            "(if any) defines that class")
    return None


@contextlib.contextmanager
def _load_errors(path_or_id: str, kwargs: dict[str, Any]) -> Iterator[None]:
    """Re-raise transformers' multi-page failures on pickles and custom code as one `ModelLoadError` line."""
    try:
        yield
    except (pickle.UnpicklingError, EOFError, RuntimeError, OSError, ValueError) as exc:
        text = str(exc)
        one_line = (_pickle_failure(exc, text, path_or_id, kwargs)
                    or _code_failure(exc, text, path_or_id, _custom_code(_local_config(path_or_id, kwargs))))
        if one_line is None and isinstance(exc, (ValueError, OSError)) and not isinstance(exc, RewardLensError):
            # transformers' own refusal of what it was pointed at (a config it cannot parse, a folder that is
            # not a model): bad input, one line, with its first line kept; the chain stays for REWARDLENS_DEBUG
            first = (text.strip().splitlines() or [type(exc).__name__])[0].rstrip(".")
            raise ModelLoadError(f"{path_or_id}: transformers could not load it: {first}; point at a folder saved "
                                 "by save_pretrained (config.json, weights and tokenizer files) or a hub id") from exc
        if one_line is None:
            raise
        raise one_line from None  # the line names file and fix; transformers' 40-line chain would bury it
    except Exception as exc:
        if not type(exc).__module__.startswith("huggingface_hub"):
            raise
        # huggingface_hub validates a config's fields (StrictDataclassError): the folder's config.json is wrong
        said = " ".join(str(exc).split())[:300].rstrip(".:") or type(exc).__name__  # its lines, as one
        raise ModelLoadError(f"{path_or_id}: its config.json does not validate ({said}): fix the field it names, or "
                             "point at a folder saved by save_pretrained") from exc


def _warn_ignored_code(path_or_id: str, model: nn.Module, config: Any, kwargs: dict[str, Any]) -> None:
    """Say that an `auto_map`'s custom code did not run (transformers fell back to its stock class)."""
    code = _custom_code({"auto_map": getattr(config, "auto_map", None)})
    if code and not kwargs.get("trust_remote_code"):
        warn(f"{path_or_id}: config.json's auto_map names custom code ({code}) that was not run: transformers "
             f"loaded its own {type(model).__name__} for model_type {getattr(config, 'model_type', None)!r}. If "
             "that code changes the layers or the head, scores differ from the model's own; trust_remote_code=True "
             "(--trust-remote-code) runs the folder's code instead (read it first)")


def _from_pretrained(
    path_or_id: str, dtype: str | torch.dtype | None, device_map: DeviceMap | None,
    attn_implementation: str | None, from_pretrained_kwargs: dict[str, Any], auto: Any = None,
    safe_only: bool = True,
) -> tuple[nn.Module, list[str]]:
    """The sequence-classification model through `from_pretrained` (our own class for ArmoRM), and the
    weights the folder lacked (transformers initialised those at random). `safe_only`: safetensors
    weights only (a hub id's files cannot be listed in advance, so transformers refuses pickle there)."""
    config = AutoConfig.from_pretrained(path_or_id, **from_pretrained_kwargs)
    kwargs = dict(from_pretrained_kwargs)
    if safe_only and "gguf_file" not in kwargs:
        kwargs["use_safetensors"] = True
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
    try:
        loaded = cast(tuple[nn.Module, dict[str, Any]], (own or auto or AutoModelForSequenceClassification)
                      .from_pretrained(path_or_id, output_loading_info=True, **kwargs))
    except AssertionError as exc:  # torch's, as the embedding is built: its padding_idx has no row
        text = config.get_text_config()
        pad, rows = getattr(text, "pad_token_id", None), getattr(text, "vocab_size", None)
        if "Padding_idx" not in str(exc) or not isinstance(pad, int) or not isinstance(rows, int):
            raise
        raise pad_error(pad, rows, text, given=False, tokenizer_pad=None, source=path_or_id) from None
    model, info = loaded
    if own is None:  # our own class is the custom code's replacement, not a fallback
        _warn_ignored_code(path_or_id, model, config, kwargs)
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
    auto: Any = None, *, allow_pickle: bool = False,
) -> tuple[nn.Module, PreTrainedTokenizerBase, list[str]]:
    """The model (class `auto`, a sequence classifier by default), its tokenizer and the weights the
    folder lacked (transformers initialised those at random), placed as asked. Pickle weights are
    refused unless `allow_pickle`; custom code runs only with `trust_remote_code=True`."""
    if device is not None and device_map is not None:
        raise UsageError(f"pass device= or device_map=, not both (got device={device!r}, device_map={device_map!r})",
                         option="device_map")
    if device_map is not None:
        _check_device_map(device_map)
    if device is not None:
        _check_placement(device, f"device={device!r}")
    # An explicit False: on None, transformers asks y/N on a terminal (then fails with pages of text).
    kwargs = {"trust_remote_code": False, **from_pretrained_kwargs}
    if not allow_pickle:
        _refuse_pickle(path_or_id, kwargs)
    with _load_errors(path_or_id, kwargs):
        model, missing = _from_pretrained(path_or_id, dtype, device_map, attn_implementation, kwargs, auto,
                                          safe_only=not allow_pickle)
        tokenizer = AutoTokenizer.from_pretrained(path_or_id, **kwargs)
    if device is not None and device_map is None:
        model = model.to(device)
    return model, tokenizer, missing


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
    allow_pickle: bool = False,
    **from_pretrained_kwargs: Any,
) -> RewardModel:
    """Load a sequence-classification reward model and its tokenizer from a folder or hub id.

    The user's model is never modified: rewardlens only adds hooks, always removed, and keeps
    fp32 copies of the head. `readout` picks the scalar of a multi-output head (an index, a label
    or a weight per output; ArmoRM's gate by default). `pad_token_id` overrides the id the read
    position is found by (default: the model's own, `config.pad_token_id`). `max_length` and
    `truncation` ('error' or 'left') govern long inputs. `check` proves on a check input that the
    architecture map's parts add up to the residual stream and the head matches the model's own.
    `allow_pickle` loads a folder whose weights only a pickle holds (refused by default: unpickling
    runs code). Non-finite head, readout or final-norm weights are refused whatever `check` says.
    """
    model, tokenizer, missing = load_pretrained(path_or_id, dtype, device, device_map, attn_implementation,
                                                from_pretrained_kwargs, allow_pickle=allow_pickle)
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
