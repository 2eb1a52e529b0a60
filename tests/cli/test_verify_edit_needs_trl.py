"""`verify-edit` without TRL: one line naming the `loop` extra and its setup target, before torch or the loop
is imported (it used to say so after 72 s of imports and organism builds)."""

from __future__ import annotations

import subprocess
import sys

WITHOUT_TRL = """
import atexit, sys
sys.modules["trl"] = None  # as if not installed: importlib.util.find_spec("trl") is None, import trl fails
atexit.register(lambda: sys.stderr.write("HEAVY:" + ",".join(m for m in ("torch", "transformers", "rewardlens.loop")
                                                          if m in sys.modules) + "\\n"))
from rewardlens.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_verify_edit_without_trl_names_the_extra_before_anything_heavy(tmp_path):
    proc = subprocess.run([sys.executable, "-c", WITHOUT_TRL, "verify-edit", "--seeds", "1"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert lines[-1] == "HEAVY:", proc.stderr  # neither torch, transformers nor the loop was imported
    assert proc.returncode == 2 and len(lines) == 2, proc.stderr
    assert lines[0].startswith("rewardlens: error: verify-edit trains its policies with TRL's GRPOTrainer")
    assert "bash scripts/setup.sh loop" in lines[0] and "rewardlens[loop]" in lines[0]


def test_the_library_names_the_setup_target_too(monkeypatch):
    import pytest

    from rewardlens.errors import MissingDependencyError
    from rewardlens.loop._train import require_trl

    monkeypatch.setitem(sys.modules, "trl", None)
    with pytest.raises(MissingDependencyError, match="bash scripts/setup.sh loop"):
        require_trl()
