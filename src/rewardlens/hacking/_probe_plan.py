"""What `probe` scores: every distinct conversation of its items' axis variants, base answers and quality
degradations, by key, and the items whose every sequence fits the model (short-context models skip the
rest whole, so every contrast stays matched; hacking/_fit.py).
"""

from __future__ import annotations

import json

from ..data import Pair
from ..model import RewardModel
from ..types import Conversation, Prompt
from ._axes import join, sentences, variant
from ._degrade import degradations
from ._fit import unfit
from ._items import Item, builtin

ProbePlan = tuple[dict[str, Conversation], list[list[tuple[str, str] | None]], list[str], dict[str, list[str | None]]]


def item_keys(cells: list[tuple[str, str] | None], original: str, qplan: dict[str, list[str | None]],
              i: int) -> list[str]:
    """Every key item `i` needs: its original, each axis' (with, without) and each quality degradation."""
    return [original, *(k for cell in cells if cell is not None for k in cell),
            *(k for q in qplan.values() if (k := q[i]) is not None)]


def probe_plan(base: list[Item], names: list[str], quality: bool, seed: int) -> ProbePlan:
    """Every distinct conversation the probe scores (by key), and per item the keys of each axis' (with,
    without), of its original and of each quality degradation (None where an axis or degradation does not apply)."""
    convs: dict[str, Conversation] = {}

    def key(prompt: Prompt, response: str) -> str:
        conv = Pair(prompt, response, response).conversation("chosen")
        k = json.dumps(conv, sort_keys=True)
        convs.setdefault(k, conv)
        return k

    plan: list[list[tuple[str, str] | None]] = [[None] * len(names) for _ in base]
    for i, item in enumerate(base):
        for j, axis in enumerate(names):
            v = variant(axis, item.prompt, item.response, seed=seed, key=item.id, item=item)
            if v is not None:
                plan[i][j] = (key(v[0], v[2]), key(v[0], v[1]))
    degraded = degradations(base, seed) if quality else {}
    originals = [key(item.prompt, join(sentences(item.response))) for item in base]
    qplan = {q: [None if d is None else key(base[i].prompt, d) for i, d in enumerate(texts)]
             for q, texts in degraded.items()}
    return convs, plan, originals, qplan


def fitting(model: RewardModel, everything: list[Item], names: list[str], quality: bool,
            seed: int) -> tuple[list[int], dict[str, Conversation], list[list[tuple[str, str] | None]], list[str],
                                dict[str, list[str | None]]]:
    """The items of `everything` (indices) whose every sequence fits the model, and `probe_plan` of them."""
    kept = list(range(len(everything)))  # indices into `everything`
    while True:  # dropping an item changes others' degradations (off topic), so plan again until all fit
        base = [everything[k] for k in kept]
        convs, plan, originals, qplan = probe_plan(base, names, quality, seed)
        needs = [[convs[k] for k in item_keys(plan[i], originals[i], qplan, i)] if builtin(item) else []
                 for i, item in enumerate(base)]
        drop = set(unfit(model, needs))
        kept = [k for i, k in enumerate(kept) if i not in drop]
        if not drop or not kept:
            return kept, convs, plan, originals, qplan


def base_answers(model: RewardModel, pool: list[Item], names: list[str], quality: bool,
                 seed: int) -> dict[str, Conversation]:
    """The base answers of the items of `pool` that fit the model (`fitting`), by key."""
    _, convs, _, originals, _ = fitting(model, pool, names, quality, seed)
    return {k: convs[k] for k in originals}


__all__ = ["ProbePlan", "base_answers", "fitting", "item_keys", "probe_plan"]
