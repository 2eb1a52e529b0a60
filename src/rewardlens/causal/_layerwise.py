"""Gradients of the reward at every capture point, one layer at a time (attribution patching's backward).

A backward pass through one whole forward holds every layer's activations of every position at
once: for a long sequence that is many times what a no-grad forward needs, and it sets the audit's
peak memory. Here one no-grad forward records each layer's input and call arguments (`Recording`,
as the stepped engine does); then, from the last layer down, layer l alone is run again with grad
from its recorded input, and the gradient arriving at its output is pulled back to its input and
to the points inside it: `g_l = (∂ out_l / ∂ in_l)ᵀ g_{l+1}`, with `g_L = ∂r/∂ out_{L-1}` at the read
position. The chain rule makes this the same gradient as the whole backward; memory is one layer's
activations. Each layer's recomputed output must equal the recorded input of the next (the proof
that stepping reproduces this model's forward); otherwise the caller backpropagates whole.

Where the caller's clean trace already recorded the targets (`trace_pairs(record=mode)`: the traced
forward itself, through `LayerTaps`), `Recorded` hands those recordings over and no recording
forward runs here (docs/design.md §5, "Attribution patching").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager

import torch
from torch import Tensor

from ..data.internal import part
from ..model import RewardModel, TraceKey
from ..model.internal import Batch, Recording, eval_mode, get_module

Tensors = dict[TraceKey, Tensor]
ProbeContext = Callable[[], AbstractContextManager[tuple[Tensors, Tensors, Tensors]]]


def _close(mine: Tensor, want: Tensor, mask: Tensor, tol: float) -> bool:
    gap = (mine - want)[mask].float().norm(dim=-1) / want[mask].float().norm(dim=-1).clamp_min(1e-12)
    return bool(gap.max() <= tol) if gap.numel() else True


class Recorded:
    """What the forward that traced some sequences' clean runs recorded of them: sequence index →
    (recording, its row). A recording holds either every layer's input ([L, r, T, d] for its r rows),
    which attribution patching's backward takes (`take`), or the model's cache ([L, r, T, 2·kv]), which
    the backward continues and leaves for the read-position sweep, which takes it (`take_caches`).
    Only the sequences asked for are kept."""

    def __init__(self) -> None:
        self.recordings: list[Recording] = []
        self.where: dict[int, tuple[int, int]] = {}

    def add(self, seqs: Sequence[int], rec: Recording | None) -> None:
        """Sequences `seqs`, rows 0..r-1 of `rec` (None: not recorded, e.g. their batch ran in pieces)."""
        if rec is None or not seqs:
            return
        for row, i in enumerate(seqs):
            self.where[int(i)] = (len(self.recordings), row)
        self.recordings.append(rec)

    def take(self, *, leave_caches: bool = False) -> Recorded:
        """Everything held, moved to a new holder: this one (the caller's `Clean`) lets go of it, or, with
        `leave_caches`, keeps the recordings of the model's cache (attribution patching leaves them for the
        read-position sweep, which continues them: [L, r, T, 2·kv] that it would otherwise compute again)."""
        out = self._split(lambda _rec: True)
        if leave_caches:  # the same recordings, held by both until the sweep takes them from here
            for i, (k, row) in out.where.items():
                if out.recordings[k].cache is not None:
                    self._put(i, out.recordings[k], row)
        return out

    def take_caches(self) -> Recorded:
        """The recordings of the model's cache, moved to a new holder; layer inputs stay here."""
        return self._split(lambda rec: rec.cache is not None)

    def _split(self, moves: Callable[[Recording], bool]) -> Recorded:
        """A new holder of the recordings `moves` picks (this one keeps the rest), each row where it was."""
        out, kept = Recorded(), Recorded()
        for i, (k, row) in self.where.items():
            (out if moves(self.recordings[k]) else kept)._put(i, self.recordings[k], row)
        self.recordings, self.where = kept.recordings, kept.where
        return out

    def _put(self, seq: int, rec: Recording, row: int) -> None:
        """Sequence `seq` as row `row` of `rec`, which is held once however many of its rows are."""
        k = next((j for j, held in enumerate(self.recordings) if held is rec), None)
        if k is None:
            k = len(self.recordings)
            self.recordings.append(rec)
        self.where[seq] = (k, row)

    def _by_recording(self, seqs: Sequence[int]) -> dict[int, list[int]]:
        """Positions in `seqs` by the recording that holds them (recording index → positions, in row order)."""
        by: dict[int, list[int]] = {}
        for j, i in enumerate(seqs):
            if i in self.where:
                by.setdefault(self.where[i][0], []).append(j)
        for js in by.values():
            js.sort(key=lambda j: self.where[seqs[j]][1])
        return by

    def groups(self, seqs: Sequence[int]) -> list[tuple[list[int], Recording | None]]:
        """Positions in `seqs` grouped by the recording that holds them (in its row order), with those rows of
        it, and the positions no recording holds under None."""
        by = self._by_recording(seqs)
        held = {j for js in by.values() for j in js}
        rest = [j for j in range(len(seqs)) if j not in held]
        out: list[tuple[list[int], Recording | None]] = [
            (js, self.recordings[k].select(_rows_of(js, seqs, self.where))) for k, js in by.items()]
        return out + ([(rest, None)] if rest else [])

    def drain(self, seqs: Sequence[int]) -> Iterator[tuple[list[int], Recording]]:
        """`groups` of the held positions, handed over one recording at a time: this holder is empty from the
        first, only the recordings asked for are kept after that, and each is let go of once handed over
        (only some of its rows: a copy of them, the whole not held while they run)."""
        by, where = self._by_recording(seqs), self.where
        recordings = {k: self.recordings[k] for k in by}
        self.recordings, self.where = [], {}
        for k in sorted(by):
            whole = recordings.pop(k)
            part = whole.select(_rows_of(by[k], seqs, where))
            del whole
            yield by[k], part


def _rows_of(js: list[int], seqs: Sequence[int], where: dict[int, tuple[int, int]]) -> Tensor:
    """The recorded rows [len(js)] of positions `js` of `seqs` (`Recorded.where`)."""
    return torch.tensor([where[seqs[j]][1] for j in js])


def layerwise_grads(
    model: RewardModel, batch: Batch, coef: Tensor, probes: ProbeContext, tol: float = 1e-4,
    rec: Recording | None = None,
) -> tuple[Tensors, Tensors] | None:
    """(activations, gradients of the reward) at every point that `probes()` touches, by trace key,
    each [B, T, w]; None when stepping does not reproduce the model's forward on `batch`.

    `probes()` is a context manager yielding `(deltas, acts, _)` (attribution patching's zero-leaf
    hooks); it is entered once per layer, so only the points inside that layer fire. `coef` [B, k]:
    the readout coefficients, held at their clean values (a gate reads an earlier position). `rec`: a
    recording of exactly `batch` already made (`rec.batch`), else one no-grad forward records it here."""
    rec = Recording(model, batch) if rec is None else rec
    mask = batch.attention_mask.bool().to(rec.last.device)
    rows = torch.arange(batch.input_ids.shape[0], device=model.device)
    acts: Tensors = {}
    grads: Tensors = {}
    upstream: Tensor | None = None
    for layer in reversed(range(model.n_layers)):
        part(model.n_layers - 1 - layer, model.n_layers)
        args, kwargs = rec.calls[layer]
        x = rec.inputs[layer].detach().requires_grad_(True)
        with torch.enable_grad(), eval_mode(model.model), probes() as (deltas, seen, _):
            out = model.layers[layer](x, *args, **kwargs)
            hidden = out[0] if isinstance(out, (tuple, list)) else out
            if not _matches(model, rec, layer, hidden.detach(), mask, tol):
                return None
            names = list(deltas)
            if upstream is None:  # the last layer: the reward read at t* through the frozen read-out
                h = hidden[rows.to(hidden.device), batch.read_index.to(hidden.device)]
                reward = (model.head(model.final_hidden(h.float().to(model.device))) * coef).sum()
                got = torch.autograd.grad(reward, [x, *(deltas[k] for k in names)], allow_unused=True)
            else:
                got = torch.autograd.grad(hidden, [x, *(deltas[k] for k in names)], grad_outputs=upstream,
                                          allow_unused=True)
        upstream = got[0] if got[0] is not None else torch.zeros_like(x)
        for name, grad in zip(names, got[1:]):
            acts[name] = seen[name]
            grads[name] = grad if grad is not None else torch.zeros_like(seen[name])
    return acts, grads


def _matches(model: RewardModel, rec: Recording, layer: int, hidden: Tensor, mask: Tensor, tol: float) -> bool:
    """Layer `layer`'s recomputed output equals what the recorded forward passed on: the next layer's
    input, or (last layer) the backbone's output, after the final norm where the backbone applies it."""
    if layer + 1 < model.n_layers:
        return _close(hidden, rec.inputs[layer + 1], mask, tol)
    last = hidden
    if model.arch.final_norm is not None:
        with torch.no_grad():
            last = get_module(model.model, model.arch.final_norm)(hidden)
    return last.shape == rec.last.shape and _close(last, rec.last, mask, tol)
