"""Published SAEs checked against their model: what a folder claims, and refusals that name both sides."""

import json
import re
import warnings

import pytest
import torch
from safetensors.torch import save_file

import rewardlens as rl
from rewardlens.errors import RewardLensWarning, SAEMismatchError
from rewardlens.sae import ActivationSource, SAEConfig, TrainConfig, load_sae, load_sae_for, train_sae
from rewardlens.sae._provenance import base_name, model_fingerprint


@pytest.fixture(scope="module")
def llama(tiny_root):
    return rl.load(str(tiny_root["llama"]))


def _weights(d, n, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return {"encoder.weight": torch.randn(n, d, generator=g).to(dtype), "encoder.bias": torch.zeros(n, dtype=dtype),
            "W_dec": torch.randn(n, d, generator=g).to(dtype), "b_dec": torch.zeros(d, dtype=dtype)}


def _sparsify_run(root, model, d=64, n=128, dtype=torch.float32):
    """A sparsify run folder: the run's config.json (RunConfig: `model`, `sae`, `hookpoints`) and layers.1/."""
    (root / "layers.1").mkdir(parents=True)
    save_file(_weights(d, n, dtype=dtype), str(root / "layers.1" / "sae.safetensors"))
    (root / "layers.1" / "cfg.json").write_text(json.dumps({"expansion_factor": 2, "num_latents": 0, "k": 4,
                                                             "normalize_decoder": True, "d_in": d}))
    (root / "config.json").write_text(json.dumps({"model": model, "sae": {"k": 4}, "hookpoints": ["layers.1"]}))
    return root / "layers.1"


def _saelens(folder, d=64, n=128, **cfg):
    w = _weights(d, n)
    folder.mkdir(parents=True)
    save_file({"W_enc": w["encoder.weight"].T.contiguous(), "b_enc": w["encoder.bias"], "W_dec": w["W_dec"],
               "b_dec": w["b_dec"]}, str(folder / "sae_weights.safetensors"))
    (folder / "cfg.json").write_text(json.dumps({"architecture": "topk", "d_in": d, "d_sae": n, "k": 4,
                                                 "normalize_activations": "none", **cfg}))
    return folder


def test_a_sparsify_run_records_its_model_and_is_refused_on_another(tmp_path, llama):
    folder = _sparsify_run(tmp_path / "run", "TinyOrg/LLaMA", dtype=torch.bfloat16)
    p = load_sae(folder).provenance
    assert (p.format, p.hook, p.point, p.layer, p.base_model) == ("sparsify", "layers.1", "resid_1", 1, "TinyOrg/LLaMA")
    assert (p.d_in, p.n_latents, p.k, p.dtype, p.folder) == (64, 128, 4, "bfloat16", folder)
    # The tiny model is the local folder .../llama: the organisation is optional, case is ignored.
    with pytest.warns(RewardLensWarning, match="stored in bfloat16 and the model runs in float32"):
        sae, layer = load_sae_for(llama, folder)
    assert layer == 1 and sae.provenance == p
    other = _sparsify_run(tmp_path / "other", "EleutherAI/pythia-70m")
    mine = str(llama.model.config._name_or_path)
    with pytest.raises(SAEMismatchError, match=re.escape(
            f"was trained on 'EleutherAI/pythia-70m' but this model is {mine!r} (compared as 'pythia-70m' vs "
            "'llama'); if this model is a renamed copy or a fine-tune of it, pass trust_base_model=True")):
        load_sae_for(llama, other)
    assert load_sae_for(llama, other, trust_base_model=True)[1] == 1


def test_saelens_fields_are_read_and_checked(tmp_path, llama):
    ok = _saelens(tmp_path / "a", model_name="org/llama", hook_name="blocks.1.hook_resid_post", hook_layer=1,
                  dtype="float32")
    sae, layer = load_sae_for(llama, ok)  # the layer comes from hook_name: the folder's name says nothing
    assert layer == 1 and (sae.provenance.format, sae.provenance.base_model) == ("saelens", "org/llama")
    # SAELens 6 keeps the model and hook in `metadata`; hook_resid_pre of layer 1 is the residual after layer 0.
    nested = _saelens(tmp_path / "b", metadata={"model_name": "llama", "hook_name": "blocks.1.hook_resid_pre"})
    assert load_sae_for(llama, nested)[1] == 0
    with pytest.raises(SAEMismatchError, match=r"trained on 'gpt2-small' but this model is .*'gpt2-small' vs 'llama'"):
        load_sae_for(llama, _saelens(tmp_path / "c", model_name="gpt2-small", hook_name="blocks.1.hook_resid_post"))
    deep = _saelens(tmp_path / "d", model_name="llama", hook_name="blocks.7.hook_resid_post", hook_layer=7)
    out_of_range = "was trained at layer 7 (resid_7 (hook 'blocks.7.hook_resid_post')) but this model has layers 0..1"
    with pytest.raises(SAEMismatchError, match=re.escape(out_of_range)):
        load_sae_for(llama, deep, trust_base_model=True)  # a layer out of range is always refused
    mlp = _saelens(tmp_path / "e", model_name="llama", hook_name="blocks.1.hook_mlp_out")
    with pytest.raises(SAEMismatchError, match="trained on mlp_1 .* applied at resid_1; a mlp SAE does not read"):
        load_sae_for(llama, mlp, layer=1, trust_base_model=True)
    narrow = _saelens(tmp_path / "f", d=32, model_name="llama", hook_name="blocks.1.hook_resid_post")
    with pytest.raises(SAEMismatchError, match="width 32 but this model's resid_1 has width 64"):
        load_sae_for(llama, narrow, trust_base_model=True)


def test_an_sae_rewardlens_trained_records_the_model_and_refuses_other_weights(tmp_path, llama, tiny_root, pairs):
    source = ActivationSource(llama, pairs, "resid_1", positions="read")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RewardLensWarning)  # a 6-row run: too short to train, enough to record
        sae = train_sae(source, TrainConfig(sae=SAEConfig(num_latents=16, k=2), batch_size=6)).sae
    folder = sae.save(tmp_path / "layers.1")
    cfg = json.loads((folder / "cfg.json").read_text())
    assert cfg["model_name"] == str(llama.model.config._name_or_path) and cfg["hook_point"] == "resid_1"
    assert cfg["model_fingerprint"] == model_fingerprint(llama) and cfg["positions"] == "read"
    back = load_sae(folder).provenance
    assert (back.base_model, back.model_fingerprint, back.positions) == (cfg["model_name"], cfg["model_fingerprint"],
                                                                        "read")
    assert load_sae_for(llama, folder)[1] == 1
    cfg["model_fingerprint"] = "0123456789abcdef"  # same name, other weights (a fine-tune saved over it)
    (folder / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(SAEMismatchError, match=f"fingerprint 0123456789abcdef but this model's is "
                                               f"{model_fingerprint(llama)}"):
        load_sae_for(llama, folder)
    gpt2 = rl.load(str(tiny_root["gpt2"]))
    with pytest.raises(SAEMismatchError, match=r"compared as 'llama' vs 'gpt2'"):
        load_sae_for(gpt2, folder, layer=1)


def test_base_names_compare_without_case_or_organisation():
    assert base_name("EleutherAI/Pythia-70M") == base_name("pythia-70m") == base_name("/models/pythia-70m/")
    assert base_name("meta-llama/Meta-Llama-3-8B") != base_name("Skywork/Skywork-Reward-Llama-3.1-8B")
