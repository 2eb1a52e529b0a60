"""Reward-term conflicts: planted conflict on the two-objective organism, exact directions and
margins against the Hugging Face modules on tiny random models, the relation rules, errors, CLI."""

import json

import numpy as np
import pytest
import torch
import transformers as tf

import rewardlens as rl
from rewardlens.calibrate import OrganismBench, grade_conflict
from rewardlens.cli import main
from rewardlens.data import save_pairs
from rewardlens.hacking import conflict
from rewardlens.hacking._conflict import bootstrap, relations, shares
from rewardlens.stats import spearman, spearman_matrix
from rewardlens.zoo import DEMO_PAIRS
from rewardlens.zoo.organisms import ORGANISMS
from tests.helpers import tiny

N_BOOT = 300


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float(a @ b / (a.norm() * b.norm()))


def _hf_hidden(model, pairs) -> torch.Tensor:
    """ĥ [2n, d] from the Hugging Face base model: one unpadded forward per sequence, read at the
    last token (decoders) or the first (encoders), independent of rewardlens' batching and hooks."""
    out = []
    for kw in tiny.unpadded(model, pairs):
        with torch.no_grad():
            h = model.model.base_model(**kw).last_hidden_state[0]
        out.append(h[0] if model.encoder else h[-1])
    return torch.stack(out).double()


# ---- the two-objective organism ------------------------------------------------------------------

@pytest.fixture(scope="module")
def two_objective(organisms):
    model = rl.load(str(organisms[("two_objective", 1.0)]), readout=0)
    spec = ORGANISMS["two_objective"]
    pairs = spec.pairs(200, seed=1)
    return model, spec, pairs, spec.labels(pairs)


def test_two_objective_conflict_is_found_at_the_planted_share(two_objective):
    model, _, pairs, labels = two_objective
    res = conflict(model, pairs)
    planted = np.mean(labels[:, 0] * labels[:, 1] < 0)  # the pairs built as bullets+hedges vs confident prose
    planted_agree = np.mean(labels[:, 0] * labels[:, 1] > 0)
    assert 0.15 < planted < 0.35
    assert res.names == ["formatting", "confidence"] and res.source == "objectives" and res.n_pairs == 200
    assert res.relation[0, 1] == res.relation[1, 0] == "conflicting"
    assert abs(res.disagree[0, 1] - planted) < 0.1
    assert abs(res.agree[0, 1] - planted_agree) < 0.1
    assert res.disagree_ci[0, 1, 0] > res.min_share
    assert res.disagree_ci[0, 1, 0] <= res.disagree[0, 1] <= res.disagree_ci[0, 1, 1]
    # The per-pair margins are the model's own objective values, chosen − rejected.
    values = model.objectives(pairs)
    np.testing.assert_allclose(res.margins, values[0::2] - values[1::2], rtol=1e-5, atol=1e-5)
    # The cosine of the head rows, read straight from the Hugging Face modules.
    w = model.model.score.weight.detach()
    gamma = model.model.model.norm.weight.detach()
    assert res.cosine[0, 1] == pytest.approx(_cos(w[0], w[1]), abs=1e-6)
    assert res.cosine_residual[0, 1] == pytest.approx(_cos(w[0] * gamma, w[1] * gamma), abs=1e-6)
    # Near-orthogonal rows and yet a quarter of the pairs in conflict: the cosine alone does not tell.
    assert abs(res.cosine[0, 1]) < 0.3
    frame = res.to_frame()
    assert len(frame) == 1 and frame.loc[0, "relation"] == "conflicting"
    assert frame.loc[0, "disagree"] == pytest.approx(res.disagree[0, 1])


def test_user_terms_recover_the_conflict_and_split_halves_align(two_objective):
    model, _, pairs, labels = two_objective
    lists, confident = ORGANISMS["list"].pairs(60, seed=7), ORGANISMS["confidence"].pairs(60, seed=7)
    res = conflict(model, pairs, terms={"list": lists, "confidence": confident, "list_b": ORGANISMS["list"].pairs(
        60, seed=8)}, n_boot=N_BOOT)
    planted = np.mean(labels[:, 0] * labels[:, 1] < 0)
    assert res.source == "terms" and res.term_sizes == {"list": 60, "confidence": 60, "list_b": 60}
    assert res.relation[0, 1] == "conflicting" and abs(res.disagree[0, 1] - planted) < 0.1
    assert res.relation[0, 2] == "aligned" and res.cosine[0, 2] > 0.99
    # The linear head is exact: the list direction read by each objective is the mean objective
    # margin over the list pairs (the formatting output prefers the bullet side, confidence barely moves).
    w, b = model.head.weight.double().cpu().numpy(), model.head.bias.double().cpu().numpy()
    for name, term in (("list", lists), ("confidence", confident)):
        values = model.objectives(term)
        np.testing.assert_allclose(res.vectors[res.index(name)] @ w.T, (values[0::2] - values[1::2]).mean(0),
                                   rtol=1e-4, atol=1e-4)
    assert b.shape == (2,)
    formatting_row = model.model.score.weight.detach()[0]
    assert _cos(torch.as_tensor(res.vectors[0]), formatting_row) > 0.9
    # Margins are the ĥ differences projected on the unit direction (ĥ from the HF forward).
    h = _hf_hidden(model, pairs[:8])
    unit = torch.as_tensor(res.vectors[0]) / torch.as_tensor(res.vectors[0]).norm()
    np.testing.assert_allclose(res.margins[:8, 0], ((h[0::2] - h[1::2]) @ unit).numpy(), rtol=1e-4, atol=1e-4)


def test_grader_passes_on_the_organism(organisms):
    rows = grade_conflict(OrganismBench(organisms=["two_objective"], n_pairs=100))
    assert len(rows) == 5 and all(r.passed for r in rows), [r for r in rows if not r.passed]
    assert grade_conflict(OrganismBench(organisms=["list"])) == []


# ---- tiny random models: exact against the Hugging Face modules ----------------------------------

def _build(tokenizer, root, name: str, num_labels: int | None = None):
    cls, config = tiny.configs(tokenizer)[name]
    if num_labels is not None:
        config.num_labels = num_labels
    torch.manual_seed(0)
    model = (cls.from_config(config) if cls is tf.AutoModelForSequenceClassification else cls(config)).eval()
    tiny.perturb_(model, 0)
    model.save_pretrained(root / name)
    tokenizer.save_pretrained(root / name)
    return root / name


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("conflict")
    return {"llama3": _build(tokenizer, root, "llama", 3), "bert2": _build(tokenizer, root, "bert", 2),
            "armorm": _build(tokenizer, root, "armorm")}


def test_multi_label_llama_cosines_and_margins_are_exact(tiny_models):
    model = rl.load(str(tiny_models["llama3"]), readout=0)
    res = conflict(model, DEMO_PAIRS, n_boot=N_BOOT, batch_size=3)
    w, gamma = model.model.score.weight.detach(), model.model.model.norm.weight.detach()
    for i in range(3):
        for j in range(3):
            assert res.cosine[i, j] == pytest.approx(_cos(w[i], w[j]), abs=1e-6)
            assert res.cosine_residual[i, j] == pytest.approx(_cos(w[i] * gamma, w[j] * gamma), abs=1e-6)
    np.testing.assert_allclose(res.vectors, w.double().numpy(), atol=1e-7)
    logits = []
    for s in model.encode(DEMO_PAIRS)[0]:  # the model's own forward, unpadded
        with torch.no_grad():
            logits.append(model.model(input_ids=torch.tensor([s.ids])).logits[0])
    logits = torch.stack(logits).double().numpy()
    np.testing.assert_allclose(res.margins, logits[0::2] - logits[1::2], rtol=1e-4, atol=1e-5)
    # Every statistic is the pure function of the margins.
    d, _ = shares(res.margins, res.tol)
    np.testing.assert_array_equal(res.disagree, d)
    assert res.spearman[0, 1] == pytest.approx(spearman(res.margins[:, 0], res.margins[:, 1]))
    assert res.names == model.head.labels == ["LABEL_0", "LABEL_1", "LABEL_2"] and len(res.pairs_table()) == 3


def test_user_terms_on_a_tiny_model_match_hf_hidden_states(tiny_models):
    model = rl.load(str(tiny_models["llama3"]), readout=0)
    terms = {"first": DEMO_PAIRS[:4], "second": DEMO_PAIRS[4:]}
    res = conflict(model, DEMO_PAIRS, terms=terms, n_boot=N_BOOT, batch_size=5)
    h = _hf_hidden(model, DEMO_PAIRS)
    diff = h[0::2] - h[1::2]
    dirs = torch.stack([diff[:4].mean(0), diff[4:].mean(0)])
    np.testing.assert_allclose(res.vectors, dirs.numpy(), rtol=1e-4, atol=1e-5)
    assert res.cosine[0, 1] == pytest.approx(_cos(dirs[0], dirs[1]), abs=1e-5)
    unit = dirs / dirs.norm(dim=1, keepdim=True)
    np.testing.assert_allclose(res.margins, (diff @ unit.T).numpy(), rtol=1e-4, atol=1e-5)
    # Residual space: the final norm's input with its scale applied, before γ, i.e. ĥ ⊘ γ for RMSNorm.
    gamma = model.model.model.norm.weight.detach().double()
    assert res.cosine_residual[0, 1] == pytest.approx(_cos(dirs[0] / gamma, dirs[1] / gamma), abs=1e-5)


def test_gated_head_uses_the_t_transformed_objectives(tiny_models):
    model = rl.load(str(tiny_models["armorm"]))
    res = conflict(model, DEMO_PAIRS, n_boot=N_BOOT)
    hf = model.model
    T, W = hf.reward_transform_matrix.detach().double(), hf.regression_layer.weight.detach().double()
    rewards = []
    for s in model.encode(DEMO_PAIRS)[0]:
        with torch.no_grad():
            rewards.append(hf(input_ids=torch.tensor([s.ids])).rewards[0])
    transformed = torch.stack(rewards).double() @ T  # score = Σ_k g_k (r T)_k
    np.testing.assert_allclose(res.margins, (transformed[0::2] - transformed[1::2]).numpy(), rtol=1e-4, atol=1e-5)
    rows = T.T @ W
    np.testing.assert_allclose(res.vectors, rows.numpy(), rtol=1e-5, atol=1e-6)
    assert res.cosine[0, 2] == pytest.approx(_cos(rows[0], rows[2]), abs=1e-6)
    assert "T-transformed" in res.direction_note


def test_pooler_head_rows_are_averaged_over_the_sequences(tiny_models):
    model = rl.load(str(tiny_models["bert2"]), readout=0)
    res = conflict(model, DEMO_PAIRS, n_boot=N_BOOT)
    hf = model.model
    h = _hf_hidden(model, DEMO_PAIRS)
    dense, clf = hf.bert.pooler.dense, hf.classifier
    z = h @ dense.weight.detach().double().T + dense.bias.detach().double()
    rows = (clf.weight.detach().double()[None] * (torch.tanh(z) / z)[:, None, :]) @ dense.weight.detach().double()
    mean_rows = rows.mean(0)
    assert res.cosine[0, 1] == pytest.approx(_cos(mean_rows[0], mean_rows[1]), abs=1e-5)
    assert res.cosine_residual is None  # post-norm encoder: no final norm, the head reads the last layer
    assert "averaged over the 16 sequences" in res.direction_note
    values = model.objectives(DEMO_PAIRS)
    np.testing.assert_allclose(res.margins, values[0::2] - values[1::2], rtol=1e-5, atol=1e-5)


# ---- the relation rules on margins whose answer is known by construction -------------------------

def test_independent_decisive_terms_disagree_on_half_the_pairs():
    # Two terms decisive on every pair (|m| = 1) with independent signs: exactly half disagree.
    signs = np.array([[1, 1], [1, -1], [-1, 1], [-1, -1]] * 50, dtype=float)
    d, a = shares(signs, 0.25)
    assert d[0, 1] == 0.5 and a[0, 1] == 0.5 and d[0, 0] == 0 and a[0, 0] == 1
    ci = bootstrap(signs, 0.25, N_BOOT, 0)
    assert relations(ci["disagree"], ci["agree"], 0.05)[0, 1] == "conflicting"


def test_orthogonal_aligned_and_mixed_labels():
    rng = np.random.default_rng(0)
    x = rng.normal(size=200)
    # Orthogonal: each term moves only on its own half of the pairs, so they are never both decisive.
    ortho = np.stack([np.r_[x[:100], np.zeros(100)], np.r_[np.zeros(100), x[100:]]], 1)
    # Aligned: the second term is the first with a small jitter.
    aligned = np.stack([x, x + 0.01 * rng.normal(size=200)], 1)
    # Mixed: they disagree on 4 % of the pairs, too few to call conflicting, too many to call aligned.
    mixed = np.stack([np.abs(x) + 1, np.where(np.arange(200) < 8, -1.0, 1.0) * (np.abs(x) + 1)], 1)
    for margins, label in ((ortho, "orthogonal"), (aligned, "aligned"), (mixed, "mixed")):
        ci = bootstrap(margins, 0.25, N_BOOT, 0)
        rel = relations(ci["disagree"], ci["agree"], 0.05)
        assert rel[0, 1] == label and rel[0, 0] == "self", (label, ci)


def test_batched_spearman_matches_the_reference_with_ties():
    rng = np.random.default_rng(1)
    m = rng.integers(0, 5, size=(6, 30, 3)).astype(float)  # many ties
    rho = spearman_matrix(m)
    for b in range(6):
        for i in range(3):
            for j in range(3):
                assert rho[b, i, j] == pytest.approx(spearman(m[b, :, i], m[b, :, j]), abs=1e-12)
    m[0, :, 1] = 2.0
    assert np.isnan(spearman_matrix(m)[0, 0, 1])


# ---- errors and the command line -----------------------------------------------------------------

def test_errors_name_the_fix(organisms, two_objective):
    single = rl.load(str(organisms[("list", 1.0)]))
    pairs = ORGANISMS["list"].pairs(10, seed=1)
    with pytest.raises(ValueError, match="terms="):
        conflict(single, pairs)
    with pytest.raises(ValueError, match="at least two"):
        conflict(single, pairs, terms={"only": pairs})
    with pytest.raises(ValueError, match="has no pairs"):
        conflict(single, pairs, terms={"a": pairs, "b": []})
    with pytest.raises(ValueError, match="list of rewardlens.Pair"):
        conflict(single, ["a text", "another", "third"], terms={"a": pairs, "b": pairs})
    with pytest.raises(ValueError, match="at least 3 pairs"):
        conflict(single, pairs[:2], terms={"a": pairs, "b": pairs})
    same = [rl.Pair("Say hi.", "Hello there.", "Hello there.")]
    with pytest.raises(ValueError, match="'flat' has no direction"):
        conflict(single, pairs, terms={"a": pairs, "flat": same})
    with pytest.raises(ValueError, match="tol"):
        conflict(two_objective[0], pairs, tol=-1)
    with pytest.raises(ValueError, match="min_share"):
        conflict(two_objective[0], pairs, min_share=0)


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_objectives_and_terms(capsys, tmp_path, organisms, two_objective):
    model, _, pairs, _ = two_objective
    folder = str(organisms[("two_objective", 1.0)])
    eval_file = str(save_pairs(pairs[:100], tmp_path / "eval.jsonl"))
    out = _json(capsys, ["conflict", folder, "--pairs", eval_file, "--json", "--boot", str(N_BOOT)])
    api = conflict(model, pairs[:100], n_boot=N_BOOT)
    row = out["pairs"][0]
    assert out["names"] == ["formatting", "confidence"] and out["n_pairs"] == 100
    assert row["relation"] == "conflicting" == api.relation[0, 1]
    assert row["disagree"] == pytest.approx(api.disagree[0, 1]) and row["disagree_lo"] == pytest.approx(
        api.disagree_ci[0, 1, 0])
    assert out["cosine"][0][1] == pytest.approx(api.cosine[0, 1])
    list_file = str(save_pairs(ORGANISMS["list"].pairs(40, seed=7), tmp_path / "list.jsonl"))
    conf_file = str(save_pairs(ORGANISMS["confidence"].pairs(40, seed=7), tmp_path / "conf.jsonl"))
    assert main(["conflict", folder, "--pairs", eval_file, "--term", f"list={list_file}",
                 "--term", f"confidence={conf_file}", "--boot", str(N_BOOT)]) == 0
    text = capsys.readouterr().out
    assert "user-defined terms" in text and "conflicting" in text and "list" in text
    with pytest.raises(SystemExit):
        main(["conflict", folder, "--pairs", eval_file, "--term", "no-equals-sign"])
    single = str(organisms[("list", 1.0)])
    assert main(["conflict", single, "--pairs", eval_file]) == 2
    assert "terms=" in capsys.readouterr().err
