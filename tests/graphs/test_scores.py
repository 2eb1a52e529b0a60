"""Influence, pruning and scores against circuit-tracer's documented definitions, re-implemented here on the
square [N × N] adjacency it uses (rows targets, columns sources; tokens and the logit last); the graph's
circuit-tracer file against that tool's schema; top paths against brute-force enumeration."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

import rewardlens as rl
from rewardlens.graphs import AttributionGraph, graph
from tests.graphs.conftest import SHORT, random_transcoders
from tests.helpers.tiny import PAIRS


@pytest.fixture(scope="module")
def pair_graph(tiny_root):
    model = rl.load(str(tiny_root["llama"]))
    return graph(model, SHORT, random_transcoders(model), max_nodes=30, batch_size=16)[0]


def _square(g: AttributionGraph) -> torch.Tensor:
    a = torch.zeros(len(g.nodes.names), len(g.nodes.names), dtype=torch.float64)
    a[torch.from_numpy(g.rows).long()] = torch.from_numpy(g.adjacency.astype(np.float64))
    return a


def _normalize(m):  # circuit-tracer: |A| / row L1, rows clamped at 1e-10
    m = m.abs()
    return m / m.sum(1, keepdim=True).clamp(min=1e-10)


def _influence(a, w):  # w @ A + w @ A² + ... until it vanishes
    cur = w @ a
    total = cur.clone()
    while cur.any():
        cur = cur @ a
        total += cur
    return total


def _threshold(scores, share):
    s = scores.flatten().sort(descending=True).values
    cum = s.cumsum(0) / s.sum()
    return s[min(int(torch.searchsorted(cum, share)), len(s) - 1)]


def _prune(g, node_t, edge_t):
    """prune_graph: node share, always tokens and logits, edge share, then no dangling features/errors."""
    a, kind = _square(g), torch.from_numpy(g.nodes.kind.astype(np.int64))
    w = torch.zeros(len(kind), dtype=torch.float64)
    w[-1] = 1.0
    infl = _influence(_normalize(a), w)
    keep = infl >= _threshold(infl, node_t)
    keep[kind >= 2] = True
    p = a.clone()
    p[~keep] = 0
    p[:, ~keep] = 0
    n = _normalize(p)
    scores = n * (_influence(n, w) + w)[:, None]
    edges = scores >= _threshold(scores, edge_t)
    inner, feats = kind <= 1, kind == 0
    old = None
    while old is None or not torch.equal(old, keep):
        old = keep.clone()
        edges[~keep] = False
        edges[:, ~keep] = False
        keep[inner] &= edges[:, inner].any(0)
        keep[feats] &= edges[feats].any(1)
    return keep, edges


def _scores(g):
    a, kind = _square(g), torch.from_numpy(g.nodes.kind.astype(np.int64))
    w = torch.zeros(len(kind), dtype=torch.float64)
    w[-1] = 1.0
    n = _normalize(a)
    infl = _influence(n, w)
    tok, err = infl[kind == 2].sum(), infl[kind == 1].sum()
    out = infl + w
    return float(tok / (tok + err)), float(((1 - n[:, kind == 1].sum(-1)) * out).sum() / out.sum())


@pytest.mark.parametrize("side", ["chosen", "margin"])
def test_scores_and_influence_are_circuit_tracers(pair_graph, side):
    g = getattr(pair_graph, side)
    replacement, completeness = _scores(g)
    assert g.scores.replacement == pytest.approx(replacement, rel=1e-9)
    assert g.scores.completeness == pytest.approx(completeness, rel=1e-9)
    assert 0 < g.scores.replacement < 1 and 0 < g.scores.completeness < 1
    w = torch.zeros(len(g.nodes.names), dtype=torch.float64)
    w[-1] = 1.0
    np.testing.assert_allclose(g.influence, _influence(_normalize(_square(g)), w).numpy(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("thresholds", [(0.8, 0.98), (0.5, 0.9)])
def test_prune_keeps_what_circuit_tracers_prune_keeps(pair_graph, thresholds):
    g = pair_graph.chosen
    keep, edges = _prune(g, *thresholds)
    pruned = g.prune(*thresholds)
    assert pruned.nodes.names == [n for n, k in zip(g.nodes.names, keep.tolist()) if k]
    kept = set(pruned.nodes.names)
    theirs = {(g.nodes.names[s], g.nodes.names[t]) for t, s in edges.nonzero().tolist()
              if g.nodes.names[s] in kept and g.nodes.names[t] in kept}
    frame = pruned.to_frame()[1]
    assert set(zip(frame.source, frame.target)) == theirs
    assert len(pruned.nodes.names) < len(g.nodes.names)


def test_frames_hold_every_node_and_edge(pair_graph):
    g = pair_graph.margin
    nodes, edges = g.to_frame()
    assert list(nodes.node) == g.nodes.names and set(nodes.kind) == {"feature", "error", "token", "reward"}
    assert len(edges) == np.count_nonzero(g.adjacency)
    into_root = edges[edges.target == "margin"].weight.sum()
    assert into_root == pytest.approx(g.adjacency[-1].astype(np.float64).sum(), rel=1e-6)


def test_top_paths_are_the_best_token_to_reward_chains(pair_graph):
    g = pair_graph.chosen.prune(0.6, 0.9)
    paths = g.top_paths(3)
    assert len(paths) == 3 and all(p[0].startswith("embed_P") and p[-1] == "reward" for p, _ in paths)
    # brute force: every token → reward path's product of normalised shares
    share = _normalize(torch.from_numpy(g.adjacency.astype(np.float64))).numpy()
    row = {int(r): i for i, r in enumerate(g.rows)}
    found = []

    def walk(node, score, path):
        if g.nodes.kind[node] == 2:
            found.append(score)
            return
        if node not in row:  # an error node: a source, but not a token
            return
        for j in np.nonzero(share[row[node]])[0]:
            walk(int(j), score * share[row[node], j], path)

    walk(g.root, 1.0, [])
    best = sorted(found, reverse=True)[:3]
    np.testing.assert_allclose(sorted((abs(s) for _, s in paths), reverse=True), best, rtol=1e-9)


def test_saved_graph_follows_circuit_tracers_schema(pair_graph, tmp_path):
    g = pair_graph.margin
    path = g.save(tmp_path, "rm-margin")
    data = json.loads(path.read_text())
    assert set(data) == {"metadata", "qParams", "nodes", "links"}
    assert {"slug", "scan", "transcoder_list", "prompt_tokens", "prompt", "node_threshold"} <= set(data["metadata"])
    assert set(data["qParams"]) == {"pinnedIds", "supernodes", "linkType", "clickedId", "sg_pos"}
    fields = {"node_id", "feature", "layer", "ctx_idx", "feature_type", "token_prob", "is_target_logit", "run_idx",
              "reverse_ctx_idx", "jsNodeId", "clerp", "influence", "activation"}
    assert all(set(n) == fields for n in data["nodes"])
    ids = {n["node_id"] for n in data["nodes"]}
    assert len(ids) == len(data["nodes"])
    assert all(link["source"] in ids and link["target"] in ids and set(link) == {"source", "target", "weight"}
               for link in data["links"])
    logits = [n for n in data["nodes"] if n["feature_type"] == "logit"]
    assert len(logits) == 1 and logits[0]["is_target_logit"] and logits[0]["layer"] == str(g.n_layers + 1)
    assert all(0 <= n["ctx_idx"] < len(data["metadata"]["prompt_tokens"]) for n in data["nodes"])
    index = json.loads((tmp_path / "graph-metadata.json").read_text())
    assert [m["slug"] for m in index["graphs"]] == ["rm-margin"]
    g.save(tmp_path, "rm-margin")  # saving again replaces the entry
    assert len(json.loads((tmp_path / "graph-metadata.json").read_text())["graphs"]) == 1


def test_plot_draws_the_graph(pair_graph):
    import matplotlib

    matplotlib.use("Agg")
    fig = pair_graph.chosen.prune().plot()
    assert fig.axes and fig.axes[0].collections


def test_margin_matches_prompt_nodes_by_position_or_by_distance_to_the_read(pair_graph, tiny_root):
    m = pair_graph.margin
    prefix = m.meta["shared_prefix"]
    assert prefix > 0
    # a causal model computes the shared prompt identically on both sides: its matched features' edges cancel
    scale = np.abs(pair_graph.chosen.adjacency).max()
    for r, node in enumerate(m.rows[:-1]):
        if m.nodes.side[node] == "both" and m.nodes.position[node] < prefix:
            assert np.abs(m.adjacency[r]).max() <= 1e-5 * scale
    assert {"chosen", "rejected", "both"} <= set(m.nodes.side)
    model = rl.load(str(tiny_root["llama"]))
    read = graph(model, SHORT, random_transcoders(model), max_nodes=30, batch_size=16, align="read")[0].margin
    assert read.reward == pytest.approx(m.reward, rel=1e-6) and read.closure_gap <= 1e-5
    tokens = read.nodes.kind == 2
    both = tokens & (read.nodes.side == "both")
    assert both.any() and (read.meta["align"], m.meta["align"]) == ("read", "prefix")


def test_closure_gap_floors_rounding_of_tiny_targets_but_sees_a_missing_edge(tiny_root):
    """Every neuron node of a tiny Llama (no feature past the cap): the reported gap is rounding, under 1e-5; with
    one edge of the largest-scale target removed (a real closure failure) the gap is that edge's share."""
    model = rl.load(str(tiny_root["llama"]))
    g = graph(model, PAIRS[0], basis="neurons", max_nodes=4096, batch_size=64)[0].rejected
    assert g.closure_gap < 1e-5
    adjacency = g.adjacency.copy()
    scale = np.abs(adjacency).sum(1)
    row = int(np.argmax(scale))
    col = int(np.argmax(np.abs(adjacency[row])))
    lost = abs(float(adjacency[row, col])) / (scale[row] + abs(g.nodes.constant[g.rows[row]]))
    adjacency[row, col] = 0.0
    broken = dataclasses.replace(g, adjacency=adjacency)
    assert broken.closure_gap >= lost > 1e-3  # the scale after removal is smaller, so the gap is at least `lost`
