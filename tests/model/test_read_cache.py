"""`ReadCache`: each distinct sequence read once, and what it hands back is the read loop's own reading."""

import importlib

import numpy as np
import pytest
import torch

import rewardlens as rl
from rewardlens.hacking import concepts, probe, spread_items
from rewardlens.model import ReadCache
from rewardlens.zoo import demo_model_dir
from tests.helpers.tiny import own_scores

TEXTS = [[{"role": "user", "content": "Answer briefly."}, {"role": "assistant", "content": t}]
         for t in ["Sure, here it is!", "Here it is.", "The answer is four, as you asked.", "It is Paris.",
                   "Boil it for nine minutes, then let it rest.", "Use a wrench."]]


READ_CACHE = importlib.import_module("rewardlens.model._read_cache")


def _counting(model, monkeypatch):
    """Count the sequences the cache asks the read loop (`read_sharing`) to read."""
    seen = []
    real = READ_CACHE.read_sharing

    def read(of, seqs, **kw):
        assert of is model
        seen.append(len(seqs))
        return real(of, seqs, **kw)
    monkeypatch.setattr(READ_CACHE, "read_sharing", read)
    return seen


@pytest.mark.parametrize("arch", ["llama", "bert", "armorm"])
def test_the_cache_hands_back_the_read_loops_reading_and_reads_each_sequence_once(tiny_root, arch, monkeypatch):
    model = rl.load(str(tiny_root[arch]))
    seqs, _ = model.encode(TEXTS)
    cache = ReadCache(model)
    labels = list(cache.labels)
    assert labels == ["embed", *map(str, range(model.n_layers))]
    seen = _counting(model, monkeypatch)
    first = cache.read(seqs[:4], batch_size=2)
    again = cache.read([seqs[5], seqs[1], seqs[4], seqs[1]], batch_size=2)  # two new, one held twice
    assert sum(seen) == 6 and len(cache) == 6
    whole = model.read(seqs, layers=labels, batch_size=3, readout=True)
    for got, rows in ((first, [0, 1, 2, 3]), (again, [5, 1, 4, 1])):
        for name in ("final", "hidden", "values", "coefficients", "readout"):
            torch.testing.assert_close(getattr(got, name), getattr(whole, name)[rows], atol=1e-5, rtol=1e-5)
        for label in labels:
            torch.testing.assert_close(got.layers[label], whole.layers[label][rows], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(again.reward.numpy(), own_scores(model, [TEXTS[i] for i in (5, 1, 4, 1)]), atol=1e-4)


def test_a_cache_of_another_model_is_refused_by_name(tiny_root):
    a, b = rl.load(str(tiny_root["llama"])), rl.load(str(tiny_root["gpt2"]))
    with pytest.raises(ValueError, match="probe: the cache holds readings of .* pass a ReadCache made for this model"):
        probe(a, spread_items(4), cache=ReadCache(b), n_boot=20)


def test_probes_and_concepts_through_one_cache_read_each_sequence_once_and_keep_their_numbers(monkeypatch):
    """The audit's sharing: the concepts' contrast sets are sequences the probes scored, so through one cache
    the concepts read nothing new, and both results equal those computed alone."""
    model = rl.load(str(demo_model_dir()))  # the built-in items fit its context
    items = spread_items(6)
    alone_p, alone_c = probe(model, items, n_boot=50), concepts(model, items=items, n_boot=50)
    cache = ReadCache(model)
    seen = _counting(model, monkeypatch)
    shared_p = probe(model, items, n_boot=50, cache=cache)
    scored = sum(seen)
    shared_c = concepts(model, items=items, n_boot=50, cache=cache)
    assert scored == len(cache) > 0 and sum(seen) == scored  # the concepts read no sequence again
    np.testing.assert_allclose(shared_p.delta, alone_p.delta, atol=1e-5)
    np.testing.assert_array_equal(shared_p.flagged, alone_p.flagged)
    for name in ("slope", "cosine", "auroc", "base"):
        np.testing.assert_allclose(getattr(shared_c, name), getattr(alone_c, name), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(shared_c.dose, alone_c.dose, atol=1e-4, rtol=1e-4)
