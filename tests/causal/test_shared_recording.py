"""Attribution patching from the trace's own recording: `trace_pairs(record=mode)` records the targets'
layer inputs in the same forward, so `attribution_patch(clean=...)` runs no clean forward before its
backward, and its estimates equal those of the path that records them again (docs/design.md §5)."""

import contextlib
import dataclasses
import importlib
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import rewardlens as rl
from rewardlens.causal import attribution_patch, trace_pairs
from rewardlens.model import TraceKey
from rewardlens.model.internal import LayerTaps, Recording, collate, continuable, proof_tol
from rewardlens.zoo import DEMO_PAIRS

PAIRS = DEMO_PAIRS[:3]


@contextlib.contextmanager
def forwards(model: rl.RewardModel) -> Iterator[list[int]]:
    """The positions of each backbone forward while open, clean forwards of whole sequences only (a layer
    run alone, as the layer-at-a-time backward does, is none; nor is the read token alone continuing a
    cache, one position)."""
    seen: list[int] = []

    def count(_module, _args, kwargs):
        if kwargs["input_ids"].shape[1] > 1:
            seen.append(kwargs["input_ids"].shape[1])

    handle = model.backbone.register_forward_pre_hook(count, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


def _both(model: rl.RewardModel, mode: str) -> tuple[rl.Patching, rl.Patching, int, int]:
    """(unshared estimate, shared estimate, clean forwards of each), at head level."""
    plain = trace_pairs(model, PAIRS, level="head")
    shared = trace_pairs(model, PAIRS, level="head", record=mode)
    with forwards(model) as unshared_count:
        want = attribution_patch(model, PAIRS, level="head", mode=mode, clean=plain.clean)
    with forwards(model) as shared_count:
        got = attribution_patch(model, PAIRS, level="head", mode=mode, clean=shared.clean)
    held = shared.clean.recorded
    assert held is not None and all(rec.cache is not None for rec in held.recordings), \
        "layer inputs are taken and let go after use; caches stay for the read-position sweep"
    assert bool(held.where) == continuable(model, shared.clean.seqs)
    return want, got, len(unshared_count), len(shared_count)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "bert", "deberta-v2"])
@pytest.mark.parametrize("mode", ["noising", "ablation"])
def test_the_traces_recording_saves_the_clean_forward_and_changes_no_estimate(tiny_root, arch, mode):
    model = rl.load(str(tiny_root[arch]))
    want, got, unshared, shared = _both(model, mode)
    assert unshared >= 1, "the unshared path records its targets with a forward of their own"
    assert shared == 0, "from the trace's recording the backward needs no forward at all"
    assert np.abs(want.effect).max() > 1e-4, "estimates worth comparing"
    np.testing.assert_allclose(got.effect, want.effect, rtol=1e-5, atol=1e-6)
    for side in ("patched_chosen", "patched_rejected"):
        np.testing.assert_allclose(getattr(got, side), getattr(want, side), rtol=1e-5, atol=1e-6)


def test_only_the_targets_are_recorded(tiny_root):
    model = rl.load(str(tiny_root["llama"]))
    noising = trace_pairs(model, PAIRS, level="head", record="noising").clean.recorded
    ablation = trace_pairs(model, PAIRS, level="head", record="ablation").clean.recorded
    assert noising is not None and ablation is not None
    assert sorted(noising.where) == [0, 2, 4], "noising patches the chosen sides only"
    assert sorted(ablation.where) == list(range(6))
    # A causal decoder keeps its targets' keys and values (the read token's backward continues them),
    # not their layer inputs.
    assert sum(rec.size for rec in noising.recordings) == 3
    for rec in noising.recordings:
        assert rec.inputs == [] and len(rec.cache.layers) == model.n_layers
        assert all(layer.keys.shape[0] == rec.size for layer in rec.cache.layers)
    encoder = rl.load(str(tiny_root["bert"]))
    held = trace_pairs(encoder, PAIRS, level="head", record="noising").clean.recorded
    assert held is not None and sum(rec.inputs[0].shape[0] for rec in held.recordings) == 3
    assert all(len(rec.inputs) == encoder.n_layers and rec.cache is None for rec in held.recordings)
    assert trace_pairs(model, PAIRS, level="head").clean.recorded is None, "nothing is kept unless asked"


@pytest.mark.parametrize("arch", ["llama", "bert"])
def test_a_recording_that_fails_its_proof_falls_back_to_recording_again(tiny_root, arch):
    model = rl.load(str(tiny_root[arch]))
    want = attribution_patch(model, PAIRS, level="head", clean=trace_pairs(model, PAIRS, level="head").clean)
    shared = trace_pairs(model, PAIRS, level="head", record="noising")
    assert shared.clean.recorded is not None
    for rec in shared.clean.recorded.recordings:  # the recording no longer gives the clean run's output
        if rec.cache is not None:
            rec.cache.layers[-1].values.add_(1.0)
        else:
            rec.inputs[-1].add_(1.0)
    with forwards(model) as count:
        got = attribution_patch(model, PAIRS, level="head", clean=shared.clean)
    assert len(count) >= 1, "the failed proof sends the rows down today's path, which records them itself"
    np.testing.assert_allclose(got.effect, want.effect, rtol=1e-5, atol=1e-6)


def test_taps_hold_only_the_rows_they_keep_and_no_other_batchs_forward(tiny_root):
    model = rl.load(str(tiny_root["llama"]))
    seqs, _ = model.encode(PAIRS)
    ran, other = (collate(s, pad_id=model.pad_token_id, side="right", first=False, device=model.device)
                  for s in (seqs[:2], seqs[2:4]))
    with LayerTaps(model, keep=lambda ids, mask: torch.tensor([1])) as taps, torch.no_grad():
        model.backbone(**model.batch_kwargs(ran))
        assert taps.take(other, torch.tensor([1])) is None, "another batch's forward is not this one's recording"
        model.backbone(**model.batch_kwargs(ran))
        assert [x.shape[0] for x in taps.inputs] == [1] * model.n_layers, "only the kept row is ever held"
        cos = [kwargs["position_embeddings"][0] for _, kwargs in taps.calls]  # Llama's rotary table, every layer's
        assert cos[0].shape[0] == 1 and all(c is cos[0] for c in cos), "an argument every layer shares is sliced once"
        rec = taps.take(ran, torch.tensor([1]))
        assert taps.inputs == [], "taken: the taps let go of the forward"
        model.backbone(**model.batch_kwargs(ran))
        assert taps.take(ran, torch.tensor([0])) is None, "a row the taps did not keep has no recording"
    assert rec is not None
    want = Recording(model, ran)
    for layer in range(model.n_layers):
        np.testing.assert_array_equal(rec.inputs[layer].numpy(), want.inputs[layer][1:].numpy())
    np.testing.assert_array_equal(rec.last.numpy(), want.last[1:].numpy())


def test_in_bf16_the_trace_records_layer_inputs_and_the_backward_steps_from_them(tiny_root):
    """Where a bf16 continuation's proof cannot tell a bug from rounding (model/_continuing.py: proof_tol
    refuses the tiny random Llama), the trace keeps the layer inputs the layer-at-a-time backward needs, and
    that backward still runs no clean forward of its own."""
    model = rl.load(str(tiny_root["llama"]), dtype=torch.bfloat16)
    assert proof_tol(model) is None, "this test is about a refused proof"
    shared = trace_pairs(model, PAIRS, level="head", record="noising")
    assert shared.clean.recorded is not None
    assert all(rec.cache is None and len(rec.inputs) == model.n_layers for rec in shared.clean.recorded.recordings)
    with forwards(model) as count:
        got = attribution_patch(model, PAIRS, level="head", clean=shared.clean)
    assert count == [], "the backward starts from the trace's recording"
    assert np.isfinite(got.effect).all() and np.abs(got.effect).max() > 0


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2", "bert"])
def test_the_read_sweep_continues_the_caches_the_trace_kept(tiny_root, arch, monkeypatch):
    """After attribution patching, the read-position sweep starts its copies from the caches the trace kept
    (no clean forward of its own on a causal decoder), takes them (nothing holds them after), and patches
    to the same rewards as from a trace that kept nothing."""
    cached = importlib.import_module("rewardlens.causal._cached")
    model = rl.load(str(tiny_root[arch]))
    plain = trace_pairs(model, PAIRS, level="head")
    want = rl.causal.patch(model, PAIRS, level="head", clean=plain.clean)
    shared = trace_pairs(model, PAIRS, level="head", record="noising")
    attribution_patch(model, PAIRS, level="head", clean=shared.clean)
    held = shared.clean.recorded
    assert held is not None
    keeps = continuable(model, shared.clean.seqs)
    assert sorted(held.where) == ([0, 2, 4] if keeps else []), "a decoder's caches stay after the backward"
    own: list[int] = []
    real = cached.cached_forward
    monkeypatch.setattr(cached, "cached_forward", lambda m, batch: own.append(len(batch.input_ids)) or real(m, batch))
    got = rl.causal.patch(model, PAIRS, level="head", clean=shared.clean)
    assert own == [], "the sweep ran a clean forward of its own"
    assert not held.where and not held.recordings, "taken by the sweep and let go"
    for side in ("chosen", "rejected", "patched_chosen", "patched_rejected"):
        np.testing.assert_allclose(getattr(got, side), getattr(want, side), rtol=1e-5, atol=2e-6, err_msg=side)
    assert np.abs(got.effect).max() > 1e-4, "effects worth comparing"


def _kept_caches(model: rl.RewardModel, pairs: list):
    """A trace that kept its targets' caches, with attribution patching run on it (as the audit does)."""
    shared = trace_pairs(model, pairs, level="head", record="noising")
    attribution_patch(model, pairs, level="head", clean=shared.clean)
    return shared


def test_a_held_group_whose_proof_fails_runs_its_own_forward_and_changes_nothing(tiny_root, monkeypatch):
    """Held read-token states that are wrong (here the targets' embeddings) fail the group's proof:
    those targets run their own clean forward, and no number of the failed try is left behind."""
    cached = importlib.import_module("rewardlens.causal._cached")
    model = rl.load(str(tiny_root["llama"]))
    want = rl.causal.patch(model, PAIRS, level="head", clean=trace_pairs(model, PAIRS, level="head").clean)
    shared = _kept_caches(model, PAIRS)
    states = dict(shared.clean.captured)
    wrong = states[TraceKey.embed()].clone()
    wrong[0::2] += 1.0  # the targets' (chosen) embeddings, what every group's copies start from
    states[TraceKey.embed()] = wrong
    own: list[int] = []
    real = cached.cached_forward
    monkeypatch.setattr(cached, "cached_forward", lambda m, batch: own.append(len(batch.input_ids)) or real(m, batch))
    clean = dataclasses.replace(shared.clean, captured=states)
    got = rl.causal.patch(model, PAIRS, level="head", clean=clean)
    assert sum(own) == 3, "every target ran its own clean forward after the held groups failed their proof"
    for side in ("chosen", "patched_chosen", "patched_rejected"):
        np.testing.assert_allclose(getattr(got, side), getattr(want, side), rtol=1e-5, atol=2e-6, err_msg=side)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_divergence_from_the_held_caches_equals_the_copy_engines(tiny_root, arch):
    """Divergence's streams from held caches (each copy's own layers, the trace's clean residuals below its
    group) score as the copy engine's, which runs every copy through every layer from scratch."""
    model = rl.load(str(tiny_root[arch]))
    pairs = list(DEMO_PAIRS[:4])  # divergence calibrates on 8 sequences or more
    got = rl.causal.patch(model, pairs, level="head", divergence=True, clean=_kept_caches(model, pairs).clean)
    assert got.provenance is not None and got.provenance.engine == "cached_read_sweep"
    want = rl.causal.patch(model, pairs, level="head", divergence=True, engine="read_sweep")
    np.testing.assert_allclose(got.patched_chosen, want.patched_chosen, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(got.divergence, want.divergence, rtol=1e-4, atol=1e-5)
    assert np.abs(got.divergence).max() > 0.1


def test_drain_hands_each_recording_over_once_in_its_row_order(tiny_root):
    """`Recorded.drain` empties the holder at once, hands each recording over with the asked positions in
    its own row order (the recording itself when all its rows are asked, not a copy), and skips the rest."""
    model = rl.load(str(tiny_root["llama"]))
    held = trace_pairs(model, DEMO_PAIRS[:4], level="head", record="ablation", batch_size=4).clean.recorded
    assert held is not None and len(held.recordings) == 2
    originals, where = list(held.recordings), dict(held.where)
    asked = [6, 0, 3, 5, 1, 2, 4, 7][::-1]  # every sequence, out of order
    got = list(held.drain(asked))
    assert not held.recordings and not held.where, "the holder lets go at once"
    assert sorted(j for js, _ in got for j in js) == list(range(len(asked)))
    for js, rec in got:
        rows = [where[asked[j]][1] for j in js]
        assert rows == sorted(rows) and any(rec is o for o in originals), "whole, in row order: itself, no copy"
    held = trace_pairs(model, DEMO_PAIRS[:4], level="head", record="ablation", batch_size=4).clean.recorded
    assert held is not None
    some = list(held.drain([2, 0]))  # part of one recording at most two: copies of those rows only
    assert sum(len(js) for js, _ in some) == 2 and all(rec.size == len(js) for js, rec in some)
