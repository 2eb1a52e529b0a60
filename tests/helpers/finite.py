"""Fault injection for the finiteness tests: a tiny model whose reward is NaN on some pairs only.

The embedding row of one word (" France") is NaN, so every sequence that holds the word reads a NaN
reward (causal attention carries it to the read token) and every other sequence is untouched. The
load-time check input never holds the word, so `load` accepts the model: the NaN shows only in the
outputs, which is what the result tables must handle. `overflowing` fills a down-projection of a
loaded model with 1e30 instead: every reward becomes the head's constant (margins exactly 0).
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers as tf

from rewardlens import Pair

WORD = " France"


def nan_word_model(source: Path, folder: Path, tokenizer) -> Path:
    """Copy the model at `source` into `folder` with the embedding of `WORD` set to NaN."""
    model = tf.AutoModelForSequenceClassification.from_pretrained(source)
    (token,) = tokenizer.encode(WORD, add_special_tokens=False)
    with torch.no_grad():
        model.get_input_embeddings().weight[token] = float("nan")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def pairs(n: int, bad: set[int], subsets: list[str] | None = None) -> list[Pair]:
    """`n` pairs with ids p1..pn; the pairs numbered in `bad` (1-based) mention `WORD`, the others do not."""
    return [Pair(f"Question {i}: tell me about{WORD if i in bad else ' Spain'}.", f"A good answer {i}.", f"Bad {i}.",
                 id=f"p{i}", subset=None if subsets is None else subsets[i - 1]) for i in range(1, n + 1)]


def overflowing(model, value: float = 1e30):
    """Fill layer 0's MLP down-projection of a loaded tiny Llama (`RewardModel`) with `value`, in place."""
    with torch.no_grad():
        model.model.model.layers[0].mlp.down_proj.weight.fill_(value)
    return model
