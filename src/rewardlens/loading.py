"""`rewardlens.load`: load through `from_pretrained`, then prove the map fits before any number."""

from __future__ import annotations

import torch
from torch import nn

from .decompose import verify
from .errors import warn
from .model.core import _UNSET, RewardModel, check_structure
from .model.load import load_model


def load(
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
    check: bool = True,
    **from_pretrained_kwargs,
) -> RewardModel:
    """Load a sequence-classification reward model and its tokenizer from a folder or hub id.

    The user's model is never modified: rewardlens only adds hooks, always removed, and keeps
    fp32 copies of the head. `readout` picks the scalar of a multi-output head (an index, a label
    or a weight per output; ArmoRM's gate by default). `pad_token_id` overrides the id the read
    position is found by (default: the model's own, `config.pad_token_id`). `max_length` and
    `truncation` ('error' or 'left') govern long inputs. `check` proves on a probe input that the
    architecture map's parts add up to the residual stream and the head matches the model's own.
    """
    model = load_model(
        path_or_id, dtype=dtype, device=device, device_map=device_map, readout=readout,
        attn_implementation=attn_implementation, pad_token_id=pad_token_id, max_length=max_length,
        truncation=truncation, **from_pretrained_kwargs,
    )
    if check:
        verify(model)
    return model


def wrap(model: nn.Module, tokenizer, **kwargs) -> RewardModel:
    """Wrap an already loaded Hugging Face reward model (never modified) and prove its map fits.

    Takes the keyword options of `RewardModel` (`arch=`, `readout=`, `pad_token_id=`,
    `max_length=`, `truncation=`). Gemma-2 should have been loaded with
    `attn_implementation="eager"`.
    """
    if getattr(model.config, "model_type", None) == "gemma2" and model.config._attn_implementation != "eager":
        warn("Gemma-2 is only exact with attn_implementation='eager'; reload the model with it")
    rm = RewardModel.from_model(model, tokenizer, **kwargs)
    check_structure(rm)
    verify(rm)
    return rm
