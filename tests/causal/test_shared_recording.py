"""Attribution patching from the trace's own recording: `trace_pairs(record=mode)` records the targets'
layer inputs in the same forward, so `attribution_patch(clean=...)` runs no clean forward before its
backward, and its estimates equal those of the path that records them again (docs/design.md §5)."""

import contextlib
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import rewardlens as rl
from rewardlens.causal import attribution_patch, trace_pairs
from rewardlens.model.internal import LayerTaps, Recording, collate
from rewardlens.zoo import DEMO_PAIRS

PAIRS = DEMO_PAIRS[:3]


@contextlib.contextmanager
def forwards(model: rl.RewardModel) -> Iterator[list[int]]:
    """Counts the backbone's forwards while open (a layer run alone, as the backward does, is none)."""
    seen: list[int] = []
    handle = model.backbone.register_forward_pre_hook(lambda *_: seen.append(1))
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
    assert shared.clean.recorded is not None and not shared.clean.recorded.where, "taken and let go after use"
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
    held = sum(rec.inputs[0].shape[0] for rec in noising.recordings)
    assert held == 3 and all(len(rec.inputs) == model.n_layers for rec in noising.recordings)
    assert trace_pairs(model, PAIRS, level="head").clean.recorded is None, "nothing is kept unless asked"


def test_a_recording_that_fails_its_proof_falls_back_to_recording_again(tiny_root):
    model = rl.load(str(tiny_root["llama"]))
    want = attribution_patch(model, PAIRS, level="head", clean=trace_pairs(model, PAIRS, level="head").clean)
    shared = trace_pairs(model, PAIRS, level="head", record="noising")
    assert shared.clean.recorded is not None
    for rec in shared.clean.recorded.recordings:  # the last layer's recorded input no longer gives its output
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
