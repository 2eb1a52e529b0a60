"""Transcoders: files in sparsify's and circuit-tracer's documented layouts load and compute what those tools
define; provenance refusals name both sides; training captures MLPs by hooks and leaves the model untouched;
fidelity agrees with a hand-written hook loop."""

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from safetensors.torch import save_file

import rewardlens as rl
from rewardlens.errors import DataError, SAEMismatchError
from rewardlens.sae import (
    Transcoder,
    TranscoderConfig,
    Transcoders,
    TranscoderTrainConfig,
    load_transcoders,
    train_transcoders,
    transcoder_fidelity,
)
from rewardlens.sae._provenance import model_name
from rewardlens.sae.internal import check_transcoders, mlp_module

D, N, K = 64, 96, 6


@pytest.fixture(scope="module")
def llama(tiny_root):
    return rl.load(str(tiny_root["llama"]))


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _sparsify_reference(t, x, k):
    """sparsify's SparseCoder.forward for transcode=True (sparse_coder.py): no b_dec subtracted at the input,
    `top-k of ReLU(encoder(x))`, decoded through W_dec plus b_dec, plus `x @ W_skip.mT`."""
    pre = F.relu(F.linear(x, t["encoder.weight"], t["encoder.bias"]))
    vals, idx = pre.topk(k, dim=-1)
    out = torch.zeros_like(pre).scatter(-1, idx, vals) @ t["W_dec"] + t["b_dec"]
    return out + x @ t["W_skip"].mT if "W_skip" in t else out


def _circuit_tracer_reference(t, x):
    """circuit-tracer's SingleLayerTranscoder: `F.linear(x, W_enc, b_enc)` → activation (JumpReLU with the
    threshold tensor, else ReLU), `acts @ W_dec + b_dec + x @ W_skip.T`."""
    pre = F.linear(x, t["W_enc"], t["b_enc"])
    thr = t.get("activation_function.threshold")
    acts = pre * (pre > thr) if thr is not None else F.relu(pre)
    out = acts @ t["W_dec"] + t["b_dec"]
    return out + x @ t["W_skip"].T if "W_skip" in t else out


def _sparsify_folder(root, *, model="HuggingFaceTB/SmolLM2-135M", layers=(0, 1), skip=True, d=D):
    """A sparsify transcoder run as its trainer writes it: `config.json` (RunConfig) and one `layers.<l>.mlp/`
    per hookpoint with `cfg.json` (SparseCoderConfig + d_in) and `sae.safetensors` (SparseCoder's state dict)."""
    tensors = {}
    for layer in layers:
        sub = root / f"layers.{layer}.mlp"
        sub.mkdir(parents=True)
        t = {"encoder.weight": _rand(N, d, seed=layer), "encoder.bias": _rand(N, seed=10 + layer) * 0.1,
             "W_dec": _rand(N, d, seed=20 + layer), "b_dec": _rand(d, seed=30 + layer)}
        if skip:
            t["W_skip"] = _rand(d, d, seed=40 + layer) * 0.1
        save_file(t, str(sub / "sae.safetensors"))
        (sub / "cfg.json").write_text(json.dumps({"expansion_factor": 32, "normalize_decoder": True, "num_latents": N,
                                                  "k": K, "multi_topk": False, "skip_connection": skip,
                                                  "transcode": True, "d_in": d}))
        tensors[layer] = t
    (root / "config.json").write_text(json.dumps({"model": model, "sae": {"k": K, "transcode": True},
                                                  "hookpoints": [f"layers.{la}.mlp" for la in layers]}))
    return tensors


def test_sparsify_skip_transcoders_load_and_compute_sparsifys_forward(tmp_path):
    tensors = _sparsify_folder(tmp_path)
    tcs = load_transcoders(tmp_path)
    assert tcs.layers == (0, 1) and tcs.provenance.format == "sparsify"
    assert tcs.provenance.base_model == "HuggingFaceTB/SmolLM2-135M" and tcs.d_sae == N
    x = _rand(5, D, seed=99)
    for layer, t in tensors.items():
        assert tcs[layer].W_skip is not None and tcs[layer].k == K
        torch.testing.assert_close(tcs[layer](x), _sparsify_reference(t, x, K), rtol=1e-5, atol=1e-5)
        assert ((tcs[layer].encode(x) != 0).sum(-1) <= K).all()


def test_circuit_tracer_files_load_and_compute_its_definition(tmp_path):
    tensors = {}
    for layer in (0, 1):
        t = {"W_enc": _rand(N, D, seed=layer), "W_dec": _rand(N, D, seed=5 + layer), "b_enc": _rand(N, seed=7) * 0.1,
             "b_dec": _rand(D, seed=8), "W_skip": _rand(D, D, seed=9) * 0.1}
        if layer == 1:
            t["activation_function.threshold"] = _rand(N, seed=3).abs()
        save_file(t, str(tmp_path / f"layer_{layer}.safetensors"))
        tensors[layer] = t
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({
        "model_name": "HuggingFaceTB/SmolLM2-135M", "feature_input_hook": "mlp.hook_in",
        "feature_output_hook": "mlp.hook_out", "transcoders": ["layer_0.safetensors", "layer_1.safetensors"]}))
    tcs = load_transcoders(tmp_path)
    assert tcs.provenance.format == "circuit-tracer" and tcs.provenance.base_model == "HuggingFaceTB/SmolLM2-135M"
    assert tcs[0].cfg.activation == "relu" and tcs[1].cfg.activation == "jumprelu"
    x = _rand(4, D, seed=11)
    for layer, t in tensors.items():
        torch.testing.assert_close(tcs[layer](x), _circuit_tracer_reference(t, x), rtol=1e-5, atol=1e-5)


def test_circuit_tracer_refuses_a_residual_input_hook(tmp_path):
    save_file({"W_enc": _rand(N, D, seed=0), "W_dec": _rand(N, D, seed=1), "b_enc": torch.zeros(N),
               "b_dec": torch.zeros(D)}, str(tmp_path / "layer_0.safetensors"))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"feature_input_hook": "hook_resid_mid",
                                                          "feature_output_hook": "hook_mlp_out",
                                                          "transcoders": ["layer_0.safetensors"]}))
    with pytest.raises(SAEMismatchError, match="hook_resid_mid") as err:
        load_transcoders(tmp_path)
    assert "\n" not in str(err.value)


def test_save_round_trips_in_sparsify_layout(tmp_path):
    tc = Transcoder(TranscoderConfig(layer=3, d_in=D, d_out=D, d_sae=N, k=K, skip=True, base_model="m"), seed=0)
    with torch.no_grad():
        for p in (tc.W_dec, tc.b_dec, tc.W_skip, tc.b_enc):
            p.normal_()
    Transcoders({3: tc}).save(tmp_path)
    cfg = json.loads((tmp_path / "layers.3.mlp" / "cfg.json").read_text())
    assert cfg["transcode"] is True and cfg["skip_connection"] is True and cfg["d_in"] == D
    from safetensors.torch import load_file

    t = load_file(str(tmp_path / "layers.3.mlp" / "sae.safetensors"))
    x = _rand(3, D, seed=1)  # the file is what sparsify's own forward reads
    torch.testing.assert_close(_sparsify_reference(t, x, K), tc(x), rtol=1e-5, atol=1e-5)
    back = load_transcoders(tmp_path)
    assert back.provenance.base_model == "m" and back.layers == (3,)
    torch.testing.assert_close(back[3](x), tc(x))


def test_an_autoencoder_folder_is_not_a_transcoder(tmp_path):
    _sparsify_folder(tmp_path, layers=(0,), skip=False)
    cfg = tmp_path / "layers.0.mlp" / "cfg.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "transcode": False}))
    with pytest.raises(SAEMismatchError, match="transcode=False.*load_sae"):
        load_transcoders(tmp_path)


def test_provenance_refusals_are_one_line_naming_value_and_fix(tmp_path, llama):
    mine = model_name(llama)
    _sparsify_folder(tmp_path / "wide", model=mine, d=D + 8)
    _sparsify_folder(tmp_path / "other", model="EleutherAI/pythia-70m")
    _sparsify_folder(tmp_path / "deep", model=mine, layers=(0, 7))
    _sparsify_folder(tmp_path / "ok", model=mine, layers=(0,))
    cases = [("wide", f"width {D + 8}"), ("other", "pythia-70m"), ("deep", r"layer\(s\) \[7\]")]
    for name, what in cases:
        with pytest.raises(SAEMismatchError, match=what) as err:
            check_transcoders(llama, load_transcoders(tmp_path / name))
        assert "\n" not in str(err.value)
    check_transcoders(llama, load_transcoders(tmp_path / "other"), trust_base_model=True)  # the explicit override
    with pytest.raises(SAEMismatchError, match=r"no transcoder for layer\(s\) \[1\]"):
        check_transcoders(llama, load_transcoders(tmp_path / "ok"), layers=[0, 1])
    with pytest.raises(SAEMismatchError, match=r"layer\(s\) \[1\].*covers \[0\]"):
        load_transcoders(tmp_path / "ok", layers=[1])
    with pytest.raises(DataError, match="does not exist"):
        load_transcoders(tmp_path / "nowhere")


def test_bad_config_values_are_refused():
    with pytest.raises(SAEMismatchError, match="k must be in 1..d_sae"):
        TranscoderConfig(layer=0, d_in=4, d_out=4, d_sae=8, k=9)
    with pytest.raises(rl.errors.UsageError, match="batch_size"):
        TranscoderTrainConfig(batch_size=0)


def _ids(model, pairs):
    """Each sequence's token ids as the model reads it (chosen, rejected per pair), one tensor [1, T] each."""
    return [torch.tensor([s.ids]) for s in model.encode(list(pairs))[0]]


def assert_explained_variance(fit, tcs, mlp_io) -> None:
    """Each layer's explained variance in `fit` is 1 − ‖y − ŷ‖² / ‖y − ȳ‖² of the transcoder on the MLP's own
    (input, output) rows `mlp_io(layer)` gives (captured by the caller's own hooks)."""
    for layer in tcs.layers:
        x, y = mlp_io(layer)
        with torch.no_grad():
            y_hat = tcs[layer](x)
        ev = 1 - float((y - y_hat).pow(2).sum() / (y - y.mean(0)).pow(2).sum())
        assert math.isclose(fit.explained_variance[layer], ev, rel_tol=1e-3, abs_tol=1e-4)


def _naive_mlp_io(model, seqs, layer):
    """MLP input/output of `layer` at every token but the first, by a forward hook written here."""
    got = []
    h = mlp_module(model, layer).register_forward_hook(lambda m, a, o: got.append((a[0][0, 1:], o[0, 1:])))
    try:
        with torch.no_grad():
            for ids in seqs:
                model.model(input_ids=ids)
    finally:
        h.remove()
    return torch.cat([x for x, _ in got]).float(), torch.cat([y for _, y in got]).float()


def test_training_leaves_the_model_untouched_and_fidelity_matches_a_hook_loop(llama, pairs):
    before = {k: v.clone() for k, v in llama.model.state_dict().items()}
    res = train_transcoders(llama, list(pairs) * 10, config=TranscoderTrainConfig(
        d_sae=128, k=8, batch_size=64, buffer_rows=256, epochs=2, lr=3e-3))
    after = llama.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in llama.model.modules())
    tcs = res.transcoders
    assert tcs.layers == tuple(range(llama.n_layers)) and res.n_tokens > 0
    assert all(len(h) > 10 and h[-1] < h[0] for h in res.fvu.values())  # the loss went down
    fit = transcoder_fidelity(llama, tcs, pairs)
    seqs = _ids(llama, pairs)
    assert_explained_variance(fit, tcs, lambda layer: _naive_mlp_io(llama, seqs, layer))
    # The reward with every MLP replaced (first token exact), by hooks written here.
    replaced = []
    hooks = [mlp_module(llama, la).register_forward_hook(
        lambda m, a, o, la=la: torch.cat([o[:, :1], tcs[la](a[0][:, 1:]).to(o.dtype)], 1)) for la in tcs.layers]
    try:
        with torch.no_grad():
            for ids in seqs:
                replaced.append(float(llama.model(input_ids=ids).logits[0, 0]))
    finally:
        for h in hooks:
            h.remove()
    np.testing.assert_allclose(fit.replaced, replaced, rtol=1e-4, atol=1e-5)
    assert np.isfinite(fit.reward_recovered) and fit.to_frame().shape == (llama.n_layers, 3)
