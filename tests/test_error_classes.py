"""Issue 43: bad input raises the hierarchy's classes, so the command line can tell it from a bug.

A bare `raise ValueError` in the package would read as a bug on the command line (exit 1, a traceback):
bad arguments raise `UsageError` (a `RewardLensError` and a `ValueError`), malformed data `DataError`.
"""

import ast
from pathlib import Path

import rewardlens

BARE = ("ValueError",)
"""`KeyError`/`IndexError` stay: a lookup by key or index raises them by Python's protocol (`cards[17]`)."""


def _bare_raises(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id in BARE:
                found.append(f"{path}:{node.lineno} raise {exc.id}")
    return found


def test_the_package_raises_no_bare_value_error():
    root = Path(rewardlens.__file__).parent
    found = [hit for path in sorted(root.rglob("*.py")) for hit in _bare_raises(path)]
    assert not found, "\n".join(found)


def test_the_yardstick_sees_a_bare_raise(tmp_path):
    planted = tmp_path / "m.py"
    planted.write_text("def f():\n    raise ValueError('x')\n")
    assert _bare_raises(planted) == [f"{planted}:2 raise ValueError"]
