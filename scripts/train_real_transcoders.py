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

NAME = "smollm2-dpo"
# (d_sae, k, max_length, training pairs, held-out pairs, epochs). "full" is the set docs/findings.md reports
# (about 20-40 min on one loaded core); "small" is the test suite's: every layer, the same code and checks, a
# few pairs and narrow transcoders, so a clean CI machine builds it in well under a minute.
SIZES = {"full": (1152, 24, 256, 80, 4, 1), "small": (96, 8, 64, 6, 2, 1)}
D_SAE, K, MAX_LENGTH, N_TRAIN, N_HELD, EPOCHS = SIZES["full"]


def tag(size: str = "full") -> str:
    d_sae, k, max_length, n_train, _, epochs = SIZES[size]
    return f"tc{d_sae}-k{k}-len{max_length}-n{n_train}-e{epochs}"


def transcoders_dir(size: str = "full") -> Path:
    """The cached folder of SmolLM2's transcoders of one of `SIZES` (built on first use)."""
    from rewardlens.sae import TranscoderTrainConfig, train_transcoders, transcoder_fidelity
    from rewardlens.zoo import realmodels
    from rewardlens.zoo._realbuild import ensure

    model_dir = realmodels.reward_model_dir(NAME)
    d_sae, k, max_length, n_train, n_held, epochs = SIZES[size]

    def build(out: Path, _scratch: Path) -> None:
        model = realmodels.load_reward_model(NAME, max_length=max_length, truncation="left")
        train = realmodels.dpo_pairs("train")[:n_train]
        held = realmodels.dpo_pairs("test")[:n_held]
        cfg = TranscoderTrainConfig(d_sae=d_sae, k=k, batch_size=256, buffer_rows=4096, epochs=epochs, lr=1e-3)
        start = time.perf_counter()
        res = train_transcoders(model, train, config=cfg, progress=True)
        res.transcoders.save(out)
        fit = transcoder_fidelity(model, res.transcoders, held)
        record = {"model": str(model_dir), "config": {"d_sae": d_sae, "k": k, "max_length": max_length,
                                                      "n_train_pairs": n_train, "epochs": epochs, "lr": 1e-3,
                                                      "batch_size": 256},
                  "train_seconds": res.seconds, "tokens": res.n_tokens, "tokens_per_second": res.tokens_per_second,
                  "threads": torch.get_num_threads(), "final_fvu": res.to_frame().set_index("layer")["final_fvu"]
                  .to_dict(), "held_out_pairs": n_held, "explained_variance": fit.explained_variance,
                  "l0": fit.l0, "reward_recovered": fit.reward_recovered, "fidelity": fit.describe(),
                  "total_seconds": time.perf_counter() - start}
        (out / "training.json").write_text(json.dumps(record, indent=1, default=float))

    return ensure(f"{model_dir.name}-transcoders-{tag(size)}", build)


if __name__ == "__main__":
    torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
    print(transcoders_dir(sys.argv[2] if len(sys.argv) > 2 else "full"))
