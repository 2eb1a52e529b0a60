"""The neuron grader: neuron-level attribution patching and exact patching of chosen neurons on an organism
whose rule runs through three planted MLP neurons."""

import pytest

from rewardlens.calibrate import GRADERS, OrganismBench, grade_dpo, grade_neurons
from rewardlens.calibrate import _neurons as neurons_grader
from rewardlens.zoo.organisms import forward_margins


@pytest.fixture(scope="module")
def bench(organisms):
    return OrganismBench(organisms=["circuit"], n_pairs=40)


def test_neuron_rows_appear_and_pass(bench):
    assert GRADERS.index(grade_neurons) < GRADERS.index(grade_dpo)
    rows = grade_neurons(bench)
    assert [(r.instrument, r.organism) for r in rows] == [
        ("organism", "circuit+neurons"), ("attribution patching", "circuit+neurons"),
        ("attribution patching", "circuit+neurons"), ("patching", "circuit+neurons")]
    assert all(r.passed for r in rows), [r for r in rows if not r.passed]
    assert "256 neurons" in rows[1].check


def test_the_planted_neurons_carry_their_shares_in_the_models_own_forward(bench):
    """Independent of the instruments: removing one planted neuron (its down-projection column) from the
    model's own forward removes about its planted share c_n / Σc of the margin."""
    import copy

    import torch

    model, planted = neurons_grader.plant_neurons(bench.model("circuit"), "attn_L1_H2")
    pairs = bench.pairs("circuit")[:20]
    full = forward_margins(model.model, model.tokenizer, pairs)[:, 0].mean()
    assert full > 0.5
    for n, c in zip(neurons_grader.NEURONS, neurons_grader.DOWN):
        cut = copy.deepcopy(model.model)
        with torch.no_grad():
            cut.model.layers[1].mlp.down_proj.weight[:, n] = 0
        share = (full - forward_margins(cut, model.tokenizer, pairs)[:, 0].mean()) / full
        assert share == pytest.approx(c / sum(neurons_grader.DOWN), abs=0.05)


def test_a_wrong_answer_fails_the_rank_row(bench, monkeypatch):
    """The grade can fail: told other neurons were planted, the rank row does."""
    plant = neurons_grader.plant_neurons

    def wrong(host, head):
        model, _ = plant(host, head)
        return model, ["mlp_L1_N0", "mlp_L1_N1", "mlp_L1_N2"]

    monkeypatch.setattr(neurons_grader, "plant_neurons", wrong)
    rows = grade_neurons(bench)
    assert not rows[1].passed and rows[1].value > 3
