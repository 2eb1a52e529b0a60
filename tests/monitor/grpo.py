"""Ground truth for the policy monitor: a tiny Llama policy trained with TRL's GRPOTrainer against a
planted-bias organism, monitored by `rewardlens.monitor.monitored_reward`, trained once and cached.

The policy first imitates both sides of the organism's pairs (a short supervised warm-up, so it
writes the organism's statements with and without the planted attribute), then GRPO pushes it
towards whatever the reward model over-rewards. Everything is seeded and runs on one thread, so a
run is deterministic on a given torch build; the cache key is a hash of the whole config.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from pathlib import Path

CONFIG = {"sft_steps": 120, "sft_lr": 3e-3, "grpo_steps": 14, "grpo_lr": 1e-3, "batch": 16, "generations": 8,
          "max_completion": 64, "seed": 0, "hidden": 64, "layers": 2, "version": 1}
AXES = ("length", "formatting", "emoji", "sycophancy", "markdown")


def directions(rm, organism: str) -> dict | None:
    """The default probe-axis directions, plus the keyword organism's own (a user-given direction)."""
    if organism != "keyword":
        return None
    from rewardlens.hacking import concepts, contrast_sets
    from rewardlens.zoo.organisms import ORGANISMS

    kp = ORGANISMS["keyword"].pairs(n=40, seed=99)
    sets = {a: contrast_sets(a) for a in AXES} | {"keyword": ([p.chosen for p in kp], [p.rejected for p in kp])}
    c = concepts(rm, sets, layers=[-1], alphas=(0.0, 1.0), n_boot=1)
    return {n: c.direction(n, -1) for n in c.names}


def _key(organism: str) -> str:
    blob = json.dumps({"organism": organism, **CONFIG}, sort_keys=True)
    return f"{organism}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def _sft(policy, tok, pairs, cfg) -> None:
    import torch

    texts = [tok.apply_chat_template([{"role": "user", "content": p.prompt}, {"role": "assistant", "content": r}],
                                     tokenize=False) for p in pairs for r in (p.chosen, p.rejected)]
    enc = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg["sft_lr"])
    rng = random.Random(cfg["seed"])
    for _ in range(cfg["sft_steps"]):
        batch = rng.sample(enc, cfg["batch"])
        ids = torch.full((len(batch), max(map(len, batch))), tok.pad_token_id)
        mask = torch.zeros_like(ids)
        for i, s in enumerate(batch):
            ids[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), 1
        policy(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss.backward()
        opt.step()
        opt.zero_grad()


def _train(organism: str, folder: Path) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    import rewardlens as rl
    from rewardlens.monitor import monitored_reward
    from rewardlens.zoo.organisms import ORGANISMS, build

    cfg = CONFIG
    path = build(organism)
    rm, tok, spec = rl.load(path), AutoTokenizer.from_pretrained(path), ORGANISMS[organism]
    torch.manual_seed(cfg["seed"])
    policy = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=cfg["hidden"], intermediate_size=2 * cfg["hidden"],
        num_hidden_layers=cfg["layers"], num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None))
    _sft(policy, tok, spec.pairs(n=300, seed=123), cfg)
    policy.generation_config.pad_token_id = tok.pad_token_id
    reward = monitored_reward(rm, directions=directions(rm, organism), log=folder / "monitor.jsonl", parts_every=5)
    samples: list[dict] = []

    def scored(prompts, completions, **kwargs):  # the monitored reward, keeping the texts for the test
        out = reward(prompts, completions, **kwargs)
        samples.append({"step": kwargs["trainer_state"].global_step, "texts": [c[-1]["content"] for c in completions],
                        "prompts": prompts, "rewards": out})
        return out

    prompts = [[{"role": "user", "content": p.prompt}] for p in spec.pairs(n=64, seed=7)]
    args = GRPOConfig(
        output_dir=str(folder / "trainer"), per_device_train_batch_size=cfg["batch"],
        num_generations=cfg["generations"], max_completion_length=cfg["max_completion"], learning_rate=cfg["grpo_lr"],
        max_steps=cfg["grpo_steps"], logging_steps=1, report_to=[], seed=cfg["seed"], use_cpu=True,
        save_strategy="no", beta=0.0, bf16=False, disable_tqdm=True)
    trainer = GRPOTrainer(model=policy, reward_funcs=scored, args=args, processing_class=tok,
                          train_dataset=Dataset.from_dict({"prompt": prompts}))
    trainer.train()
    shutil.rmtree(folder / "trainer", ignore_errors=True)
    (folder / "samples.json").write_text(json.dumps(samples))
    (folder / "log_history.json").write_text(json.dumps(trainer.state.log_history))


def trained(organism: str) -> Path:
    """The folder of a GRPO run against `organism` (monitor.jsonl, samples.json, log_history.json),
    trained once per config and cached next to the organisms."""
    from rewardlens.zoo.internal import cache_dir
    from rewardlens.zoo.organisms.internal import built_once

    return built_once(cache_dir() / "policies" / _key(organism), lambda work: _train(organism, work))
