"""`rewardlens.load`: load through `from_pretrained`, then prove the map fits before any number."""

from __future__ import annotations

import numpy as np
import torch

from .decompose import check_bookkeeping
from .errors import ArchitectureError
from .model.core import _UNSET, RewardModel
from .model.load import load_model
from .model.tokens import Tokenized
from .trace import trace

_PROBE = "The quick brown fox jumps over the lazy dog. Is that a good answer?"


def verify(model: RewardModel) -> None:
    """Prove on a probe input that the map's parts add up and the fp32 head equals the model's own.

    Raises `ClosureError` or `ArchitectureError` naming what does not fit. Gated heads skip the
    head comparison (their gate needs a chat-formatted input); their closure is still checked.
    """
    enc = model.tokenizer(_PROBE, add_special_tokens=True)
    types = enc.get("token_type_ids") if model.encoder else None
    seq = Tokenized(list(enc["input_ids"]), list(types) if types is not None else None)
    _, batch = next(model.batches([seq], 1))
    tr = trace(model, batch, gate=False)
    check_bookkeeping(model, tr)
    if model.arch.head_kind == "gated":
        return
    ours = model.head(model.final_hidden(tr["final"])).cpu().numpy()
    kwargs = {"input_ids": batch.input_ids}
    if batch.token_type_ids is not None:
        kwargs["token_type_ids"] = batch.token_type_ids
    with torch.no_grad():
        theirs = model.model(**kwargs).logits.float().cpu().numpy()
    scale = max(float(np.abs(theirs).max()), 1e-3)
    dtype = next(model.model.parameters()).dtype
    tol = 1e-3 if dtype == torch.float32 else 5e-2
    if theirs.shape != ours.shape or np.abs(theirs - ours).max() > tol * scale:
        raise ArchitectureError(
            f"rewardlens' fp32 head gives {ours.ravel()[:4]} but the model's own forward gives "
            f"{theirs.ravel()[:4]} on a probe input; map {model.arch.name!r} reads the wrong final norm "
            f"({model.arch.final_norm!r}, kind {model.arch.norm!r}), head or read position"
        )


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
