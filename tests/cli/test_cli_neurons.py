"""`rewardlens patch --level neuron --neurons ...`: chosen neurons, or the top k by attribution patching."""

import pytest

import rewardlens as rl
from rewardlens.causal import attribution_patch, patch
from rewardlens.cli import main
from rewardlens.zoo import DEMO_PAIRS
from tests.cli.test_cli_causal import _json


def test_chosen_neurons_match_the_api(capsys, tiny_root, demo_file):
    path = str(tiny_root["llama"])
    chosen = ["mlp_L1_N77", "mlp_L0_N3"]
    out = _json(capsys, ["patch", path, "--pairs", demo_file, "--json", "--level", "neuron", "--neurons",
                         ",".join(chosen), "--all-parts", "--atp"])
    res = patch(rl.load(path), DEMO_PAIRS, level="neuron", neurons=chosen)
    assert out["level"] == "neuron" and out["neurons_chosen_by"] is None
    for pair, effect in zip(out["pairs"], res.effect):
        assert [pair["effects"][n] for n in chosen] == pytest.approx(effect.tolist(), abs=1e-6)
    assert out["attribution_patching_agreement"]["k"] == 2  # agreement over the two neurons patched


def test_top_k_neurons_are_attribution_patchings_first_then_patched_exactly(capsys, tiny_root, demo_file):
    path = str(tiny_root["gpt2"])
    out = _json(capsys, ["patch", path, "--pairs", demo_file, "--json", "--level", "neuron", "--neurons", "top:4",
                         "--all-parts"])
    model = rl.load(path)
    ranked = [n for n, _ in attribution_patch(model, DEMO_PAIRS, level="neuron").top(50) if "_N" in n][:4]
    assert sorted(out["pairs"][0]["effects"]) == sorted(ranked)
    assert "top 4 neurons by attribution patching" in out["neurons_chosen_by"]
    exact = patch(model, DEMO_PAIRS, level="neuron", neurons=ranked)
    assert [out["pairs"][0]["effects"][n] for n in ranked] == pytest.approx(exact.effect[0].tolist(), abs=1e-6)
    assert main(["patch", path, "--pairs", demo_file, "--level", "neuron", "--neurons", "top:2"]) == 0
    assert "neurons patched: the top 2 neurons" in capsys.readouterr().out


@pytest.mark.parametrize(("extra", "message"), [
    (["--level", "neuron"], "--neurons is needed with --level neuron"),
    (["--neurons", "mlp_L0_N1"], "--neurons needs --level neuron"),
    (["--level", "neuron", "--neurons", "mlp_L9_N0"], "the model has layers 0..1"),
    (["--level", "neuron", "--neurons", "attn_L0_H1"], "not one MLP neuron"),
])
def test_bad_neuron_choices_end_in_one_line(capsys, tiny_root, demo_file, extra, message):
    assert main(["patch", str(tiny_root["llama"]), "--pairs", demo_file, "--quiet", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("rewardlens: error:") and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("value", ["top:0", "top:x", "mlp_L0_N1,,mlp_L0_N2"])
def test_malformed_neuron_lists_are_refused_by_the_parser(tiny_root, demo_file, value):
    with pytest.raises(SystemExit):
        main(["patch", str(tiny_root["llama"]), "--pairs", demo_file, "--level", "neuron", "--neurons", value])
