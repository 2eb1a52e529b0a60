"""Every script in examples/ runs on the built-in demo model and prints what its question asks."""

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
EXPECT = {
    "where_does_the_preference_form.py": ["linear lens", "normed lens", "crystallization depth"],
    "which_parts_write_it.py": ["attribution vs direct", "attribution vs total", "attn_L"],
    "does_it_reward_length.py": ["sycophancy", "length: the model"],
    "what_does_one_head_do.py": ["attn_L", "through later layers"],
    "at_which_step.py": ["forms at step", "patching at every step (noising)",
                         "largest mean effect on the margin attn_L1_H2"],
    "what_did_dpo_learn.py": ["accuracy 1.00", "attn_L1_H2", "read at 'ĠImportantly'"],
}


def test_every_example_is_listed():
    assert sorted(p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_")) == sorted(EXPECT)


@pytest.mark.parametrize("script", sorted(EXPECT))
def test_example_runs_on_the_demo(script, organisms):
    proc = subprocess.run([sys.executable, str(EXAMPLES / script)], capture_output=True, text=True, timeout=600,
                          cwd=EXAMPLES.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for text in EXPECT[script]:
        assert text in proc.stdout, (text, proc.stdout[-2000:])
    if script == "at_which_step.py":  # the organism's planted truth: every pair forms at its hedged step
        lines = [line for line in proc.stdout.splitlines() if "forms at step" in line]
        assert lines and all(line.split("forms at step ")[1].split()[0] == line.rsplit(" ", 1)[1].rstrip(")")
                             for line in lines), proc.stdout
    if script == "does_it_reward_length.py":  # the demo's planted bias is the one finding (flagged, not fragile)
        rows = [line.split() for line in proc.stdout.splitlines() if line.rstrip().endswith(("True", "False"))]
        assert [r[0] for r in rows if r[-2:] == ["True", "False"]] == ["sycophancy"], proc.stdout
        assert "flagged: sycophancy\n" in proc.stdout, proc.stdout
