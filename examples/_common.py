"""What every example shares: a model and pairs from the command line, or the built-in demo."""

from __future__ import annotations

import argparse

import rewardlens as rl


def model_and_pairs(description: str, extra=None) -> tuple[rl.RewardModel, list[rl.Pair], argparse.Namespace]:
    """`python examples/X.py [MODEL] [--pairs FILE] [--limit N]`; no MODEL: the built-in demo model and pairs."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("model", nargs="?", help="reward model folder (default: the built-in demo model)")
    parser.add_argument("--pairs", help="preference pairs file (default: the demo's pairs)")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N pairs")
    if extra:
        extra(parser)
    args = parser.parse_args()
    if args.model is None:
        from rewardlens.zoo._demo import AUDIT_PAIRS, demo_model_dir

        args.model = str(demo_model_dir())  # trained once (about 15 s), then cached
        pairs = list(AUDIT_PAIRS)
    else:
        pairs = None
    if args.pairs:
        pairs = rl.load_pairs(args.pairs)
    if pairs is None:
        parser.error("a model needs --pairs FILE")
    return rl.load(args.model), pairs[: args.limit], args
