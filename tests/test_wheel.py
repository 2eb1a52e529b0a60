"""A real package: the tree builds a wheel and an sdist (`python -m build`, the wheel built from the sdist), and
the wheel, installed into a fresh virtual environment (not editable; torch from the pin scripts/setup.sh uses),
gives a working `rewardlens` command that runs the demo audit, with every package-data file inside.

Slow (a fresh environment installs torch and the dependencies: minutes); `pytest -m "not slow"` skips it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"
"""scripts/setup.sh's default TORCH_SPEC: the CPU wheel this project's machines carry locally."""


def _run(args: list[str | Path], *, cwd: Path, timeout: int = 1200, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env)
    assert done.returncode == 0, f"{' '.join(map(str, args))} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _tree(dest: Path) -> Path:
    """A copy of the working tree's files (tracked, and untracked but not ignored), so the build writes nothing
    into the repository (its egg-info, build/)."""
    files = _run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO).split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def package_data() -> list[str]:
    """Every file pyproject.toml's package-data globs name, as a path inside the wheel."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    root = REPO / "src"
    out = []
    for package, globs in config["tool"]["setuptools"]["package-data"].items():
        base = root / package.replace(".", "/")
        out += [p.relative_to(root).as_posix() for g in globs for p in sorted(base.glob(g)) if p.is_file()]
    return out


@pytest.mark.slow
def test_the_wheel_installs_into_a_fresh_environment_and_runs_the_demo_audit(tmp_path):
    tree = _tree(tmp_path / "tree")
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "build", "--outdir", dist, tree], cwd=tmp_path)
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in dist.iterdir())

    import rewardlens

    assert f"rewardlens-{rewardlens.__version__}-" in wheels[0].name
    inside = set(zipfile.ZipFile(wheels[0]).namelist())
    data = package_data()
    assert data and any(p.endswith(".safetensors") for p in data) and any(p.endswith(".jsonl") for p in data)
    assert not [p for p in data if p not in inside], "package data missing from the wheel"
    modules = [p.relative_to(REPO / "src").as_posix() for p in (REPO / "src" / "rewardlens").rglob("*.py")]
    assert not [m for m in modules if m not in inside], "modules missing from the wheel"

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=tmp_path)
    py, bindir = venv / "bin" / "python", venv / "bin"
    _run([py, "-m", "pip", "install", "-q", TORCH], cwd=tmp_path)
    _run([py, "-m", "pip", "install", "-q", wheels[0]], cwd=tmp_path)

    outside = tmp_path / "elsewhere"  # not the repository: nothing can be imported from its src/
    outside.mkdir()
    env = {**os.environ, "PYTHONPATH": "", "PATH": f"{bindir}:{os.environ.get('PATH', '')}"}
    code = "import rewardlens, json; print(json.dumps([rewardlens.__file__, rewardlens.__version__]))"
    where = _run([py, "-c", code], cwd=outside, env=env)
    path, version = json.loads(where)
    assert Path(path).is_relative_to(venv) and version == rewardlens.__version__
    assert "audit" in _run([bindir / "rewardlens", "--help"], cwd=outside, env=env)
    found = _run([py, "-c", "from rewardlens.data import sample_path; from rewardlens.zoo.realmodels import HEADS;"
                            "print(sample_path('rewardbench').is_file(), sorted(p.name for p in HEADS.iterdir()))"],
                 cwd=outside, env=env)
    assert found.startswith("True") and "smollm2-dpo.safetensors" in found

    # The demo audit from the installed command: the demo model is cached under REWARDLENS_CACHE (inherited,
    # or ~/.cache/rewardlens), so a machine that trained it once reuses it here.
    out = outside / "audit"
    _run([bindir / "rewardlens", "audit", "--limit", "4", "--no-probes", "--no-concepts", "--out", out, "--json"],
         cwd=outside, env=env)
    numbers = json.loads((out / "numbers.json").read_text(encoding="utf-8"))
    assert numbers["n_pairs"] == 4 and numbers["rewardlens_version"] == rewardlens.__version__
    assert (out / "report.html").stat().st_size > 10_000
