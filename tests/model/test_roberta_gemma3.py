"""RoBERTa / XLM-RoBERTa (positions numbered from the pad id, a dense-tanh classifier) and multimodal
Gemma-3 (sizes in `text_config`), against the models' own forwards."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import transformers as tf

import rewardlens as rl
from rewardlens.errors import ArchitectureError, TokenizationError
from rewardlens.model import ArchitectureMap
from tests.helpers import tiny

ROBERTAS = ["roberta", "xlm-roberta"]


def _text_of(tokenizer, n: int) -> str:
    """A plain text that tokenizes to exactly `n` tokens (the test tokenizer adds no special tokens)."""
    text = " ".join(["a"] * n)  # one token per " a" in the test tokenizer, checked
    assert len(tokenizer(text)["input_ids"]) == n
    return text


@pytest.mark.parametrize("arch", ROBERTAS)
def test_positions_are_the_models_own_under_both_paddings(tiny_root, tokenizer, arch):
    """The model numbers positions pad_id + 1 + i; 0-based positions fail the load-time proof."""
    model = rl.load(str(tiny_root[arch]))
    assert model.arch.position_ids == "model"
    texts = ["short", _text_of(tokenizer, 40), "a <|pad|> inside", _text_of(tokenizer, 7)]
    theirs = tiny.own_scores(model, texts)
    assert np.ptp(theirs) > 1e-6, "degenerate test model: every text scores the same"
    for side in ("left", "right"):
        ours = model.score(texts, batch_size=4, padding_side=side)
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6 * np.abs(theirs).max())
    counted = dataclasses.replace(model.arch, position_ids="mask")
    with pytest.raises(ArchitectureError, match="model's own forward"):
        rl.wrap(model.model, tokenizer, arch=counted)


@pytest.mark.parametrize("arch", ROBERTAS)
def test_usable_length_leaves_room_for_the_pad_offset(tiny_root, tokenizer, arch):
    model = rl.load(str(tiny_root[arch]))
    config = model.model.config
    assert model.max_length == config.max_position_embeddings - config.pad_token_id - 1
    longest = _text_of(tokenizer, model.max_length)
    np.testing.assert_allclose(model.score([longest]), tiny.own_scores(model, [longest]), rtol=1e-5, atol=1e-7)
    too_long = _text_of(tokenizer, model.max_length + 1)
    with pytest.raises(TokenizationError, match="over the limit"):
        model.score([too_long])
    cut = rl.load(str(tiny_root[arch]), truncation="left")
    np.testing.assert_allclose(cut.score([too_long]), tiny.own_scores(cut, [too_long]), rtol=1e-5, atol=1e-7)


def test_another_pad_id_is_refused_by_name(tiny_root):
    with pytest.raises(ArchitectureError, match="number positions from its pad id"):
        rl.load(str(tiny_root["roberta"]), pad_token_id=3)


def test_position_ids_must_be_a_known_rule():
    with pytest.raises(ValueError, match="position_ids must be one of"):
        ArchitectureMap(name="x", layers="l", attn_out="a", mlp_out="m", final_norm="n", position_ids="zero")


@pytest.mark.parametrize("arch", ROBERTAS)
def test_classifier_rows_are_the_models_own_dense_tanh_out_proj(tiny_root, arch):
    """The pooler rows at h, applied to h, equal the model's own classifier (dropouts off in eval)."""
    model = rl.load(str(tiny_root[arch]))
    h = torch.randn(5, model.d_model, generator=torch.Generator().manual_seed(0))
    rows, bias = model.head.rows(h)
    ours = (rows * h[:, None]).sum(-1) + bias
    with torch.no_grad():
        theirs = model.model.classifier(h[:, None, :])  # reads position 0 of [n, T, d]
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_token_attribution_on_roberta_ignores_padding_side(tiny_root, pairs):
    model = rl.load(str(tiny_root["roberta"]))
    one = rl.tokens(model, pairs, batch_size=1)
    left = rl.tokens(model, pairs, batch_size=6, padding_side="left")
    for a, b in zip(one.per_head, left.per_head):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(left.reward, tiny.own_scores(model, pairs), rtol=1e-5, atol=1e-6)


def _gemma3_mm(tokenizer, top_pad: int | None) -> tf.PreTrainedModel:
    """A tiny multimodal Gemma-3 whose text pad id is the tokenizer's and whose top level says `top_pad`."""
    _, config = tiny.configs(tokenizer)["gemma3-mm"]
    config = tf.Gemma3Config(**{**config.to_dict(), "pad_token_id": top_pad})
    torch.manual_seed(0)
    model = tf.AutoModelForSequenceClassification.from_config(config).eval()
    tiny.perturb_(model, 0)
    return model


def test_gemma3_multimodal_reads_its_sizes_from_the_text_config(tokenizer, tmp_path, pairs):
    model = _gemma3_mm(tokenizer, top_pad=5)  # the model's own pooling uses text_config.pad_token_id
    text = model.config.get_text_config()
    assert model.config.pad_token_id != text.pad_token_id
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    rm = rl.load(str(tmp_path))
    assert rm.arch.name == "gemma3-mm" and rm.n_layers == text.num_hidden_layers
    assert (rm.n_heads, rm.d_model) == (text.num_attention_heads, text.hidden_size)
    assert (rm.pad_token_id, rm.max_length) == (text.pad_token_id, text.max_position_embeddings)
    texts = ["ends in the top-level pad id !\"", "hi"]  # '"' is id 5: read as a real token, as the model does
    theirs = tiny.own_scores(rm, texts)
    for side in ("left", "right"):
        np.testing.assert_allclose(rm.score(texts, padding_side=side, batch_size=2), theirs, rtol=1e-5, atol=1e-6)
    att = rl.attribute(rm, pairs, level="head")
    np.testing.assert_allclose(att.values.sum(1) + att.constant, tiny.own_scores(rm, pairs), rtol=1e-4, atol=1e-5)


def test_gemma3_multimodal_wraps_a_loaded_model(tokenizer, pairs):
    model = _gemma3_mm(tokenizer, top_pad=None)
    rm = rl.wrap(model, tokenizer)
    assert rm.verified and rm.pad_token_id == tokenizer.pad_token_id
    np.testing.assert_allclose(rm.score(pairs, padding_side="left"), tiny.own_scores(rm, pairs), rtol=1e-5, atol=1e-6)
