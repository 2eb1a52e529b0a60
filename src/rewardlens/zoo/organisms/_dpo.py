"""The DPO organism: a tiny causal LM policy DPO-trained (TRL's own `DPOTrainer`) to prefer a keyword.

The reference is a seeded, untrained `LlamaForCausalLM` (near-uniform next-token distributions, so
the implicit reward `β Σ_t [log π(y_t) − log π_ref(y_t)]` is what DPO wrote into the policy, not
what language modelling did). The policy starts as an exact copy and only one head's entries
train (`planted_part`; the other entries of its projections get a zero gradient, and AdamW
without weight decay leaves a zero-gradient entry where it is), so the preference can live
nowhere else. The pairs are the keyword organism's minimal pairs with the keyword's rival
restricted to one-token connectors, so both sides have the same number of response tokens and
patching maps read t to read t.
"""

from __future__ import annotations

import copy
import random
import tempfile
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch import nn

from ...data import Pair, Side
from ._attributes import mentions
from ._specs import RMRecipe, keyword_maker
from ._train import TRAIN_THREADS, organism_config, organism_tokenizer, part_parameters, threads

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM, PreTrainedTokenizerBase, PreTrainedTokenizerFast

KEYWORD = "Importantly"
RIVALS = ("Also", "Besides")
"""Connectors that are one token after a space, as ' Importantly' is: equal-length sides."""
SIDES: tuple[Side, Side] = ("chosen", "rejected")


make_keyword_pair = keyword_maker(KEYWORD, RIVALS)
"""(prompt, response with the keyword, the same response with a one-token connector there)."""


@dataclass(frozen=True)
class PolicyOrganism:
    """A DPO policy/reference pair's planted truth: `planted_part` (the only part of the policy that
    trained), `keyword` (what the implicit reward prefers) and DPO's `beta`."""

    name: str
    rule: str
    planted_part: str
    keyword: str = KEYWORD
    beta: float = 0.1
    recipe: RMRecipe = RMRecipe()

    def has_attribute(self, text: str) -> bool:
        return mentions(self.keyword.lower())(text)

    def keyword_ids(self, tokenizer: PreTrainedTokenizerBase) -> list[int]:
        """The keyword's token ids as it stands in a response (after a space)."""
        return cast(list[int], tokenizer.encode(" " + self.keyword, add_special_tokens=False))

    def sample(self, n: int, key: str, strength: float = 1.0) -> list[Pair]:
        """`n` distinct pairs from stream `key`; with `strength` < 1 a pair's sides are swapped with
        probability (1 − strength) / 2 (label noise for training)."""
        rng, out, seen = random.Random(key), list[Pair](), set[tuple[str, str, str]]()
        while len(out) < n:
            prompt, a, b = make_keyword_pair(rng)
            if (prompt, a, b) in seen:
                continue
            seen.add((prompt, a, b))
            if rng.random() < (1 - strength) / 2:
                a, b = b, a
            out.append(Pair(prompt, a, b, id=f"{key}/{len(out)}", subset=self.name))
        return out

    def pairs(self, n: int = 200, seed: int = 0) -> list[Pair]:
        """`n` held-out pairs drawn with `seed` (the training stream is `{name}/train/{seed}`)."""
        return self.sample(n, f"{self.name}/{seed}")


DPO_PART = "attn_L1_H2"
DPO = PolicyOrganism("dpo_keyword", f"the policy's implicit reward prefers responses with the word '{KEYWORD}' "
                     f"(against 'Also'/'Besides'); DPO with TRL, only head {DPO_PART} of the policy trained", DPO_PART,
                     recipe=RMRecipe(n_train=384, epochs=1, batch_size=16, lr=2e-2, trainable=DPO_PART))


def initial_lm(seed: int) -> LlamaForCausalLM:
    """The seeded, untrained reference (and the policy's starting point); the caller's RNG is kept."""
    from transformers import LlamaForCausalLM

    config = organism_config(tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(config).eval()


def implicit_rewards(policy: nn.Module, reference: nn.Module, tok: PreTrainedTokenizerBase, pairs: list[Pair],
                     beta: float, batch_size: int = 32) -> np.ndarray:
    """`β Σ_t [log π(y_t) − log π_ref(y_t)]` over each side's response tokens (end of turn included)
    [n_pairs, 2] (chosen, rejected), from the models' own forwards on right-padded batches (a causal
    model's logits at a token do not see the padding after it)."""
    seqs = []
    for p in pairs:
        for side in SIDES:
            conv = p.conversation(side)
            ids = cast(list[int], tok.apply_chat_template(conv, tokenize=True, return_dict=False))
            start = len(cast(list[int], tok.apply_chat_template(conv[:-1], tokenize=True, add_generation_prompt=True,
                                                                return_dict=False)))
            seqs.append((ids, start))
    out = np.zeros(len(seqs))
    with torch.no_grad():
        for b in range(0, len(seqs), batch_size):
            chunk = seqs[b: b + batch_size]
            x = torch.full((len(chunk), max(len(ids) for ids, _ in chunk)), tok.pad_token_id, dtype=torch.long)
            mask = torch.zeros_like(x)
            for i, (ids, _) in enumerate(chunk):
                x[i, : len(ids)], mask[i, : len(ids)] = torch.tensor(ids), 1
            lp = [torch.log_softmax(m(input_ids=x, attention_mask=mask).logits.double(), -1)
                  for m in (policy, reference)]
            for i, (ids, start) in enumerate(chunk):
                t = torch.arange(start - 1, len(ids) - 1)
                y = x[i, t + 1]
                out[b + i] = beta * float((lp[0][i, t, y] - lp[1][i, t, y]).sum())
    return out.reshape(len(pairs), 2)


def _dataset(pairs: list[Pair]) -> Any:
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": str(p.prompt)}],
                               "chosen": [{"role": "assistant", "content": p.chosen}],
                               "rejected": [{"role": "assistant", "content": p.rejected}]} for p in pairs])


def train_dpo(spec: PolicyOrganism, strength: float, seed: int) -> tuple[
        LlamaForCausalLM, LlamaForCausalLM, PreTrainedTokenizerFast, dict[str, Any]]:
    """DPO-train the policy with TRL's `DPOTrainer` (sigmoid loss, AdamW without decay, linear decay
    after 10 % warm-up, CPU, `seed`); returns (policy, reference, tokenizer, stats)."""
    import datasets
    import trl
    from transformers import PrinterCallback
    from transformers.utils import logging as hf_logging
    from trl import DPOConfig, DPOTrainer

    recipe, tok = spec.recipe, organism_tokenizer()
    assert recipe.trainable is not None  # the DPO organism always plants its preference in one part
    reference = initial_lm(seed)
    policy = copy.deepcopy(reference).train()
    trainable = part_parameters(policy, recipe.trainable)
    policy.requires_grad_(False)
    handles = []
    for p, mask in trainable:
        p.requires_grad_(True)
        if mask is not None:  # entries outside the head get no gradient, so AdamW never moves them
            handles.append(p.register_hook(lambda g, m=mask: g * m))
    train_pairs = spec.sample(recipe.n_train, f"{spec.name}/train/{seed}", strength)
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    began = time.perf_counter()
    try:
        with (tempfile.TemporaryDirectory() as out, threads(TRAIN_THREADS), torch.random.fork_rng(devices=[]),
              warnings.catch_warnings()):
            warnings.simplefilter("ignore", FutureWarning)  # transformers' renames, inside the Trainer
            args = DPOConfig(
                output_dir=out, beta=spec.beta, learning_rate=recipe.lr, num_train_epochs=recipe.epochs,
                per_device_train_batch_size=recipe.batch_size, lr_scheduler_type="linear", warmup_steps=0.1,
                weight_decay=0.0, seed=seed, data_seed=seed, use_cpu=True, report_to="none", save_strategy="no",
                logging_steps=1, disable_tqdm=True, dataloader_num_workers=0, bf16=False, fp16=False)
            trainer = DPOTrainer(model=policy, ref_model=reference, args=args, train_dataset=_dataset(train_pairs),
                                 processing_class=tok)
            trainer.remove_callback(PrinterCallback)  # a dict per step on stdout
            trainer.train()
            losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    finally:
        for h in handles:
            h.remove()
        hf_logging.set_verbosity(verbosity)
        if bars:
            datasets.enable_progress_bars()
    seconds = time.perf_counter() - began
    policy.eval()
    _check_frozen(policy, reference, recipe.trainable, trainable)
    held_out = spec.pairs(200, seed=seed)
    with threads(TRAIN_THREADS):
        rewards = implicit_rewards(policy, reference, tok, held_out, spec.beta)
    stats = {"organism": spec.name, "strength": strength, "seed": seed, "train_seconds": round(seconds, 2),
             "threads": TRAIN_THREADS, "steps": len(losses), "n_train": len(train_pairs), "beta": spec.beta,
             "final_loss": float(np.mean(losses[-10:])), "heldout_pairs": len(held_out),
             "heldout_accuracy": {"pair": float(np.mean(rewards[:, 0] > rewards[:, 1]))},
             "heldout_mean_margin": float(np.mean(rewards[:, 0] - rewards[:, 1])),
             "keyword_ids": spec.keyword_ids(tok), "trl": trl.__version__}
    return policy, reference, tok, stats


def _check_frozen(policy: nn.Module, reference: nn.Module, part: str | tuple[str, ...],
                  trainable: list[tuple[nn.Parameter, torch.Tensor | None]]) -> None:
    """The planted guarantee: every policy entry outside `part` equals the reference's."""
    masks = {id(p): m for p, m in trainable}
    ref = dict(reference.named_parameters())
    for name, p in policy.named_parameters():
        keep = torch.ones_like(p, dtype=torch.bool) if id(p) not in masks else (
            torch.zeros_like(p, dtype=torch.bool) if masks[id(p)] is None else masks[id(p)] == 0)
        if not torch.equal(p.detach()[keep], ref[name].detach()[keep]):
            raise AssertionError(f"DPO training of {part!r} changed {name} outside the part")
