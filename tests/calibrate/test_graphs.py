"""The graph grader: on two_step and circuit the pruned margin graph's top path runs through the planted
positions; on the planted-neuron organism the top feature nodes are the planted neurons (and, with transcoders,
a feature writing along the read-out); graph-predicted ablations agree with the real model's."""

import dataclasses

import pytest

from rewardlens.calibrate import GRADERS, OrganismBench, grade_dpo
from rewardlens.calibrate import _graphs as graphs_grader
from rewardlens.calibrate._graphs import differing, grade_graphs
from rewardlens.zoo.organisms._specs import TWO_STEP_WORDS


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


def test_a_wrong_answer_fails_the_path_row(bench, monkeypatch):
    """The grade can fail: told the sides differ at the first token, no top path runs through it."""
    real = graphs_grader.differing

    def wrong(model, pair):
        p = real(model, pair)
        return dataclasses.replace(p, chosen=frozenset({0}), rejected=frozenset({0}))

    monkeypatch.setattr(graphs_grader, "differing", wrong)
    rows = graphs_grader._paths(bench.model("two_step"), bench.pairs("two_step")[:4], "two_step")
    assert not rows[1].passed and rows[1].value == 0
