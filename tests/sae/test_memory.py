"""`sae train` holds the activations in memory within a budget, so several epochs run the model once; the forward
count is the yardstick (a hook on the model's first layer counts every forward, whoever makes it)."""

import json

import pytest
import torch

import rewardlens as rl
from rewardlens.cli import main
from rewardlens.cli import sae as cli_sae
from rewardlens.data import save_pairs
from rewardlens.sae import ActivationSource, SAEConfig, TrainConfig, hold_activations, train_sae
from rewardlens.sae.internal import DEFAULT_MEMORY_GB, MemoryActivations, activation_bytes
from rewardlens.zoo import DEMO_PAIRS


def _counting(model):
    """`model` with a counter of its forwards: every forward runs the first layer once."""
    model.forwards = 0

    def count(*_):
        model.forwards += 1

    model.layers[0].register_forward_pre_hook(count)
    return model


@pytest.fixture
def counted(monkeypatch, tiny_root):
    """`sae train`'s model loader, wrapped so the test can read the loaded model's forward count."""
    loaded = []

    def load(args):
        loaded.append(_counting(rl.load(args.model)))
        return loaded[-1]

    monkeypatch.setattr(cli_sae, "load_model", load)
    return loaded


def _train(tmp_path, tiny_root, *extra):
    tmp_path.mkdir()
    pairs_file = str(save_pairs(list(DEMO_PAIRS[:6]), tmp_path / "p.jsonl"))
    return main(["sae", "train", str(tiny_root["llama"]), "--layer", "1", "--pairs", pairs_file, "--out",
                 str(tmp_path / "saes"), "--k", "4", "--expansion-factor", "2", "--sae-batch-size", "32", "--epochs",
                 "2", "--json", "--quiet", *extra])


def test_two_epochs_within_the_budget_run_the_model_once(capsys, tmp_path, tiny_root, counted):
    one = _counting(rl.load(str(tiny_root["llama"])))
    for _ in ActivationSource(one, list(DEMO_PAIRS[:6]), "resid_1", positions="all", batch_size=8):
        pass
    per_pass = one.forwards  # one pass of the inputs, measured on its own
    assert per_pass > 0
    # The fidelity check after training makes 3 forwards per batch (clean, spliced, zeroed) in both runs.
    assert _train(tmp_path / "held", tiny_root) == 0
    held = capsys.readouterr()
    assert counted[-1].forwards == per_pass + 3 * per_pass  # one capture pass, for both epochs and the evaluation
    assert "activations held in memory" in held.err and "the model runs once" in held.err
    assert "held in memory" in json.loads(held.out)["activations_held"]
    assert _train(tmp_path / "streamed", tiny_root, "--memory-gb", "0") == 0
    streamed = capsys.readouterr()
    assert counted[-1].forwards == 3 * per_pass + 3 * per_pass  # epoch 1, epoch 2 and the evaluation each rerun it
    assert "activations streamed" in streamed.err and "holding is off" in streamed.err
    assert "raise --memory-gb, or pass --cache DIR" in streamed.err


def test_the_budget_is_the_computed_size_and_held_activations_are_the_sources(tiny_root):
    model = _counting(rl.load(str(tiny_root["llama"])))
    source = ActivationSource(model, list(DEMO_PAIRS[:4]), "resid_0", positions="all", batch_size=8)
    tokens = sum(len(s.ids) - 1 for s in source.seqs)  # a decoder's first token is left out
    assert activation_bytes(source) == tokens * model.d_model * 4
    size_gb = activation_bytes(source) / 1e9
    assert hold_activations(source, size_gb * 0.999)[0] is source  # just over: streamed
    model.forwards = 0
    held, line = hold_activations(source, size_gb)  # exactly at the budget: held
    assert isinstance(held, MemoryActivations) and f"within the {size_gb:g} GB budget" in line
    once = model.forwards
    streamed = list(source)
    for a, b in zip(held, streamed, strict=True):
        assert torch.equal(a.x, b.x.cpu()) and torch.equal(a.seq, b.seq) and torch.equal(a.pos, b.pos)
    assert sum(len(c.x) for c in held) == held.n_rows == source.n_rows
    model.forwards = 0
    result = train_sae(held, TrainConfig(sae=SAEConfig(num_latents=32, k=4), batch_size=16, epochs=3))
    assert model.forwards == 0 and once > 0  # three epochs, no forward
    assert result.sae.provenance.point == "resid_0" and result.sae.provenance.positions == "all"
    with pytest.raises(ValueError, match="budget_gb is a memory budget"):
        hold_activations(source, -1.0)


def test_the_clis_default_is_the_librarys():
    assert cli_sae.DEFAULT_MEMORY_GB == DEFAULT_MEMORY_GB


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_a_bad_memory_budget_is_refused_in_one_line_before_the_model_loads(capsys, tmp_path, tiny_root, counted,
                                                                           value):
    pairs_file = str(save_pairs(list(DEMO_PAIRS[:2]), tmp_path / "p.jsonl"))
    assert main(["sae", "train", str(tiny_root["llama"]), "--layer", "0", "--pairs", pairs_file, "--out",
                 str(tmp_path / "saes"), f"--memory-gb={value}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"rewardlens: error: --memory-gb {float(value)} is not a memory budget")
    assert not counted  # no model was loaded
