"""The patching engines against the library's reference engine (one unbatched forward per part and pair), on
every architecture; tests/causal/test_engines.py checks the reference itself against a hook-based loop."""

import numpy as np
import pytest

import rewardlens as rl
from rewardlens import Pair
from rewardlens.causal import patch
from rewardlens.errors import DataError, TokenizationError
from rewardlens.model import TraceKey
from rewardlens.model.internal import tokenize
from tests.helpers.tiny import ARCHS

DECODERS = [a for a in ARCHS if a not in ("bert", "deberta-v2")]

# (mode, ablation, positions, level, estimand)
READ_CASES = [
    ("noising", "zero", "read", "sublayer", "total"),
    ("denoising", "zero", "read", "sublayer", "total"),
    ("ablation", "zero", "read", "sublayer", "total"),
    ("ablation", "mean", "read", "sublayer", "total"),
    ("noising", "zero", "read", "sublayer", "direct"),
    ("ablation", "mean", "read", "sublayer", "direct"),
    ("noising", "zero", "read", "head", "total"),
    ("denoising", "zero", "read", "head", "direct"),
    ("ablation", "zero", "read", "head", "total"),
]
WHOLE_CASES = [
    ("noising", "zero", "all", "sublayer", "total"),
    ("denoising", "zero", "all", "head", "total"),
    ("ablation", "mean", "all", "sublayer", "total"),
    ("noising", "zero", "all", "sublayer", "direct"),
    ("noising", "zero", ((-3, None),), "sublayer", "total"),
]


@pytest.fixture(scope="module")
def aligned(tokenizer):
    """Pairs whose two sides tokenize to the same length (checked, so 'all' positions apply)."""
    candidates = [
        ("Say a number.", "The number is 7.", "The number is 9."),
        ("Is it hot?", "It is hot.", "It is not."),
        ("Answer.", "Yes", "No!"),
        ("Where did the cat sit?", "The cat sat on the mat today.", "The dog sat on the rug today."),
    ]
    out = []
    for prompt, a, b in candidates:
        pair = Pair(prompt, a, b)
        sides = [tokenize(tokenizer, pair.conversation(side), encoder=False).ids for side in ("chosen", "rejected")]
        if len(sides[0]) == len(sides[1]):
            out.append(pair)
    assert len(out) >= 2, "the test needs at least two token-aligned pairs"
    return out


def _check(model, pairs, case):
    mode, ablation, positions, level, estimand = case
    got = patch(model, pairs, mode=mode, ablation=ablation, positions=positions, level=level, estimand=estimand,
                batch_size=2)
    want = patch(model, pairs, mode=mode, ablation=ablation, positions=positions, level=level, estimand=estimand,
                 engine="reference")
    assert got.provenance is not None and want.provenance is not None and want.provenance.engine == "reference"
    np.testing.assert_allclose(got.patched_chosen, want.patched_chosen, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(got.patched_rejected, want.patched_rejected, atol=2e-5, rtol=1e-5)
    return got


@pytest.mark.parametrize("arch", ARCHS)
def test_read_position_patching_equals_the_reference(tiny_root, pairs, arch):
    model = rl.load(str(tiny_root[arch]))
    for case in READ_CASES:
        got = _check(model, pairs, case)
        assert np.abs(got.effect).max() > 1e-5, f"{case}: every effect is zero, the check would be empty"


@pytest.mark.parametrize("arch", ARCHS)
def test_whole_sequence_and_span_patching_equal_the_reference(tiny_root, aligned, arch):
    model = rl.load(str(tiny_root[arch]))
    for case in WHOLE_CASES:
        _check(model, aligned, case)


def test_read_engines_on_decoders_and_encoders(tiny_root, pairs):
    """Decoders take the cached engine (copies from their own layer on the prefix's cache); the copy engine,
    forced, gives the same numbers; encoders take neither, and the result says why."""
    model = rl.load(str(tiny_root["llama"]))
    fast = patch(model, pairs, level="head")
    assert fast.provenance is not None and fast.provenance.engine == "cached_read_sweep"
    slow = patch(model, pairs, level="head", engine="read_sweep")
    assert slow.provenance is not None and slow.provenance.engine == "read_sweep" and slow.provenance.forced
    np.testing.assert_allclose(fast.patched_chosen, slow.patched_chosen, atol=2e-5)
    np.testing.assert_allclose(fast.chosen, slow.chosen, atol=2e-5)
    bert = patch(rl.load(str(tiny_root["bert"])), pairs).provenance
    assert bert is not None and bert.engine not in ("cached_read_sweep", "read_sweep")
    assert "attends both ways" in (bert.reason("cached_read_sweep") or "")
    assert "attends both ways" in (bert.reason("read_sweep") or "")


def test_chunking_and_batch_size_do_not_change_results(tiny_root, pairs):
    model = rl.load(str(tiny_root["qwen2"]))
    a = patch(model, pairs, level="head", batch_size=1, chunk=3)
    b = patch(model, pairs, level="head", batch_size=8, chunk=256)
    np.testing.assert_allclose(a.patched_chosen, b.patched_chosen, atol=1e-5)


def test_sign_convention_and_normalisation(tiny_root, pairs):
    model = rl.load(str(tiny_root["llama"]))
    res = patch(model, pairs, mode="denoising")
    rewards = model.score(pairs)
    np.testing.assert_allclose(res.chosen, rewards[0::2], rtol=1e-5)
    np.testing.assert_allclose(res.patched_chosen, np.repeat(res.chosen[:, None], len(res.names), 1))
    # denoising moves only the rejected reward; effect = how far it moved toward chosen's
    np.testing.assert_allclose(res.effect, res.patched_rejected - res.rejected[:, None], atol=1e-6)
    np.testing.assert_allclose(res.normalized, res.effect / res.margin[:, None], rtol=1e-6)


def test_near_zero_margins_are_flagged_not_divided(tiny_root):
    model = rl.load(str(tiny_root["llama"]))
    same = [Pair("Hi", "Hello there.", "Hello there."), Pair("Hi", "Hello there.", "Go away.")]
    res = patch(model, same)
    assert res.near_zero.tolist() == [True, False]
    assert np.isnan(res.normalized[0]).all() and np.isfinite(res.normalized[1]).all()


def test_bad_inputs_are_refused_with_a_fix(tiny_root, pairs):
    model = rl.load(str(tiny_root["llama"]))
    with pytest.raises(TokenizationError, match="token-aligned"):
        patch(model, pairs, positions="all")
    with pytest.raises(DataError, match="Pair"):
        patch(model, ["just a string", "another"])
    with pytest.raises(ValueError, match="mode"):
        patch(model, pairs, mode="swap")
    with pytest.raises(ValueError, match="estimand='total'"):
        patch(model, pairs, estimand="direct", divergence=True)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_direct_patching_is_attribution_with_the_final_scale_recomputed(tiny_root, pairs, arch):
    """Pre-norm: r(x + Δ) − c = (s'/s)·(r − c + u·Δ) with u = s·(w⊙γ) (centred for LayerNorm) and
    c = w·β + b, so with the scale ratio undone the path-frozen effect is exactly the attribution
    difference u·(c_src − c_tgt)."""
    import torch

    from rewardlens.causal._plan import Clean

    model = rl.load(str(tiny_root[arch]))
    res = patch(model, pairs, mode="noising", estimand="direct")
    att = rl.attribute(model, pairs)
    seqs, _ = model.encode(pairs)
    clean = Clean.run(model, seqs, heads=False, batch_size=8)
    x = clean.captured[TraceKey.final()][0::2]
    norm = model.norm(model.arch.final_norm)
    w = model.head.weight[0]
    const = float(model.head.bias[0]) + (0.0 if norm.beta is None else float(w @ norm.beta))
    s = norm.scale(x)
    u = (w * norm.gamma) * s[:, None]
    if norm.kind == "layer":
        u = u - u.mean(-1, keepdim=True)
    for p, name in enumerate(res.names):
        if name == "embed":
            continue
        kind, layer = name.split("_L")[0], int(name.split("_L")[1])
        key = TraceKey.sublayer(kind, layer)
        tgt, src = clean.captured[key][0::2], clean.captured[key][1::2]
        unscaled = (torch.tensor(res.patched_chosen[:, p]) - const) * (s / norm.scale(x + src - tgt)) + const
        np.testing.assert_allclose(unscaled.numpy(), res.chosen + (u * (src - tgt)).sum(-1).numpy(), atol=1e-5)
        np.testing.assert_allclose((u * tgt).sum(-1).numpy(), att.chosen[:, att.names.index(name)], atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma2", "bert", "armorm"])
def test_attribution_patching_is_the_first_order_term_of_exact_patching(tiny_root, pairs, arch):
    """Inserting a_tgt + ε(a_src − a_tgt) changes the reward by ε·AtP + O(ε²): AtP must equal the
    finite-difference slope of exact patching at small ε, part by part."""
    import torch

    from rewardlens.causal import agreement, attribution_patch
    from rewardlens.causal._engine import batched_sweep, sites
    from rewardlens.causal._plan import Clean

    model = rl.load(str(tiny_root[arch]))
    atp = attribution_patch(model, pairs, level="head" if arch != "bert" else "sublayer")
    exact = patch(model, pairs, level=atp.level)
    assert atp.approximate and not exact.approximate
    np.testing.assert_allclose(atp.chosen, exact.chosen, rtol=1e-5)
    ag = agreement(exact, atp)
    assert -1 <= ag["spearman_mean"] <= 1 and 0 <= ag["topk_overlap"] <= 1
    eps = 1e-3
    seqs, _ = model.encode(pairs)
    clean = Clean.run(model, seqs, heads=atp.level == "head", batch_size=8)
    sweep = sites(model, atp.level)
    tgt, src = list(range(0, len(seqs), 2)), list(range(1, len(seqs), 2))
    values = {
        s.key: (clean.captured[s.key][tgt] + eps * (clean.captured[s.key][src] - clean.captured[s.key][tgt]))[:, None]
        for s in sweep
    }
    cols = torch.tensor([[clean.read[i]] for i in tgt])
    stepped, _ = batched_sweep(model, [seqs[i] for i in tgt], sweep, cols, values, batch_size=8)
    slope = ((stepped - clean.reward[tgt][:, None]) / eps).numpy()
    np.testing.assert_allclose(atp.patched_chosen - atp.chosen[:, None], slope, atol=2e-3 * max(1, np.abs(slope).max()))


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gpt2", "gpt_neox", "bert", "deberta-v2", "armorm"])
def test_whole_sequence_runs_start_at_their_own_layer_and_match_full_forwards(tiny_root, aligned, arch):
    """The stepped engine (each run from its patched layer, the model's own layer modules), which the registry
    may choose where the suffix engine cannot (ablation changes every position), equals the full-forward
    batched engine."""
    from rewardlens.causal import _stepped as patch_stepped

    model = rl.load(str(tiny_root[arch]))
    seqs, _ = model.encode(aligned)
    batch = patch_stepped.collate(seqs, pad_id=model.pad_token_id, side="right", first=model.encoder,
                                  device=model.device)
    assert patch_stepped.stepping_works(model, patch_stepped.Recording(model, batch))
    stepped = patch(model, aligned, mode="ablation", positions="all", level="head", batch_size=3,
                    engine="stepped_sweep")
    assert stepped.provenance is not None and stepped.provenance.proof
    full = patch(model, aligned, mode="ablation", positions="all", level="head", batch_size=3, engine="batched_sweep")
    np.testing.assert_allclose(stepped.patched_chosen, full.patched_chosen, atol=2e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def alibi_root(tmp_path_factory, tokenizer):
    """Two ALiBi decoders found by structural discovery: MPT (ignores position_ids) and Bloom (builds
    its biases from a 2-D mask). The read-token copies cannot share one position in either."""
    import torch
    import transformers as tf

    common = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id, "bos_token_id": None,
              "num_labels": 1}
    configs = {
        "mpt": tf.MptConfig(vocab_size=len(tokenizer), d_model=64, n_layers=2, n_heads=4, max_seq_len=256, **common),
        "bloom": tf.BloomConfig(vocab_size=len(tokenizer), hidden_size=64, n_layer=2, n_head=4, **common),
    }
    root = tmp_path_factory.mktemp("alibi")
    for name, config in configs.items():
        torch.manual_seed(0)
        model = tf.AutoModelForSequenceClassification.from_config(config).eval()
        with torch.no_grad():
            for key, p in model.named_parameters():
                if p.ndim == 1:
                    p.add_(0.2 * torch.randn(p.shape))
                if key.endswith("score.weight"):
                    p.copy_(torch.randn(p.shape) / 8)
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root


@pytest.mark.parametrize("arch", ["mpt", "bloom"])
def test_models_whose_copies_differ_by_column_fall_back_and_stay_exact(alibi_root, pairs, arch):
    model = rl.load(str(alibi_root / arch))
    for level in ("sublayer", "head"):
        got = patch(model, pairs, level=level, batch_size=2)
        want = patch(model, pairs, level=level, engine="reference")
        np.testing.assert_allclose(got.patched_chosen, want.patched_chosen, atol=2e-5, rtol=1e-5)
        np.testing.assert_allclose(got.chosen, model.score(pairs)[0::2], rtol=1e-5)
        assert got.provenance is not None and got.provenance.engine not in ("cached_read_sweep", "read_sweep")
        assert got.provenance.reason("cached_read_sweep") or got.provenance.reason("read_sweep")
    # Whole prefixes: each run continues the clean run's cache from its first changed position, or declines.
    got = patch(model, pairs, positions="prefix", batch_size=2)
    want = patch(model, pairs, positions="prefix", engine="reference")
    np.testing.assert_allclose(got.patched_chosen, want.patched_chosen, atol=2e-5, rtol=1e-5)


def test_a_single_pair_is_accepted(tiny_root, pairs):
    model = rl.load(str(tiny_root["llama"]))
    one = patch(model, pairs[0])
    np.testing.assert_allclose(one.effect, patch(model, pairs[:1]).effect, atol=1e-6)


def test_a_missing_gate_pattern_names_the_pair(tiny_root, pairs):
    """ArmoRM reads its gate at the end of the user turn; without the chat template the error names
    a pair and its side, as the user numbered them (not an internal row)."""
    model = rl.load(str(tiny_root["armorm"]))
    model.tokenizer.chat_template, saved = None, model.tokenizer.chat_template
    try:
        with pytest.raises(rl.RewardLensError, match=r"^pair [0-2] \((chosen|rejected)\): the gate's token pattern"):
            patch(model, pairs)
    finally:
        model.tokenizer.chat_template = saved


def test_every_mode_gives_the_planted_head_a_positive_effect(organisms):
    """Sign convention, checked where the truth is known: on the circuit organism the preference
    lives in attn_L1_H2, so noising it lowers the chosen reward, denoising raises the rejected one,
    and zeroing it shrinks the margin — a positive effect in every mode, carrying most of the margin.
    (Zeroing other parts is off-distribution and moves rewards too, so only swaps are checked for
    the other parts staying small.)"""
    from rewardlens.zoo.organisms import ORGANISMS

    model = rl.load(str(organisms[("circuit", 1.0)]))
    pairs = ORGANISMS["circuit"].pairs(n=12, seed=7, strength=1.0)
    for mode in ("noising", "denoising", "ablation"):
        res = patch(model, pairs, mode=mode, level="head")
        head = res.names.index("attn_L1_H2")
        assert (res.effect[:, head] > 0).all(), mode
        assert np.nanmedian(res.normalized[:, head]) > 0.5, mode
        if mode != "ablation":
            others = np.delete(np.abs(res.effect).mean(0), head)
            assert others.max() < 0.1 * res.effect[:, head].mean(), mode


@pytest.mark.parametrize("min_copies", [1, 5, 1000])
def test_cached_engine_groups_do_not_change_results(tiny_root, pairs, min_copies):
    """However layers are pooled into groups (each copy starting at its group's first layer), the
    cached engine equals the copy engine that runs every copy through every layer."""
    from rewardlens.causal._cached import cached_read_sweep
    from rewardlens.causal._engine import read_sweep, sites
    from rewardlens.causal._plan import Clean

    model = rl.load(str(tiny_root["gemma2"]))
    seqs, _ = model.encode(pairs)
    clean = Clean.run(model, seqs, heads=True, batch_size=8)
    sweep = sites(model, "head")
    values = {s.key: clean.captured[s.key][1::2] for s in sweep}
    read = [clean.read[i] for i in range(0, len(seqs), 2)]
    got = cached_read_sweep(model, seqs[0::2], read, sweep, values, clean.coef[0::2], batch_size=2,
                            min_copies=min_copies)
    want = read_sweep(model, seqs[0::2], read, sweep, values, clean.coef[0::2], batch_size=2)
    assert got is not None
    np.testing.assert_allclose(got[1].numpy(), want[1].numpy(), atol=2e-5)
    np.testing.assert_allclose(got[0].numpy(), clean.reward[0::2].numpy(), atol=2e-5)
