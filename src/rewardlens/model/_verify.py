"""The load-time proof: a map's parts add up to the residual stream, and our fp32 head is the model's.

Every number rewardlens reports rests on two facts checked here on a check input before any
analysis runs: the captured parts sum to the residual stream the final norm reads (bookkeeping),
and the fp32 copy of the head, applied to that stream, equals the model's own output (docs/design.md §1).
Both presume finite numbers (a NaN compares false with every tolerance and passes any check), so
the weights rewardlens reads and every value of the check forward are proven finite first.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import torch
from torch import Tensor

from ..errors import ArchitectureError, ClosureError, ModelLoadError
from ._arch import hf_config, text_config
from ._core import RewardModel
from ._hooks import eval_mode
from ._keys import TraceKey
from ._tokens import Batch, Tokenized, tokenize
from ._trace import Trace, bookkeeping_error, trace

# fp32 closure is ~1e-6; a map that misses a part is off by O(1). Half-precision models sit between.
BOOKKEEPING_TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-6}

SQUARE_LIMIT = float(torch.finfo(torch.float32).max) ** 0.5
"""|x| ≈ 1.8e19: every norm squares its input (`mean(x²)`, `var(x)`) in fp32, so a residual value
beyond this overflows there, the norm's scale becomes 0 and the reward its constant, with no NaN
anywhere to show it."""
_CHUNK = 1 << 24  # values per isfinite pass: a [V, d] vocabulary head is read in slices, not copied as bools


def non_finite(t: Tensor) -> str | None:
    """None when every value of `t` is finite; else its first non-finite value, where, and how many."""
    flat, count, first = t.detach().reshape(-1), 0, -1
    for start in range(0, flat.numel(), _CHUNK):
        bad = ~torch.isfinite(flat[start:start + _CHUNK])
        n = int(bad.sum())
        if n and first < 0:
            first = start + int(bad.nonzero()[0, 0])
        count += n
    if not count:
        return None
    where = [int(i) for i in np.unravel_index(first, tuple(t.shape))] if t.ndim else []
    return f"{float(flat[first])} at {where} ({count} of {flat.numel()} values non-finite)"


def _unreadable(t: Tensor) -> str | None:
    """Why no norm can read `t`: a non-finite value, or one whose square overflows fp32; None if neither."""
    bad = non_finite(t)
    if bad is not None:
        return bad
    peak = float(t.detach().abs().max()) if t.numel() else 0.0
    if peak > SQUARE_LIMIT:
        return (f"finite but reaches |x| = {peak:.1e}, beyond {SQUARE_LIMIT:.1e} where x² overflows float32 "
                "(the next norm's scale becomes 0 and every reward its constant)")
    return None


def _source(model: RewardModel) -> str:
    return f"{model.source}: " if model.source else ""


def _read_weights(model: RewardModel) -> Iterator[tuple[str, Tensor]]:
    """(name, fp32 copy) of each weight rewardlens reads for every score: the head (its pooler, gate
    and transform) and the final norm; never the backbone (a 70B model's is 140 GB)."""
    arch, head = model.arch, model.head
    rows = "" if head.tokens is None else f" (the rows of token ids {head.tokens[0]} and {head.tokens[1]})"
    yield f"{arch.head}.weight{rows}", head.weight
    yield f"{arch.head}.bias{rows}", head.bias
    if head.pooler_weight is not None and head.pooler_bias is not None:
        yield f"{arch.pooler}.weight", head.pooler_weight
        yield f"{arch.pooler}.bias", head.pooler_bias
    if head.gating is not None:
        yield from ((f"{arch.gate}.{name}", p) for name, p in head.gating.named_parameters())
    if head.transform is not None:
        yield "reward_transform_matrix", head.transform
    if arch.final_norm is not None:
        norm = model.norm(arch.final_norm)
        yield f"{arch.final_norm}.weight", norm.gamma
        if norm.beta is not None:
            yield f"{arch.final_norm}.bias", norm.beta


def check_finite_weights(model: RewardModel) -> None:
    """Refuse a head, readout or final norm holding NaN or inf (`ModelLoadError` naming the tensor):
    every score is read through them, so every score would be NaN or inf."""
    for name, tensor in _read_weights(model):
        bad = non_finite(tensor)
        if bad is not None:
            raise ModelLoadError(
                f"{_source(model)}the weight {name} holds {bad}; every score is read through it, so every "
                "score would be NaN or inf (invariant: the weights rewardlens reads are finite). The checkpoint "
                "is damaged: download it again, or re-save it from a model whose weights pass torch.isfinite")
    readout = model.head.readout
    bad = None if readout is None else non_finite(readout)
    if bad is not None:
        raise ModelLoadError(f"readout= holds {bad}; a readout weighs the head's outputs into one score, so "
                             "every score would be NaN or inf: pass finite readout weights", option="readout")


def _trace_parts(model: RewardModel, tr: Trace) -> Iterator[tuple[str, Tensor]]:
    """(what, value [n, width]) of every captured point, in the order the forward computes them."""
    arch = model.arch
    rnorms = arch.residual_norms if arch.layout == "post_norm" else None
    yield "the embeddings (layer 0's input)", tr[TraceKey.embed()]
    for layer in range(model.n_layers):
        at = f"{arch.layers}.{layer}"
        yield f"layer {layer}'s attention output ({at}.{arch.attn_out})", tr[TraceKey.attn(layer)]
        if rnorms is not None:
            yield f"layer {layer}'s residual norm input ({at}.{rnorms[0]})", tr[TraceKey.attn_rnorm(layer)]
        yield f"layer {layer}'s MLP output ({at}.{arch.mlp_out})", tr[TraceKey.mlp(layer)]
        if rnorms is not None:
            yield f"layer {layer}'s residual norm input ({at}.{rnorms[1]})", tr[TraceKey.mlp_rnorm(layer)]
        yield f"layer {layer}'s output ({at})", tr[TraceKey.resid(layer)]
    yield "the residual the head reads", tr[TraceKey.final()]


def check_finite_trace(model: RewardModel, tr: Trace) -> None:
    """Refuse a check forward whose parts are not finite numbers a norm can square, naming the first
    one the forward computes: its module (or one before it) holds the weight at fault."""
    for what, value in _trace_parts(model, tr):
        bad = _unreadable(value)
        if bad is not None:
            raise ModelLoadError(
                f"{_source(model)}on the check input, {what} is {bad} (invariant: every part of the residual "
                "stream is finite and its square fits in float32). A weight of that module, or of one before "
                "it, is NaN, inf or far too large: check them with torch.isfinite and .abs().max(), then "
                "download the checkpoint again or re-save it with finite weights")


def _refuse_non_finite(model: RewardModel, values: np.ndarray, who: str) -> None:
    """Refuse a non-finite reward of the check forward (after naming a weight at fault, if one is)."""
    if np.isfinite(values).all():
        return
    check_finite_weights(model)  # a DPO reference gets here without check_structure: name its head
    bad = non_finite(torch.from_numpy(np.ascontiguousarray(values)))
    raise ModelLoadError(
        f"{_source(model)}on the check input, {who} gives {bad} though every part of the residual stream is "
        f"finite (invariant: a reward is a finite number); the head {model.arch.head!r} or the final norm "
        f"{model.arch.final_norm!r} holds weights so large that the score overflows: check them with .abs().max()")


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

    Raises `ModelLoadError` naming a non-finite (or overflowing) part or reward, else `ClosureError`
    or `ArchitectureError` naming what does not fit; marks the model verified.
    Gated heads are compared objective by objective when the model's forward returns `rewards`.
    """
    check = _check_input(model) if not model.reads.multi else _check_reads(model)
    _, batch = next(model.batches([check], 1))
    tr = trace(model, batch, gate=False)
    check_finite_trace(model, tr)  # before any tolerance: a NaN gap passes every `gap > tol`
    check_bookkeeping(model, tr)
    # The head alone, without per-read offsets (a DPO reference's term, proven by its own verify): an
    # implicit reward near 0 must not hide a head that is off by more than its terms' float error.
    head = model.head(model.final_hidden(tr[TraceKey.final()]), None if batch.reads is None else batch.reads.targets)
    ours = head.cpu().numpy()
    _refuse_non_finite(model, ours, "rewardlens' fp32 head")
    theirs = _own_output(model, batch)
    if theirs is not None:
        _refuse_non_finite(model, theirs, "the model's own forward")
        _compare_heads(model, ours, theirs)
    model.verified = True


def _own_output(model: RewardModel, batch: Batch) -> np.ndarray | None:
    """The model's own read-out values on the check batch; None for a gated head whose gate found no
    chat pattern in it (or whose forward returns no per-objective `rewards`)."""
    kwargs: dict[str, Tensor] = {"input_ids": batch.input_ids}
    if batch.token_type_ids is not None:
        kwargs["token_type_ids"] = batch.token_type_ids
    try:
        with torch.no_grad(), eval_mode(model.model):  # a model wrapped mid-training must not drop out here
            out = model.model(**kwargs)
    except ValueError:
        if model.arch.head_kind != "gated":
            raise
        return None  # the gate found no chat pattern in the check input; closure still holds
    raw = getattr(out, "rewards", None) if model.arch.head_kind == "gated" else out.logits
    return None if raw is None else _own_values(model, raw, batch).cpu().numpy()


def _compare_heads(model: RewardModel, ours: np.ndarray, theirs: np.ndarray) -> None:
    """Refuse an fp32 head whose values differ from the model's own beyond float error."""
    scale = max(float(np.abs(theirs).max()), 1e-3)
    dtype = next(model.model.parameters()).dtype
    tol = 1e-3 if dtype == torch.float32 else 5e-2
    if theirs.shape != ours.shape or np.abs(theirs - ours).max() > tol * scale:
        raise ArchitectureError(
            f"rewardlens' fp32 head gives {ours.ravel()[:4]} but the model's own forward gives "
            f"{theirs.ravel()[:4]} on a check input; map {model.arch.name!r} reads the wrong final norm "
            f"({model.arch.final_norm!r}, kind {model.arch.norm!r}), head or read position"
        )


def check_structure(model: RewardModel) -> None:
    """Refuse what no map describes (a head of the wrong width, DeBERTa-v2's convolution layer) and
    non-finite weights among those rewardlens reads (`check_finite_weights`); runs with check=False too."""
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
    check_finite_weights(model)
