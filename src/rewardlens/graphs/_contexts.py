"""Top-activating contexts of a graph's features over a corpus, for the page's feature cards.

A transcoder feature `tc_L3_F120`'s activation is `f_120(x)` of layer 3's transcoder at each token's MLP
input; a neuron `mlp_L1_N5`'s is the input of layer 1's down-projection at neuron 5. Both are read with
hooks on one forward per batch (the model untouched), at every token of every sequence, and the `n`
largest (one per sequence) are kept with `window` tokens either side, the token marked «».
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import torch
from torch import Tensor

from ..data import Inputs
from ..model import Part, RewardModel
from ..model.internal import rewriting
from ._page import Context


def feature_contexts(model: RewardModel, inputs: Inputs, names: Sequence[str], *, transcoders: object = None,
                     n: int = 3, window: int = 8, batch_size: int = 8) -> dict[str, list[Context]]:
    """The `n` top contexts of each feature in `names` (transcoder features need `transcoders`)."""
    from ..sae.internal import mlp_module

    parts = {name: Part.parse(name) for name in dict.fromkeys(names)}
    wanted = {name: p for name, p in parts.items() if p.feature is not None or p.neuron is not None}
    layers = sorted({p.layer for p in wanted.values() if p.layer is not None})
    seqs, is_pairs = model.encode(inputs)
    best: dict[str, list[tuple[float, int, int]]] = {name: [] for name in wanted}
    for rows, batch in model.batches(seqs, batch_size, is_pairs=is_pairs):
        seen: dict[tuple[str, int], Tensor] = {}
        hooks = []
        for layer in layers:
            def keep(v: Tensor, key: tuple[str, int], seen: dict[tuple[str, int], Tensor] = seen) -> None:
                seen[key] = v.detach().float()
            if any(p.feature is not None and p.layer == layer for p in wanted.values()):
                hooks.append((mlp_module(model, layer), "in", lambda v, k=("tc", layer): keep(v, k)))
            if any(p.neuron is not None and p.layer == layer for p in wanted.values()):
                hooks.append((model.layer_module(layer, model.arch.mlp_out), "in",
                              lambda v, k=("mlp", layer): keep(v, k)))
        with torch.no_grad(), rewriting(hooks):
            model.run(batch, {})
        mask = batch.attention_mask.bool()
        for name, p in wanted.items():
            assert p.layer is not None
            if p.feature is not None:
                tc = transcoders[p.layer]  # type: ignore[index]
                x = seen[("tc", p.layer)]
                with torch.no_grad():  # a loaded transcoder's weights may require grad; no graph is wanted here
                    acts = tc.encode(x.to(tc.W_enc.dtype))[..., p.feature]
            else:
                acts = seen[("mlp", p.layer)][..., p.neuron]
            acts = acts.masked_fill(~mask.to(acts.device), float("-inf")).cpu()
            for b, row in enumerate(rows):
                value, pos = acts[b].max(0)
                if float(value) > 0:
                    _push(best[name], (float(value), int(row), int(pos) - _pad(batch, b)), n)
    return {name: [Context(_window(model, seqs[row].ids, pos, window), value)
                   for value, row, pos in sorted(heap, reverse=True)] for name, heap in best.items()}


def _pad(batch: object, b: int) -> int:
    """Left padding of row `b` (0 for right-padded batches): positions are the sequence's own."""
    mask = batch.attention_mask[b]  # type: ignore[attr-defined]
    return int((mask.cumsum(0) == 0).sum())


def _push(heap: list[tuple[float, int, int]], item: tuple[float, int, int], n: int) -> None:
    if len(heap) < n:
        heapq.heappush(heap, item)
    else:
        heapq.heappushpop(heap, item)


def _window(model: RewardModel, ids: list[int], pos: int, window: int) -> str:
    """The text of `window` tokens either side of `pos`, the token at `pos` marked «»."""
    dec = model.tokenizer.decode
    left, mid = dec(ids[max(pos - window, 0):pos]), dec(ids[pos:pos + 1])
    return f"{left}«{mid}»{dec(ids[pos + 1:pos + 1 + window])}".replace("\n", "\\n")
