"""Does the audit's pairs bar move at least once per pair on a real reward model?

The audit stores its pairs a chunk at a time; the bar moves inside a chunk from the sequences the batch
loops report (docs/audit.md, Progress). This runs the per-pair part (`run_pairs`) of the real SmolLM2-135M
RM over `--pairs` training pairs of dpo_en_demo with the bar replaced by a recorder, and prints whether
every pair count 1..n was shown, in order, and the waits between moves.

    python benchmarks/audit_progress.py                 # 50 pairs, 2 threads: about 8 minutes here
    python benchmarks/audit_progress.py --pairs 12
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
import torch

from rewardlens.audit import Plan, Store, _runner
from rewardlens.zoo.realmodels import dpo_pairs, load_reward_model


class Recorder:
    """A stand-in for the tqdm bar: the count after every move, with its time."""

    def __init__(self) -> None:
        self.n = 0
        self.moves: list[tuple[float, int]] = []

    def update(self, k: int = 1) -> None:
        self.n += k
        self.moves.append((time.monotonic(), self.n))

    def set_postfix_str(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    bar = Recorder()

    def recorder(*_: Any, **__: Any) -> Recorder:
        return bar

    _runner.progress_bar = recorder  # type: ignore[assignment]  # the runner's bar, recorded
    model, pairs = load_reward_model("smollm2-dpo"), dpo_pairs("train")[: args.pairs]
    start = time.monotonic()
    _runner.run_pairs(model, pairs, Store(":memory:"), Plan(), progress=True)
    counts = [n for _, n in bar.moves]
    times = np.array([start] + [t for t, _ in bar.moves])
    waits = np.diff(times)
    every = set(range(1, len(pairs) + 1)) <= set(counts)
    print(f"{len(pairs)} pairs in {times[-1] - start:.0f} s ({args.threads} threads); {len(counts)} moves; every "
          f"count 1..{len(pairs)} shown: {every}; never backwards: {counts == sorted(counts)}")
    print(f"waits between moves: median {np.median(waits):.1f} s, longest {waits.max():.1f} s (before count "
          f"{counts[int(waits.argmax())]})")


if __name__ == "__main__":
    main()
