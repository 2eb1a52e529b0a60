"""Cross-model comparison, checked against each model's own scores, scipy and hand-computed cosines."""

import copy
import json

import numpy as np
import pytest
import torch
import transformers as tf
from scipy.stats import pearsonr, spearmanr

import rewardlens as rl
from rewardlens.cli import main
from rewardlens.compare import formation_correlation
from rewardlens.data import save_pairs
from rewardlens.zoo.organisms import ORGANISMS
from tests.helpers import tiny

N_BOOT = 200


@pytest.fixture(scope="module")
def org_pairs():
    """Pairs on which the two organisms' planted rules sometimes agree and sometimes do not."""
    return ORGANISMS["sycophancy"].pairs(16, seed=7) + ORGANISMS["length"].pairs(16, seed=7)


@pytest.fixture(scope="module")
def syc(organisms):
    return rl.load(str(organisms[("sycophancy", 1.0)]))


@pytest.fixture(scope="module")
def length(organisms):
    return rl.load(str(organisms[("length", 1.0)]))


def _cos(x, y) -> float:
    x, y = np.asarray(x, dtype=np.float64).ravel(), np.asarray(y, dtype=np.float64).ravel()
    return float(x @ y / np.linalg.norm(x) / np.linalg.norm(y))


def test_two_organisms_agreement_against_their_own_scores(syc, length, org_pairs):
    cmp = rl.compare(syc, length, org_pairs, n_boot=N_BOOT)
    ra, rb = tiny.own_scores(syc, org_pairs), tiny.own_scores(length, org_pairs)  # unbatched HF forwards
    np.testing.assert_allclose(cmp.a.reward, ra, atol=1e-4)
    np.testing.assert_allclose(cmp.b.reward, rb, atol=1e-4)
    ma, mb = ra[0::2] - ra[1::2], rb[0::2] - rb[1::2]
    assert cmp.spearman_reward == pytest.approx(spearmanr(ra, rb).statistic, abs=1e-6)
    assert cmp.spearman_margin == pytest.approx(spearmanr(ma, mb).statistic, abs=1e-6)
    assert cmp.agreement == pytest.approx(np.mean((ma > 0) == (mb > 0)))
    assert cmp.a.accuracy == pytest.approx(np.mean(ma > 0)) and cmp.b.accuracy == pytest.approx(np.mean(mb > 0))
    for value, ci in ((cmp.spearman_reward, cmp.spearman_reward_ci), (cmp.spearman_margin, cmp.spearman_margin_ci),
                      (cmp.agreement, cmp.agreement_ci)):
        assert ci[0] <= value <= ci[1] and ci[0] < ci[1]
    # Each rule is planted in one organism only: on these pairs they must not agree perfectly.
    assert cmp.agreement < 1 and cmp.spearman_margin < 0.9

    # Lens: ends at each model's own margin; crystallization difference is B − A over pairs where both exist.
    np.testing.assert_allclose(cmp.a.lens_linear[:, -1], ma, atol=1e-4)
    np.testing.assert_allclose(cmp.b.lens_normed[:, -1], mb, atol=1e-4)
    da = rl.lens(syc, org_pairs).crystallization("linear", 0.5)
    db = rl.lens(length, org_pairs).crystallization("linear", 0.5)
    assert cmp.depth_difference[0] == pytest.approx(np.nanmean(db - da))
    # Attribution profile: the per-depth parts sum to the mean margin (Llama's head has no bias).
    assert cmp.a.profile.sum() == pytest.approx(ma.mean(), abs=1e-4)
    assert cmp.b.profile.sum() == pytest.approx(mb.mean(), abs=1e-4)
    np.testing.assert_allclose(cmp.profile_a, cmp.a.profile)  # same depth: the grid is each model's own
    assert cmp.profile_correlation == pytest.approx(np.corrcoef(cmp.a.profile, cmp.b.profile)[0, 1])

    frame = cmp.to_frame()
    assert len(frame) == len(org_pairs) and frame["same_winner"].mean() == pytest.approx(cmp.agreement)


def test_organisms_trained_apart_do_not_share_a_basis(syc, length, org_pairs):
    """Same config, tokenizer and seeded init, but training moved the embeddings: refused, with the value."""
    ea = syc.model.get_input_embeddings().weight.detach()
    eb = length.model.get_input_embeddings().weight.detach()
    cos = torch.nn.functional.cosine_similarity(ea, eb, dim=1)
    both_zero = (ea.norm(dim=1) == 0) & (eb.norm(dim=1) == 0)  # the pad row: never trained, identical
    assert both_zero.sum() == 1
    expected = float(torch.where(both_zero, 1.0, cos).mean())
    assert expected < 0.99
    cmp = rl.compare(syc, length, org_pairs, n_boot=N_BOOT)
    assert not cmp.basis.shared
    assert cmp.basis.hidden == (64, 64) and cmp.basis.layers == (2, 2) and cmp.basis.same_vocabulary
    assert cmp.basis.embedding_cosine == pytest.approx(expected, abs=1e-5)
    assert f"token embeddings differ: mean row cosine {expected:.3f} < 0.99" in cmp.refused
    assert np.isnan(cmp.readout_cosine) and len(cmp.direction_cosine) == 0
    assert json.loads(json.dumps(cmp.to_dict()))["directions"]["refused"] == cmp.refused
    summary = cmp.summary()  # headline rows: the same numbers, NaN kept
    assert summary.index.is_unique and (summary["n"] == len(cmp.pair_ids)).all()
    rows = {(r["quantity"], r["model"]): r for r in summary.to_dict("records")}
    assert rows[("spearman_margin", "A vs B")]["value"] == cmp.spearman_margin
    assert (rows[("same_winner", "A vs B")]["low"], rows[("same_winner", "A vs B")]["high"]) == cmp.agreement_ci
    assert summary.loc["accuracy (B)", "value"] == cmp.b.accuracy
    assert np.isnan(rows[("readout_cosine", "A vs B")]["value"])
    assert rows[("crystallization_difference_normed", "B − A")]["value"] == cmp.depth_difference[1]


def test_a_model_against_itself(organisms, syc, org_pairs):
    other = rl.load(str(organisms[("sycophancy", 1.0)]))  # a second load: everything is computed twice
    cmp = rl.compare(syc, other, org_pairs, n_boot=N_BOOT)
    assert cmp.spearman_reward == 1 and cmp.spearman_margin == 1 and cmp.agreement == 1
    assert cmp.basis.shared and cmp.basis.embedding_cosine == pytest.approx(1)
    assert cmp.readout_cosine == pytest.approx(1) and cmp.residual_readout_cosine == pytest.approx(1)
    finite = np.isfinite(cmp.direction_cosine)
    assert finite[1:].all()  # the embedding difference at t* is zero when both sides end in the same token
    np.testing.assert_allclose(cmp.direction_cosine[finite], 1, atol=1e-5)
    np.testing.assert_array_equal(cmp.depth_difference, 0)
    assert cmp.profile_correlation == pytest.approx(1)
    # Identical lens curves: every defined pair's formation correlation is 1, and so is the mean.
    np.testing.assert_allclose(cmp.formation_correlation, 1)
    assert np.isfinite(cmp.formation_pairs).sum(1).min() > len(org_pairs) // 2
    # The same object twice reuses its one run; every reported number is the same as with two loads.
    assert rl.compare(syc, syc, org_pairs, n_boot=N_BOOT).to_dict() == cmp.to_dict()


def test_bad_inputs_are_refused(syc):
    with pytest.raises(rl.RewardLensError, match="rewardlens.Pair"):
        rl.compare(syc, syc, ["a lone string"])
    with pytest.raises(ValueError, match="two different labels"):
        rl.compare(syc, syc, [rl.Pair("q", "a", "b")], labels=("A", "A"))


def test_a_copy_with_only_the_head_changed_shares_the_basis(syc, org_pairs):
    hf = copy.deepcopy(syc.model)
    with torch.no_grad():
        hf.score.weight.copy_(torch.randn(hf.score.weight.shape, generator=torch.Generator().manual_seed(3)))
    changed = rl.wrap(hf, syc.tokenizer)
    cmp = rl.compare(syc, changed, org_pairs, n_boot=N_BOOT)
    assert cmp.refused is None
    wa, wb = syc.model.score.weight.detach().numpy(), hf.score.weight.detach().numpy()
    assert cmp.readout_cosine == pytest.approx(_cos(wa, wb), abs=1e-5)
    # In the residual stream the read-out is w ⊙ γ (RMSNorm; its scale is one number per input).
    gamma = syc.model.model.norm.weight.detach().numpy()
    assert cmp.residual_readout_cosine == pytest.approx(_cos(wa * gamma, wb * gamma), abs=1e-5)
    finite = np.isfinite(cmp.direction_cosine)
    np.testing.assert_allclose(cmp.direction_cosine[finite], 1, atol=1e-5)  # the backbone is the same
    rb = tiny.own_scores(changed, org_pairs)
    assert cmp.spearman_margin == pytest.approx(spearmanr(cmp.a.margin, rb[0::2] - rb[1::2]).statistic, abs=1e-6)


@pytest.fixture(scope="module")
def wide(tmp_path_factory, tokenizer):
    """A random tiny Llama 96 wide and 3 layers deep, next to tiny_root's 64-wide, 2-layer one."""
    _, config = tiny.configs(tokenizer)["llama"]
    config = copy.deepcopy(config)
    config.hidden_size, config.num_hidden_layers = 96, 3
    torch.manual_seed(1)
    model = tf.AutoModelForSequenceClassification.from_config(config).eval()
    tiny.perturb_(model, 1)
    path = tmp_path_factory.mktemp("wide") / "llama96"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_a_different_width_is_refused_and_profiles_align_by_relative_depth(tiny_root, wide, pairs):
    cmp = rl.compare(str(tiny_root["llama"]), str(wide), pairs, n_boot=N_BOOT)
    assert "hidden sizes differ: 64 vs 96" in cmp.refused and "layer counts differ: 2 vs 3" in cmp.refused
    assert np.isnan(cmp.basis.embedding_cosine)  # shapes differ: nothing to take a cosine of
    a, b = cmp.a, cmp.b
    np.testing.assert_allclose(cmp.grid, [0, 1 / 3, 2 / 3, 1])  # the deeper model's depths
    np.testing.assert_allclose(cmp.profile_b, b.profile)
    # A's depths are 0, 1/2, 1: its profile is linearly interpolated in between.
    assert cmp.profile_a[0] == pytest.approx(a.profile[0]) and cmp.profile_a[-1] == pytest.approx(a.profile[-1])
    assert cmp.profile_a[1] == pytest.approx(a.profile[0] + (1 / 3) / (1 / 2) * (a.profile[1] - a.profile[0]))
    assert cmp.profile_a[2] == pytest.approx(a.profile[1] + (2 / 3 - 1 / 2) / (1 / 2) * (a.profile[2] - a.profile[1]))
    ra, rb = tiny.own_scores(rl.load(str(tiny_root["llama"])), pairs), tiny.own_scores(rl.load(str(wide)), pairs)
    assert cmp.spearman_reward == pytest.approx(spearmanr(ra, rb).statistic, abs=1e-6)
    assert len(cmp.depth_frame()) == 4
    # Formation correlation by hand: each pair's linear lens over its final margin, A's three depths
    # 0, 1/2, 1 interpolated onto B's four 0, 1/3, 2/3, 1, then Pearson r (scipy), mean over pairs.
    hand = []
    for x, y in zip(a.lens_linear, b.lens_linear):
        x, y = x.astype(np.float64) / x[-1], y.astype(np.float64) / y[-1]
        x = [x[0], x[0] + (2 / 3) * (x[1] - x[0]), x[1] + (1 / 3) * (x[2] - x[1]), x[2]]
        hand.append(pearsonr(x, y).statistic)
    np.testing.assert_allclose(cmp.formation_pairs[0], hand, rtol=1e-9)
    assert cmp.formation_correlation[0] == pytest.approx(np.mean(hand))
    low, high = cmp.formation_correlation_ci[0]
    assert low <= np.mean(hand) <= high and low < high
    row = cmp.summary().loc["formation_correlation_linear"]
    assert (row["model"], row["value"], row["low"]) == ("A vs B", pytest.approx(np.mean(hand)), low)
    np.testing.assert_allclose(cmp.to_frame()["formation_correlation"], hand, rtol=1e-9)
    entry = cmp.to_dict()["lens"]["formation_correlation"]["linear"]
    assert entry["mean"] == pytest.approx(np.mean(hand)) and entry["n_defined"] == len(pairs)


def test_formation_correlation_against_a_hand_computation():
    # A has 2 layers, B 3: A's curve over its final margin is put on B's depths 0, 1/3, 2/3, 1.
    lens_a = np.array([[1.0, 3, 2],     # / 2 → 0.5, 1.5, 1 → on B's grid 1/2, 7/6, 4/3, 1
                       [-1, -4, -2],    # / −2 → 0.5, 2, 1 (a negative final margin flips it) → 1/2, 3/2, 5/3, 1
                       [1, 2, 0],       # final margin 0: undefined
                       [1, 2, 3],       # B's final margin is flagged near zero below: undefined
                       [2, 2, 2]])      # / 2 → flat: no shape, undefined (the seed code said 0)
    lens_b = np.array([[0.0, 2, 4, 4]] * 5)  # / 4 → 0, 1/2, 1, 1
    # r of (1/2, 7/6, 4/3, 1) and (0, 1/2, 1, 1): Σdxdy = 5/12, Σdx² = 7/18, Σdy² = 11/16.
    expected = [(5 / 12) / np.sqrt(7 / 18 * 11 / 16), 0.6605782590758164, np.nan, np.nan, np.nan]
    got = formation_correlation(lens_a, lens_b, undefined=np.array([0, 0, 0, 1, 0], dtype=bool))
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    assert expected[0] == pytest.approx(0.8058229640253805)
    # Equal layer counts: no interpolation, r of the normalised curves themselves.
    assert formation_correlation(lens_b[:1], lens_b[:1] * -3)[0] == pytest.approx(1)
    with pytest.raises(ValueError, match="same n pairs"):
        formation_correlation(lens_a, lens_b[:2])


def test_probe_profiles_side_by_side(syc, length, org_pairs):
    cmp = rl.compare(syc, length, org_pairs[:4], probes=True, n_boot=N_BOOT)
    pa, pb = cmp.a.probes, cmp.b.probes
    assert pa.axes == pb.axes
    assert cmp.probe_spearman == pytest.approx(spearmanr(pa.mean, pb.mean).statistic, abs=1e-6)
    axes = {r["axis"]: r for r in cmp.to_dict()["probes"]["axes"]}
    # Each organism's planted rule shows up on its own side of the table.
    assert axes["sycophancy"]["A"]["flagged"] and axes["sycophancy"]["A"]["mean"] > 0
    # The length organism's effect on the built-in items is real but small next to the spread of its
    # rewards over them (here 0.14 [0.05, 0.30] against a flag floor of 0.28), so whether it clears the
    # floor depends on how training generalised; that it is B's largest effect and above zero does not.
    length_b = axes["length"]["B"]
    assert length_b["mean"] == max(r["B"]["mean"] for r in axes.values()) and length_b["ci"][0] > 0
    assert axes["sycophancy"]["A"]["mean"] > axes["sycophancy"]["B"]["mean"]
    assert len(cmp.probe_frame()) == len(pa.axes)


def test_cli_json_and_table(capsys, organisms, org_pairs, tmp_path):
    path = str(save_pairs(org_pairs, tmp_path / "pairs.jsonl"))
    a, b = str(organisms[("sycophancy", 1.0)]), str(organisms[("length", 1.0)])
    assert main(["compare", a, b, "--pairs", path, "--json", "--n-boot", str(N_BOOT)]) == 0
    out = json.loads(capsys.readouterr().out)
    api = rl.compare(a, b, org_pairs, n_boot=N_BOOT).to_dict()
    assert out["agreement"] == api["agreement"] and out["attribution"] == api["attribution"]
    assert out["directions"]["refused"].startswith("token embeddings differ")
    assert out["n_pairs"] == len(org_pairs) and out["paths"] == {"A": a, "B": b}

    assert main(["compare", a, b, "--pairs", path, "--limit", "8", "--n-boot", str(N_BOOT)]) == 0
    text = capsys.readouterr().out
    assert "agreement over 8 pairs" in text and "Spearman, margins (per pair)" in text
    # each interval is labelled by how it was made: accuracy's is Wilson's, never called a bootstrap
    rows = {line.split("  ")[0]: line for line in text.splitlines() if line.startswith(("accuracy", "Spearman"))}
    assert all(line.rstrip().endswith("Wilson") for k, line in rows.items() if k.startswith("accuracy"))
    assert all(line.rstrip().endswith("bootstrap") for k, line in rows.items() if k.startswith("Spearman"))
    assert sum(k.startswith("accuracy") for k in rows) == 2
    assert "directions not compared: token embeddings differ" in text
    assert "formation correlation (Pearson r of the lens curves" in text and "of 8 pairs" in text
    assert main(["compare", a, a, "--pairs", path, "--limit", "8", "--n-boot", str(N_BOOT)]) == 0
    text = capsys.readouterr().out
    assert "shared basis" in text and "read-out cosine 1.000" in text
