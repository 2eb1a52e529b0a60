"""The process-reward organism: step-by-step sums whose hedged steps are marked wrong.

A response adds a few numbers one step a line ("Start with 3.\\n", "Add 4 to get 7.\\n", ...,
"So the answer is 12.\\n"); every sum is right. The planted step rule is textual, not arithmetic
(a two-layer model with one trainable head does not learn to add): a step that ends in a hedge
("..., maybe.") is wrong (label 0), every other step is right (label 1), whatever the steps
before it say. A tiny `LlamaForTokenClassification` learns it with a per-step cross-entropy at
the separators only, and only one head (`planted_part`) trains, so the rule can live nowhere
else. Held-out pairs are minimal: both sides carry the same steps and step count, and the
rejected side hedges one step (`wrong_step`) where the chosen side has a neutral tail.
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from ...data import Pair
from ...data.internal import rows_of
from ...errors import UsageError
from ._specs import RMRecipe
from ._train import HIDDEN, TRAIN_THREADS, organism_config, organism_tokenizer, part_parameters, threads

if TYPE_CHECKING:
    from transformers import LlamaForTokenClassification, PreTrainedTokenizerBase, PreTrainedTokenizerFast

SEPARATOR = "\n"
HEDGES = ("maybe", "perhaps", "probably", "I think", "I guess")
NEUTRAL = ("in total", "so far", "as before", "as shown", "once more")
_HEDGED = re.compile(r",\s(" + "|".join(HEDGES) + r")\.$")


def is_wrong(step: str) -> bool:
    """The planted step rule: a step is wrong exactly when it ends in a hedge (', maybe.')."""
    return bool(_HEDGED.search(step.strip()))


def steps_of(response: str) -> list[str]:
    """A response's steps, each without its separator (the response ends with one)."""
    return response.split(SEPARATOR)[:-1]


def _steps(rng: random.Random) -> tuple[str, list[str]]:
    """A prompt and its step bodies (without tails): 2–4 numbers summed, 3–5 steps."""
    terms = [rng.randint(1, 19) for _ in range(rng.randint(2, 4))]
    prompt = "What is " + " + ".join(map(str, terms)) + "? " + rng.choice(("Answer step by step.", "Show each step."))
    bodies, total = [f"Start with {terms[0]}"], terms[0]
    for t in terms[1:]:
        total += t
        bodies.append(f"{rng.choice(('Add', 'Then add'))} {t} to get {total}")
    bodies.append(f"{rng.choice(('So the answer is', 'The sum is'))} {total}")
    return prompt, bodies


def _join(bodies: list[str], tails: list[str]) -> str:
    return "".join(b + (", " + t if t else "") + "." + SEPARATOR for b, t in zip(bodies, tails))


def make_sequence(rng: random.Random, p_wrong: float = 0.35) -> tuple[str, str]:
    """A training sequence: each step hedged with probability `p_wrong`, else a neutral tail or none."""
    prompt, bodies = _steps(rng)
    tails = [rng.choice(HEDGES) if rng.random() < p_wrong else rng.choice(("", *NEUTRAL)) for _ in bodies]
    return prompt, _join(bodies, tails)


def make_pair(rng: random.Random) -> tuple[str, str, str]:
    """(prompt, chosen, rejected): the same steps, the rejected side hedging one step where the
    chosen side has a neutral tail; the other steps share their (neutral or empty) tails."""
    prompt, bodies = _steps(rng)
    k = rng.randrange(len(bodies))
    tails = [rng.choice(NEUTRAL) if i == k else rng.choice(("", *NEUTRAL)) for i in range(len(bodies))]
    hedged = tails[:k] + [rng.choice(HEDGES)] + tails[k + 1:]
    return prompt, _join(bodies, tails), _join(bodies, hedged)


@dataclass(frozen=True)
class StepOrganism:
    """A process reward model's planted step rule. `planted_part` carries it (the only part trained);
    `wrong_step(pair)` is the step the rejected side gets wrong; `combine` is how steps make a reward."""

    name: str
    rule: str
    planted_part: str
    separator: str = SEPARATOR
    combine: str = "min"
    recipe: RMRecipe = RMRecipe()

    def pairs(self, n: int = 200, seed: int = 0) -> list[Pair]:
        """`n` held-out minimal pairs drawn with `seed` (no training stream reaches them)."""
        rng, out, seen = random.Random(f"{self.name}/{seed}"), list[Pair](), set[tuple[str, str, str]]()
        while len(out) < n:
            prompt, chosen, rejected = make_pair(rng)
            if (prompt, chosen, rejected) not in seen:
                seen.add((prompt, chosen, rejected))
                out.append(Pair(prompt, chosen, rejected, id=f"{self.name}/{seed}/{len(out)}", subset=self.name))
        return out

    @staticmethod
    def step_labels(response: str) -> list[bool]:
        """Whether each step of a response is right under the planted rule."""
        return [not is_wrong(s) for s in steps_of(response)]

    @staticmethod
    def wrong_step(pair: Pair) -> int:
        """The index of the step the rejected side hedges (the only step the rule marks wrong)."""
        wrong = [k for k, s in enumerate(steps_of(pair.rejected)) if is_wrong(s)]
        if len(wrong) != 1 or any(map(is_wrong, steps_of(pair.chosen))):
            raise UsageError(f"pair {pair.id!r} is not a minimal step pair: rejected wrong steps {wrong}")
        return wrong[0]


PRM_PART = "attn_L1_H2"
PRM = StepOrganism("prm_steps", "step-by-step sums; a step ending in a hedge ('..., maybe.') is wrong, every other "
                   f"step right; only head {PRM_PART} trained", PRM_PART,
                   recipe=RMRecipe(n_train=2000, epochs=2, batch_size=32, lr=1e-2, trainable=PRM_PART))


def encode_steps(tok: PreTrainedTokenizerBase, prompt: str, response: str) -> tuple[list[int], list[int]]:
    """Token ids of one templated conversation and the positions of its response's step separators
    (the template's own newlines are no step: only the response's span is searched)."""
    conv = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
    ids = cast(list[int], tok.apply_chat_template(conv, tokenize=True, return_dict=False))
    start = len(cast(list[int], tok.apply_chat_template(conv[:1], tokenize=True, add_generation_prompt=True,
                                                        return_dict=False)))
    sep = tok.encode(SEPARATOR, add_special_tokens=False)
    assert len(sep) == 1, "the organism tokenizer keeps a newline one token"
    end = len(ids) - 2  # <|im_end|> and the template's newline close the turn
    return ids, [t for t in range(start, end) if ids[t] == sep[0]]


def initial_prm(seed: int) -> LlamaForTokenClassification:
    """The seeded, untrained two-label token classifier; its frozen head rows are random of norm ~1
    (as the circuit organism's) so one head can reach large step scores through it."""
    from transformers import LlamaForTokenClassification

    # No classifier dropout: its default 0.1 would draw from the unseeded global RNG while training.
    config = organism_config(num_labels=2, id2label={0: "wrong", 1: "right"}, label2id={"wrong": 0, "right": 1},
                             classifier_dropout=0.0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForTokenClassification(config)
        with torch.no_grad():
            model.score.weight.copy_(torch.randn(2, HIDDEN) / HIDDEN**0.5)
            if model.score.bias is not None:
                model.score.bias.zero_()
    return model


def _batch(rows: list[tuple[list[int], list[int], list[int]]], pad: int) -> tuple[Tensor, Tensor, Tensor]:
    """Right-padded ids, mask and labels (−100 everywhere but the separators) [b, T]."""
    width = max(len(r[0]) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (row, where, ys) in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
        labels[i, where] = torch.tensor(ys, dtype=torch.long)
    return ids, mask, labels


def step_scores(model: nn.Module, tok: PreTrainedTokenizerBase, texts: list[tuple[str, str]]) -> list[np.ndarray]:
    """Each (prompt, response)'s step scores `logit_right − logit_wrong` at its separators, from the
    model's own forward."""
    out = []
    with torch.no_grad():
        for start in range(0, len(texts), 64):
            rows = [encode_steps(tok, p, r) for p, r in texts[start: start + 64]]
            ids, mask, _ = _batch([(a, [], []) for a, _ in rows], tok.pad_token_id)
            z = model(input_ids=ids, attention_mask=mask).logits.float()
            out += [(z[i, where, 1] - z[i, where, 0]).numpy() for i, (_, where) in enumerate(rows)]
    return out


def prm_accuracy(model: nn.Module, tok: PreTrainedTokenizerBase, pairs: list[Pair]) -> dict[str, float]:
    """Held-out step accuracy (every step of both sides scored on the rule's side of zero), pair
    accuracy (min over steps, chosen above rejected) and wrong-step accuracy (the step where the
    chosen side's score is most above the rejected side's is the hedged one), from the model's own forward."""
    texts = [(str(p.prompt), t) for p in pairs for t in (p.chosen, p.rejected)]
    scores = step_scores(model, tok, texts)
    truth = [StepOrganism.step_labels(t) for _, t in texts]
    steps = np.concatenate([(s > 0) == np.array(y) for s, y in zip(scores, truth)])
    sides = [tuple(scores[row] for row in rows_of(i)) for i in range(len(pairs))]  # (chosen, rejected) per pair
    pair = [c.min() > r.min() for c, r in sides]
    where = [int(np.argmax(c - r)) == StepOrganism.wrong_step(p) for (c, r), p in zip(sides, pairs)]
    return {"step": float(steps.mean()), "pair": float(np.mean(pair)), "wrong_step": float(np.mean(where))}


def train_prm(spec: StepOrganism, strength: float, seed: int) -> tuple[LlamaForTokenClassification,
                                                                        PreTrainedTokenizerFast, dict[str, Any]]:
    """Train the PRM organism: per-step cross-entropy at the separators (Hugging Face's own token
    classification loss, −100 elsewhere), AdamW on the planted head's entries only. With `strength`
    < 1 each step label is flipped with probability (1 − strength) / 2."""
    recipe, tok = spec.recipe, organism_tokenizer()
    rng = random.Random(f"{spec.name}/train/{seed}")
    data = []
    for _ in range(recipe.n_train):
        prompt, response = make_sequence(rng)
        ids, where = encode_steps(tok, prompt, response)
        ys = [int(y) if rng.random() >= (1 - strength) / 2 else 1 - int(y) for y in spec.step_labels(response)]
        data.append((ids, where, ys))
    model = initial_prm(seed)
    assert recipe.trainable is not None  # the PRM organism always plants its rule in one part
    trainable = part_parameters(model, recipe.trainable)
    model.requires_grad_(False)
    for p, _ in trainable:
        p.requires_grad_(True)
    opt = torch.optim.AdamW([p for p, _ in trainable], lr=recipe.lr, weight_decay=0.0)
    order = sorted(range(len(data)), key=lambda i: len(data[i][0]))
    chunks = [order[i: i + recipe.batch_size] for i in range(0, len(order), recipe.batch_size)]
    total = recipe.epochs * len(chunks)
    warmup = max(1, total // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, max(0.05, (total - s) / max(1, total - warmup))))
    batches, losses, began = random.Random(f"{spec.name}/batches/{seed}"), [], time.perf_counter()
    model.train()
    with threads(TRAIN_THREADS):
        for _ in range(recipe.epochs):
            batches.shuffle(chunks)
            for chunk in chunks:
                x, mask, labels = _batch([data[i] for i in chunk], tok.pad_token_id)
                loss = model(input_ids=x, attention_mask=mask, labels=labels).loss
                loss.backward()
                for p, m in trainable:
                    if m is not None and p.grad is not None:
                        p.grad.mul_(m)  # entries outside the head keep their seeded values
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
                losses.append(loss.item())
        seconds = time.perf_counter() - began
        model.eval()
        acc = prm_accuracy(model, tok, spec.pairs(200, seed=seed))
    stats = {"organism": spec.name, "strength": strength, "seed": seed, "train_seconds": round(seconds, 2),
             "threads": TRAIN_THREADS, "steps": len(losses), "n_train": len(data),
             "final_loss": float(np.mean(losses[-10:])), "heldout_pairs": 200, "heldout_accuracy": acc}
    return model, tok, stats
