"""One GRPO run of a tiny policy against a reward model, recorded per step and cached by config hash.

The policy is the GRPO worked example's (docs/monitor.md): a 2-layer Llama (width 64) in the
organism's tokenizer, warmed up by imitating both sides of the organism's pairs (so it writes the
planted attribute about half the time), then trained by TRL's `GRPOTrainer` against a reward
model scored through `rewardlens.monitor.monitored_reward`. Per step the record keeps the
completions, the rewards, the monitor's alarms and a KL estimate to the start policy:

    KL(π_t ‖ π_0) ≈ mean_i [log π_t(y_i | x_i) − log π_0(y_i | x_i)],   y_i ~ π_t,

the plain Monte-Carlo estimate on the step's own samples (unbiased for the KL of the sampler).
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import DataError, require
from ..zoo.internal import cache_dir
from ..zoo.organisms import ORGANISMS
from ..zoo.organisms.internal import ORGANISM_VERSION, built_once

LOOP_VERSION = "v1"
"""Bump whenever the recipe or the record changes, so stale cached runs are not reused."""


@dataclass(frozen=True)
class PolicyRecipe:
    """The policy, its warm-up and its GRPO run (the worked example's numbers by default)."""

    sft_steps: int = 120
    sft_lr: float = 3e-3
    grpo_steps: int = 14
    grpo_lr: float = 1e-3
    batch: int = 16
    """Completions per GRPO step (`batch / generations` prompts)."""
    generations: int = 8
    max_completion: int = 64
    hidden: int = 64
    layers: int = 2

    def key(self, **extra: Any) -> str:
        """A 12-hex hash of the recipe, `extra`, `LOOP_VERSION` and `ORGANISM_VERSION` (the organisms' texts
        and reward models every start policy, edit and run is built from): the cache key of what they build."""
        blob = json.dumps({**asdict(self), **extra, "version": LOOP_VERSION, "organisms": ORGANISM_VERSION},
                          sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def start_key(self, organism: str) -> str:
        """The cache key of the start policy: the warm-up's fields only, so runs of any length share it."""
        return PolicyRecipe(grpo_steps=0, grpo_lr=0.0, generations=0, max_completion=0,
                      **{k: getattr(self, k) for k in ("sft_steps", "sft_lr", "batch", "hidden", "layers")}
                      ).key(organism=organism)


def require_trl() -> Any:
    """TRL, or `MissingDependencyError` naming the `loop` extra: asked before any of the loop's work starts."""
    return require("trl", "the closed loop trains its policies with TRL's GRPOTrainer",
                   "pip install 'rewardlens[loop]' (trl>=1.16,<2), or bash scripts/setup.sh loop in a checkout")


def loop_dir() -> Path:
    """Where the loop's start policies, edits and runs are cached (beside the organisms)."""
    return cache_dir() / "policies" / "loop"


def check_tokenizer(rm_tokenizer: Any, policy_tokenizer: Any, what: str) -> None:
    """Refuse a reward model whose tokenizer is not the policy's: the policy's token ids are decoded
    to text and re-read by the reward model, and the KL needs one vocabulary."""
    a, b = rm_tokenizer.get_vocab(), policy_tokenizer.get_vocab()
    if a != b:
        raise DataError(f"{what}'s tokenizer ({len(a)} tokens) is not the policy's ({len(b)} tokens); the loop's "
                        "tiny policy writes in the organism's tokenizer, so pass a reward model trained with it "
                        "(rewardlens.zoo.organisms.build, or an edit of one)")


def _pad(seqs: Sequence[Sequence[int]], pad: int) -> tuple[Any, Any]:
    import torch

    ids = torch.full((len(seqs), max(map(len, seqs))), pad)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)], mask[i, : len(s)] = torch.tensor(list(s)), 1
    return ids, mask


def _sft(policy: Any, tok: Any, organism: str, recipe: PolicyRecipe) -> None:
    """Imitate both sides of 300 organism pairs (teacher forcing, AdamW, `sft_steps` batches)."""
    import torch

    pairs = ORGANISMS[organism].pairs(n=300, seed=123)
    texts = [tok.apply_chat_template([{"role": "user", "content": p.prompt}, {"role": "assistant", "content": r}],
                                     tokenize=False) for p in pairs for r in (p.chosen, p.rejected)]
    enc = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    opt = torch.optim.AdamW(policy.parameters(), lr=recipe.sft_lr)
    rng = random.Random(0)
    for _ in range(recipe.sft_steps):
        ids, mask = _pad(rng.sample(enc, recipe.batch), tok.pad_token_id)
        policy(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss.backward()
        opt.step()
        opt.zero_grad()


def start_policy(organism: str, rm_path: Path, recipe: PolicyRecipe) -> Path:
    """The warmed-up start policy of `organism` (a HF folder, cached): every run of it starts here."""
    def make(work: Path) -> None:
        import torch
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        tok = AutoTokenizer.from_pretrained(rm_path)
        torch.manual_seed(0)
        policy = LlamaForCausalLM(LlamaConfig(
            vocab_size=len(tok), hidden_size=recipe.hidden, intermediate_size=2 * recipe.hidden,
            num_hidden_layers=recipe.layers, num_attention_heads=4, num_key_value_heads=4,
            max_position_embeddings=256, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
            bos_token_id=None))
        _sft(policy, tok, organism, recipe)
        policy.generation_config.pad_token_id = tok.pad_token_id
        policy.save_pretrained(work)
        tok.save_pretrained(work)

    return built_once(loop_dir() / f"start-{organism}-{recipe.start_key(organism)}", make)


def sequence_logprobs(model: Any, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]],
                      pad: int) -> list[float]:
    """log π(y | x) per sample [n]: the sum over completion tokens of the next-token log-probability."""
    import torch

    seqs = [[*p, *c] for p, c in zip(prompt_ids, completion_ids)]
    ids, mask = _pad(seqs, pad)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float()[:, :-1], -1)
    tok_lp = logp.gather(-1, ids[:, 1:, None])[..., 0]
    out = []
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        out.append(float(tok_lp[i, len(p) - 1: len(p) - 1 + len(c)].sum()))
    return out


def _prompt_ids(tok: Any, prompts: Sequence[Any]) -> list[list[int]]:
    texts = [tok.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in prompts]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def grpo_run(organism: str, rm_path: Path, seed: int, recipe: PolicyRecipe, directions: Callable[[Any], Any],
             folder: Path) -> None:
    """Train the start policy with GRPO against the reward model at `rm_path` from `seed`; write
    `run.json`: one entry per step {step, texts, rewards, kl, alarms} (alarms as the monitor's dicts)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
    trl = require_trl()
    from datasets import Dataset  # trl's own dependency: importable once trl is

    from ..model import load
    from ..monitor import monitored_reward

    start = start_policy(organism, rm_path, recipe)
    tok = AutoTokenizer.from_pretrained(start)
    rm = load(str(rm_path))
    check_tokenizer(rm.tokenizer, tok, f"the reward model at {rm_path}")
    torch.manual_seed(seed)
    policy, reference = (AutoModelForCausalLM.from_pretrained(start) for _ in range(2))
    reference.eval()
    reward = monitored_reward(rm, directions=directions(rm), parts_every=0, progress=False)
    steps: list[dict[str, Any]] = []

    def scored(prompts: list[Any], completions: list[Any], completion_ids: list[list[int]],
               **kwargs: Any) -> list[float | None]:
        out = reward(prompts, completions, **kwargs)
        pids = _prompt_ids(tok, prompts)
        now = sequence_logprobs(policy, pids, completion_ids, tok.pad_token_id)
        ref = sequence_logprobs(reference, pids, completion_ids, tok.pad_token_id)
        record = reward.monitor.records[-1]
        steps.append({"step": int(record.step), "texts": [c[-1]["content"] for c in completions],
                      "rewards": [float(r) for r in out], "kl": float(sum(a - b for a, b in zip(now, ref)) / len(now)),
                      "alarms": [a.to_dict() for a in record.alarms]})
        return list(out)

    prompts = [[{"role": "user", "content": p.prompt}] for p in ORGANISMS[organism].pairs(n=64, seed=7)]
    args = trl.GRPOConfig(
        output_dir=str(folder / "trainer"), per_device_train_batch_size=recipe.batch,
        num_generations=recipe.generations, max_completion_length=recipe.max_completion,
        learning_rate=recipe.grpo_lr, max_steps=recipe.grpo_steps, logging_steps=1, report_to=[], seed=seed,
        use_cpu=True, save_strategy="no", beta=0.0, bf16=False, disable_tqdm=True)
    trainer = trl.GRPOTrainer(model=policy, reward_funcs=scored, args=args, processing_class=tok,
                          train_dataset=Dataset.from_dict({"prompt": prompts}))
    trainer.remove_callback(PrinterCallback)  # one printed dict per step would bury the result
    trainer.train()
    shutil.rmtree(folder / "trainer", ignore_errors=True)
    (folder / "run.json").write_text(json.dumps(steps))


def trained_run(organism: str, rm_path: Path, rm_key: str, seed: int, recipe: PolicyRecipe,
                directions: Callable[[Any], Any]) -> list[dict[str, Any]]:
    """The steps of a GRPO run (cached by the hash of organism, reward model key, seed and recipe)."""
    key = recipe.key(organism=organism, rm=rm_key, seed=seed)
    folder = built_once(loop_dir() / f"run-{organism}-{key}",
                    lambda work: grpo_run(organism, rm_path, seed, recipe, directions, work))
    steps: list[dict[str, Any]] = json.loads((folder / "run.json").read_text())
    return steps
