"""How long the command line takes to refuse a path that does not exist, next to importing torch.

Issue 19's target: `rewardlens score MODEL --pairs missing.jsonl` fails in under a second, because
arguments and paths are checked before torch and transformers are imported. Each case runs in a
fresh interpreter (what a user pays), `--repeats` interleaved rounds, median wall time:

- `refuse missing model`: `python -m rewardlens score missing-folder --pairs missing.jsonl`;
- `refuse missing pairs`: the same with a real model folder (the demo model) and a missing pairs file;
- `import rewardlens`: the package face alone;
- `import torch+transformers`: what every command paid before the checks moved ahead of them.

It prints seconds and each case as a ratio to the torch+transformers import, and checks that the
refusals exited with status 2 and imported neither torch nor transformers.

    python benchmarks/cli_startup.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

# Runs the command in-process, then reports whether the heavy modules were imported.
PROBE = """
import runpy, sys
sys.argv = ["rewardlens", *sys.argv[1:]]
try:
    runpy.run_module("rewardlens", run_name="__main__")
except SystemExit as exc:
    code = exc.code
heavy = sorted(m for m in ("torch", "transformers") if m in sys.modules)
print("HEAVY=" + ",".join(heavy), file=sys.stderr)
sys.exit(code)
"""


def timed(argv: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return time.perf_counter() - start, done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    from rewardlens.zoo import demo_model_dir  # trains the demo model on first use, before any timing

    model = str(demo_model_dir())
    py = sys.executable
    cases = {
        "refuse missing model": [py, "-c", PROBE, "score", "missing-folder", "--pairs", "missing.jsonl"],
        "refuse missing pairs": [py, "-c", PROBE, "score", model, "--pairs", "missing.jsonl"],
        "import rewardlens": [py, "-c", "import rewardlens"],
        "import torch+transformers": [py, "-c", "import torch, transformers"],
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.repeats):
        for name, argv in cases.items():
            seconds, done = timed(argv)
            times[name].append(seconds)
            if name.startswith("refuse"):
                heavy = done.stderr.rsplit("HEAVY=", 1)[-1].strip()
                assert done.returncode == 2 and not heavy, (name, done.returncode, heavy, done.stderr[-500:])
    base = statistics.median(times["import torch+transformers"])
    print(f"{'case':<28}{'median s':>10}{'x torch import':>16}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<28}{median:>10.3f}{median / base:>16.3f}")
    print("\nboth refusals exited with status 2 and imported neither torch nor transformers")


if __name__ == "__main__":
    main()
