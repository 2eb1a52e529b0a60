"""The audit's added whole-model instruments on a multi-objective (ArmoRM-like) head: divergence scores
and the conflicts between the head's terms equal the instruments run directly, are stored once (a
second run computes neither), come back with the pairs' subsets, and render in the report; too few
pairs for either leaves it out and the report says why."""

import importlib
import json
from html.parser import HTMLParser

import numpy as np
import pytest
import torch

import rewardlens as rl
from rewardlens.audit import NaturalStates, Plan, Store, audit
from rewardlens.audit.internal import collect, content_key, run_pairs, run_whole
from rewardlens.audit.report import write_report
from rewardlens.model import TraceKey
from tests.helpers import tiny

PLAN = Plan(chunk_size=3, probes=False, concepts=False)
SUBSETS = ["chat", "chat-hard", None, "chat", "safety"]


@pytest.fixture(scope="module")
def armo(tmp_path_factory, tokenizer):
    return rl.load(str(tiny.build("armorm", tokenizer, tmp_path_factory.mktemp("armo"))))


def _pairs(n: int) -> list[rl.Pair]:
    base = tiny.PAIRS
    return [rl.Pair(f"({i}) {base[i % len(base)].prompt}" if isinstance(base[i % len(base)].prompt, str)
                    else base[i % len(base)].prompt, base[i % len(base)].chosen, base[i % len(base)].rejected + f" {i}",
                    id=f"p{i}", subset=SUBSETS[i % len(SUBSETS)]) for i in range(n)]


class Sections(HTMLParser):
    def __init__(self, text: str):
        super().__init__()
        self.figures, self.notrun, self.how, self._section = set(), set(), set(), None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = (a.get("class") or "").split()
        if tag == "section":
            self._section = a["id"]
        elif tag == "figure":
            self.figures.add(a["data-figure"])
        elif tag == "p" and "notrun" in cls:
            self.notrun.add(self._section)
        elif tag == "p" and "how" in cls:
            self.how.add(self._section)


def test_divergence_and_conflicts_equal_the_instruments_and_are_stored_once(armo, tmp_path, monkeypatch):
    assert armo.head.n_objectives > 1
    pairs = _pairs(5)
    path = tmp_path / "results.sqlite"
    res = audit(armo, pairs, store=path, plan=PLAN)
    own = rl.hacking.conflict(armo, pairs)
    assert res.conflicts is not None and res.conflicts.names == own.names
    np.testing.assert_allclose(res.conflicts.margins, own.margins, atol=1e-5)
    np.testing.assert_allclose(res.conflicts.disagree, own.disagree)
    assert res.conflicts.relation.tolist() == own.relation.tolist()  # labels survive the store as text
    scored = rl.patch(armo, pairs, level="head", divergence=True)
    assert res.divergence is not None and res.divergence.names == scored.names
    np.testing.assert_allclose(res.divergence.divergence, scored.divergence, atol=1e-5)
    np.testing.assert_array_equal(res.divergence.effect, res.faithfulness.total)  # the effects shown: one sweep
    assert res.subsets == SUBSETS

    def boom(*args, **kwargs):
        raise AssertionError("a whole-model instrument was computed again")

    runner = importlib.import_module("rewardlens.audit._whole")  # `rewardlens.audit` names the function too
    monkeypatch.setattr(importlib.import_module("rewardlens.audit._divergence"), "patch", boom)
    monkeypatch.setattr(importlib.import_module("rewardlens.audit._natural"), "natural_states", boom)  # no fit
    monkeypatch.setattr(runner, "conflict", boom)
    again = audit(armo, pairs, store=path, plan=PLAN)
    np.testing.assert_array_equal(again.divergence.divergence, res.divergence.divergence)
    assert again.conflicts.relation.tolist() == res.conflicts.relation.tolist()
    store = Store(path)
    try:
        names = [k.instrument for k, _ in store.runs()]
    finally:
        store.close()
    assert names.count("divergence/head/noising") == 1 and names.count("conflict/objectives") == 1

    page = write_report(res, tmp_path / "out")
    sections = Sections(page.read_text(encoding="utf-8"))
    assert {"conflicts", "crystallization", "estimands"} <= sections.figures
    assert {"conflicts", "divergence", "subsets"} <= sections.how and not {"conflicts", "divergence"} & sections.notrun
    numbers = json.loads((tmp_path / "out" / "numbers.json").read_text())
    assert [(r["term_a"], r["term_b"]) for r in numbers["conflicts"]["pairs"]] == \
        [(r["term_a"], r["term_b"]) for r in own.pairs_table()]
    assert numbers["subsets"]["names"] == ["chat", "chat-hard", "safety", "(no subset)"]
    assert {name: v["n"] for name, v in numbers["subsets"]["accuracy"].items()} == \
        {"chat": 2, "chat-hard": 1, "safety": 1, "(no subset)": 1}


def test_too_few_pairs_leave_divergence_and_conflicts_out(armo, tmp_path):
    pairs = _pairs(2)  # divergence's natural fit needs 8 sequences; a conflict's rank correlation 3 pairs
    res = audit(armo, pairs, plan=PLAN)
    assert res.divergence is None and res.conflicts is None
    sections = Sections(write_report(res, tmp_path).read_text(encoding="utf-8"))
    assert {"divergence", "conflicts"} <= sections.notrun
    assert "tokens" not in sections.notrun  # token attribution runs on any number of pairs


def test_concepts_are_stored_under_their_item_set_and_never_read_back_for_another(tmp_path, monkeypatch):
    """Under the staged budget the concepts use the items of the stage the stored probes stopped at, or all
    items when none are stored: concepts computed before the probes ran are not reused once they have, and
    the audit reads back the set that matches its probes. (The interim rule decides every axis at the first
    look here: where the probes stop, not the demo's effects, is the point.)"""
    from rewardlens.audit.internal import collect, run_pairs, run_whole
    from rewardlens.hacking import concepts, spread_items
    from rewardlens.zoo import AUDIT_PAIRS, demo_model_dir

    monkeypatch.setattr(importlib.import_module("rewardlens.hacking._probes"), "decide",
                        lambda mean, *_: ("negligible",) * len(mean))
    model = rl.load(str(demo_model_dir()))
    pairs = list(AUDIT_PAIRS)
    store = Store(tmp_path / "results.sqlite")
    quick = dict(divergence=False, tokens=False)
    run_pairs(model, pairs, store, Plan(**quick))
    run_whole(model, pairs, store, Plan(probes=False, **quick))  # no probes stored: every item
    before = collect(model, pairs, store, Plan(probes=False, **quick)).concepts
    run_whole(model, pairs, store, Plan(**quick))  # the probes stop at a stage: its items, computed anew
    after = collect(model, pairs, store, Plan(**quick))
    assert before is not None and after.concepts is not None and after.probes is not None
    stage = after.probes.stages[after.probes.stage - 1]
    assert stage < 72, "the probes stopped before the full set, so the two item sets differ"
    want = concepts(model, items=spread_items(stage), batch_size=16)
    np.testing.assert_allclose(after.concepts.slope, want.slope, rtol=1e-4, atol=1e-6)
    assert after.concepts.n_positive.sum() < before.n_positive.sum(), "the stage's items, not all of them"
    store.close()


def test_the_probes_scale_comes_from_the_stored_margins_without_scoring_the_pairs_again(tmp_path, monkeypatch):
    """The probes' alternative scale is the pairs' mean |margin| (the floor's is the items' reward sd): the
    audit takes the margins its per-pair part stored, so the pairs are not scored a second time; the scale
    equals the one from scoring them, and so do the flags and the fragile marks."""
    from rewardlens.audit.internal import collect, run_pairs, run_whole
    from rewardlens.hacking import probe, spread_items
    from rewardlens.zoo import AUDIT_PAIRS, demo_model_dir

    model = rl.load(str(demo_model_dir()))
    pairs = list(AUDIT_PAIRS)
    store = Store(tmp_path / "results.sqlite")
    plan = Plan(probe_items=6, concepts=False, divergence=False, tokens=False)
    run_pairs(model, pairs, store, plan)
    scored: list[int] = []
    real = model.score
    monkeypatch.setattr(model, "score", lambda inputs, **kw: scored.append(len(inputs)) or real(inputs, **kw))
    run_whole(model, pairs, store, plan)
    got = collect(model, pairs, store, plan).probes
    monkeypatch.undo()
    want = probe(model, spread_items(6), reference=pairs, batch_size=16)
    assert got is not None and got.alt_scale_source == want.alt_scale_source == "mean |margin| of 8 reference pairs"
    assert got.alt_scale == pytest.approx(want.alt_scale, rel=1e-5) and got.scale == want.scale
    np.testing.assert_array_equal(got.flagged, want.flagged)
    np.testing.assert_array_equal(got.fragile, want.fragile)
    assert scored.count(len(pairs)) == 3, "parity's three scorings only: the probes scored no pair"
    with pytest.raises(ValueError, match="finite"):
        probe(model, spread_items(2), reference=np.array([0.5, np.nan]))
    store.close()


def test_divergence_scores_the_faithfulness_sweep_and_patches_only_the_pairs_it_resumed(armo, tmp_path, monkeypatch):
    """The natural fit is made first, from every pair's read-position residuals traced head-less in the chunks'
    spans; each chunk's faithfulness sweep is scored against it, so the divergence run's effects are the audit's
    total effects (one sweep) and no pair is patched again. Pairs an earlier run stored get the scored sweep
    alone. Either way the scores equal one `patch` call over every pair."""
    natural = importlib.import_module("rewardlens.audit._natural")
    real, traced = natural.natural_states, []
    monkeypatch.setattr(natural, "natural_states",
                        lambda m, seqs, b, **k: traced.append(len(seqs)) or real(m, seqs, b, **k))
    divergence = importlib.import_module("rewardlens.audit._divergence")
    alone, trace = [], divergence.trace_pairs
    monkeypatch.setattr(divergence, "trace_pairs", lambda m, p, **k: alone.append(len(p)) or trace(m, p, **k))
    pairs = _pairs(6)
    scored = rl.patch(armo, pairs, level="head", divergence=True)
    fresh = audit(armo, pairs, plan=PLAN)
    assert traced == [2, 6, 4]  # the fit: every pair's sides once, in the chunks' spans (1 pair, then 3, 2)
    assert alone == []  # no pair patched a second time
    np.testing.assert_array_equal(fresh.divergence.effect, fresh.faithfulness.total)  # the same patched runs
    np.testing.assert_allclose(fresh.divergence.divergence, scored.divergence, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fresh.divergence.patched_chosen, scored.patched_chosen, rtol=1e-5, atol=2e-5)
    assert fresh.divergence.pair_ids == scored.pair_ids
    twice = [*pairs, pairs[1]]  # a pair given twice: one unit, traced once, its sides counted twice in the fit
    np.testing.assert_allclose(audit(armo, twice, plan=PLAN).divergence.divergence,
                               rl.patch(armo, twice, level="head", divergence=True).divergence, rtol=1e-4, atol=1e-5)
    path = tmp_path / "results.sqlite"
    audit(armo, pairs[1::2], store=path, plan=PLAN)  # 3 pairs, not a prefix: stored, too few for divergence
    alone.clear()
    resumed = audit(armo, pairs, store=path, plan=PLAN)
    assert alone == [3]  # the 3 stored pairs, patched once more (one chunk); the 3 new ones scored in their own
    np.testing.assert_allclose(resumed.divergence.divergence, scored.divergence, rtol=1e-4, atol=1e-5)
    traced.clear()
    again = audit(armo, pairs, store=path, plan=PLAN)  # every score stored: no fit, no forward
    assert traced == [] and alone == [3]
    np.testing.assert_array_equal(again.divergence.divergence, resumed.divergence.divergence)


def test_the_fit_takes_the_residuals_the_chunk_traces_take(armo, monkeypatch):
    """The fit's head-less traces run in the chunks' spans and batch size, so the residuals it fits are bit for
    bit those each chunk's own trace captures (the scores equal those of a fit over the traces' residuals)."""
    runner = importlib.import_module("rewardlens.audit._runner")
    captured, trace = [], runner.trace_pairs

    def spy(m, p, **k):
        out = trace(m, p, **k)
        captured.append((list(p), out.clean.captured))
        return out

    monkeypatch.setattr(runner, "trace_pairs", spy)
    pairs = [*_pairs(5), _pairs(5)[2]]  # a pair given twice: one unit
    natural, store = NaturalStates(), Store(":memory:")
    try:
        run_pairs(armo, pairs, store, PLAN, natural=natural)
        assert natural.scoring is not None and len(natural.by_unit) == 5
        for part, got in captured:
            for j, pair in enumerate(part):
                for layer in range(armo.n_layers):
                    kept = natural.by_unit[content_key(pair)][:, layer]
                    assert torch.equal(kept, got[TraceKey.resid(layer)][2 * j: 2 * j + 2].cpu())
        run_whole(armo, pairs, store, PLAN, natural=natural)
        got = collect(armo, pairs, store, PLAN).divergence
    finally:
        store.close()
    scored = rl.patch(armo, pairs, level="head", divergence=True)
    np.testing.assert_allclose(got.divergence, scored.divergence, rtol=1e-4, atol=1e-5)


def test_natural_states_belong_to_the_model_that_kept_them(armo, tmp_path_factory, tokenizer):
    """The kept residuals are bound to the model that read them: the same folder loaded again fits from them,
    and another model is refused by name before its divergence could be fitted on them."""
    pairs = _pairs(4)
    natural, store = NaturalStates(), Store(":memory:")
    try:
        run_pairs(armo, pairs, store, PLAN, natural=natural)
        assert len(natural.by_unit) == 4 and natural.model is not None
        again = rl.load(str(armo.model.config._name_or_path))  # another object, the same folder
        seqs = [s for p in pairs for s in again.encode([p])[0]]
        fit = natural.fit(again, seqs, list(natural.by_unit), batch_size=4)  # the same weights: accepted
        other = rl.load(str(tiny.build("llama", tokenizer, tmp_path_factory.mktemp("llama"))))
        with pytest.raises(ValueError, match=r"NaturalStates hold the residuals of model .*fresh NaturalStates"):
            run_whole(other, pairs, Store(":memory:"), Plan(chunk_size=3, probes=False, concepts=False, tokens=False),
                      natural=natural)
        with pytest.raises(ValueError, match="fresh NaturalStates"):
            natural.keep(other, ["x"], {})
        np.testing.assert_allclose(fit.limits, natural.fit(armo, seqs, list(natural.by_unit), batch_size=4).limits)
    finally:
        store.close()
