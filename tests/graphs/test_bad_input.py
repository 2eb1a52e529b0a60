"""Bad input to `graph` is refused in one line that names the value and the fix; nothing runs first."""

from __future__ import annotations

from dataclasses import replace

import pytest

import rewardlens as rl
from rewardlens.errors import RewardLensError
from rewardlens.graphs import graph
from tests.graphs.conftest import SHORT, random_transcoders


@pytest.fixture(scope="module")
def llama(tiny_root):
    return rl.load(str(tiny_root["llama"]))


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text and isinstance(exc.value, RewardLensError)
    return text


def test_bad_arguments_are_one_line(llama):
    tcs = random_transcoders(llama)
    cases = [
        (dict(transcoders=tcs, max_nodes=0), "max_nodes"),
        (dict(transcoders=None), "transcoders="),
        (dict(transcoders=tcs, basis="heads"), "basis"),
        (dict(transcoders=tcs, basis="neurons"), "drop transcoders"),
        (dict(transcoders=tcs, align="middle"), "align"),
        (dict(transcoders=tcs, exact_layers=[7]), "exact_layers"),
    ]
    for kwargs, word in cases:
        with pytest.raises(RewardLensError) as exc:
            graph(llama, SHORT, **kwargs)
        assert word in _one_line(exc)
    with pytest.raises(RewardLensError) as exc:
        graph(llama, ["not a pair"], tcs)
    assert "Pair" in _one_line(exc)


def test_transcoders_that_do_not_fit_are_refused(llama):
    partial = rl.sae.Transcoders({0: random_transcoders(llama)[0]})
    with pytest.raises(RewardLensError) as exc:
        graph(llama, SHORT, partial)
    assert "[1]" in _one_line(exc)  # names the missing layer
    got = graph(llama, SHORT, partial, exact_layers=[1], max_nodes=8, batch_size=8)[0]  # that MLP as error nodes
    assert got.chosen.closure_gap <= 1e-5 and not any(n.startswith("tc_L1_F") for n in got.chosen.nodes.names)
    with pytest.raises(RewardLensError) as exc:
        graph(llama, SHORT, _wider(llama))
    assert "wide" in _one_line(exc)


def _wider(model):
    class Fake:
        d_model = model.d_model * 2
        n_layers = model.n_layers

    return random_transcoders(Fake())


def test_attention_nothing_can_freeze_is_refused_in_one_line(tiny_root):
    """What is still unsupported: attention outside transformers' AttentionInterface whose map names no query and
    key projections to freeze, and a map that claims the interface for attention that never calls it (DeBERTa-v2
    mapped as if it did). Each is one line naming the field, and leaves no hook behind."""
    deberta = rl.load(str(tiny_root["deberta-v2"]))
    no_keys = rl.wrap(deberta.model, deberta.tokenizer, arch=replace(deberta.arch, attn_k=None))
    with pytest.raises(RewardLensError) as exc:
        graph(no_keys, SHORT, basis="neurons")
    assert "attn_k=None" in _one_line(exc)
    as_if_interface = rl.wrap(deberta.model, deberta.tokenizer, arch=replace(deberta.arch, attn_values=None))
    with pytest.raises(RewardLensError) as exc:
        graph(as_if_interface, SHORT, basis="neurons")
    assert "AttentionInterface" in _one_line(exc)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in deberta.model.modules())
