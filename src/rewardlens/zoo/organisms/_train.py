"""Training an organism on CPU: its tokenizer, a seeded tiny Llama, a Bradley–Terry loop, and the
held-out pair accuracy, all measured with the Hugging Face model's own forward."""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from ...data import Pair, Side, margin
from ...errors import UsageError
from ...model import Part
from ...model.internal import hf_config
from .._builtin import build_tokenizer
from . import _bank as bank
from ._specs import ORGANISMS, Organism

if TYPE_CHECKING:
    from transformers import (
        LlamaConfig,
        LlamaForSequenceClassification,
        PreTrainedTokenizerBase,
        PreTrainedTokenizerFast,
    )

VOCAB_SIZE = 2048
HIDDEN, FFN, LAYERS, HEADS = 64, 128, 2, 4
TRAIN_THREADS = 1
"""Threads used while training: fixed, because float sums (and so the weights) can depend on it;
one, because on a shared 2-core machine two spinning threads run several times slower."""
EVAL_PAIRS = 200
"""Held-out pairs the build measures accuracy on: `spec.pairs(EVAL_PAIRS, seed=seed)`, a stream
the training pairs (`{name}/train/{seed}`) never come from."""

TOKENIZER_ORGANISMS = ("length", "list", "confidence", "sycophancy", "keyword", "two_objective", "circuit")
"""The organisms whose pairs the shared tokenizer is trained on: the seven it was first built with,
named so that organisms added later (quality_list) leave the tokenizer, and so every cached
organism folder of this `ORGANISM_VERSION`, unchanged. Their new words just split into more tokens."""


@lru_cache(maxsize=1)
def organism_tokenizer() -> PreTrainedTokenizerFast:
    """The byte-level BPE tokenizer (ChatML template, pad ≠ eos) every organism shares, trained on
    the organisms' own words so most words are one token. Deterministic."""
    corpus = ["user", "assistant"] * 50
    for domain, (questions, points) in bank.DOMAINS.items():
        corpus += questions + points + bank.CLAIMS[domain]
    for name in TOKENIZER_ORGANISMS:
        pairs, _ = ORGANISMS[name].sample(300, f"tokenizer/{name}", 1.0)
        corpus += [t for p in pairs for t in (str(p.prompt), p.chosen, p.rejected)]
    return build_tokenizer(VOCAB_SIZE, corpus)


def organism_config(**extra: Any) -> LlamaConfig:
    """The organisms' Llama size with the organism tokenizer's vocabulary and special ids; `extra`
    (num_labels, id2label, ...) go to PretrainedConfig through **kwargs, which LlamaConfig's typed
    signature does not show."""
    from transformers import LlamaConfig

    tok = organism_tokenizer()
    return LlamaConfig(
        vocab_size=len(tok), hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=HEADS, max_position_embeddings=512,
        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None, **extra,
    )


def initial_model(spec: Organism, seed: int) -> LlamaForSequenceClassification:
    """The seeded, untrained `LlamaForSequenceClassification` an organism starts from.

    When only one part trains, the frozen score head is set by hand to a random direction of
    norm 1 (instead of the default std 0.02), so the trained part can reach margins of several
    reward units through it. The caller's global torch RNG is left as it was.
    """
    from transformers import LlamaForSequenceClassification

    k = len(spec.objectives)
    labels = {i: name for i, name in enumerate(spec.objectives)} if k > 1 else None
    extra: dict[str, Any] = {"num_labels": k}
    if labels:
        extra.update(id2label=labels, label2id={v: i for i, v in labels.items()})
    config = organism_config(**extra)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForSequenceClassification(config)
        if spec.recipe.trainable is not None:
            with torch.no_grad():
                model.score.weight.copy_(torch.randn(k, HIDDEN) / HIDDEN**0.5)
    return model


def part_parameters(model: nn.Module, part: str | tuple[str, ...]) -> list[tuple[nn.Parameter, Tensor | None]]:
    """The parameters (with a 0/1 mask of the entries that belong to `part`, or None for all)
    that write part `part` (`attn_L{l}`, `attn_L{l}_H{h}` or `mlp_L{l}`) of a Llama model; for a
    tuple of parts, each parameter once, its mask the union of the parts' masks."""
    if isinstance(part, tuple):
        merged: dict[int, tuple[nn.Parameter, Tensor | None]] = {}
        for one in part:
            for p, mask in part_parameters(model, one):
                _, seen = merged.get(id(p), (p, mask))
                # None (the whole parameter) absorbs any mask; two masks of one matrix are OR-ed
                both = None if mask is None or seen is None else torch.maximum(mask, seen)
                merged[id(p)] = (p, both)
        return list(merged.values())
    found = Part.parse(part)
    if found.kind == "embed" or found.bias or found.neuron is not None:
        raise UsageError(f"trainable part {part!r} is not attn_L<l>, attn_L<l>_H<h> or mlp_L<l>")
    llama = cast("LlamaForSequenceClassification", model)  # organisms are Llama models
    layer = llama.model.layers[found.layer]
    if found.kind == "mlp":
        return [(p, None) for p in layer.mlp.parameters()]
    attn = layer.self_attn
    if found.head is None:
        return [(p, None) for p in attn.parameters()]
    head, config = found.head, llama.config
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    assert config.num_key_value_heads is not None  # LlamaConfig defaults it to num_attention_heads
    kv = head // (config.num_attention_heads // config.num_key_value_heads)
    out: list[tuple[nn.Parameter, Tensor | None]] = []
    for proj, index in ((attn.q_proj, head), (attn.k_proj, kv), (attn.v_proj, kv), (attn.o_proj, head)):
        mask = torch.zeros_like(proj.weight)
        span = slice(index * dim, (index + 1) * dim)
        if proj is attn.o_proj:
            mask[:, span] = 1  # o_proj reads head h's slice of z: its columns
        else:
            mask[span] = 1  # q/k/v write head h's slice: their rows
        out.append((proj.weight, mask))
    return out


def ablated(model: nn.Module, part: str | tuple[str, ...]) -> nn.Module:
    """A copy of `model` in which `part` (each part of a tuple) writes nothing (its weights zeroed);
    `model` is untouched."""
    import copy

    clone = copy.deepcopy(model)
    with torch.no_grad():
        for p, mask in part_parameters(clone, part):
            p.mul_(0 if mask is None else 1 - mask)
    return clone


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    """Run with `n` torch threads, restoring the caller's setting."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def encode(tok: PreTrainedTokenizerBase, pair: Pair) -> tuple[list[int], list[int]]:
    """Token ids of both sides, templated once as `rewardlens` tokenizes them (docs/design.md §3)."""

    def ids(side: Side) -> list[int]:  # one conversation, tokenized, not as a dict: a list of ids
        return cast(list[int], tok.apply_chat_template(pair.conversation(side), tokenize=True, return_dict=False))

    return ids("chosen"), ids("rejected")


def _pad(rows: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
    return ids, mask


def forward_margins(
    model: nn.Module, tok: PreTrainedTokenizerBase, pairs: list[Pair], batch_size: int = 64
) -> np.ndarray:
    """Chosen − rejected logits [n_pairs, k] from the model's own forward (right padding; Hugging
    Face pools the last non-pad token)."""
    out = []
    with torch.no_grad():
        for start in range(0, len(pairs), batch_size):
            rows = [ids for p in pairs[start : start + batch_size] for ids in encode(tok, p)]
            ids, mask = _pad(rows, tok.pad_token_id)
            logits = model(input_ids=ids, attention_mask=mask).logits.float()
            out.append(margin(logits).numpy())
    if out:
        return np.concatenate(out)
    k = hf_config(model).num_labels
    assert k is not None  # a sequence-classification config counts its labels
    return np.zeros((0, k), dtype=np.float32)


def accuracy(spec: Organism, model: nn.Module, tok: PreTrainedTokenizerBase, pairs: list[Pair]) -> dict[str, float]:
    """Per objective: the share of the pairs its rule decides that the model orders the rule's way."""
    labels, diff = spec.labels(pairs), forward_margins(model, tok, pairs)
    return {name: float(np.mean(np.sign(diff[labels[:, k] != 0, k]) == labels[labels[:, k] != 0, k]))
            for k, name in enumerate(spec.objectives)}


def train(
    spec: Organism, strength: float, seed: int, *, steps: int | None = None,
    callback: Callable[[nn.Module, PreTrainedTokenizerFast, int], object] | None = None,
) -> tuple[LlamaForSequenceClassification, PreTrainedTokenizerFast, dict[str, Any]]:
    """Train `spec` at `strength` from seed `seed`; returns (model in eval mode, tokenizer, stats).

    `steps` caps the optimiser steps (for tests of determinism); by default the recipe's epochs.
    `callback(model, tokenizer, step)` is called once before the first step (step 0, the seeded
    initial model) and after every optimiser step (step = steps done), with the model in train
    mode; it must leave the model as it found it (`rewardlens.monitor.Monitor` does).
    Stats hold the training time, the steps, the final loss and the held-out accuracy.
    """
    recipe, tok = spec.recipe, organism_tokenizer()
    pairs, labels = spec.sample(recipe.n_train, f"{spec.name}/train/{seed}", strength)
    encoded = [encode(tok, p) for p in pairs]
    model = initial_model(spec, seed)
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainable: list[tuple[nn.Parameter, Tensor | None]] = (
        part_parameters(model, recipe.trainable) if recipe.trainable else [(p, None) for p in model.parameters()])
    model.requires_grad_(False)
    for p, _ in trainable:
        p.requires_grad_(True)
    # No weight decay when only a part trains: decay would move the frozen entries of its matrices.
    opt = torch.optim.AdamW([p for p, _ in trainable], lr=recipe.lr,
                            weight_decay=0.0 if recipe.trainable else 0.01)
    # Length-sorted batches waste little padding; their order is shuffled every epoch.
    order = sorted(range(len(pairs)), key=lambda i: max(map(len, encoded[i])))
    chunks = [order[i : i + recipe.batch_size] for i in range(0, len(order), recipe.batch_size)]
    total = recipe.epochs * len(chunks) if steps is None else steps
    warmup = max(1, total // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, max(0.05, (total - s) / max(1, total - warmup))))
    rng, step, losses = random.Random(f"{spec.name}/batches/{seed}"), 0, []
    began, cpu = time.perf_counter(), time.process_time()
    model.train()
    with threads(TRAIN_THREADS):
        if callback is not None:
            callback(model, tok, 0)
        while step < total:
            rng.shuffle(chunks)
            for chunk in chunks[: total - step]:
                ids, mask = _pad([s for i in chunk for s in encoded[i]], tok.pad_token_id)
                logits = model(input_ids=ids, attention_mask=mask).logits.float()
                y = torch.as_tensor(labels[chunk], dtype=torch.float32)
                decided = (y != 0).float()
                loss = -(nn.functional.logsigmoid(y * margin(logits)) * decided).sum() / decided.sum()
                loss.backward()
                for p, m in trainable:
                    if m is not None:
                        assert p.grad is not None  # every trainable parameter takes part in the loss
                        p.grad.mul_(m)
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
                losses.append(loss.item())
                step += 1
                if callback is not None:
                    callback(model, tok, step)
        seconds, cpu = time.perf_counter() - began, time.process_time() - cpu
        model.eval().requires_grad_(True)
        if recipe.trainable:
            _check_frozen(model, start, trainable, recipe.trainable)
        held_out = spec.pairs(EVAL_PAIRS, seed=seed, strength=1.0)
        acc = accuracy(spec, model, tok, held_out)
    seen = {frozenset((str(p.prompt), p.chosen, p.rejected)) for p in pairs}
    stats = {
        "organism": spec.name, "strength": strength, "seed": seed, "train_seconds": round(seconds, 2),
        "train_cpu_seconds": round(cpu, 2), "threads": TRAIN_THREADS, "steps": step, "n_train": len(pairs),
        "final_loss": float(np.mean(losses[-10:])) if losses else None,
        "heldout_pairs": len(held_out), "heldout_accuracy": acc,
        "heldout_seen_in_training": sum(frozenset((str(p.prompt), p.chosen, p.rejected)) in seen for p in held_out),
    }
    return model, tok, stats


def _check_frozen(
    model: nn.Module, start: dict[str, Tensor], trainable: list[tuple[nn.Parameter, Tensor | None]],
    part: str | tuple[str, ...],
) -> None:
    """The planted-circuit guarantee: every entry outside `part` (each of the parts, for a tuple)
    still has its initial value."""
    masks = {id(p): m for p, m in trainable}
    for name, p in model.named_parameters():
        keep = torch.ones_like(p, dtype=torch.bool) if id(p) not in masks else (
            torch.zeros_like(p, dtype=torch.bool) if masks[id(p)] is None else masks[id(p)] == 0)
        if not torch.equal(p.detach()[keep], start[name][keep]):
            raise AssertionError(f"training {part!r} changed {name} outside the part")
