#!/usr/bin/env bash
# Set up the project's virtual environment in <repo>/.venv and install rewardlens into it.
#
#   bash scripts/setup.sh          # runtime dependencies only
#   bash scripts/setup.sh real     # plus gguf, which building the real SmolLM2 reward model needs
#                                  # (python -m rewardlens.zoo.realmodels smollm2-dpo)
#   bash scripts/setup.sh loop     # plus TRL, which verify-edit (rewardlens.loop) trains its policies with
#   bash scripts/setup.sh test     # plus the test extras (pytest, datasets, gguf, scipy, ...)
#                                  # and Debian's chromium (/usr/bin/chromium) for the report test
#
# Environment:
#   PYTHON      interpreter used to create .venv when it does not exist (default: python3)
#   TORCH_SPEC  what to pip-install for torch (default: torch==2.13.0). It is split on
#               whitespace, so pip options may follow, e.g. TORCH_SPEC='torch' or
#               TORCH_SPEC='torch==2.13.0 --index-url <a CUDA wheel index>'.
#
# Idempotent: an existing .venv is reused and pip leaves satisfied requirements alone.
# Works from any working directory.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

case "${1:-}" in
  test) target=".[test]" ;;
  real) target=".[gguf]" ;;
  loop) target=".[loop]" ;;
  "") target="." ;;
  *)
    echo "usage: bash scripts/setup.sh [real|loop|test]" >&2
    exit 2
    ;;
esac

export PIP_DISABLE_PIP_VERSION_CHECK=1

venv_python="$repo_root/.venv/bin/python"
if [[ ! -x "$venv_python" ]]; then
  python="${PYTHON:-python3}"
  if ! command -v "$python" >/dev/null 2>&1; then
    echo "setup: no Python interpreter '$python' (set PYTHON to one, >= 3.10)" >&2
    exit 1
  fi
  echo "setup: creating .venv with $("$python" --version 2>&1) ($python)"
  "$python" -m venv "$repo_root/.venv"
fi
pip=("$venv_python" -m pip install -q)

# torch goes in first, on its own, so that the build is chosen here rather than by the
# resolver. The default is pinned: this project's machines carry the CPU wheel
# torch-2.13.0+cpu locally (pip's find-links), and "==2.13.0" matches it, whereas a looser
# spec lets pip take a newer release from PyPI, whose Linux wheels are CUDA builds that drag
# in several GB of nvidia-* packages even on CPU-only machines. Users with GPUs set
# TORCH_SPEC (e.g. TORCH_SPEC='torch', or a spec plus --index-url for a CUDA build).
# Without TORCH_SPEC, a torch >= 2.1 already in .venv (say, someone's own CUDA build) is
# kept as it is.
have_torch() {
  "$venv_python" - <<'EOF' 2>/dev/null
import sys
import torch
major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
sys.exit(0 if (major, minor) >= (2, 1) else 1)
EOF
}
if [[ -n "${TORCH_SPEC:-}" ]] || ! have_torch; then
  read -r -a torch_args <<<"${TORCH_SPEC:-torch==2.13.0}"
  echo "setup: pip install ${torch_args[*]}"
  "${pip[@]}" "${torch_args[@]}"
fi

echo "setup: pip install -e $target"
"${pip[@]}" -e "$target"

# The report test renders report.html in headless Chromium. Debian's package is the only
# browser this project uses (a test tool's own browser download cannot reach its host here);
# installing it needs root and apt, as on the project's machines and in CI.
if [[ "$target" == ".[test]" && ! -x /usr/bin/chromium ]]; then
  if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "setup: the report test needs Debian's chromium at /usr/bin/chromium; install it as root with" \
      "'apt-get install chromium' (this script needs root and apt-get to do it)" >&2
    exit 1
  fi
  echo "setup: apt-get install chromium (for the report test)"
  apt_log="$(mktemp)"
  if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
         DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; } \
       >"$apt_log" 2>&1 || [[ ! -x /usr/bin/chromium ]]; then
    cat "$apt_log" >&2
    rm -f "$apt_log"
    echo "setup: could not install Debian's chromium (apt-get output above); the report test needs" \
      "/usr/bin/chromium" >&2
    exit 1
  fi
  rm -f "$apt_log"
fi

# Report versions from the installed metadata (importing rewardlens itself is left to tests).
"$venv_python" - <<'EOF'
import sys
from importlib.metadata import version

print(
    f"setup: done: python {sys.version.split()[0]}, torch {version('torch')}, "
    f"transformers {version('transformers')}, rewardlens {version('rewardlens')} (editable)"
)
EOF
