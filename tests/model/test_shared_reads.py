"""The read loop on sequences sharing a prefix (model/_shared_reads.py): each family's prefix read once and
its members continued on the prefix's cache give the plain read loop's reading, at every depth, on every
causal decoder; encoders, gated heads and failed proofs read everything the plain way."""

import importlib

import pytest
import torch

import rewardlens as rl
from rewardlens.model import ReadCache
from rewardlens.model.internal import Tokenized, collate
from tests.helpers.tiny import ARCHS

SHARED = importlib.import_module("rewardlens.model._shared_reads")
PROMPT = ("You are a careful assistant. Read the question, think about what is asked, and answer in one or two "
          "plain sentences without lists.")
ANSWERS = ["Paris is the capital of France.", "It is Paris.", "Paris, a city on the Seine, is the capital.",
           "Lyon.", "I do not know."]
OTHER = "Answer as a cook would, in a friendly tone, and mention the time it takes when it matters at all."
# Two families (a long system prompt and a question each, different answers), plus two loners.
CONVERSATIONS = [
    *[[{"role": "system", "content": PROMPT}, {"role": "user", "content": "What is the capital of France?"},
       {"role": "assistant", "content": a}] for a in ANSWERS],
    *[[{"role": "system", "content": OTHER}, {"role": "user", "content": "How do I boil an egg?"},
       {"role": "assistant", "content": a}] for a in ("Nine minutes in boiling water.", "Put it in water.")],
    [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello!"}],
    [{"role": "user", "content": "Thanks."}, {"role": "assistant", "content": "You are welcome."}],
]
# Where the plain loop must read everything, and why.
PLAIN = {"bert": "encoder", "deberta-v2": "encoder", "roberta": "encoder", "xlm-roberta": "encoder",
         "armorm": "a gate read at its own position", "gemma3-mm": "a sliding window (8) shorter than the texts"}

def _reading(model, seqs, shared=True):
    labels = ["embed", *map(str, range(model.n_layers))]
    if not shared:
        return model.read(seqs, layers=labels, batch_size=3, readout=True)
    return SHARED.read_sharing(model, seqs, layers=labels, batch_size=3, readout=True)


def _same(got, want):
    for name in ("final", "hidden", "values", "coefficients", "readout"):
        torch.testing.assert_close(getattr(got, name), getattr(want, name), atol=2e-5, rtol=1e-5, msg=name)
    for label, value in want.layers.items():
        torch.testing.assert_close(got.layers[label], value, atol=2e-5, rtol=1e-5, msg=label)


@pytest.mark.parametrize("arch", ARCHS)
def test_shared_prefixes_read_as_the_plain_loop_reads(tiny_root, arch, monkeypatch):
    model = rl.load(str(tiny_root[arch]))
    seqs, _ = model.encode(CONVERSATIONS)
    continued: list[int] = []
    real = SHARED._continue
    monkeypatch.setattr(SHARED, "_continue", lambda *a, **k: continued.append(len(a[4])) or real(*a, **k))
    got = _reading(model, seqs)
    _same(got, _reading(model, seqs, shared=False))
    if arch in PLAIN:
        assert not continued, PLAIN[arch]
    else:  # two proof rows per family (reversed, twice over), then the members: 5 + 2; the loners read plainly
        assert continued[0] == 2 * 2 and sum(continued) == 2 * 2 + 7, f"{arch}: not continued ({continued})"


def test_families_group_a_prompts_variants_and_leave_loners(tiny_root):
    model = rl.load(str(tiny_root["llama"]))
    seqs, _ = model.encode(CONVERSATIONS)
    reads = collate(seqs, pad_id=model.pad_token_id, side="right", first=False, device=torch.device("cpu")).read_index
    groups = {tuple(sorted(m)): p for p, m in SHARED.families(seqs, reads.tolist())}
    assert set(groups) == {(0, 1, 2, 3, 4), (5, 6), (7,), (8,)}
    for members, p in groups.items():
        if len(members) > 1:  # the shared prefix: exactly the tokens every member has in common
            ids = [seqs[i].ids for i in members]
            common = next(k for k in range(min(map(len, ids))) if len({x[k] for x in ids}) > 1)
            assert p == common and p >= SHARED.MIN_SHARED


def test_a_run_is_split_where_that_saves_more_prefix_tokens():
    """Two triples sharing 20 tokens, each sharing 80 within: apart they save 2·80 + 2·80, together 5·20.
    Two pairs sharing 100 tokens, 101 within: together they save 3·100, apart 101 + 101."""
    base = list(range(20))
    seqs = [Tokenized(base + [50 + t] * 60 + [200 + k, 7]) for t in range(2) for k in range(3)]
    assert sorted(SHARED.families(seqs, [81] * 6)) == [(80, [0, 1, 2]), (80, [3, 4, 5])]
    base = list(range(100))
    seqs = [Tokenized(base + [50 + t] + [200 + k, 7]) for t in range(2) for k in range(2)]
    assert SHARED.families(seqs, [102] * 4) == [(100, [0, 1, 2, 3])]


def test_short_shared_prefixes_are_not_families():
    seqs = [Tokenized(list(range(10)) + [100 + k, 7]) for k in range(4)]  # 10 tokens in common: below the minimum
    assert [len(m) for _, m in SHARED.families(seqs, [11] * 4)] == [1, 1, 1, 1]
    seqs = [Tokenized(list(range(40)) + [100 + k, 7]) for k in range(4)]
    assert SHARED.families(seqs, [41] * 4) == [(40, [0, 1, 2, 3])]


def test_a_failed_proof_reads_everything_the_plain_way(tiny_root, monkeypatch):
    model = rl.load(str(tiny_root["llama"]))
    seqs, _ = model.encode(CONVERSATIONS)
    monkeypatch.setattr(SHARED, "agrees", lambda *a, **k: False)
    plain = []
    real = SHARED.read_loop
    monkeypatch.setattr(SHARED, "read_loop", lambda m, s, *a, **k: plain.append(len(s)) or real(m, s, *a, **k))
    _same(_reading(model, seqs), _reading(model, seqs, shared=False))
    assert plain == [len(seqs)], "every sequence went to the plain loop"


def test_the_cache_reads_families_once_and_hands_back_the_plain_numbers(tiny_root):
    model = rl.load(str(tiny_root["qwen2"]))
    seqs, _ = model.encode(CONVERSATIONS)
    cache = ReadCache(model)
    first = cache.read(seqs[:6], batch_size=2)
    again = cache.read(seqs, batch_size=2)
    want = _reading(model, seqs, shared=False)
    torch.testing.assert_close(again.reward, want.reward, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(first.reward, want.reward[:6], atol=2e-5, rtol=1e-5)
    assert len(cache) == len(seqs)


@pytest.mark.parametrize("fail", [None, "proof", "later call"])
def test_the_progress_steps_count_each_sequence_once(tiny_root, monkeypatch, fail):
    """`step` hears of every sequence exactly once, also when a chunk fails after filling some rows (they are
    read again plainly) and the reading is still the plain loop's."""
    model = rl.load(str(tiny_root["llama"]))
    seqs, _ = model.encode(CONVERSATIONS)
    if fail == "proof":
        monkeypatch.setattr(SHARED, "agrees", lambda *a, **k: False)
    elif fail == "later call":  # the proof and the first members' call pass, the next call is refused
        calls, real = [], SHARED._continue
        monkeypatch.setattr(SHARED, "_continue", lambda *a: None if calls.append(1) or len(calls) > 2 else real(*a))
    steps: list[int] = []
    labels = ["embed", *map(str, range(model.n_layers))]
    got = SHARED.read_sharing(model, seqs, layers=labels, batch_size=3, readout=True, step=steps.append)
    assert sum(steps) == len(seqs) and all(n > 0 for n in steps)
    _same(got, _reading(model, seqs, shared=False))
