"""Loading through `from_pretrained`: local folders and hub ids take the same path."""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from .arch import find_map
from .armorm import LlamaForRewardModelWithGating
from .core import _UNSET, RewardModel, check_structure

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


def load_model(
    path_or_id: str,
    *,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device | None = None,
    device_map: str | dict | None = None,
    readout: int | str | list | None = None,
    attn_implementation: str | None = None,
    pad_token_id: int | None | object = _UNSET,
    max_length: int | None = None,
    truncation: str = "error",
    **from_pretrained_kwargs,
) -> RewardModel:
    """Load model and tokenizer with `from_pretrained` and wrap them (see `rewardlens.load`)."""
    if device is not None and device_map is not None:
        raise ValueError(f"pass device= or device_map=, not both (got device={device!r}, device_map={device_map!r})")
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
    model = (own or AutoModelForSequenceClassification).from_pretrained(path_or_id, **kwargs)
    if device is not None and device_map is None:
        model = model.to(device)
    tokenizer = AutoTokenizer.from_pretrained(path_or_id, **from_pretrained_kwargs)
    rm = RewardModel(
        model, tokenizer, find_map(model), readout=readout, pad_token_id=pad_token_id,
        max_length=max_length, truncation=truncation,
    )
    check_structure(rm)
    return rm
