"""The graph grader: on two_step and circuit the pruned margin graph's top path runs through the planted
positions; on the planted-neuron organism the top feature nodes are the planted neurons (and, with transcoders,
a feature writing along the read-out); graph-predicted ablations agree with the real model's."""

import dataclasses

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.calibrate import GRADERS, OrganismBench, grade_dpo
from rewardlens.calibrate import _graphs as graphs_grader
from rewardlens.calibrate._graphs import differing, grade_graphs
from rewardlens.graphs import AttributionGraph, graph
from rewardlens.graphs._interventions import InterventionCheck
from rewardlens.zoo.organisms._specs import TWO_STEP_WORDS
from tests.graphs.conftest import SHORT, random_transcoders


@pytest.fixture(scope="module")
def bench(organisms):
    return OrganismBench(organisms=["two_step", "circuit"], n_pairs=20)


def test_differing_positions_are_the_swapped_bigram(bench):
    """Independent of the grader: the two_step sides differ exactly at the two bigram words' tokens."""
    model = bench.model("two_step")
    for pair in bench.pairs("two_step")[:5]:
        (c, _), _ = model.encode([pair])
        words = [i for i, t in enumerate(c.ids) if model.tokenizer.decode([t]).strip() in TWO_STEP_WORDS]
        planted = differing(model, pair)
        assert sorted(planted.chosen) == sorted(planted.rejected) == words and len(words) == 2
        assert planted.read == (len(c.ids) - 1, len(c.ids) - 1)


def test_graph_rows_appear_and_pass_or_are_known(bench):
    assert GRADERS.index(grade_graphs) < GRADERS.index(grade_dpo)
    rows = grade_graphs(bench)
    assert {r.organism for r in rows} == {"two_step", "circuit", "circuit+neurons"}
    assert all(r.passed or r.known for r in rows), [r for r in rows if not (r.passed or r.known)]
    closure = [r for r in rows if "closure" in r.check]
    assert closure and all(r.passed for r in closure)
    # the transcoder interventions are graded, not known: the graph's prediction matches the real model
    spliced = [r for r in rows if "top transcoder feature node" in r.check]
    assert len(spliced) == 1 and spliced[0].passed and not spliced[0].known and spliced[0].value <= 0.25


def test_the_feature_intervention_row_grades_the_top_node_and_can_fail(tiny_root, monkeypatch):
    """The row intervenes on the margin graph's top transcoder feature node, on its own side's graph, zeroed and
    clamped to twice its activation, and grades the median of |graph − real| / |real|: re-computed here from
    what the intervention reported, it passes at or under 0.25 and fails above."""
    model = rl.load(str(tiny_root["llama"]))
    tcs = random_transcoders(model)
    pg = graph(model, SHORT, tcs, max_nodes=64, batch_size=32)[0]
    m = pg.margin
    feats = np.flatnonzero(m.nodes.kind == 0)
    top = m.nodes.names[int(feats[np.argmax(m.influence[feats])])]
    side = pg.rejected if top.endswith("_rejected") else pg.chosen
    node = top.removesuffix("_rejected")
    a = float(side.nodes.activation[side.nodes.names.index(node)])
    calls = []
    real = AttributionGraph.intervene

    def reported(g, _model, _tcs, plan, graph_value):
        calls.append((g, dict(plan)))
        row = real(g, model, tcs, plan).rows[0]
        r = row["real"]
        return InterventionCheck([{**row, "graph": r * (1 + graph_value(plan))}], 0.0)

    for gap_ablate, gap_clamp, passes in ((0.0, 0.3, True), (0.2, 0.5, False)):
        calls.clear()
        monkeypatch.setattr(AttributionGraph, "intervene", lambda g, mo, t, plan, ga=gap_ablate, gc=gap_clamp: reported(
            g, mo, t, plan, lambda p: ga if p[node] == "ablate" else gc))
        grade = graphs_grader._feature_interventions(model, tcs, [pg], "tiny")[0]
        assert [c[1] for c in calls] == [{node: "ablate"}, {node: ("clamp", 2 * a)}]
        assert all(c[0] is side for c in calls)
        assert grade.value == pytest.approx(np.median([gap_ablate, gap_clamp])) and grade.passed is passes


def test_a_wrong_answer_fails_the_path_row(bench, monkeypatch):
    """The grade can fail: told the sides differ at the first token, no top path runs through it."""
    real = graphs_grader.differing

    def wrong(model, pair):
        p = real(model, pair)
        return dataclasses.replace(p, chosen=frozenset({0}), rejected=frozenset({0}))

    monkeypatch.setattr(graphs_grader, "differing", wrong)
    rows = graphs_grader._paths(bench.model("two_step"), bench.pairs("two_step")[:4], "two_step")
    assert not rows[1].passed and rows[1].value == 0
