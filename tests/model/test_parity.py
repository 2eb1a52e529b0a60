"""`parity`: each check passes on real tiny HF models, and catches the bug it names when one is planted
where parity measures it (the read position, the position ids, the token ids, the batch)."""

from dataclasses import replace

import numpy as np
import pytest
import torch

import rewardlens as rl
from rewardlens.model import _core, parity
from rewardlens.model.internal import PARITY_CHECKS as CHECKS
from rewardlens.model.internal import PARITY_TOLERANCE as TOLERANCE
from tests.helpers import tiny


@pytest.fixture(scope="module")
def llama(tiny_root):
    return rl.load(str(tiny_root["llama"]))


def _llama_padded_by(pad, tmp_path_factory, tokenizer):
    """A tiny Llama whose config's pad id is `pad`."""
    cls, config = tiny.configs(tokenizer)["llama"]
    config.pad_token_id = pad
    torch.manual_seed(0)
    model = cls.from_config(config).eval()
    tiny.perturb_(model, 0)
    path = tmp_path_factory.mktemp("pad") / "llama"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return rl.load(str(path))


@pytest.fixture(scope="module")
def pad_is_eos(tmp_path_factory, tokenizer):
    """Pad = eos = `<|im_end|>`, which every chat turn of the pairs ends with."""
    return _llama_padded_by(tokenizer.eos_token_id, tmp_path_factory, tokenizer)


def test_passes_without_a_pad_token(tmp_path_factory, tokenizer, pairs):
    # The model's own forward refuses batches of two without a pad id: TRL's batches go one at a time.
    with pytest.warns(rl.errors.RewardLensWarning, match="no pad token"):
        model = _llama_padded_by(None, tmp_path_factory, tokenizer)
    assert parity(model, pairs).passed


@pytest.mark.parametrize("name", ["llama", "gpt2", "bert"])
def test_every_check_passes_on_tiny_models(tiny_root, pairs, name):
    model = rl.load(str(tiny_root[name]))
    result = parity(model, pairs)
    assert result.passed and not result.failed
    assert list(result.summary().index) == list(CHECKS)
    assert list(result.summary()["value"]) == [c.difference for c in result.checks]
    scale = max(1.0, float(np.abs(tiny.own_scores(model, pairs)).max()))
    assert all(c.tolerance == pytest.approx(TOLERANCE[torch.float32] * scale) for c in result.checks)
    assert all(c.n == 2 * len(pairs) for c in result.checks)
    # The yardstick, by hand: one unpadded forward per sequence (tests/helpers/tiny.own_scores).
    by_hand = np.abs(model.score(pairs, batch_size=8) - tiny.own_scores(model, pairs)).max()
    assert result["pad_eos"].difference == pytest.approx(by_hand, abs=1e-7)
    frame = result.to_frame()
    assert list(frame["name"]) == list(CHECKS) and frame["passed"].all()


def test_passes_when_pad_is_eos_inside_the_text(pad_is_eos, pairs):
    ids = pad_is_eos.encode(pairs)[0][4].ids  # the chat pair: eos after each turn, read after the last
    assert pad_is_eos.pad_token_id in ids[:-1] and ids[-1] != pad_is_eos.pad_token_id
    assert parity(pad_is_eos, pairs).passed


def _failed(model, pairs):
    return {c.name for c in parity(model, pairs).failed}


def test_catches_a_score_that_moves_with_batch_size(monkeypatch, llama, pairs):
    run = llama.run

    def batch_dependent(batch, points):  # a reduction whose result depends on the batch's composition
        return {k: v + 0.05 * (batch.input_ids.shape[0] - 1) for k, v in run(batch, points).items()}

    monkeypatch.setattr(llama, "run", batch_dependent)
    assert "batch_size" in _failed(llama, pairs)


def test_catches_left_padding_without_position_ids(monkeypatch, tiny_root, pairs):
    # GPT-2's learned absolute positions (rotary ones shift as a whole and would not notice).
    gpt2 = rl.load(str(tiny_root["gpt2"]))
    kwargs = gpt2.batch_kwargs
    monkeypatch.setattr(gpt2, "batch_kwargs", lambda b: {k: v for k, v in kwargs(b).items() if k != "position_ids"})
    result = parity(gpt2, pairs)
    assert {c.name for c in result.failed} >= {"padding_side"}
    assert result["batch_size"].passed  # right padding numbers positions from 0 either way


def test_catches_a_double_bos(monkeypatch, llama, pairs):
    tokenize, bos = llama.tokenize, 1  # a tokenizer's BOS added in front of a template's own rendering

    def doubled(item):
        tok = tokenize(item)
        return tok if isinstance(item, str) else replace(tok, ids=[bos, *tok.ids], prompt_length=None)

    monkeypatch.setattr(llama, "tokenize", doubled)
    result = parity(llama, pairs)
    assert {c.name for c in result.failed} == {"double_bos"}
    assert result["double_bos"].difference > 10 * result["double_bos"].tolerance


def _plant_read(monkeypatch, where):
    collate = _core.collate

    def planted(seqs, **kw):
        batch = collate(seqs, **kw)
        return replace(batch, read_at=where(batch))

    monkeypatch.setattr(_core, "collate", planted)


def test_catches_a_read_at_the_first_eos(monkeypatch, pad_is_eos, pairs):
    # Transformers' old rule (RLHFlow #49): the token before the first pad id, wrapping to the last column.
    pad = pad_is_eos.pad_token_id
    _plant_read(monkeypatch, lambda b: ((b.input_ids == pad).int().argmax(-1) - 1) % b.input_ids.shape[1])
    assert "pad_eos" in _failed(pad_is_eos, pairs)


def test_catches_a_read_one_token_early(monkeypatch, llama, pairs):
    _plant_read(monkeypatch, lambda b: b.read_at - 1)
    result = parity(llama, pairs)
    assert {"pad_eos", "trl_read"} <= {c.name for c in result.failed}
    assert not result.passed



def test_the_templates_own_forward_runs_only_where_it_renders_other_ids(monkeypatch, llama, pairs):
    """`double_bos` compares against the model's own forward on the template's rendering; where that is the
    ids rewardlens reads (the rule), it is `pad_eos`'s forward already, so each sequence runs alone once;
    a sequence rendered otherwise runs again, and the check still sees it."""
    from rewardlens.model import _parity

    seen = []
    real = _parity.own_unpadded
    monkeypatch.setattr(_parity, "own_unpadded", lambda m, seqs: seen.append(len(seqs)) or real(m, seqs))
    n = 2 * len(pairs)
    assert parity(llama, pairs).passed and seen == [n]
    seen.clear()
    template_ids, calls = _parity.template_ids, []

    def first_doubled(m, item, s):  # the first sequence's rendering gains a BOS
        calls.append(1)
        ids = template_ids(m, item, s)
        return [1, *ids] if len(calls) == 1 else ids

    monkeypatch.setattr(_parity, "template_ids", first_doubled)
    result = parity(llama, pairs)
    assert seen == [n, 1], "one sequence rendered otherwise runs again, alone"
    assert {c.name for c in result.failed} == {"double_bos"}
