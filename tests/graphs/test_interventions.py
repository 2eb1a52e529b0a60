"""Interventions check the graph in the real model (transcoders spliced in, errors kept, attention live).

Yardsticks: untouched, the spliced model's reward is the model's own; a small steer of a feature is a
directional derivative, which the graph's linear prediction must match up to what the graph freezes
(attention patterns, norm scales: second-order small for a small step); an ablation is reported beside it."""

from __future__ import annotations

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.errors import RewardLensError
from rewardlens.graphs import graph
from tests.graphs.conftest import SHORT, random_transcoders
from tests.helpers.tiny import own_scores


@pytest.fixture(scope="module", params=["llama", "bert"])  # a pre-norm MLP module; a post-norm encoder's MLP points
def setup(request, tiny_root):
    model = rl.load(str(tiny_root[request.param]))
    tcs = random_transcoders(model)
    return model, tcs, graph(model, SHORT, tcs, max_nodes=10**6, batch_size=32)[0].chosen


def test_small_steers_move_the_reward_as_the_graph_predicts(setup):
    model, tcs, g = setup
    nodes, _ = g.to_frame()
    feats = nodes[nodes.kind == "feature"].sort_values("influence", ascending=False).head(8)
    plan = {name: ("steer", 1e-4 * a) for name, a in zip(feats.node, feats.activation)}
    check = g.intervene(model, tcs, plan)
    assert check.reward == pytest.approx(own_scores(model, [SHORT])[0], rel=1e-5)
    frame = check.to_frame()
    assert list(frame.node) == list(plan)
    # the graph freezes attention patterns and norm scales, whose first-order change the real model keeps: the
    # prediction follows the real change closely but not exactly (measured here: correlation, largest miss)
    assert np.corrcoef(frame.graph, frame.real)[0, 1] > 0.9
    assert np.abs(frame.graph - frame.real).max() < 0.3 * np.abs(frame.real).max()
    last = frame[[n.startswith(f"tc_L{model.n_layers - 1}_") for n in frame.node]]
    np.testing.assert_allclose(last.direct, last.graph, rtol=1e-6)  # nothing downstream of the last layer


def test_ablation_reports_prediction_beside_the_real_effect(setup):
    model, tcs, g = setup
    name = g.to_frame()[0].query("kind == 'feature'").sort_values("influence").node.iloc[-1]
    row = g.intervene(model, tcs, {name: "ablate"}).rows[0]
    assert row["new_activation"] == 0.0 and np.isfinite([row["direct"], row["graph"], row["real"]]).all()
    with pytest.raises(RewardLensError, match="not a feature node"):
        g.intervene(model, tcs, {"embed_P0": "ablate"})
    with pytest.raises(RewardLensError, match="mode"):
        g.intervene(model, tcs, {name: ("double", 2.0)})
