"""A TRL GRPO run on the `list` organism whose reward function is the reward server, called through
`rewardlens.serve.remote_reward`, raises the same alarms at the same steps as `rl.monitor.monitored_reward`
in-process on the same samples (the policy's completions, recorded as the run went)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tests.serve.helpers import threaded

pytest.importorskip("trl")
pytest.importorskip("fastapi")

STEPS = 8


@pytest.mark.slow
def test_grpo_through_the_server_raises_the_alarms_monitored_reward_raises(tmp_path):
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    import rewardlens as rl
    from rewardlens.hacking import concepts, contrast_sets
    from rewardlens.monitor import PolicyRun
    from rewardlens.serve import remote_reward
    from rewardlens.zoo.organisms import ORGANISMS, build
    from tests.monitor.grpo import CONFIG, _sft

    path = build("list")
    rm, tok, spec = rl.load(path), AutoTokenizer.from_pretrained(path), ORGANISMS["list"]
    fitted = concepts(rm, {a: contrast_sets(a) for a in ("formatting", "length")}, layers=[-1], alphas=(0.0, 1.0),
                      n_boot=1, progress=False)
    dirs = {n: fitted.direction(n, -1) for n in fitted.names}
    torch.manual_seed(CONFIG["seed"])
    policy = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=CONFIG["hidden"], intermediate_size=2 * CONFIG["hidden"],
        num_hidden_layers=CONFIG["layers"], num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None))
    _sft(policy, tok, spec.pairs(n=300, seed=123), CONFIG)
    policy.generation_config.pad_token_id = tok.pad_token_id
    calls: list[tuple[int, list, list, list[float]]] = []
    with threaded(rm, tmp_path, directions=dirs, parts_every=5) as (port, _server):
        remote = remote_reward(f"http://127.0.0.1:{port}")

        def reward(prompts, completions, **kwargs):
            out = remote(prompts, completions, **kwargs)
            calls.append((kwargs["trainer_state"].global_step, prompts, completions, out))
            return out

        prompts = [[{"role": "user", "content": p.prompt}] for p in spec.pairs(n=64, seed=7)]
        args = GRPOConfig(
            output_dir=str(tmp_path / "trainer"), per_device_train_batch_size=CONFIG["batch"],
            num_generations=CONFIG["generations"], max_completion_length=CONFIG["max_completion"],
            learning_rate=CONFIG["grpo_lr"], max_steps=STEPS, logging_steps=1, report_to=[], seed=CONFIG["seed"],
            use_cpu=True, save_strategy="no", beta=0.0, bf16=False, disable_tqdm=True)
        GRPOTrainer(model=policy, reward_funcs=reward, args=args, processing_class=tok,
                    train_dataset=Dataset.from_dict({"prompt": prompts})).train()
    served = PolicyRun.from_jsonl(tmp_path / "policy.jsonl")  # the last step rolled when the server stopped

    local = rl.monitor.monitored_reward(rm, directions=dirs, parts_every=5, progress=False)
    for step, p, c, out in calls:
        np.testing.assert_allclose(local(p, c, trainer_state=SimpleNamespace(global_step=step)), out, atol=1e-5)
    mine = local.monitor.run
    assert [r.step for r in served.records] == [r.step for r in mine.records] == sorted({s for s, *_ in calls})
    raised = lambda run: [[(a.kind, a.name) for a in r.alarms] for r in run.records]  # noqa: E731
    assert raised(served) == raised(mine)
    assert any(raised(mine)), "the list organism raises its list_lines alarm (the planted rule)"
    for a, b in zip(served.records, mine.records):
        np.testing.assert_allclose(a.share, b.share, atol=1e-6)
