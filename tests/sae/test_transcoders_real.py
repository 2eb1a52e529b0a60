"""SmolLM2's cached transcoders (scripts/train_real_transcoders.py): they load, fit the model's provenance checks,
cover every layer, and the fidelity the build recorded is what `transcoder_fidelity` measures again."""

import json
import math

from rewardlens.sae import load_transcoders, transcoder_fidelity
from rewardlens.sae.internal import check_transcoders
from rewardlens.zoo import realmodels as zoo_real
from tests.helpers import realmodels


def test_smollm2_transcoders_load_fit_and_report_their_fidelity():
    folder = realmodels.smollm2_transcoders_dir()
    record = json.loads((folder / "training.json").read_text())
    model = zoo_real.load_reward_model("smollm2-dpo", max_length=record["config"]["max_length"], truncation="left")
    tcs = load_transcoders(folder)
    assert tcs.layers == tuple(range(model.n_layers)) and tcs.d_sae == record["config"]["d_sae"]
    check_transcoders(model, tcs)  # width, layers, base model and fingerprint all fit
    held = zoo_real.dpo_pairs("test")[:record["held_out_pairs"]]
    fit = transcoder_fidelity(model, tcs, held)
    assert math.isclose(fit.reward_recovered, record["reward_recovered"], rel_tol=1e-3, abs_tol=1e-4)
    for layer, ev in record["explained_variance"].items():
        assert math.isclose(fit.explained_variance[int(layer)], ev, rel_tol=1e-3, abs_tol=1e-4)
