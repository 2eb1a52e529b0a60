"""The load-time proof: a map's parts add up to the residual stream, and our fp32 head is the model's.

Every number rewardlens reports rests on two facts checked here on a check input before any
analysis runs: the captured parts sum to the residual stream the final norm reads (bookkeeping),
and the fp32 copy of the head, applied to that stream, equals the model's own output (docs/design.md §1).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from torch import Tensor

from ..errors import ArchitectureError, ClosureError
from ._arch import hf_config, text_config
from ._core import RewardModel
from ._hooks import eval_mode
from ._keys import TraceKey
from ._tokens import Batch, Tokenized, tokenize
from ._trace import Trace, bookkeeping_error, trace

# fp32 closure is ~1e-6; a map that misses a part is off by O(1). Half-precision models sit between.
BOOKKEEPING_TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-6}


def check_bookkeeping(model: RewardModel, tr: Trace) -> None:
    """Refuse to report numbers when the captured parts do not add up to the residual stream."""
    dtype = next(model.model.parameters()).dtype
    tol = BOOKKEEPING_TOLERANCE.get(dtype, 5e-2)
    err = bookkeeping_error(model, tr)
    if err > tol:
        raise ClosureError(
            f"the parts named by architecture map {model.arch.name!r} do not add up to the residual stream "
            f"(relative gap {err:.2e} > {tol:.0e} for {dtype}); the map misses a part or a norm — "
            "check attn_post_norm/mlp_post_norm/layout, or register a corrected map (docs/architectures.md)"
        )


_CHECK_TEXT = "The quick brown fox jumps over the lazy dog. Is that a good answer?"


def _check_input(model: RewardModel) -> Tokenized:
    tok = model.tokenizer
    if model.arch.head_kind == "gated" and getattr(tok, "chat_template", None):
        conv = [{"role": "user", "content": "Is that a good answer?"}, {"role": "assistant", "content": _CHECK_TEXT}]
        return tokenize(tok, conv, encoder=model.encoder)
    enc = tok(_CHECK_TEXT, add_special_tokens=True)
    types = enc.get("token_type_ids") if model.encoder else None
    return Tokenized(list(enc["input_ids"]), list(types) if types is not None else None)


def _check_reads(model: RewardModel) -> Tokenized:
    """A check input for a multi-position read-out: the check text with the step separator after its
    third token and at its end (steps), or read from its fourth token on (response tokens)."""
    ids = list(model.tokenizer(_CHECK_TEXT, add_special_tokens=True)["input_ids"])
    prompt = min(3, len(ids) - 1)
    if model.reads.at == "separator":
        sep = model.reads.separator_id(model.tokenizer)
        ids = ids[:prompt + 1] + [sep] + ids[prompt + 1:] + [sep]
    where, targets = model.reads.positions(ids, prompt, None if model.reads.at != "separator" else ids[-1], "check")
    seq = Tokenized(ids, reads=where, targets=targets)
    return seq if model.offsets is None else replace(seq, offsets=model.offsets([seq])[0])


def _own_values(model: RewardModel, raw: Tensor, batch: Batch) -> Tensor:
    """The model's own read-out values [m, k] from its output `raw`: a sequence classifier's logits
    [n, k], or an LM's / token classifier's [n, T, V] read at every read (with its target)."""
    if raw.ndim == 2:
        return raw.float()
    reads = batch.reads
    if reads is None:
        at = raw[torch.arange(raw.shape[0], device=raw.device), batch.read_index.to(raw.device)]
        return model.head.own(at)
    return model.head.own(raw[reads.rows.to(raw.device), reads.cols.to(raw.device)], reads.targets)


def verify(model: RewardModel) -> None:
    """Prove on a check input that the map's parts add up and the fp32 head equals the model's own.

    Raises `ClosureError` or `ArchitectureError` naming what does not fit; marks the model verified.
    Gated heads are compared objective by objective when the model's forward returns `rewards`.
    """
    check = _check_input(model) if not model.reads.multi else _check_reads(model)
    _, batch = next(model.batches([check], 1))
    tr = trace(model, batch, gate=False)
    check_bookkeeping(model, tr)
    # The head alone, without per-read offsets (a DPO reference's term, proven by its own verify): an
    # implicit reward near 0 must not hide a head that is off by more than its terms' float error.
    head = model.head(model.final_hidden(tr[TraceKey.final()]), None if batch.reads is None else batch.reads.targets)
    ours = head.cpu().numpy()
    kwargs: dict[str, Tensor] = {"input_ids": batch.input_ids}
    if batch.token_type_ids is not None:
        kwargs["token_type_ids"] = batch.token_type_ids
    try:
        with torch.no_grad(), eval_mode(model.model):  # a model wrapped mid-training must not drop out here
            out = model.model(**kwargs)
    except ValueError:
        if model.arch.head_kind != "gated":
            raise
        out = None  # the gate found no chat pattern in the check input; closure above still holds
    raw = None if out is None else getattr(out, "rewards", None) if model.arch.head_kind == "gated" else out.logits
    if raw is not None:
        theirs = _own_values(model, raw, batch).cpu().numpy()
        scale = max(float(np.abs(theirs).max()), 1e-3)
        dtype = next(model.model.parameters()).dtype
        tol = 1e-3 if dtype == torch.float32 else 5e-2
        if theirs.shape != ours.shape or np.abs(theirs - ours).max() > tol * scale:
            raise ArchitectureError(
                f"rewardlens' fp32 head gives {ours.ravel()[:4]} but the model's own forward gives "
                f"{theirs.ravel()[:4]} on a check input; map {model.arch.name!r} reads the wrong final norm "
                f"({model.arch.final_norm!r}, kind {model.arch.norm!r}), head or read position"
            )
    model.verified = True


def check_structure(model: RewardModel) -> None:
    """Refuse what no map describes: a head of the wrong width, DeBERTa-v2's convolution layer."""
    config = hf_config(model.model)
    width = getattr(text_config(model.model), "hidden_size", None)
    if width is not None and model.d_model != width:
        raise ArchitectureError(
            f"the head reads vectors of width {model.d_model} but hidden_size is {width}; "
            f"the map's head path {model.arch.head!r} points at the wrong module"
        )
    if getattr(config, "conv_kernel_size", 0):
        raise ArchitectureError(
            f"this DeBERTa-v2 has a convolution layer (conv_kernel_size={config.conv_kernel_size}) that adds "
            "a part to the first layer's output; no architecture map can describe it yet"
        )
