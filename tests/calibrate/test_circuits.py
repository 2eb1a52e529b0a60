"""The circuits grader: path patching, edge attribution and circuits on planted paths."""

import copy
import dataclasses
import importlib

import pytest
import torch

from rewardlens.calibrate import GRADERS, OrganismBench, calibrate
from rewardlens.calibrate._circuits import grade_circuits, two_part_edges
from rewardlens.zoo.organisms import ORGANISMS, forward_margins

DIM = 16  # head dimension of the organisms
HOPS = (("two_step", "attn_L0_H1 -> attn_L1_H2"), ("circuit", "embed -> attn_L1_H2"))
"""Each organism's planted first hop: the path's sender into its receiver; the embeddings into the one head."""


@pytest.fixture(scope="module")
def card(organisms):
    return calibrate(graders=[grade_circuits], organisms=["two_step", "circuit"], n_pairs=60)


def test_circuit_rows_appear_and_pass(card):
    assert grade_circuits in GRADERS
    rows = {(r.organism, r.instrument, r.check): r for r in card.rows}
    edge = "attn_L0_H1 -> attn_L1_H2"
    assert set(rows) == {
        ("two_step", "organism", "|mean margin| left with attn_L0_H1 ablated, as a share"),
        ("two_step", "organism", "|mean margin| left with attn_L1_H2 ablated, as a share"),
        ("two_step", "organism", "|mean margin| left with attn_L0_H1 and attn_L1_H2 ablated, as a share"),
        ("two_step", "path patching", f"rank of the planted edge {edge} by mean path effect (of 36 edges)"),
        ("two_step", "path patching", f"mean path effect of {edge} over the mean margin"),
        ("two_step", "attribution", "rank of attn_L1_H2 by mean margin (head level)"),
        ("two_step", "attribution", "share of the |mean margin| on attn_L1_H2 (head level)"),
        ("two_step", "attribution", "share of the |mean margin| on the planted sender attn_L0_H1 (head level)"),
        ("circuit", "path patching", "rank of attn_L1_H2 by mean path effect into reward (head level)"),
        ("circuit", "path patching", "share of the |mean path effect into reward| on attn_L1_H2 (head level)"),
        ("two_step", "edges (EAP)", f"rank of the planted edge {edge} by mean EAP score (of 36 edges; "
                                    "informational: EAP misses saturated paths)"),
        ("two_step", "edges (EAP-IG)", f"rank of the planted edge {edge} by mean EAP-IG score (of 36 edges)"),
        ("two_step", "circuit", "share of the mean margin kept by the two-part circuit (6 edges among embed, "
                                "attn_L0_H1, attn_L1_H2, reward)"),
        ("circuit", "circuit", "parts besides embed and reward in the smallest circuit reaching 0.8 of the mean "
                               "margin"),
        ("circuit", "circuit", "attn_L1_H2 is a part of that circuit"),
        *((organism, "circuit", f"the circuit of the top 10 edges (EAP-IG, every position noised) holds the planted "
                                f"first hop {hop}") for organism, hop in HOPS),
        *((organism, "verified edges", "share of the 10 kept edges scored exactly (verify=10)")
          for organism, _ in HOPS),
        *((organism, "verified edges", "largest |kept edge score - its own path_patch effect| over the mean margin "
                                       "(verify=10)") for organism, _ in HOPS),
        *((organism, "verified edges", f"rank of the planted edge {hop} by mean EAP-IG score verified by path "
                                       "patching (verify=10) (of 36 edges)") for organism, hop in HOPS),
    }
    assert card.passed, card.failures
    assert not any(r.known for r in card.rows)
    eap = rows[("two_step", "edges (EAP)", f"rank of the planted edge {edge} by mean EAP score (of 36 edges; "
                "informational: EAP misses saturated paths)")]
    assert eap.value == 1 and eap.threshold == 36  # measured at seed 0; seed 1 gives 36 (docs/circuits.md)
    assert rows[("two_step", "circuit", "share of the mean margin kept by the two-part circuit (6 edges among "
                 "embed, attn_L0_H1, attn_L1_H2, reward)")].value >= 0.8
    assert rows[("two_step", "path patching", f"mean path effect of {edge} over the mean margin")].value >= 0.8
    assert rows[("two_step", "attribution", "share of the |mean margin| on the planted sender attn_L0_H1 "
                 "(head level)")].value <= 0.05


def test_ablation_rows_match_zeroing_the_heads_output_columns_by_hand(card):
    # A head writes only through its o_proj columns, so zeroing those is the ablation, computed apart.
    bench = OrganismBench(organisms=["two_step"], n_pairs=60)
    model, pairs = bench.model("two_step"), bench.pairs("two_step")[:40]
    full = forward_margins(model.model, model.tokenizer, pairs)[:, 0].mean()
    for layer, head, part in ((0, 1, "attn_L0_H1"), (1, 2, "attn_L1_H2")):
        clone = copy.deepcopy(model.model)
        with torch.no_grad():
            clone.model.layers[layer].self_attn.o_proj.weight[:, head * DIM:(head + 1) * DIM] = 0
        left = abs(forward_margins(clone, model.tokenizer, pairs)[:, 0].mean() / full)
        row = next(r for r in card.rows if r.check == f"|mean margin| left with {part} ablated, as a share")
        assert row.value == pytest.approx(left, abs=1e-5)


def test_the_two_part_circuit_is_every_edge_among_the_planted_parts():
    assert two_part_edges(("a", "b")) == [("embed", "a"), ("embed", "b"), ("embed", "reward"), ("a", "b"),
                                          ("a", "reward"), ("b", "reward")]


def test_a_wrong_planted_path_fails(organisms, monkeypatch):
    module = importlib.import_module("rewardlens.calibrate._circuits")  # rl.calibrate is also a function's name
    assert not hasattr(module, "PATH_CHECKS")  # checks are direct calls, nothing is registered at import
    wrong = dataclasses.replace(ORGANISMS["two_step"], planted_path=("attn_L0_H0", "attn_L1_H2"))
    monkeypatch.setitem(ORGANISMS, "two_step", wrong)
    rows = grade_circuits(OrganismBench(organisms=["two_step"], n_pairs=20))
    failed = {r.check for r in rows if not r.passed}
    assert failed == {"|mean margin| left with attn_L0_H0 ablated, as a share",
                      "rank of the planted edge attn_L0_H0 -> attn_L1_H2 by mean path effect (of 36 edges)",
                      "mean path effect of attn_L0_H0 -> attn_L1_H2 over the mean margin",
                      "rank of the planted edge attn_L0_H0 -> attn_L1_H2 by mean EAP-IG score (of 36 edges)",
                      "share of the mean margin kept by the two-part circuit (6 edges among embed, attn_L0_H0, "
                      "attn_L1_H2, reward)",
                      "the circuit of the top 10 edges (EAP-IG, every position noised) holds the planted first hop "
                      "attn_L0_H0 -> attn_L1_H2",
                      "rank of the planted edge attn_L0_H0 -> attn_L1_H2 by mean EAP-IG score verified by path "
                      "patching (verify=10) (of 36 edges)"}


def test_the_verified_rows_fail_when_verify_scores_nothing(organisms, monkeypatch):
    """The yardstick is each kept edge's own path_patch run: with verification a no-op, the first-order
    scores of the kept edges are neither exact nor equal to it."""
    from rewardlens.causal import Edges

    monkeypatch.setattr(Edges, "verify", lambda self, *args, **kwargs: self)
    rows = grade_circuits(OrganismBench(organisms=["two_step"], n_pairs=40))
    failed = {r.check for r in rows if not r.passed}
    assert failed == {"share of the 10 kept edges scored exactly (verify=10)",
                      "largest |kept edge score - its own path_patch effect| over the mean margin (verify=10)"}


def test_at_the_read_token_alone_the_first_hop_is_not_in_the_circuit(organisms):
    """Why the first-hop row noises every position: at the read token the planted sender changes nothing
    there (its path effect is 0 of the margin), so the circuit of the same 10 edges by EAP-IG misses it at
    seed 0 (the command line's old default)."""
    import rewardlens as rl

    bench = OrganismBench(organisms=["two_step"], n_pairs=40)
    model, pairs, path = bench.model("two_step"), bench.pairs("two_step")[:40], ORGANISMS["two_step"].planted_path
    found = rl.circuit(model, pairs, level="head", top=10)
    assert path not in [(u, d) for u, d, _ in found.kept]
    moved = rl.path_patch(model, pairs, senders=[path[0]], receivers=[path[1]])
    assert abs(moved.effect.mean()) < 1e-3 * moved.margin.mean()
