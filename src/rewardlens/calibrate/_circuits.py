"""Grader of the circuit instruments on planted paths: path patching (and, appended to
`PATH_CHECKS`, edge attribution and circuits) on the `two_step` organism, whose rule needs two heads
in series, and on the `circuit` organism, whose rule lives in one head."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..causal import path_patch
from ..data import Pair
from ..exact import attribute
from ..model import Part, RewardModel
from ..zoo.organisms import ORGANISMS, ablated, forward_margins
from ._core import Grade, OrganismBench, circuits, localisation

PATH_SHARE = 0.8
"""The planted edge's mean path effect must carry at least this share of the mean clean margin."""
SENDER_SHARE = 0.05
"""Attribution (the direct view) may credit the planted sender with at most this share of Σ|mean margin|."""
CIRCUIT_PAIRS = 40
"""Held-out pairs each path patching grade runs on (the first of the bench's pairs)."""

PathCheck = Callable[[RewardModel, list[Pair], str, tuple[str, str]], list[Grade]]
"""A further check on a planted path: (model, held-out pairs, organism name, (sender, receiver)) → rows."""
PATH_CHECKS: list[PathCheck] = []
"""EXTRA CHECKS on every planted path, run after path patching's and attribution's. Edge attribution
(`rl.edges`, EAP / EAP-IG: the planted edge ranked first) and circuits (`rl.circuit`: the two-part
circuit recovering ≥ 80 % of the mean margin; the `circuit` organism's head its one node) append
their graders here when they land."""


def grade_circuits(bench: OrganismBench) -> list[Grade]:
    """Path patching finds the planted path: on organisms with a `planted_path`, the planted
    (sender → receiver) edge is the top edge and carries ≥ 80 % of the mean margin, ablating either
    part removes the margin, and attribution credits the receiver alone; on organisms with one
    `planted_part`, that part is the top sender into the reward."""
    rows: list[Grade] = []
    for name in (n for n in bench.organisms if ORGANISMS[n].planted_path is not None):
        path = ORGANISMS[name].planted_path
        assert path is not None  # the generator keeps the organisms with a planted path
        model, pairs = bench.model(name), bench.pairs(name)[:CIRCUIT_PAIRS]
        rows += _ablation(model, pairs, name, path)
        rows += _planted_edge(model, pairs, name, path)
        rows += _direct_view(model, pairs, name, path)
        for check in PATH_CHECKS:
            rows += check(model, pairs, name, path)
    for name in circuits(bench):
        part = ORGANISMS[name].planted_part
        assert part is not None  # circuits() keeps the organisms with a planted part
        model, pairs = bench.model(name), bench.pairs(name)[:CIRCUIT_PAIRS]
        senders = _parts(model, model.n_layers)
        pp = path_patch(model, pairs, senders=senders, receivers=["reward"])
        rows += localisation("path patching", name, senders, pp.effect.mean(0)[:, 0], part, "head",
                             by="mean path effect into reward")
    return rows


def _parts(model: RewardModel, below: int) -> list[str]:
    """Head-level part names of layers `< below`, the embeddings first: ['embed', 'attn_L0_H0', ..., 'mlp_L0', ...]."""
    names = ["embed"]
    for layer in range(below):
        names += [f"attn_L{layer}_H{h}" for h in range(model.n_heads)] + [f"mlp_L{layer}"]
    return names


def _ablation(model: RewardModel, pairs: list[Pair], name: str, path: tuple[str, str]) -> list[Grade]:
    """The answer key: zeroing either planted part (or both) leaves ≤ 5 % of the mean margin, so
    the rule needs both, in series."""
    full = forward_margins(model.model, model.tokenizer, pairs)[:, 0].mean()
    rows = []
    for cut in (path[0], path[1], path):
        left = forward_margins(ablated(model.model, cut), model.tokenizer, pairs)[:, 0].mean()
        what = " and ".join(cut) if isinstance(cut, tuple) else cut
        rows.append(Grade.of("organism", name, f"|mean margin| left with {what} ablated, as a share",
                             abs(left / full), 0.05, "<="))
    return rows


def _planted_edge(model: RewardModel, pairs: list[Pair], name: str, path: tuple[str, str]) -> list[Grade]:
    """Path patching with every position noised (the organism's sides are token-aligned): among
    every (sender of an earlier layer, receiver of the planted receiver's layer or the reward) edge,
    the planted one has the largest mean effect, and that effect is ≥ 80 % of the mean margin."""
    layer = Part.parse(path[1]).layer
    senders = _parts(model, layer)
    receivers = [f"attn_L{layer}_H{h}" for h in range(model.n_heads)] + [f"mlp_L{layer}", "reward"]
    pp = path_patch(model, pairs, senders=senders, receivers=receivers, positions="all")
    mean = pp.effect.mean(0)  # [S, R]
    order = np.argsort(-mean, axis=None, kind="stable")
    edges = [(senders[i // len(receivers)], receivers[i % len(receivers)]) for i in order]
    planted = mean[senders.index(path[0]), receivers.index(path[1])]
    edge = f"{path[0]} -> {path[1]}"
    return [Grade.of("path patching", name, f"rank of the planted edge {edge} by mean path effect "
                     f"(of {mean.size} edges)", edges.index(path) + 1, 1, "<="),
            Grade.of("path patching", name, f"mean path effect of {edge} over the mean margin",
                     float(planted / pp.margin.mean()), PATH_SHARE)]


def _direct_view(model: RewardModel, pairs: list[Pair], name: str, path: tuple[str, str]) -> list[Grade]:
    """Exact attribution sees only the last hop: the receiver ranks first with ≥ 90 % of Σ|mean
    margin| at head level, and the sender, which writes nowhere near the read token, gets ≤ 5 %."""
    att = attribute(model, pairs, level="head")
    scores = att.margin.mean(0)
    rows = localisation("attribution", name, att.names, scores, path[1], "head")
    share = abs(scores[att.names.index(path[0])]) / np.abs(scores).sum()
    rows.append(Grade.of("attribution", name, f"share of the |mean margin| on the planted sender {path[0]} "
                         "(head level)", float(share), SENDER_SHARE, "<="))
    return rows
