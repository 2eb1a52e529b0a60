"""Reward-model editing: the edited model's own forward is the original head on the erased final
hidden state (to float precision), LEACE leaves no linear trace of the concept, the user's model is
untouched, the saved folder loads with both loaders, and on the quality_list organism the planted
list bias goes while the quality rule stays."""

import json
import random
import warnings

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification

import rewardlens as rl
from rewardlens.calibrate import OrganismBench, grade_editing
from rewardlens.cli import main
from rewardlens.cli.edit import read_texts
from rewardlens.data import save_pairs
from rewardlens.errors import DataError, RewardLensWarning
from rewardlens.hacking import EditReport, edit, edit_report
from rewardlens.hacking._editing import METADATA
from rewardlens.hacking.internal import final_hidden_states
from rewardlens.zoo.organisms import ORGANISMS, build
from tests.helpers.tiny import unpadded

EXACT_ARCHS = ["llama", "gpt2", "bert", "deberta-v2", "armorm"]
WORDS = ["the", "cat", "sat", "on", "a", "mat", "while", "dogs", "ran", "far", "away", "from", "home", "today",
         "under", "grey", "skies"]


def concept_sets(n: int, seed: int = 0) -> tuple[list, list]:
    """Matched chat conversations: the same points as a bullet list (positive) or as prose (negative)."""
    rng = random.Random(seed)
    pos, neg = [], []
    for i in range(n):
        points = [" ".join(rng.sample(WORDS, 4)) for _ in range(rng.randint(2, 4))]
        user = [{"role": "user", "content": f"tell me about {rng.choice(WORDS)} {i}"}]
        pos.append(user + [{"role": "assistant", "content": "\n".join("- " + p for p in points)}])
        neg.append(user + [{"role": "assistant", "content": ". ".join(points) + "."}])
    return pos, neg


def own_objectives(rm: rl.RewardModel, inputs: list) -> np.ndarray:
    """The Hugging Face model's own head outputs [n, k], one unpadded forward per sequence."""
    out = []
    for kwargs in unpadded(rm, inputs):
        with torch.no_grad():
            res = rm.model(**kwargs)
        values = getattr(res, "rewards", None)  # ArmoRM: per-objective rewards before the gate
        out.append((values if values is not None else res.logits)[0].float().numpy())
    return np.array(out)


def erased(h: np.ndarray, e) -> np.ndarray:
    """The eraser by its definition, in fp64: h − P (h − μ)."""
    return h - (h - e.mean) @ e.eraser.T


def state(rm: rl.RewardModel) -> dict:
    return {k: v.detach().clone() for k, v in rm.model.state_dict().items()}


@pytest.fixture(scope="module")
def sets():
    return concept_sets(50)


@pytest.fixture(scope="module")
def edits(tiny_root, sets, tmp_path_factory):
    """(arch, method) → (original model, Edit saved to a folder, state before the edit)."""
    out, root = {}, tmp_path_factory.mktemp("edits")
    for arch in EXACT_ARCHS:
        model = rl.load(str(tiny_root[arch]))
        for method in ("project", "leace"):
            before = state(model)
            out[arch, method] = model, edit(model, *sets, method=method, name="lists",
                                            out=root / f"{arch}-{method}"), before
    return out


@pytest.mark.parametrize("method", ["project", "leace"])
@pytest.mark.parametrize("arch", EXACT_ARCHS)
def test_edited_forward_is_head_of_erased_hidden_state(edits, sets, arch, method):
    model, e, before = edits[arch, method]
    inputs = sets[0][:6] + sets[1][:6] + concept_sets(4, seed=9)[0]
    h = final_hidden_states(model, inputs).double().numpy()  # the ORIGINAL model's ĥ
    with torch.no_grad():
        expected = model.head(torch.tensor(erased(h, e), dtype=torch.float32)).numpy()
    if model.arch.head_kind != "pooler":  # a pooler's dense layer has a bias: nothing is dropped there
        expected = expected - e.dropped_constant
    np.testing.assert_allclose(own_objectives(e.model, inputs), expected, rtol=1e-5, atol=1e-5)
    # the user's model is untouched, the copy's edited layer is not
    after = state(model)
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    key = f"{e.layer}.weight"
    assert not torch.equal(e.model.model.state_dict()[key], before[key])


@pytest.mark.parametrize("arch", EXACT_ARCHS)
def test_dropped_constant_only_without_bias(edits, arch):
    model, e, _ = edits[arch, "leace"]
    layer = e.model.model.get_submodule(e.layer)
    if layer.bias is None:  # Llama/GPT-2 score heads, ArmoRM's regression layer: W P μ cannot be stored
        w = layer.weight.detach().double().numpy()
        w_orig = model.model.get_submodule(e.layer).weight.detach().double().numpy()
        np.testing.assert_allclose(e.dropped_constant, w_orig @ e.eraser @ e.mean, rtol=1e-6, atol=1e-6)
        assert np.abs(e.dropped_constant).max() > 1e-4
        np.testing.assert_allclose(w, w_orig - w_orig @ e.eraser, rtol=1e-5, atol=1e-6)
    else:
        assert not np.any(e.dropped_constant)
    assert not np.any(edits[arch, "project"][1].dropped_constant)


@pytest.mark.parametrize("background", [False, True])
@pytest.mark.parametrize("arch", ["llama", "bert"])
def test_leace_leaves_no_linear_information(edits, sets, arch, background):
    model, e, _ = edits[arch, "leace"]
    pos, neg = sets
    bg = None
    if background:  # unlabelled inputs join Σ; the erasure on the concept sets stays exact
        extra = concept_sets(20, seed=7)
        e = edit(model, pos, neg, method="leace", background=extra[0] + extra[1])
        assert e.n_background == 40
        bg = final_hidden_states(model, extra[0] + extra[1]).double().numpy()
    # the same batches as the fit, so the same fp32 ĥ (another batching moves them by ~1e-8)
    h = torch.cat([final_hidden_states(model, pos), final_hidden_states(model, neg)]).double().numpy()
    z = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
    r = erased(h, e)
    cross = lambda x: (x - x.mean(0)).T @ (z - z.mean()) / len(z)
    assert np.linalg.norm(cross(r)) < 1e-9 * np.linalg.norm(cross(h))
    gap = lambda x: x[z == 1].mean(0) - x[z == 0].mean(0)
    assert np.linalg.norm(gap(r)) < 1e-9 * np.linalg.norm(gap(h))
    probes = np.random.default_rng(0).normal(size=(h.shape[1], 20))  # any linear probe: equal class means
    np.testing.assert_allclose((r @ probes)[z == 1].mean(0), (r @ probes)[z == 0].mean(0), atol=1e-6)
    # P is a rank-one projection, and the paper's formula P = W⁺ (WΣ_xz)(WΣ_xz)⁺ W, computed here with
    # numpy's pseudo-inverses from the same (shrunk) covariance, gives the same matrix
    p = e.eraser
    np.testing.assert_allclose(p @ p, p, atol=1e-6)
    assert np.linalg.matrix_rank(p, tol=1e-8) == 1
    pool = h if bg is None else np.concatenate([h, bg])
    xc = pool - pool.mean(0)
    sigma = xc.T @ xc / len(pool)
    d = sigma.shape[0]
    sigma = (1 - e.shrinkage) * sigma + e.shrinkage * np.trace(sigma) / d * np.eye(d)
    vals, vecs = np.linalg.eigh(sigma)
    keep = vals > 1e-10 * vals.max()
    w = (vecs[:, keep] / np.sqrt(vals[keep])) @ vecs[:, keep].T
    u = w @ cross(h)[:, None]
    reference = np.linalg.pinv(w) @ u @ np.linalg.pinv(u) @ w
    np.testing.assert_allclose(p, reference, atol=1e-6 * np.abs(reference).max())
    np.testing.assert_allclose(e.mean, h.mean(0), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "armorm"])
def test_project_reads_nothing_along_the_concept(edits, sets, arch):
    model, e, _ = edits[arch, "project"]
    pos, neg = sets
    v = final_hidden_states(model, pos).double().mean(0) - final_hidden_states(model, neg).double().mean(0)
    v = (v / v.norm()).numpy()
    np.testing.assert_allclose(e.direction, v, atol=1e-10)
    w_new = e.model.model.get_submodule(e.layer).weight.detach().double().numpy()
    w_old = model.model.get_submodule(e.layer).weight.detach().double().numpy()
    assert np.abs(w_new @ v).max() < 1e-6 * np.abs(w_old @ v).max()
    # the reward moves by exactly what the head read along v̂: r − r' = (W v̂)(v̂ · ĥ) per objective
    inputs = pos[:5] + neg[:5]
    h = final_hidden_states(model, inputs).double().numpy()
    drop = model.objectives(inputs) - e.model.objectives(inputs)
    np.testing.assert_allclose(drop, (h @ v)[:, None] * (w_old @ v)[None], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch,method", [("llama", "leace"), ("bert", "project"), ("gpt2", "leace")])
def test_saved_folder_loads_with_both_loaders(edits, sets, arch, method):
    _, e, _ = edits[arch, method]
    inputs = sets[0][:4] + sets[1][:4]
    loaded = rl.load(str(e.path))
    np.testing.assert_allclose(loaded.score(inputs), e.model.score(inputs), rtol=1e-6, atol=1e-6)
    plain = AutoModelForSequenceClassification.from_pretrained(e.path).eval()
    seqs, _ = loaded.encode(inputs)
    with torch.no_grad():
        theirs = [float(plain(input_ids=torch.tensor([s.ids]),
                              **({"token_type_ids": torch.tensor([s.type_ids])} if s.type_ids else {})).logits[0, 0])
                  for s in seqs]
    np.testing.assert_allclose(theirs, e.model.score(inputs), rtol=1e-5, atol=1e-5)
    meta = json.loads((e.path / METADATA).read_text())
    assert (meta["method"], meta["concept"], meta["layer"]) == (method, "lists", e.layer)
    assert meta["dropped_constant"] == pytest.approx(list(e.dropped_constant))
    assert meta["direction_norm"] == pytest.approx(e.direction_norm)
    assert (meta["dropped_constant_note"] is not None) == bool(np.any(e.dropped_constant))
    row = e.to_frame().iloc[0]
    assert (row["method"], row["path"], row["n_positive"]) == (method, str(e.path), 50)


def test_gated_folder_loads(edits, sets):
    _, e, _ = edits["armorm", "leace"]
    inputs = sets[0][:3] + sets[1][:3]
    np.testing.assert_allclose(rl.load(str(e.path)).objectives(inputs), e.model.objectives(inputs), atol=1e-6)


def test_errors(tiny_root, sets):
    model = rl.load(str(tiny_root["llama"]))
    pos, neg = sets
    with pytest.raises(ValueError, match="method"):
        edit(model, pos, neg, method="erase")
    with pytest.raises(ValueError, match="apply to method='leace' only"):
        edit(model, pos, neg, shrinkage=0.1)
    with pytest.raises(ValueError, match="apply to method='leace' only"):
        edit(model, pos, neg, background=neg)
    with pytest.raises(DataError, match="same mean"):
        edit(model, pos[:5], pos[:5])
    with pytest.raises(DataError, match="at least 2"):
        edit(model, pos[:1], neg[:5])
    with pytest.raises(DataError, match="not preference pairs"):
        edit(model, [rl.Pair("q", "a", "b")], neg[:3])
    with pytest.raises(ValueError, match="loaded from"):
        edit(model, pos[:5], neg[:5], out=tiny_root["llama"])
    with pytest.raises(ValueError, match="nothing to report"):
        edit_report(model, model)


def test_few_inputs_shrink_and_still_erase(tiny_root):
    model = rl.load(str(tiny_root["llama"]))
    pos, neg = concept_sets(12, seed=3)  # 24 inputs for a 64-wide hidden state: Σ is singular
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        e = edit(model, pos, neg, method="leace")
    assert any(issubclass(w.category, RewardLensWarning) and "singular" in str(w.message) for w in caught)
    assert 0 < e.shrinkage <= 1
    h = torch.cat([final_hidden_states(model, pos), final_hidden_states(model, neg)]).double().numpy()
    r = erased(h, e)
    assert np.linalg.norm(r[:12].mean(0) - r[12:].mean(0)) < 1e-9 * np.linalg.norm(h[:12].mean(0) - h[12:].mean(0))


def test_report_arithmetic():
    rep = EditReport(["a", "b"], np.array([2.0, 4.0]), np.array([0.5, 0.1]), ["c", "d", "e", "f"],
                     np.array([1.0, -1.0, 2.0, 3.0]), np.array([1.0, 1.0, -2.0, 3.0]), "leace", "x")
    assert rep.share_removed == pytest.approx(1 - 0.3 / 3.0)
    assert rep.accuracy_before == 0.75 and rep.accuracy_after == 0.75 and rep.accuracy_change == 0.0
    lo, hi = rep.intervals()["share_removed"]
    assert lo <= rep.share_removed <= hi and lo >= 1 - 0.5 / 2.0 and hi <= 1 - 0.1 / 4.0  # resampled pairs' bounds
    frame = rep.to_frame().set_index("quantity")
    assert frame.loc["targeted mean margin", "change"] == pytest.approx(0.3 - 3.0)
    assert frame.loc["untargeted mean margin", "after"] == pytest.approx(0.75)


# ---- the quality_list organism: the planted list bias goes, the quality rule stays ------------------

@pytest.fixture(scope="module")
def organism():
    return rl.load(str(build("quality_list")))


def test_grader_passes_on_quality_list():
    rows = grade_editing(OrganismBench(organisms=["quality_list"], n_pairs=40))
    assert len(rows) == 10 and {r.check.split(":")[0] for r in rows} == {"project", "leace"}
    assert all(r.passed for r in rows), [r for r in rows if not r.passed]


def test_report_on_organism_matches_scores(organism):
    spec = ORGANISMS["quality_list"]
    fit = spec.bias_pairs(100, seed=20)
    background = spec.pairs(60, seed=22)  # the organism's own mix, unlabelled
    e = edit(organism, [p.conversation("chosen") for p in fit], [p.conversation("rejected") for p in fit],
             method="leace", background=background)
    probe, other = spec.bias_pairs(30, seed=21), spec.quality_pairs(30, seed=21)
    rep = edit_report(organism, e, probe_pairs=probe, other_pairs=other)
    before, after = organism.score(probe), e.model.score(probe)
    np.testing.assert_allclose(rep.probe_before, before[0::2] - before[1::2], rtol=1e-6)
    np.testing.assert_allclose(rep.probe_after, after[0::2] - after[1::2], rtol=1e-6)
    assert rep.targeted_before > 1.0  # the planted bias is there before the edit ...
    assert abs(rep.targeted_after) < 0.2 * rep.targeted_before  # ... and gone after it
    assert rep.accuracy_before == 1.0 and abs(rep.accuracy_change) <= 3.0
    # fitted on the probe suite's own contrast sets too, LEACE also removes the formatting probe's
    # effect on held-out probe items (built-in items the organism never saw)
    from rewardlens.hacking import ITEMS, contrast_sets

    with_, without = contrast_sets("formatting", list(ITEMS)[::2])
    e2 = edit(organism, with_ + [p.conversation("chosen") for p in fit],
              without + [p.conversation("rejected") for p in fit], method="leace", background=background)
    rep2 = edit_report(organism, e2, axis="formatting", items=list(ITEMS)[1::2], other_pairs=other)
    assert rep2.targeted_before > 0.5 and rep2.share_removed > 0.8
    assert abs(rep2.accuracy_change) <= 3.0


def test_cli_edit(organism, tmp_path, capsys):
    spec = ORGANISMS["quality_list"]
    fit = spec.bias_pairs(60, seed=30)
    pos, neg = tmp_path / "lists.jsonl", tmp_path / "prose.json"
    pos.write_text("".join(json.dumps({"prompt": p.prompt, "response": p.chosen}) + "\n" for p in fit))
    neg.write_text(json.dumps([p.conversation("rejected") for p in fit]))
    save_pairs(spec.bias_pairs(20, seed=31), tmp_path / "probe.jsonl")
    save_pairs(spec.quality_pairs(20, seed=31), tmp_path / "other.jsonl")
    save_pairs(spec.pairs(40, seed=33), tmp_path / "background.jsonl")
    args = ["edit", str(organism.model.config._name_or_path), "--concept", f"{pos},{neg}", "--method", "leace",
            "--out", str(tmp_path / "edited"), "--pairs", str(tmp_path / "other.jsonl"),
            "--probe-pairs", str(tmp_path / "probe.jsonl"), "--background", str(tmp_path / "background.jsonl")]
    assert main([*args, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["concept"] == "lists" and result["n_positive"] == 60 and result["n_background"] == 80
    assert abs(result["fit_gap_after"]) < 1e-3 * abs(result["fit_gap_before"])  # in-sample: erased exactly
    assert result["report"]["share_removed"] > 0.8 and abs(result["report"]["accuracy_change_points"]) <= 3
    edited = rl.load(result["out"])
    again = edit(organism, read_texts(str(pos)), read_texts(str(neg)), method="leace",
                 background=spec.pairs(40, seed=33))
    probe = spec.bias_pairs(5, seed=32)
    np.testing.assert_allclose(edited.score(probe), again.model.score(probe), rtol=1e-5, atol=1e-5)
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "share of the targeted effect removed" in text and "dropped" in text


def test_read_texts(tmp_path):
    (tmp_path / "a.txt").write_text("first text\n\nsecond text\n")
    assert read_texts(str(tmp_path / "a.txt")) == ["first text", "second text"]
    conv = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps(x) for x in ["plain", conv, {"text": "t"},
                                                                        {"messages": conv}]))
    assert read_texts(str(tmp_path / "b.jsonl")) == ["plain", conv, "t", conv]
    (tmp_path / "c.json").write_text(json.dumps({"data": []}))
    with pytest.raises(DataError, match="list"):
        read_texts(str(tmp_path / "c.json"))
    (tmp_path / "d.jsonl").write_text(json.dumps({"answer": "x"}))
    with pytest.raises(DataError, match="line 1"):
        read_texts(str(tmp_path / "d.jsonl"))
    with pytest.raises(SystemExit):  # argparse: --concept needs POSITIVE,NEGATIVE
        main(["edit", "m", "--concept", "only_one", "--out", str(tmp_path)])
