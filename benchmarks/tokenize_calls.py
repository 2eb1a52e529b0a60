"""How many times an audit tokenizes, against how many distinct inputs it reads (issue 25, item 4).

Counts calls of the tokenizer behind `RewardModel.tokenize` (a cache miss of its `TokenMemo`) during
the audit of the built-in demo model on its built-in pairs: once for the per-pair part alone (lens,
attribution, faithfulness), once for the whole audit (probes, concepts, divergence, tokens too).
A count, not a timing: it is the same on every machine, so one run says it.

    python benchmarks/tokenize_calls.py
"""

from __future__ import annotations

import json

import rewardlens as rl
import rewardlens.model._core as core
from rewardlens.audit import Plan, audit
from rewardlens.zoo import AUDIT_PAIRS, demo_model_dir


def count(plan: Plan) -> tuple[int, int]:
    """(tokenizer calls, distinct inputs) of one audit of the demo pairs on a freshly loaded model."""
    model = rl.load(str(demo_model_dir()))  # a fresh model: an empty memo
    seen: list[str] = []
    real = core.tokenize
    core.tokenize = lambda tok, item, *a, **k: seen.append(json.dumps(item, sort_keys=True)) or real(tok, item, *a, **k)
    try:
        audit(model, AUDIT_PAIRS, plan=plan)
    finally:
        core.tokenize = real
    return len(seen), len(set(seen))


def main() -> None:
    per_pair = Plan(chunk_size=8, probes=False, concepts=False, divergence=False, tokens=False)
    for name, plan in (("per-pair part", per_pair), ("whole audit", Plan(chunk_size=8))):
        calls, distinct = count(plan)
        print(f"{name}: {calls} tokenizer calls for {distinct} distinct inputs ({2 * len(AUDIT_PAIRS)} pair sides)")


if __name__ == "__main__":
    main()
