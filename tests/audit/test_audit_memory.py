"""A pair too long for accelerator memory even alone (a fake CUDA out-of-memory error above a width,
on CPU): the audit skips it, records it in the store, says so, and computes every other pair exactly
as an audit of those pairs alone would."""

import warnings

import numpy as np
import torch

import rewardlens as rl
from rewardlens.audit import Plan, Store, audit
from rewardlens.audit.internal import content_key
from rewardlens.audit.report import summary
from rewardlens.model.internal import hidden_arg
from rewardlens.zoo import DEMO_PAIRS

PLAN = Plan(chunk_size=3, probes=False, concepts=False, divergence=False, tokens=False)


def _pairs():
    long = rl.Pair("Tell me everything.", " ".join(["This answer goes on and on."] * 12), "No.", id="long")
    return [*[rl.Pair(p.prompt, p.chosen, p.rejected, id=f"p{i}") for i, p in enumerate(DEMO_PAIRS[:4])], long]


def test_a_pair_that_fits_in_no_batch_is_skipped_recorded_and_named(tiny_root, tmp_path):
    model = rl.load(str(tiny_root["llama"]))
    pairs = _pairs()
    width = max(len(s.ids) for s in model.encode(pairs[:4])[0])

    def hook(module, args, kwargs):
        if hidden_arg(args, kwargs).shape[1] > width:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (fake)")

    handle = model.layers[0].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            res = audit(model, pairs, store=tmp_path / "results.sqlite", plan=PLAN)
    finally:
        handle.remove()
    said = [str(w.message) for w in seen if "skipped" in str(w.message)]
    assert len(said) == 1 and "long" in said[0]
    assert res.skipped == {"long": "out of accelerator memory at batch size 1"}
    assert res.pair_ids == ["p0", "p1", "p2", "p3"]
    alone = audit(model, pairs[:4], plan=PLAN)
    np.testing.assert_allclose(res.heads.values, alone.heads.values, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(res.faithfulness.total, alone.faithfulness.total, rtol=1e-5, atol=1e-6)
    store = Store(tmp_path / "results.sqlite")
    try:
        names = {key.instrument: [u for u, _ in store.records(key)] for key, _ in store.runs()}
    finally:
        store.close()
    assert names["skipped"] == [content_key(pairs[4])]  # the store records it: a resumed run does not try it again
    again = audit(model, pairs, store=tmp_path / "results.sqlite", plan=PLAN)
    assert again.skipped == res.skipped and again.pair_ids == res.pair_ids
    assert summary(again)["skipped"] == res.skipped  # numbers.json and the report's summary name it


def test_a_pair_that_fits_in_no_batch_is_left_out_of_the_divergence_fit(tiny_root, monkeypatch):
    """Divergence's natural fit is traced before the per-pair stage: a pair too long for memory fails in the
    fit's forward first, is left out of the fit there, and is skipped by the per-pair stage as without
    divergence; the others' scores are those of one `patch` call over them alone."""
    import importlib

    model = rl.load(str(tiny_root["llama"]))
    pairs = _pairs()
    width = max(len(s.ids) for s in model.encode(pairs[:4])[0])
    natural = importlib.import_module("rewardlens.audit._natural")
    failed, real = [], natural.natural_states

    def states(m, seqs, b, **k):
        if any(len(s.ids) > width for s in seqs):
            failed.append(len(seqs))
        return real(m, seqs, b, **k)

    monkeypatch.setattr(natural, "natural_states", states)

    def hook(module, args, kwargs):
        if hidden_arg(args, kwargs).shape[1] > width:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (fake)")

    handle = model.layers[0].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = audit(model, pairs, plan=Plan(chunk_size=3, probes=False, concepts=False, tokens=False))
    finally:
        handle.remove()
    assert failed, "the fit's forward met the long pair"
    assert res.skipped == {"long": "out of accelerator memory at batch size 1"}
    assert res.divergence is not None and res.divergence.pair_ids == ["p0", "p1", "p2", "p3"]
    want = rl.patch(model, pairs[:4], level="head", divergence=True)
    np.testing.assert_allclose(res.divergence.divergence, want.divergence, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(res.divergence.effect, res.faithfulness.total)
