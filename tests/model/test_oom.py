"""CUDA out-of-memory back-off, on CPU: a forward hook raises the accelerator's out-of-memory error
(constructed directly), the batch loop halves and retries, and nothing is lost or changed.

"Changed" is checked bit for bit where the arithmetic has the same shapes as in the yardstick (a
split batch is exactly the batch its rows form on their own; the engines compute each piece whole),
and to float precision (1e-6) where a later step reduces over a different number of rows (the fp32
head over a batch of 8 rather than 2 may round the last bit differently)."""

import contextlib
import importlib
import pickle
import warnings

import numpy as np
import pytest
import torch

import rewardlens as rl
from rewardlens.causal import patch
from rewardlens.errors import OutOfMemoryError, RewardLensError, RewardLensWarning
from rewardlens.model.internal import OOM_ERRORS, hidden_arg


@contextlib.contextmanager
def fake_oom(model, *, first=False, max_rows=None, max_width=None):
    """Raise `torch.cuda.OutOfMemoryError` in layer 0: on its first call only (`first`), or whenever
    its input holds more than `max_rows` rows or `max_width` positions (a memory budget). Yields the
    list of batch sizes the layer was called with (successful calls only)."""
    calls, seen = [], []

    def hook(module, args, kwargs):
        x = hidden_arg(args, kwargs)
        calls.append(x.shape[0])
        too_big = (max_rows is not None and x.shape[0] > max_rows) or (max_width is not None and x.shape[1] > max_width)
        if (first and len(calls) == 1) or too_big:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (fake)")
        seen.append(x.shape[0])

    handle = model.layers[0].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


@pytest.fixture(autouse=True)
def whole_batches(request, monkeypatch):
    """These tests count batch sizes under back-off: batches are not also cut for padding here
    (except in the test of that rule), so a batch of 6 short sequences of unequal length stays one."""
    if "padding" not in request.node.name:
        monkeypatch.setattr(importlib.import_module("rewardlens.model._oom"), "PAD_SLACK", float("inf"))


def _backoff_warnings(seen):
    return [str(w.message) for w in seen
            if issubclass(w.category, RewardLensWarning) and "ran out of memory" in str(w.message)]


@pytest.fixture(scope="module")
def llama(tiny_root):
    return rl.load(str(tiny_root["llama"]))


def test_the_accelerator_error_is_what_backs_off():
    assert torch.cuda.OutOfMemoryError in OOM_ERRORS
    if hasattr(torch, "OutOfMemoryError"):
        assert torch.OutOfMemoryError in OOM_ERRORS


def test_a_fake_oom_on_the_first_try_halves_the_batch_and_changes_nothing(llama, pairs):
    want = llama.score(pairs, batch_size=8)
    with warnings.catch_warnings(record=True) as said, fake_oom(llama, first=True) as sizes:
        warnings.simplefilter("always")
        got = llama.score(pairs, batch_size=8)
    np.testing.assert_array_equal(got, want)
    assert sizes == [3, 3], "the batch of 6 sequences is retried as two halves of 3"
    msgs = _backoff_warnings(said)
    assert len(msgs) == 1 and "batch of 6 sequences" in msgs[0] and "batches of 3 from now on" in msgs[0]


def test_a_memory_budget_keeps_later_batches_small_and_says_so_once(llama, pairs):
    more = list(pairs) * 3  # 18 sequences: batches of 8, 8, 2 without back-off
    with warnings.catch_warnings(record=True) as said, fake_oom(llama, max_rows=2) as sizes:
        warnings.simplefilter("always")
        got = llama.score(more, batch_size=8)
    np.testing.assert_allclose(got, llama.score(more, batch_size=8), rtol=1e-6, atol=0)
    assert max(sizes) == 2 and sum(sizes) == 18, "every sequence ran once, in batches of at most 2"
    assert len(_backoff_warnings(said)) == 1


def test_head_attribution_and_lens_back_off_to_the_same_numbers(llama, pairs):
    want = rl.attribute(llama, pairs, level="head", batch_size=8)
    want_lens = rl.lens(llama, pairs, batch_size=8)
    with warnings.catch_warnings(), fake_oom(llama, max_rows=1) as sizes:
        warnings.simplefilter("ignore", RewardLensWarning)
        got = rl.attribute(llama, pairs, level="head", batch_size=8)
        got_lens = rl.lens(llama, pairs, batch_size=8)
    assert sizes and max(sizes) == 1
    np.testing.assert_allclose(got.values, want.values, rtol=0, atol=1e-6)
    np.testing.assert_allclose(got.reward, want.reward, rtol=1e-6, atol=0)
    np.testing.assert_allclose(got_lens.normed, want_lens.normed, rtol=1e-6, atol=1e-7)
    assert np.abs(got.residual_error).max() < 1e-5  # still exact: parts + constant = reward


@pytest.mark.parametrize("case", [
    dict(level="head"),                                     # cached read-position engine
    dict(level="sublayer", divergence=True),                # cached engine, with divergence's streams
    dict(level="sublayer", divergence=True, engine="read_sweep"),  # copy engine
    dict(level="sublayer", positions="prefix", engine="suffix_sweep"),  # suffix engine (only what a patch changes)
    dict(level="sublayer", positions="prefix", mode="ablation", engine="stepped_sweep"),  # stepped engine
    dict(level="sublayer", positions="prefix", divergence=True),  # full forwards (batched_sweep)
])
def test_every_patch_engine_backs_off_to_the_same_numbers(llama, pairs, case):
    pairs = list(pairs) * 2 if case.get("divergence") else pairs  # divergence calibrates on 8+ sequences
    case = dict(case)  # the parameter itself stays as listed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RewardLensWarning)
        want = patch(llama, pairs, batch_size=4, **case)
        with fake_oom(llama, max_rows=2) as sizes:  # the stepped engine's proof runs each row twice
            got = patch(llama, pairs, batch_size=4, **case)
    assert sizes and max(sizes) <= 2
    for field in ("chosen", "rejected", "patched_chosen", "patched_rejected", "divergence"):
        if getattr(want, field) is not None:
            np.testing.assert_allclose(getattr(got, field), getattr(want, field), rtol=1e-6, atol=1e-6, err_msg=field)


def test_a_sequence_too_long_at_batch_one_is_skipped_and_named(llama, pairs):
    seqs, _ = llama.encode(pairs)
    lengths = np.array([len(s.ids) for s in seqs])
    limit = int(np.sort(lengths)[-3])  # the two longest sequences do not fit, even alone
    too_long = sorted(np.flatnonzero(lengths > limit).tolist())
    assert 0 < len(too_long) < len(seqs)
    with warnings.catch_warnings(), fake_oom(llama, max_width=limit) as sizes:
        warnings.simplefilter("ignore", RewardLensWarning)
        with pytest.raises(OutOfMemoryError) as caught:
            llama.score(pairs, batch_size=8)
    err = caught.value
    assert err.rows == too_long
    assert err.pairs == sorted({r // 2 for r in too_long})
    assert err.labels == [f"pair {r // 2} ({'chosen' if r % 2 == 0 else 'rejected'})" for r in too_long]
    assert sum(sizes) == len(seqs) - len(too_long), "every other sequence was still computed"
    assert isinstance(err, RewardLensError) and isinstance(err, MemoryError)
    again = pickle.loads(pickle.dumps(err))
    assert (again.rows, again.pairs, again.labels) == (err.rows, err.pairs, err.labels)
    # Dropping the named pairs is the fix: the rest then fits and scores as it does with memory to spare.
    keep = [p for i, p in enumerate(pairs) if i not in err.pairs]
    with warnings.catch_warnings(record=True) as said, fake_oom(llama, max_width=limit):
        warnings.simplefilter("always")
        got = llama.score(keep)
    assert not _backoff_warnings(said)
    np.testing.assert_array_equal(got, llama.score(keep))


def test_patching_names_the_pair_that_fits_nowhere(llama, pairs):
    seqs, _ = llama.encode(pairs)
    lengths = np.array([len(s.ids) for s in seqs])
    longest = int(np.argmax(lengths))
    with warnings.catch_warnings(), fake_oom(llama, max_width=int(lengths.max()) - 1):
        warnings.simplefilter("ignore", RewardLensWarning)
        with pytest.raises(OutOfMemoryError) as caught:
            patch(llama, pairs, positions="prefix", batch_size=4)
    assert caught.value.pairs == [longest // 2]


def test_length_sorted_batches_are_cut_where_padding_would_pass_the_slack(llama):
    from rewardlens.model.internal import PAD_SLACK

    short = [rl.Pair("Hi.", "Yes.", "No.") for _ in range(3)]
    long = [rl.Pair("Hi.", " ".join(["A long answer that keeps going."] * 10), "No.")]
    seqs, is_pairs = llama.encode(short + long)
    lengths = [len(s.ids) for s in seqs]
    batches = [rows.tolist() for rows, _ in llama.batches(seqs, 8, "right", is_pairs)]
    assert sorted(r for b in batches for r in b) == list(range(len(seqs)))
    for rows in batches:  # within the slack, and no batch could have taken its successor's first row
        width = max(lengths[r] for r in rows)
        assert len(rows) * width <= (1 + PAD_SLACK) * sum(lengths[r] for r in rows)
    assert [6] in batches  # the long chosen side runs alone instead of padding seven short ones
    same, _ = llama.encode(short)
    assert len(list(llama.batches(same, 8, "right", True))) == 1  # similar lengths still batch whole
