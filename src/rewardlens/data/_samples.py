"""Sample files shipped with the package, written for this project (our own text), for tests and docs.

- `rewardbench`: 40 RewardBench-schema pairs (`prompt`, `chosen`, `rejected`, `subset`, `id`) in 21
  subsets of all four sections: Chat (alpacaeval-*, mt-bench-easy/med), Chat Hard (mt-bench-hard,
  llmbar-*), Safety (refusals-*, xstest-*, donotanswer) and Reasoning (math-prm, hep-*).
- `rewardbench2`: 8 RewardBench 2-schema records, one chosen against three rejected each, in the
  Factuality, Precise IF, Math, Safety and Focus subsets (read as 24 grouped pairs).

They exercise the formats and the scoring, not a model: a few pairs per subset say nothing about
how a reward model does on the real benchmark.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError

SAMPLES = {"rewardbench": "rewardbench_sample.jsonl", "rewardbench2": "rewardbench2_sample.jsonl"}
"""Sample name → file name under `rewardlens/data/samples/`."""


def sample_path(name: str) -> Path:
    """The path of a shipped sample file: `sample_path("rewardbench")` or `sample_path("rewardbench2")`."""
    if name not in SAMPLES:
        raise UsageError(f"no sample named {name!r}; the samples are {sorted(SAMPLES)}")
    return Path(__file__).parent / "samples" / SAMPLES[name]
