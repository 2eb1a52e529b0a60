"""The graph page: Python computes every number it shows; token text cannot inject markup; headless Chromium
opens a node's card and an edge's weight from the URL hash; nothing points off the machine."""

import re

import numpy as np
import pytest

from rewardlens.graphs import AttributionGraph, Nodes
from rewardlens.graphs._page import Context, graph_page, page_data, write_graph_page
from tests.helpers.browser import dom

EVIL = "<script>window.hacked=1</script>"


def _graph() -> AttributionGraph:
    """tokens t0 (EVIL), t1 → feature tc_L0_F3 at position 1 → reward; an error node at layer 0 → reward."""
    names = ["tc_L0_F3_P1", "tc_L0_error_P1", "embed_P0", "embed_P1", "reward"]
    nodes = Nodes(names, np.array([0, 1, 2, 2, 3], dtype=np.int8), np.array([0, 0, -1, -1, 2]),
                  np.array([1, 1, 0, 1, 1]), np.array([3, -1, 11, 12, -1]), np.array([0.7, np.nan, np.nan, np.nan, 0]),
                  np.array([0.5, np.nan, np.nan, np.nan, 1.25]), np.array([0.1, np.nan, np.nan, np.nan, 0.05]))
    adjacency = np.array([[0, 0, 0.3, 0.1, 0], [0.9, -0.2, 0.25, 0.25, 0]], dtype=np.float32)
    return AttributionGraph(nodes, adjacency, np.array([0, 4]), [EVIL, "b"], "pair 0 (chosen)", "transcoders", 2, 1)


def test_page_numbers_come_from_the_graph():
    g = _graph()
    data = page_data(g, {"tc_L0_F3": [Context("a «b» c", 2.5)]}, ["replacement score 0.9"])
    feature = data["nodes"][0]
    assert "direct write on the reward: +0.9" in feature["lines"]  # the root row's entry for this node
    assert feature["contexts"] == [["a «b» c", "2.5"]]
    labels = {e["label"] for e in data["edges"]}
    assert labels == {f"{g.nodes.names[s]} → {g.nodes.names[g.rows[r]]}: {g.adjacency[r, s]:+.4g}"
                      for r, s in zip(*g.adjacency.nonzero())}
    assert len(data["edges"]) == int(np.count_nonzero(g.adjacency))
    ys = {n["name"]: n["y"] for n in data["nodes"]}
    assert ys["reward"] < ys["tc_L0_F3_P1"] < ys["embed_P0"]  # the reward on top, tokens at the bottom


def test_token_text_is_data_not_markup_and_nothing_is_fetched(tmp_path):
    text = graph_page(_graph())
    assert "<script>window" not in text and "\\u003cscript\\u003e" in text
    urls = set(re.findall(r"https?://[^\s'\"]+", text))
    assert urls == {"http://www.w3.org/2000/svg"}  # the SVG namespace, a name, never fetched


def test_chromium_opens_a_card_and_an_edge_from_the_hash(tmp_path):
    g = _graph()
    page = write_graph_page(g, tmp_path / "g.html", contexts={"tc_L0_F3": [Context("x «y» z", 1.5)]})
    out = dom(page.as_uri() + "#node=tc_L0_F3_P1&edge=0", tmp_path / "profile", what="the graph page",
              budget_ms=5000)
    assert 'data-ready="1"' in out and 'data-node="tc_L0_F3_P1"' in out and 'data-edge="0"' in out
    title = re.search(r"<h3 id=\"card-title\">(.*?)</h3>", out)
    assert title and title[1] == "tc_L0_F3_P1"
    assert "activation: +0.7" in out and "x «y» z" in out
    first = page_data(g)["edges"][0]["label"]
    assert re.search(r'<div id="edge-info">(.*?)</div>', out)[1] == first.replace(">", "&gt;")
    assert out.count("<circle") == len(g.nodes.names) and out.count("<line") == int(np.count_nonzero(g.adjacency))
    evil = dom(page.as_uri() + "#node=embed_P0", tmp_path / "p2", what="the graph page", budget_ms=5000)
    assert EVIL not in evil  # never an element: the DOM holds it only as text
    assert "token: '&lt;script&gt;window.hacked=1&lt;/script&gt;'" in evil


def test_feature_contexts_match_a_hook_loop(tiny_root, pairs):
    """A neuron's top context is the sequence and position of its largest activation, found here by a forward
    pre-hook on the down projection over each sequence alone."""
    import torch

    import rewardlens as rl
    from rewardlens.graphs import feature_contexts

    model = rl.load(str(tiny_root["llama"]))
    got = feature_contexts(model, pairs, ["mlp_L1_N5"], n=2)["mlp_L1_N5"]
    seen = []
    down = model.layers[1].mlp.down_proj
    h = down.register_forward_pre_hook(lambda m, a: seen.append(a[0][0, :, 5].detach()))
    try:
        with torch.no_grad():
            for s in model.encode(list(pairs))[0]:
                model.model(input_ids=torch.tensor([s.ids]))
    finally:
        h.remove()
    best = sorted((float(v.max()) for v in seen if float(v.max()) > 0), reverse=True)[:2]
    assert [c.activation for c in got] == pytest.approx(best, rel=1e-5)
    assert all("«" in c.text and "»" in c.text for c in got)
