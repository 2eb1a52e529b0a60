"""Grader of the circuit instruments on planted paths: path patching, edge attribution (EAP, EAP-IG),
verified edges and circuits on the `two_step` organism, whose rule needs two heads in series, and on the
`circuit` organism, whose rule lives in one head (its first hop: the embeddings into that head)."""

from __future__ import annotations

import dataclasses

import numpy as np

from ..causal import Edges, circuit, edges, path_patch
from ..causal.internal import encode_pairs
from ..data import Pair
from ..data.internal import rows_of
from ..errors import CircuitError
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

CIRCUIT_SHARE = 0.8
"""The two-part circuit must keep, and the `circuit` organism's recovered circuit reach, this share of the
mean clean margin (edge ablation)."""
VERIFY = 10
"""Edges scored by exact path patching (`verify=`), and edges kept, in the verified circuit checks."""
EXACT_TOLERANCE = 1e-5
"""A verified edge's mean score may differ from its own `path_patch` run by this share of the mean margin."""


def grade_circuits(bench: OrganismBench) -> list[Grade]:
    """The circuit instruments find the planted path: on organisms with a `planted_path`, the planted
    (sender → receiver) edge is the top edge by path patching (carrying ≥ 80 % of the mean margin) and
    by EAP-IG (EAP's rank reported), the two-part circuit keeps ≥ 80 % of the mean margin, ablating either part
    removes the margin, and attribution credits the receiver alone; on organisms with one
    `planted_part`, that part is the top sender into the reward and the one part of the smallest
    circuit reaching 80 %."""
    rows: list[Grade] = []
    for name in (n for n in bench.organisms if ORGANISMS[n].planted_path is not None):
        path = ORGANISMS[name].planted_path
        assert path is not None  # the generator keeps the organisms with a planted path
        model, pairs = bench.model(name), bench.pairs(name)[:CIRCUIT_PAIRS]
        rows += _ablation(model, pairs, name, path)
        rows += _planted_edge(model, pairs, name, path)
        rows += _direct_view(model, pairs, name, path)
        scored = edges(model, pairs, method="eap-ig", level="head", positions="all")
        rows += _edge_rank(edges(model, pairs, method="eap", level="head", positions="all"), name, path)
        rows += _edge_rank(scored, name, path)
        rows += _two_part(model, pairs, scored, name, path)
        rows += _hops(model, pairs, scored, name, path)
    for name in circuits(bench):
        part = ORGANISMS[name].planted_part
        assert part is not None  # circuits() keeps the organisms with a planted part
        model, pairs = bench.model(name), bench.pairs(name)[:CIRCUIT_PAIRS]
        senders = _parts(model, model.n_layers)
        pp = path_patch(model, pairs, senders=senders, receivers=["reward"])
        rows += localisation("path patching", name, senders, pp.effect.mean(0)[:, 0], part, "head",
                             by="mean path effect into reward")
        rows += _one_node(model, pairs, name, part)
        aligned = _aligned(model, bench.pairs(name))[:CIRCUIT_PAIRS]  # positions='all' needs token-aligned sides
        rows += _hops(model, aligned, edges(model, aligned, method="eap-ig", level="head", positions="all"), name,
                      ("embed", part))
    return rows


def _aligned(model: RewardModel, pairs: list[Pair]) -> list[Pair]:
    """The pairs whose two sides have as many tokens (28 of 100 held-out `circuit` pairs at seed 0)."""
    seqs = encode_pairs(model, pairs)
    return [p for k, p in enumerate(pairs) if len(seqs[rows_of(k)[0]].ids) == len(seqs[rows_of(k)[1]].ids)]


def _hops(model: RewardModel, pairs: list[Pair], scored: Edges, name: str, path: tuple[str, str]) -> list[Grade]:
    """Every position noised (`positions='all'`, what `rewardlens circuit --positions all` runs): the circuit
    of the top edges by EAP-IG holds the planted first hop (at the read token alone it cannot: that hop
    changes nothing there); verified (`verify=10`), each kept edge's score is its own `path_patch` run's
    mean effect (checked edge by edge) and the planted edge ranks first among path patching's candidates."""
    edge = f"{path[0]} -> {path[1]}"
    found = circuit(model, pairs, edges=scored, top=VERIFY, sizes=[VERIFY], positions="all")
    checked = scored.verify(model, pairs, VERIFY, positions="all")
    exact = circuit(model, pairs, edges=checked, top=VERIFY, sizes=[VERIFY], positions="all")
    margin = abs(float(checked.margin.mean()))
    off = max(abs(s - float(path_patch(model, pairs, senders=[u], receivers=[d], positions="all").effect.mean()))
              for u, d, s in exact.kept)
    rank = _edge_rank(checked, name, path)[0]
    return [Grade.of("circuit", name, f"the circuit of the top {VERIFY} edges (EAP-IG, every position noised) holds "
                     f"the planted first hop {edge}", float(path in [(u, d) for u, d, _ in found.kept]), 1, "=="),
            Grade.of("verified edges", name, f"share of the {VERIFY} kept edges scored exactly (verify={VERIFY})",
                     float(np.mean(exact.exact[:len(exact.kept)])), 1, "=="),
            Grade.of("verified edges", name, f"largest |kept edge score - its own path_patch effect| over the mean "
                     f"margin (verify={VERIFY})", off / margin, EXACT_TOLERANCE, "<="),
            dataclasses.replace(rank, instrument="verified edges", check=rank.check.replace(
                "EAP-IG score", f"EAP-IG score verified by path patching (verify={VERIFY})"))]


def _parts(model: RewardModel, below: int) -> list[str]:
    """Head-level part names of layers `< below`, the embeddings first: ['embed', 'attn_L0_H0', ..., 'mlp_L0', ...]."""
    names = ["embed"]
    for layer in range(below):
        names += _heads_and_mlp(model, layer)
    return names


def _heads_and_mlp(model: RewardModel, layer: int) -> list[str]:
    """Layer `layer`'s head parts then its MLP part, by name (`Part` owns the labels)."""
    return [Part.attn(layer, h).name for h in range(model.n_heads)] + [Part.mlp(layer).name]


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
    receivers = [*_heads_and_mlp(model, layer), "reward"]
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


def _edge_rank(scored: Edges, name: str, path: tuple[str, str]) -> list[Grade]:
    """Edge attribution (whole-head receivers: a head's query, key and value inputs together, since
    they carry the edge between them; every position noised): the planted edge has the largest mean
    score among path patching's candidates."""
    senders, receivers = _crossing(scored, path)
    mean = scored.score.mean(0)
    sub = mean[np.ix_([scored.upstream.index(u) for u in senders], [scored.downstream.index(d) for d in receivers])]
    order = np.argsort(-sub, axis=None, kind="stable")
    ranked = [(senders[i // len(receivers)], receivers[i % len(receivers)]) for i in order]
    rank = ranked.index(path) + 1
    if scored.method == "eap-ig":
        return [Grade.of("edges (EAP-IG)", name, f"rank of the planted edge {path[0]} -> {path[1]} by mean EAP-IG "
                         f"score (of {sub.size} edges)", rank, 1, "<=")]
    # EAP is the gradient at the clean run, blind where attention saturates: measured rank 1 at seed 0 but
    # 36 of 36 at seed 1 (a previous-token head, 0.99997 of its attention on one token; score -0.03 of the
    # margin where path patching gives 1.09, EAP-IG 0.71). Seed-dependent, so reported, not graded.
    return [Grade.of("edges (EAP)", name, f"rank of the planted edge {path[0]} -> {path[1]} by mean EAP score "
                     f"(of {sub.size} edges; informational: EAP misses saturated paths)", rank, sub.size, "<=")]


def _crossing(scored: Edges, path: tuple[str, str]) -> tuple[list[str], list[str]]:
    """Path patching's candidates: senders of the layers before the planted receiver's (head level, the
    embeddings first) into that layer's heads, its MLP and the reward."""
    layer = Part.parse(path[1]).layer
    senders = [u for u in scored.upstream if u == "embed" or Part.parse(u).layer < layer]
    receivers = [d for d in scored.downstream if d == "reward" or Part.parse(_node_part(d)).layer == layer]
    return senders, receivers


def _node_part(node: str) -> str:
    """The part whose input a downstream node is: 'attn_L1_H2_q' → 'attn_L1_H2' (edges' node names)."""
    return node[:-2] if node[-2:] in ("_q", "_k", "_v") else node


def two_part_edges(path: tuple[str, str]) -> list[tuple[str, str]]:
    """The two-part circuit of a planted path (sender s, receiver r): every edge among the embeddings,
    s, r and the read-out, in stream order: embed→s, embed→r, embed→reward, s→r, s→reward, r→reward."""
    s, r = path
    return [("embed", s), ("embed", r), ("embed", "reward"), (s, r), (s, "reward"), (r, "reward")]


def _fixed(scored: Edges, keep: list[tuple[str, str]]) -> Edges:
    """`scored` with the scores of `keep` set to 1 and every other edge's to 0, so that circuit() ranks
    exactly those edges first (ties keep their order)."""
    score = np.where(np.isnan(scored.score), np.nan, 0.0)
    for u, d in keep:
        score[:, scored.upstream.index(u), scored.downstream.index(d)] = 1.0
    return dataclasses.replace(scored, score=score)


def _two_part(model: RewardModel, pairs: list[Pair], scored: Edges, name: str, path: tuple[str, str]) -> list[Grade]:
    """Edge ablation, every position noised: the two-part circuit alone keeps ≥ 80 % of the mean margin."""
    keep = two_part_edges(path)
    c = circuit(model, pairs, edges=_fixed(scored, keep), top=len(keep), sizes=[len(keep)], positions="all")
    return [Grade.of("circuit", name, f"share of the mean margin kept by the two-part circuit ({len(keep)} edges "
                     f"among embed, {path[0]}, {path[1]}, reward)", c.share, CIRCUIT_SHARE)]


def _one_node(model: RewardModel, pairs: list[Pair], name: str, part: str) -> list[Grade]:
    """EAP-IG then edge ablation at the read token: the smallest circuit reaching 80 % of the mean
    margin has the planted head as its only part besides the embeddings and the read-out."""
    try:
        found = circuit(model, pairs, level="head", top=1).smallest(CIRCUIT_SHARE)
    except CircuitError:  # no evaluated circuit reaches the share: both rows fail, with NaN
        found = None
    inner = set() if found is None else {_node_part(n) for u, d, _ in found for n in (u, d)} - {"embed", "reward"}
    count = float("nan") if found is None else len(inner)
    return [Grade.of("circuit", name, f"parts besides embed and reward in the smallest circuit reaching "
                     f"{CIRCUIT_SHARE:g} of the mean margin", count, 1, "=="),
            Grade.of("circuit", name, f"{part} is a part of that circuit", float(part in inner), 1, "==")]
