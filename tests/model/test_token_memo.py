"""`TokenMemo`: a model tokenizes each input once, whatever reads it (a length check, then scoring), and
afresh when its tokenizer or chat template changes."""

from __future__ import annotations

import rewardlens as rl
import rewardlens.model._core as core
from rewardlens.model.internal import Tokenized, TokenMemo
from rewardlens.zoo import DEMO_PAIRS


def _counting(monkeypatch):
    calls = []
    real = core.tokenize
    monkeypatch.setattr(core, "tokenize", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    return calls


def test_each_input_is_tokenized_once_per_model(tiny_root, monkeypatch):
    model = rl.load(str(tiny_root["llama"]))
    calls = _counting(monkeypatch)
    fresh = model.fits(DEMO_PAIRS[:2])
    seqs, _ = model.encode(DEMO_PAIRS[:2])
    again, _ = model.encode(DEMO_PAIRS[:2])
    assert fresh == [True] * 4 and len(calls) == 4  # the length check tokenized; encoding twice did not
    assert [s.ids for s in seqs] == [s.ids for s in again]
    model.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    changed, _ = model.encode(DEMO_PAIRS[:2])
    assert len(calls) == 8  # a template changed in place is a new key, never a stale entry
    assert [s.ids for s in changed] != [s.ids for s in seqs]


def test_the_memo_is_bounded_by_tokens_least_recently_used_out_first():
    memo = TokenMemo(max_tokens=5)
    made = []

    def make(n: int):
        return lambda: made.append(n) or Tokenized(ids=list(range(n)))

    tok = object()
    memo.get(tok, "a", make(2))
    memo.get(tok, "b", make(2))
    memo.get(tok, "a", make(2))  # a hit: "a" is now the most recent
    memo.get(tok, "c", make(2))  # 6 tokens > 5: "b", the least recent, goes
    assert made == [2, 2, 2]
    memo.get(tok, "a", make(2))
    memo.get(tok, "b", make(2))
    assert made == [2, 2, 2, 2]  # "a" was kept, "b" was made again
