"""TopK SAEs: exact feature attribution, sparsify/SAELens folders, training, shards, reports and CLI."""

import json
import re

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import rewardlens as rl
from rewardlens.cli import main
from rewardlens.data import save_pairs
from rewardlens.errors import ArchitectureError, DataError
from rewardlens.model import TraceKey
from rewardlens.sae import (
    ActivationSource,
    SAEConfig,
    TopKSAE,
    TrainConfig,
    attribute_features,
    cache_activations,
    evaluate,
    feature_report,
    load_sae,
    load_sae_for,
    train_sae,
)
from rewardlens.sae._activations import ShardedActivations
from rewardlens.stats import auroc
from rewardlens.zoo import DEMO_PAIRS
from tests.helpers import tiny

CORPUS = [t for p in DEMO_PAIRS for t in (str(p.prompt), p.chosen, p.rejected)] + [
    "The quick brown fox jumps over the lazy dog.",
    "Here is a list:\n- first item\n- second item\n- third item",
    "Step 1: preheat the oven. Step 2: mix flour, sugar and eggs. Step 3: bake for 30 minutes.",
    "I'm sorry, but I cannot help with that request. Please consult a professional.",
]
SMALL = SAEConfig(expansion_factor=4, k=8)



@pytest.fixture(scope="module")
def llama(tiny_root):
    return rl.load(str(tiny_root["llama"]))


def _direct_codes(x, w_enc, b_enc, b_dec, k):
    """sparsify's encoder written out: TopK(ReLU(W_enc (x − b_dec) + b_enc)), as a dense [N, n] code."""
    pre = torch.relu((x - b_dec) @ w_enc.T + b_enc)
    top = pre.topk(k, dim=-1)
    return torch.zeros_like(pre).scatter_(-1, top.indices, top.values)


# ---- closure -----------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["llama", "gemma2", "bert", "gpt_neox", "gpt2", "armorm"])
def test_features_bias_error_and_later_parts_sum_to_the_models_own_reward(tiny_root, pairs, arch):
    model = rl.load(str(tiny_root[arch]))
    own = tiny.own_scores(model, pairs)
    sae = TopKSAE(model.d_model, SMALL, seed=1)
    with torch.no_grad():  # a decoder bias that matters, so its term is tested too
        sae.b_dec.normal_(0, 0.5, generator=torch.Generator().manual_seed(2))
    for layer in range(model.n_layers):
        att = attribute_features(model, sae, pairs, layer=layer)
        total = att.totals()["total"]
        scale = np.abs(own).max()
        assert np.abs(total - own).max() <= 1e-4 * scale, (arch, layer)
        assert np.abs(att.residual_error).max() <= 1e-4 * scale
        assert np.abs(att.values).sum() > 1e-3 and np.abs(att.decoder_bias).max() > 1e-4
        # Parts after the layer are exactly the later sublayers; the last layer has none.
        assert att.rest.shape[1] == 2 * (model.n_layers - 1 - layer)


def test_feature_contribution_is_activation_times_the_final_norm_readout(llama, pairs):
    """Last layer of a Llama: u = (w ⊙ γ) / rms(x), built here from the HF modules themselves."""
    sae = TopKSAE(llama.d_model, SMALL, seed=3)
    att = attribute_features(llama, sae, pairs, layer=1)
    hf = llama.model
    seqs, _ = llama.encode(pairs)
    xs, errors = [], []
    for row, s in enumerate(seqs):
        got = []  # the last layer's output at the last token: the final norm's input

        def grab(module, args, got=got):
            got.append(args[0][0, -1])

        handle = hf.model.norm.register_forward_pre_hook(grab)
        with torch.no_grad():
            hf(torch.tensor([s.ids]))
        handle.remove()
        x = got[0]
        norm = hf.model.norm
        u = hf.score.weight[0] * norm.weight / torch.sqrt(x.pow(2).mean() + norm.variance_epsilon)
        f = sae.codes(x[None])[0].detach()
        expected = (f * (sae.W_dec.detach() @ u.detach()))[torch.as_tensor(att.features)]
        np.testing.assert_allclose(att.values[row], expected.numpy(), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(att.activations[row], f[torch.as_tensor(att.features)].numpy(), rtol=1e-5, atol=1e-7)
        xs.append(x)
        errors.append(x - (f @ sae.W_dec + sae.b_dec).detach())
    xs, errors = torch.stack(xs), torch.stack(errors)
    assert att.fvu == pytest.approx(float(errors.pow(2).sum() / (xs - xs.mean(0)).pow(2).sum()), rel=1e-4)
    assert att.relative_error == pytest.approx(float(errors.pow(2).sum() / xs.pow(2).sum()), rel=1e-4)
    cos = (sae.W_dec @ u / (sae.W_dec.norm(dim=1) * u.norm())).detach().numpy()
    np.testing.assert_allclose(att.latent_alignment, cos, atol=1e-5)  # Llama's u has one direction for all inputs


def test_pairs_margin_table_and_frame(llama, pairs):
    att = attribute_features(llama, TopKSAE(llama.d_model, SMALL, seed=4), pairs, layer=0)
    assert att.margin.shape == (len(pairs), len(att.features))
    ranked = att.top(5, by="margin")
    assert [abs(s) for _, s in ranked] == sorted((abs(s) for _, s in ranked), reverse=True)
    col = list(att.features).index(ranked[0][0])
    assert ranked[0][1] == pytest.approx(float(att.margin[:, col].mean()), rel=1e-6)
    frame = att.to_frame()
    assert len(frame) == int((att.activations > 0).sum())
    np.testing.assert_allclose(frame.groupby("input", sort=False)["contribution"].sum().reindex(att.rows).to_numpy(),
                               att.values.sum(1), rtol=1e-5, atol=1e-6)


# ---- folders -----------------------------------------------------------------------------------
def _write_sparsify(folder, d, n, k, *, seed=0, dtype=torch.float32, minimal=False):
    """A folder written the way sparsify's `save_to_disk` writes it (`save_model` + cfg.json)."""
    g = torch.Generator().manual_seed(seed)
    tensors = {"encoder.weight": torch.randn(n, d, generator=g) / d**0.5,
               "encoder.bias": 0.1 * torch.randn(n, generator=g),
               "W_dec": torch.randn(n, d, generator=g), "b_dec": 0.3 * torch.randn(d, generator=g)}
    tensors = {key: v.to(dtype) for key, v in tensors.items()}
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "sae.safetensors"))
    cfg = {"expansion_factor": n // d, "normalize_decoder": True, "num_latents": 0, "k": k, "multi_topk": False,
           "d_in": d}
    if not minimal:  # today's SparseCoderConfig; the published Llama-3-8B SAEs have the older, shorter one
        cfg = {"activation": "topk", **cfg, "skip_connection": False, "embed_skip": False, "gram_lookup": False,
               "lookup_max_order": 4, "gram_table_hash": None, "transcode": False}
    with open(folder / "cfg.json", "w") as f:
        json.dump(cfg, f)
    return {key: v.float() for key, v in tensors.items()}


@pytest.mark.parametrize("minimal", [False, True])
def test_a_sparsify_folder_loads_and_gives_identical_codes(tmp_path, minimal):
    w = _write_sparsify(tmp_path / "layers.1", 64, 512, 16, minimal=minimal)
    sae = load_sae(tmp_path / "layers.1")
    assert (sae.d_in, sae.n_latents, sae.k) == (64, 512, 16)
    x = torch.randn(50, 64, generator=torch.Generator().manual_seed(9)) * 3
    expected = _direct_codes(x, w["encoder.weight"], w["encoder.bias"], w["b_dec"], 16)
    with torch.no_grad():
        got = sae.codes(x)
    assert torch.equal(got != 0, expected != 0)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(sae.decode(*sae.encode(x)), expected @ w["W_dec"] + w["b_dec"], rtol=1e-5, atol=1e-5)


def test_bf16_weights_load_in_fp32_and_parent_folders_resolve(tmp_path, llama):
    _write_sparsify(tmp_path / "layers.0", 64, 256, 8, seed=1, dtype=torch.bfloat16)
    w1 = _write_sparsify(tmp_path / "layers.1", 64, 256, 8, seed=2, dtype=torch.bfloat16)
    sae = load_sae(tmp_path, "layers.1")
    assert sae.W_dec.dtype == torch.float32 and torch.equal(sae.W_dec, w1["W_dec"])
    with pytest.raises(DataError, match=r"several hook points \['layers.0', 'layers.1'\]"):
        load_sae(tmp_path)
    got, layer = load_sae_for(llama, tmp_path, layer=1)
    assert layer == 1 and torch.equal(got.W_dec, w1["W_dec"])
    got, layer = load_sae_for(llama, tmp_path / "layers.0")
    assert layer == 0 and got.folder.name == "layers.0"


@pytest.mark.parametrize("arch,name", [("llama", "layers.1"), ("bert", "encoder.layer.1"), ("gpt2", "h.1")])
def test_folder_names_are_sparsify_hook_points(tiny_root, arch, name):
    from rewardlens.sae._activations import point_of_folder
    from rewardlens.sae.internal import hookpoint

    model = rl.load(str(tiny_root[arch]))
    assert hookpoint(model, "resid_1") == name and hookpoint(model, "mlp_1") == "mlp_1"
    assert point_of_folder(model, name) == point_of_folder(model, "resid_1") == TraceKey.resid(1)
    assert hookpoint(model, TraceKey.resid(1)) == name and hookpoint(model, TraceKey.mlp(1)) == "mlp_1"


def test_save_round_trips_in_sparsify_and_saelens_layouts(tmp_path):
    sae = TopKSAE(32, SAEConfig(num_latents=100, k=5), seed=0)
    with torch.no_grad():
        sae.encoder.bias.normal_()
        sae.b_dec.normal_()
    folder = sae.save(tmp_path / "layers.3")
    from safetensors.torch import load_file

    assert set(load_file(str(folder / "sae.safetensors"))) == {"encoder.weight", "encoder.bias", "W_dec", "b_dec"}
    cfg = json.loads((folder / "cfg.json").read_text())
    assert cfg["d_in"] == 32 and cfg["k"] == 5 and cfg["num_latents"] == 100 and cfg["normalize_decoder"] is True
    x = torch.randn(20, 32)
    for back in (load_sae(folder), load_sae(sae.save_saelens(tmp_path / "lens")), load_sae(tmp_path / "lens")):
        for name, p in sae.state_dict().items():
            torch.testing.assert_close(back.state_dict()[name], p, rtol=0, atol=0)
        assert torch.equal(back.codes(x), sae.codes(x))


def test_a_saelens_folder_without_b_dec_on_the_input_gives_saelens_codes(tmp_path):
    g = torch.Generator().manual_seed(5)
    d, n, k = 24, 96, 6
    w = {"W_enc": torch.randn(d, n, generator=g), "b_enc": torch.randn(n, generator=g),
         "W_dec": torch.randn(n, d, generator=g), "b_dec": torch.randn(d, generator=g)}
    (tmp_path / "s").mkdir()
    save_file(w, str(tmp_path / "s" / "sae_weights.safetensors"))
    (tmp_path / "s" / "cfg.json").write_text(json.dumps({
        "architecture": "topk", "d_in": d, "d_sae": n, "k": k, "apply_b_dec_to_input": False,
        "normalize_activations": "none", "hook_name": "blocks.3.hook_resid_post"}))
    x = torch.randn(40, d, generator=g)
    hidden = x @ w["W_enc"] + w["b_enc"]  # SAELens: TopK of the pre-activation, then ReLU
    top = hidden.topk(k, dim=-1)
    expected = torch.zeros_like(hidden).scatter_(-1, top.indices, torch.relu(top.values))
    with torch.no_grad():
        torch.testing.assert_close(load_sae(tmp_path / "s").codes(x), expected, rtol=1e-5, atol=1e-4)


def test_folders_and_models_that_do_not_fit_are_refused_by_name(tmp_path, llama, pairs):
    _write_sparsify(tmp_path / "a", 64, 128, 4)
    (tmp_path / "a" / "sae.safetensors").unlink()
    with pytest.raises(DataError, match="sae.safetensors"):
        load_sae(tmp_path / "a")
    (tmp_path / "b").mkdir()
    save_file({"encoder.weight": torch.zeros(8, 4), "W_dec": torch.zeros(8, 4), "b_dec": torch.zeros(4)},
              str(tmp_path / "b" / "sae.safetensors"))
    (tmp_path / "b" / "cfg.json").write_text(json.dumps({"k": 2, "num_latents": 8, "d_in": 4}))
    with pytest.raises(DataError, match="encoder.bias"):
        load_sae(tmp_path / "b")
    with pytest.raises(ArchitectureError, match="width 4 .* width 64"):
        attribute_features(llama, TopKSAE(4, SAEConfig(num_latents=8, k=2)), pairs, layer=0)
    with pytest.raises(ArchitectureError, match="no hook point 'resid_7'"):
        ActivationSource(llama, CORPUS, "resid_7")
    with pytest.raises(ValueError, match="skip_connection"):
        SAEConfig(skip_connection=True)
    with pytest.raises(DataError, match="no SAE folder for layer 0"):
        load_sae_for(llama, tmp_path, layer=0)


def test_hook_points_are_trace_keys_or_their_names(llama):
    by_key = ActivationSource(llama, CORPUS[:4], TraceKey.mlp_act(1))
    by_name = ActivationSource(llama, CORPUS[:4], "mlp_act_1")  # the user's string, parsed once
    assert by_key.point == by_name.point == TraceKey.mlp_act(1)
    assert by_key.fingerprint() == by_name.fingerprint()
    assert by_key.d_in == by_name.d_in == llama.model.config.intermediate_size
    assert torch.equal(torch.cat([c.x for c in by_key]), torch.cat([c.x for c in by_name]))
    # The string form of a point the model lacks, or one no SAE reads, is refused by name.
    for bad in ("resid_03", "layers.1", "attn_rnorm_0", "gate", TraceKey.resid(7), TraceKey.gate()):
        with pytest.raises(ArchitectureError, match=re.escape(f"no hook point {str(bad)!r}")):
            ActivationSource(llama, CORPUS, bad)


# ---- activations, shards, training ------------------------------------------------------------
def test_streamed_activations_are_the_models_hidden_states(llama):
    """Rows of 'all' and 'read' sources equal Hugging Face's own hidden state of that token."""
    seqs, _ = llama.encode(CORPUS[:6])
    lengths = [len(s.ids) for s in seqs]
    for positions, skip, n_rows in (("all", 0, sum(lengths)), ("all", None, sum(lengths) - 6), ("read", None, 6)):
        source = ActivationSource(llama, CORPUS[:6], "resid_0", positions=positions, batch_size=4, skip_first=skip)
        chunks = list(source)
        x = torch.cat([c.x for c in chunks])
        seq, pos = torch.cat([c.seq for c in chunks]), torch.cat([c.pos for c in chunks])
        assert len(x) == source.n_rows == n_rows
        assert (pos == 0).any() == (skip == 0)  # a decoder's first token (an attention sink) is left out by default
        for i in range(len(seqs)):
            with torch.no_grad():
                hs = llama.model.model(torch.tensor([seqs[i].ids]), output_hidden_states=True).hidden_states[1][0]
            mine = seq == i
            torch.testing.assert_close(x[mine], hs[pos[mine]], rtol=1e-4, atol=1e-5)
            if positions == "read":
                assert pos[mine].tolist() == [len(seqs[i].ids) - 1]


def test_shards_round_trip_and_are_reused_only_for_the_same_source(tmp_path, llama):
    source = ActivationSource(llama, CORPUS, "resid_1", positions="all", batch_size=4)
    cache = cache_activations(source, tmp_path / "c", rows_per_shard=100)
    assert len(cache.meta["shards"]) == -(-source.n_rows // 100) and cache.n_rows == source.n_rows
    streamed, stored = list(source), list(ShardedActivations(tmp_path / "c"))
    for field in ("x", "seq", "pos"):
        assert torch.equal(torch.cat([getattr(c, field) for c in streamed]),
                           torch.cat([getattr(c, field) for c in stored]))
    stamp = (tmp_path / "c" / "shard_00000.safetensors").stat().st_mtime_ns
    cache_activations(source, tmp_path / "c", rows_per_shard=100)
    assert (tmp_path / "c" / "shard_00000.safetensors").stat().st_mtime_ns == stamp  # reused, not rewritten
    with pytest.raises(DataError, match="another model, hook point or input set"):
        cache_activations(ActivationSource(llama, CORPUS, "resid_0", positions="all"), tmp_path / "c")
    # One buffer holding everything: the stream and the shards give the very same training run.
    cfg = TrainConfig(sae=SMALL, batch_size=64, epochs=2, buffer_rows=4096, max_norm_ratio=None)
    a, b = train_sae(source, cfg), train_sae(cache, cfg)
    for name, p in a.sae.state_dict().items():
        torch.testing.assert_close(b.sae.state_dict()[name], p, rtol=1e-5, atol=1e-6)


def test_training_lowers_fvu_and_keeps_decoder_rows_unit_norm(tmp_path, llama):
    cache = cache_activations(ActivationSource(llama, CORPUS * 2, "resid_1", positions="all"), tmp_path / "c")
    before = evaluate(TopKSAE(cache.d_in, SMALL, seed=0), cache)
    result = train_sae(cache, TrainConfig(sae=SMALL, batch_size=128, epochs=15, buffer_rows=1024))
    after = evaluate(result.sae, cache)
    assert after.fvu < 0.5 * before.fvu and after.explained_variance > 0.6, (before.fvu, after.fvu)
    assert result.fvu[-5:].mean() < 0.5 * result.fvu[:5].mean()
    assert after.l0 == pytest.approx(SMALL.k)
    norms = result.sae.W_dec.norm(dim=1)
    torch.testing.assert_close(norms, torch.ones_like(norms), rtol=0, atol=1e-5)
    assert result.n_activations == 15 * cache.n_rows and len(result.to_frame()) == len(result.fvu)


class _Rows:
    """A minimal activation source: fixed chunks."""

    def __init__(self, chunks):
        self.chunks, self.d_in, self.n_rows = chunks, chunks[0].x.shape[1], sum(len(c.x) for c in chunks)

    def __iter__(self):
        return iter(self.chunks)


def test_massive_activations_are_left_out_of_training_and_counted():
    from rewardlens.sae import Activations

    g = torch.Generator().manual_seed(0)
    chunks = [Activations(torch.randn(100, 16, generator=g), torch.arange(100), torch.zeros(100, dtype=torch.long))
              for _ in range(3)]
    chunks[1].x[7] *= 1000  # an attention-sink-like row
    source = _Rows(chunks)
    result = train_sae(source, TrainConfig(sae=SAEConfig(num_latents=32, k=4), batch_size=50, epochs=2))
    assert result.n_dropped == 2 and result.n_activations == 2 * 299
    assert result.max_norm == pytest.approx(10 * float(chunks[0].x.norm(dim=1).median()))
    kept, everything = evaluate(result.sae, source, max_norm=result.max_norm), evaluate(result.sae, source)
    assert (kept.n_rows, kept.n_dropped, everything.n_rows) == (299, 1, 300)
    assert train_sae(source, TrainConfig(sae=SAEConfig(num_latents=32, k=4), max_norm_ratio=None)).n_dropped == 0


def test_auxk_revives_latents_that_never_make_the_top_k(tmp_path, llama):
    cache = cache_activations(ActivationSource(llama, CORPUS * 2, "resid_1", positions="all"), tmp_path / "c")
    start = TopKSAE(cache.d_in, SMALL, seed=0)
    with torch.no_grad():
        start.b_dec.copy_(torch.cat([c.x for c in cache]).mean(0))
        start.encoder.weight[128:] *= 1e-3  # half the latents: positive but far below the top k
    assert (evaluate(start, cache).frequency[128:] > 0).sum() == 0

    def revived(alpha: float) -> float:
        cfg = TrainConfig(sae=SMALL, batch_size=64, epochs=20, buffer_rows=1024, lr=3e-3, auxk_alpha=alpha,
                          dead_after=256)
        result = train_sae(cache, cfg, init=start)
        return float((evaluate(result.sae, cache).frequency[128:] > 0).mean())

    without, with_auxk = revived(0.0), revived(1 / 32)
    assert without < 0.05 and with_auxk > 0.4, (without, with_auxk)  # measured: 0 and 0.62
    assert (evaluate(start, cache).frequency[128:] > 0).sum() == 0  # the caller's SAE was not trained in place


def test_report_contexts_are_the_strongest_activations_in_the_corpus(llama, pairs):
    sae = TopKSAE(llama.d_model, SMALL, seed=6)
    att = attribute_features(llama, sae, pairs, layer=1)
    rep = feature_report(llama, sae, att, CORPUS, top=4, n_contexts=3, window=4)
    source = ActivationSource(llama, CORPUS, "resid_1", positions="all")
    with torch.no_grad():
        codes = torch.cat([sae.codes(c.x) for c in source])
    stats = evaluate(sae, source)
    assert rep.explained_variance == pytest.approx(stats.explained_variance, rel=1e-6)
    assert rep.n_activations == source.n_rows and rep.l0 == pytest.approx(stats.l0)
    assert [f for f, _ in att.top(4, by="margin")] == rep.features.tolist()
    for f, freq, ctx in zip(rep.features, rep.frequency, rep.contexts):
        column = codes[:, f]
        assert freq == pytest.approx(float((column > 0).float().mean()))
        if column.max() > 0:
            assert ctx[0].activation == pytest.approx(float(column.max()), rel=1e-5)
            token = llama.tokenizer.decode(source.tokens(ctx[0].input)[ctx[0].position]).replace("\n", "\\n")
            assert f"«{token}»" in ctx[0].text
        assert len({c.text for c in ctx}) == len(ctx) <= 3
    assert len(rep.to_frame()) == sum(len(c) for c in rep.contexts)


# ---- CLI -------------------------------------------------------------------------------------
def test_cli_trains_saves_and_attributes(capsys, tmp_path, tiny_root, pairs):
    pairs_file = str(save_pairs(list(DEMO_PAIRS) + list(pairs), tmp_path / "pairs.jsonl"))
    model = str(tiny_root["qwen2"])
    assert main(["sae", "train", model, "--layer", "1", "--pairs", pairs_file, "--out", str(tmp_path / "saes"),
                 "--k", "8", "--expansion-factor", "4", "--epochs", "5", "--sae-batch-size", "64", "--json"]) == 0
    trained = json.loads(capsys.readouterr().out)
    assert trained["folder"].endswith("layers.1") and trained["l0"] == pytest.approx(8)
    assert {p.name for p in (tmp_path / "saes" / "layers.1").iterdir()} == {"cfg.json", "sae.safetensors"}
    assert main(["sae", "attribute", model, "--sae", str(tmp_path / "saes"), "--pairs", pairs_file, "--json",
                 "--top", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    rewards = rl.load(model).score(list(DEMO_PAIRS) + list(pairs))
    assert out["layer"] == 1 and len(out["top_features"]) == 3
    assert out["mean_margin"]["total"] == pytest.approx(float(np.mean(rewards[0::2] - rewards[1::2])), abs=1e-5)
    assert out["max_abs_residual_error"] <= 1e-4 * out["max_abs_reward"]
    assert main(["sae", "attribute", model, "--sae", str(tmp_path / "saes"), "--pairs", pairs_file]) == 0
    text = capsys.readouterr().out
    assert "strongest context" in text and "SAE error" in text
    args = ["sae", "attribute", model, "--sae", str(tmp_path / "saes"), "--pairs", pairs_file, "--layer", "0"]
    assert main(args) == 2
    assert "no SAE folder for layer 0" in capsys.readouterr().err


def test_sparse_backward_equals_plain_autograd():
    """The training forward's hand-written backward against autograd through the dense formula."""
    sae = TopKSAE(16, SAEConfig(num_latents=64, k=4), seed=0)
    with torch.no_grad():
        sae.b_dec.normal_()
        sae.encoder.bias.normal_(0, 0.1)
    x = torch.randn(30, 16, generator=torch.Generator().manual_seed(1))
    dead = torch.zeros(64, dtype=torch.bool)
    dead[::3] = True
    out = sae(x, dead)
    (out.fvu + 0.5 * out.auxk).backward()
    mine = {n: p.grad.clone() for n, p in sae.named_parameters()}
    sae.zero_grad()
    pre = torch.relu((x - sae.b_dec) @ sae.encoder.weight.T + sae.encoder.bias)
    top = pre.topk(4, dim=-1)
    codes = torch.zeros_like(pre).scatter(-1, top.indices, top.values)
    err = x - (codes @ sae.W_dec + sae.b_dec)
    total = (x - x.mean(0)).pow(2).sum()
    k_aux = min(8, int(dead.sum()))
    aux = torch.where(dead, pre, -torch.inf).topk(k_aux, dim=-1)
    e_hat = torch.zeros_like(pre).scatter(-1, aux.indices, aux.values) @ sae.W_dec
    auxk = min(int(dead.sum()) / 8, 1.0) * (e_hat - err.detach()).pow(2).sum() / total
    torch.testing.assert_close(out.fvu, err.pow(2).sum() / total)
    torch.testing.assert_close(out.auxk, auxk)
    (err.pow(2).sum() / total + 0.5 * auxk).backward()
    for name, p in sae.named_parameters():
        torch.testing.assert_close(mine[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_on_a_planted_organism_the_top_reward_writing_features_separate_the_attribute():
    """The 'list' organism prefers bullet lists. Features are ranked on clean pairs; on other pairs,
    where a coin puts the list on either side half the time, they must track the list, not the side."""
    from rewardlens.zoo.organisms import ORGANISMS, build

    spec = ORGANISMS["list"]
    model = rl.load(str(build("list", strength=1.0, seed=0)))
    layer = model.n_layers - 1
    source = ActivationSource(model, spec.pairs(n=200, seed=1, strength=1.0), f"resid_{layer}", positions="all")
    sae = train_sae(source, TrainConfig(sae=SMALL, batch_size=256, epochs=3)).sae
    clean = attribute_features(model, sae, spec.pairs(n=60, seed=2, strength=1.0), layer=layer)
    top = clean.top(3, by="margin")
    assert all(score > 0 for _, score in top)  # they write reward towards the list side
    margins = clean.reward[0::2] - clean.reward[1::2]
    assert clean.margin[:, [list(clean.features).index(f) for f, _ in top]].sum(1).mean() > 0.3 * margins.mean()
    mixed_pairs = spec.pairs(n=100, seed=3, strength=0.0)
    mixed = attribute_features(model, sae, mixed_pairs, layer=layer)
    has_list = np.array([spec.has_attribute(t) for p in mixed_pairs for t in (p.chosen, p.rejected)])
    is_chosen = np.arange(len(has_list)) % 2 == 0
    assert 0.3 < np.mean(has_list[is_chosen]) < 0.7  # the coin did decide the sides
    for feature, _ in top:
        column = list(mixed.features).index(feature) if feature in mixed.features else None
        acts = mixed.activations[:, column] if column is not None else np.zeros(len(has_list))
        assert auroc(acts, has_list) > 0.95, feature
        assert abs(auroc(acts, is_chosen) - 0.5) < 0.25
