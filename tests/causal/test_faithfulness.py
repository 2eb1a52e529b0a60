"""Faithfulness report, divergence scores and the statistics under them."""

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

import rewardlens as rl
from rewardlens import Pair
from rewardlens.causal import faithfulness, patch
from rewardlens.causal._divergence import Natural, thresholds
from rewardlens.stats import bootstrap_ci, rank_agreement, spearman, topk_overlap
from rewardlens.zoo import DEMO_PAIRS
from tests.helpers.tiny import ARCHS

ALIGNED = [Pair("Say a number.", "The number is 7.", "The number is 9."),
           Pair("Is it hot?", "It is hot.", "It is not."),
           Pair("Answer.", "Yes", "No!")]


def test_spearman_is_scipys_and_undefined_when_constant():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=20), rng.normal(size=20)
    b[3] = b[4]  # a tie
    assert spearman(a, b) == pytest.approx(spearmanr(a, b).statistic)
    assert np.isnan(spearman(a, np.ones(20)))
    assert topk_overlap(np.arange(10.0), np.arange(10.0)[::-1], 3) == 0.0
    lo, hi = bootstrap_ci(rng.normal(1.0, 1.0, size=200), seed=1)
    assert lo < 1.0 < hi and hi - lo < 0.5
    assert np.isnan(bootstrap_ci(np.array([1.0]))[0])
    ag = rank_agreement(np.arange(12.0).reshape(2, 6), np.arange(12.0).reshape(2, 6) * 2, k=2)
    assert ag["spearman_per_pair"] == pytest.approx(1.0) and ag["topk_overlap"] == 1.0


def test_faithfulness_report_is_consistent_with_its_parts(tiny_root):
    model = rl.load(str(tiny_root["llama"]))
    rep = faithfulness(model, DEMO_PAIRS, n_boot=200)
    att = rl.attribute(model, DEMO_PAIRS)
    np.testing.assert_allclose(rep.attribution, att.margin[:, [att.names.index(n) for n in rep.names]])
    np.testing.assert_allclose(rep.indirect, rep.total - rep.direct)
    # one shared clean trace instead of each estimand's own: equal to float precision
    np.testing.assert_allclose(rep.total, patch(model, DEMO_PAIRS).effect, rtol=1e-5, atol=1e-6)
    row = 2
    assert rep.rho("direct")[row] == pytest.approx(spearmanr(rep.attribution[row], rep.direct[row]).statistic)
    mean, lo, hi = rep.pooled("total")
    assert lo <= mean <= hi
    assert rep.seed_positions == "read"  # the demo pairs are not token-aligned
    seed = rep.seed_rho[0]
    assert seed == pytest.approx(spearmanr(np.abs(rep.attribution[0]), np.abs(rep.total[0])).statistic)
    assert [name.split(" vs ")[-1] for name in rep.summary().index[:4]] == [
        "direct", "total", "indirect", "attribution_patching"]
    assert rep.summary().loc["attribution vs total", ["value", "low", "high"]].tolist() == list(rep.pooled("total"))
    frame = rep.to_frame()
    assert len(frame) == len(DEMO_PAIRS) * len(rep.names)
    # direct patching and attribution measure the same thing up to the final norm's scale change
    assert np.nanmean(rep.rho("direct")) > 0.8


def test_seed_statistic_patches_whole_sequences_when_pairs_align(tiny_root):
    model = rl.load(str(tiny_root["gpt2"]))
    rep = faithfulness(model, ALIGNED, n_boot=100)
    assert rep.seed_positions == "all"
    whole = patch(model, ALIGNED, positions="all")
    np.testing.assert_allclose(rep.seed_effect, whole.effect)


def test_whitened_distance_matches_the_explicit_shrunk_covariance():
    rng = np.random.default_rng(0)
    acts = torch.tensor(rng.normal(size=(12, 20)) @ rng.normal(size=(20, 20)))
    fit = Natural.fit(acts)
    x = acts - acts.mean(0)
    s = (x.T @ x / len(x)).numpy()
    mu = np.trace(s) / 20
    sigma = (1 - fit.shrinkage) * s + fit.shrinkage * mu * np.eye(20)
    v = rng.normal(size=(5, 20))
    d = v - acts.mean(0).numpy()
    explicit = np.sqrt(np.einsum("ni,ij,nj->n", d, np.linalg.inv(sigma), d))
    np.testing.assert_allclose(fit.distance(torch.tensor(v)).numpy(), explicit, rtol=1e-6)
    assert 0 < fit.shrinkage < 1


def test_far_points_exceed_the_natural_threshold_and_natural_ones_do_not():
    rng = np.random.default_rng(1)
    mix = rng.normal(size=(16, 16))
    natural = torch.tensor(rng.normal(size=(200, 16)) @ mix)
    limit = thresholds(natural[:100])
    fit = Natural.fit(natural[:100])
    held_out = fit.distance(natural[100:]) / limit
    far = fit.distance(natural[100:] + 8 * natural[:100].std(0)) / limit
    assert (held_out <= 1).double().mean() > 0.9
    assert (far > 1).all()
    with pytest.raises(ValueError, match="at least"):
        thresholds(natural[:4])


def test_divergence_scores_patched_runs_against_natural_activations(tiny_root):
    model = rl.load(str(tiny_root["llama"]))
    res = patch(model, DEMO_PAIRS, mode="ablation", divergence=True)
    assert res.divergence.shape == res.effect.shape and np.isfinite(res.divergence).all()
    rel = res.reliability()
    assert 0 <= rel["flagged_share"] <= 1 and 0 <= rel["effect_share_flagged"] <= 1
    assert res.to_frame()["flagged"].dtype == bool
    # the read-position engine and the batched engine see the same downstream activations
    batched = patch(model, DEMO_PAIRS, mode="ablation", divergence=True, engine="batched_sweep")
    np.testing.assert_allclose(res.divergence, batched.divergence, rtol=1e-4, atol=1e-6)
    # zeroing a whole sublayer of a random model is not natural: something must get flagged
    assert res.flagged.any()


@pytest.mark.parametrize("arch", ARCHS)
def test_divergence_from_the_cached_engine_equals_the_copy_engines(tiny_root, arch):
    """Each copy's stream in the cached engine (its own layers' residuals, the clean ones below its group)
    scores as the copy engine's, which runs every copy through every layer; decoders take the cached one."""
    from rewardlens.model.internal import not_continuable

    model = rl.load(str(tiny_root[arch]))
    fast = patch(model, DEMO_PAIRS, level="head", divergence=True)
    copies = not_continuable(model, model.encode(DEMO_PAIRS)[0]) is None
    slow = patch(model, DEMO_PAIRS, level="head", divergence=True, engine="read_sweep" if copies else None)
    assert fast.provenance is not None
    assert (fast.provenance.engine == "cached_read_sweep") == copies, "which engine ran"
    np.testing.assert_allclose(fast.patched_chosen, slow.patched_chosen, rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(fast.divergence, slow.divergence, rtol=1e-4, atol=1e-5)
    assert np.abs(fast.divergence).max() > 0.1  # a real stream was scored, not the zeros it starts as


def test_faithfulness_records_the_engine_of_every_patch_run_it_makes(tiny_root):
    """Each patched field names the engine that computed it, as the same patch run alone records it; the
    plain records a store keeps rebuild the same `Provenance`s, and chunks that ran differently join."""
    import dataclasses

    from rewardlens.causal import Faithfulness, attribution_patch
    from rewardlens.causal._registry import Provenance

    model = rl.load(str(tiny_root["llama"]))
    rep = faithfulness(model, DEMO_PAIRS, n_boot=50, paper=True)
    prov = rep.provenance
    assert set(prov) == {"total", "seed_effect", "direct", "attribution_patching", "paper_effect"}
    alone = {"total": patch(model, DEMO_PAIRS, level="sublayer"), "direct": patch(model, DEMO_PAIRS, estimand="direct"),
             "paper_effect": patch(model, DEMO_PAIRS, positions="prefix"),
             "attribution_patching": attribution_patch(model, DEMO_PAIRS)}
    for name, run in alone.items():
        assert prov[name].engine == run.provenance.engine, name
        assert prov[name].declined == run.provenance.declined, name
        assert (prov[name].proof is None) == (run.provenance.proof is None), name
    assert prov["total"] == prov["seed_effect"]  # the demo pairs are not aligned: one read-token sweep gives both
    assert prov["total"].engine == "cached_read_sweep" and prov["direct"].engine == "direct_rewards"

    record = {f.name: getattr(rep, f.name) for f in dataclasses.fields(rep)}
    plain = {name: dataclasses.asdict(p) for name, p in prov.items()}
    assert Faithfulness(**{**record, "provenance": plain}).provenance == prov
    # read back pair by pair from a store: pairs of one chunk repeat its record; chunks that differ join
    other = {**plain, "total": dataclasses.asdict(Provenance("read_sweep", prov["total"].declined[:1], "copies"))}
    back = Faithfulness(**{**record, "provenance": [plain, plain, other]}).provenance
    assert back["direct"] == prov["direct"]
    assert back["total"].engine == "cached_read_sweep / read_sweep"
    assert back["total"].declined == prov["total"].declined and back["total"].proof.endswith("; copies")
