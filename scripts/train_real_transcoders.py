"""Train transcoders for the SmolLM2-135M reward model once, and cache them beside the model.

    .venv/bin/python scripts/train_real_transcoders.py          # prints the folder (trains on first use)

CPU cost is bounded on purpose (a shared 2-core machine): every one of the 30 MLPs gets a TopK
transcoder of `D_SAE` features (k = `K`), trained for one epoch on the first `N_TRAIN` training pairs
of dpo_en_demo, each side read at most `MAX_LENGTH` tokens (left-truncated, so the read token stays).
The folder (`rewardlens transcoders train`'s layout) also holds `training.json`: the cost (seconds,
tokens, tokens/s, threads), the per-layer final FVU, and the fidelity on `N_HELD` held-out pairs
(per-layer explained variance of the MLP output, reward recovered with every MLP replaced).
Built once per head checksum and config (`ensure`: under a lock, never half-written).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

D_SAE, K, MAX_LENGTH, N_TRAIN, N_HELD, EPOCHS = 1152, 24, 256, 80, 4, 1
NAME = "smollm2-dpo"


def tag() -> str:
    return f"tc{D_SAE}-k{K}-len{MAX_LENGTH}-n{N_TRAIN}-e{EPOCHS}"


def transcoders_dir() -> Path:
    """The cached folder of SmolLM2's transcoders (built on first use: about 20-40 min on one loaded core)."""
    from rewardlens.sae import TranscoderTrainConfig, train_transcoders, transcoder_fidelity
    from rewardlens.zoo import realmodels
    from rewardlens.zoo._realbuild import ensure

    model_dir = realmodels.reward_model_dir(NAME)

    def build(out: Path, _scratch: Path) -> None:
        model = realmodels.load_reward_model(NAME, max_length=MAX_LENGTH, truncation="left")
        train = realmodels.dpo_pairs("train")[:N_TRAIN]
        held = realmodels.dpo_pairs("test")[:N_HELD]
        cfg = TranscoderTrainConfig(d_sae=D_SAE, k=K, batch_size=256, buffer_rows=4096, epochs=EPOCHS, lr=1e-3)
        start = time.perf_counter()
        res = train_transcoders(model, train, config=cfg, progress=True)
        res.transcoders.save(out)
        fit = transcoder_fidelity(model, res.transcoders, held)
        record = {"model": str(model_dir), "config": {"d_sae": D_SAE, "k": K, "max_length": MAX_LENGTH,
                                                      "n_train_pairs": N_TRAIN, "epochs": EPOCHS, "lr": 1e-3,
                                                      "batch_size": 256},
                  "train_seconds": res.seconds, "tokens": res.n_tokens, "tokens_per_second": res.tokens_per_second,
                  "threads": torch.get_num_threads(), "final_fvu": res.to_frame().set_index("layer")["final_fvu"]
                  .to_dict(), "held_out_pairs": N_HELD, "explained_variance": fit.explained_variance,
                  "l0": fit.l0, "reward_recovered": fit.reward_recovered, "fidelity": fit.describe(),
                  "total_seconds": time.perf_counter() - start}
        (out / "training.json").write_text(json.dumps(record, indent=1, default=float))

    return ensure(f"{model_dir.name}-transcoders-{tag()}", build)


if __name__ == "__main__":
    torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
    print(transcoders_dir())
