"""The package's shape, read from its source with `ast`: one import direction, no cycle, faces only.

The layers (docs/design.md §2), top to bottom:

    faces      rewardlens/__init__.py, cli/, __main__
    workflows  audit/, compare, monitor, calibrate/, bench/, loop/ (which may use the monitor's face)
    instruments exact/ (lowest), then causal/, hacking/, sae/ (which do not import each other), graphs/ (which
                reads sae's transcoders);
               zoo/ beside them (demo, tokenizer, organisms, real models: no instrument imports it)
    model      model/
    base       data/, plotting/, stats, errors, types, _version, _deprecated (old names, one release)

Every import is counted, also one inside a function: a lazy import still ties two modules together.
"""

from __future__ import annotations

import ast
import warnings
from collections import defaultdict
from pathlib import Path

import pytest

import rewardlens

ROOT = Path(rewardlens.__file__).parent
BASE = {"data", "plotting", "stats", "errors", "types", "_version", "_deprecated"}
WORKFLOWS = {"audit", "compare", "monitor", "calibrate", "bench", "loop", "serve"}
INSTRUMENTS = {"exact", "causal", "hacking", "sae", "graphs"}
# What each group may import besides itself. A workflow imports another workflow's face only where listed.
ALLOWED: dict[str, set[str]] = {
    "base": set(),
    "model": {"base"},
    "exact": {"model", "base"},
    "causal": {"exact", "model", "base"},
    "hacking": {"exact", "model", "base"},
    "sae": {"exact", "model", "base"},
    "graphs": {"sae", "exact", "model", "base"},
    "zoo": {"model", "base"},
    "audit": {*INSTRUMENTS, "model", "base"},
    "compare": {*INSTRUMENTS, "model", "base"},
    "monitor": {*INSTRUMENTS, "model", "base"},
    "calibrate": {*INSTRUMENTS, "zoo", "model", "base"},
    "bench": {*INSTRUMENTS, "model", "base"},
    "loop": {"monitor", *INSTRUMENTS, "zoo", "model", "base"},
    "serve": {"monitor", *INSTRUMENTS, "model", "base"},
    "face": {*WORKFLOWS, *INSTRUMENTS, "zoo", "model", "base"},
}
# Item text is prose, not code: the one module allowed past the length limit.
LONG_TEXT = {"rewardlens.hacking._items"}
# A module holds one concept: past WARN_LINES it is worth a look (a warning), past MAX_LINES it is two things
# (a failure). Split by concept, never by size: a cap that splits by size scatters one concept over files.
WARN_LINES = 400
MAX_LINES = 600


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = ["rewardlens", *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def group(module: str) -> str:
    """The layer group of a dotted module name inside rewardlens."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("cli", "__main__"):
        return "face"
    top = parts[1]
    return "base" if top in BASE else top


def _package(module: str) -> str:
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def imports(module: str, *, annotations: bool = False) -> list[tuple[str, str, int]]:
    """(imported module, imported name or '', line) for every rewardlens import in `module`; with
    `annotations`, also those only a type checker runs (`if TYPE_CHECKING:`)."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    # Imports only a type checker runs tie no modules together at run time.
    typing_only = set() if annotations else {
        id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
        and getattr(block.test, "id", getattr(block.test, "attr", "")) == "TYPE_CHECKING"
        for stmt in block.body for n in ast.walk(stmt)}
    out = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package(module).split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.split(".")[0] == "rewardlens":
                target = node.module
            else:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.append((sub, "", node.lineno) if sub in MODULES else (target, alias.name, node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name, "", node.lineno) for a in node.names if a.name.split(".")[0] == "rewardlens"]
    return out


def _owner(module: str) -> str:
    """The subpackage a private module belongs to: the part of the name before its first `_` component."""
    parts = module.split(".")
    private = [i for i, p in enumerate(parts) if p.startswith("_") and p not in ("__main__",)]
    return ".".join(parts[: private[0]]) if private else module


def test_every_module_parses_and_the_layout_is_the_documented_one():
    groups = {group(m) for m in MODULES}
    assert groups == set(ALLOWED), f"groups {sorted(groups)} differ from the documented {sorted(ALLOWED)}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module):
    mine = group(module)
    upward = [
        f"line {line}: {target} ({group(target)})"
        for target, _, line in imports(module)
        if target in MODULES and group(target) != mine and group(target) not in ALLOWED[mine]
    ]
    assert not upward, f"{module} ({mine}) imports against the layer direction: {upward}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_other_packages_are_reached_through_their_faces(module):
    """A private module (`pkg._x`) is imported only from inside `pkg`; a private name never."""
    bad = []
    for target, name, line in imports(module):
        owner = _owner(target)
        if target != owner and not (module == owner or module.startswith(owner + ".")):
            bad.append(f"line {line}: private module {target} from outside {owner}")
        if name.startswith("_") and name != "__version__":
            bad.append(f"line {line}: private name {name} of {target}")
    assert not bad, f"{module}: {bad}"


@pytest.mark.parametrize("annotations", [False, True], ids=["run-time", "with-annotations"])
def test_no_import_cycle(annotations):
    """No cycle at run time, nor among the imports a type checker follows: a module that needs another's
    names only for annotations still depends on it (the top-level lazy face, which names everything, aside)."""
    graph = defaultdict(set)
    for module in MODULES:
        for target, _, _ in imports(module, annotations=annotations):
            if target in MODULES and target != module and target != "rewardlens":
                graph[module].add(target)
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for module in sorted(MODULES):
        if module not in state and (cycle := visit(module)):
            pytest.fail("import cycle: " + " → ".join(cycle))


def test_the_cycle_finder_finds_a_planted_cycle(tmp_path, monkeypatch):
    """The checks above would pass vacuously if `imports` saw nothing: plant an upward import and a
    cycle in a copy of two real modules and watch both checks fail."""
    found = {t for t, _, _ in imports("rewardlens.exact._lens")}
    assert "rewardlens.exact._decompose" in found and "rewardlens.model" in found
    fake = tmp_path / "fake.py"
    fake.write_text("from ..causal import patch\nfrom ..audit import Store\n")
    monkeypatch.setitem(MODULES, "rewardlens.model._fake", fake)
    with pytest.raises(AssertionError, match="against the layer direction"):
        test_imports_point_down("rewardlens.model._fake")
    loop = tmp_path / "loop.py"
    loop.write_text("from ..exact import _loopback\n")
    monkeypatch.setitem(MODULES, "rewardlens.model._loop", loop)
    monkeypatch.setitem(MODULES, "rewardlens.exact._loopback", tmp_path / "back.py")
    (tmp_path / "back.py").write_text("from ..model import _loop\n")
    with pytest.raises(pytest.fail.Exception, match="import cycle"):
        test_no_import_cycle(False)


class LongModuleWarning(UserWarning):
    """A module past `WARN_LINES` (and within `MAX_LINES`): check it still holds one concept."""


@pytest.mark.parametrize("module", sorted(set(MODULES) - LONG_TEXT))
def test_modules_stay_short(module):
    n = len(MODULES[module].read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"{module} has {n} lines (> {MAX_LINES}): it is two things; split it by concept"
    if n > WARN_LINES:
        warnings.warn(f"{module} has {n} lines (> {WARN_LINES}): check it still holds one concept",
                      LongModuleWarning, stacklevel=1)


def test_faces_re_export_explicitly():
    """Every subpackage face names each public name as `from ._x import Y as Y` and lists it in __all__.

    A lazy face (the top-level package's) writes those imports in an `if TYPE_CHECKING:` block."""
    for module, path in MODULES.items():
        if path.name != "__init__.py" or module == "rewardlens.cli":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        body = [*tree.body, *(n for b in tree.body if isinstance(b, ast.If)
                              and getattr(b.test, "id", "") == "TYPE_CHECKING" for n in b.body)]
        exported = {a.asname for n in body if isinstance(n, ast.ImportFrom) for a in n.names if a.asname}
        names = next((ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                      and any(getattr(t, "id", "") == "__all__" for t in n.targets)), None)
        assert names is not None, f"{module} has no __all__"
        missing = set(names) - exported
        assert not missing, f"{module}: {sorted(missing)} in __all__ but not re-exported as `X as X`"


def test_no_top_level_module_but_the_faces_and_the_base():
    """Every implementation lives in a subpackage with a face; the top level holds only the package's own
    face, `python -m rewardlens`, and the base modules every layer may use."""
    top = {m for m in MODULES if m.count(".") == 1 and MODULES[m].name != "__init__.py"}
    assert top == {"rewardlens.__main__", "rewardlens.errors", "rewardlens.stats", "rewardlens.types",
                   "rewardlens._version", "rewardlens._deprecated"}, sorted(top)


def test_plotting_is_a_leaf():
    """`plotting` is the `plot(ax=)` rule every result follows and the notebook views; it imports no other
    rewardlens module but `errors` (a leaf: a wrong `ax` is a `UsageError`)."""
    mine = {"rewardlens.plotting", "rewardlens.plotting._axes", "rewardlens.plotting._html",
            "rewardlens.plotting._token_html"}
    assert {m for m in MODULES if m.startswith("rewardlens.plotting")} == mine
    assert [t for t, _, _ in imports("rewardlens.errors", annotations=True)] == []
    for module in mine:
        assert {t for t, _, _ in imports(module, annotations=True)} <= mine | {"rewardlens.errors"}, module


def test_types_is_a_leaf():
    """`types` names options and shapes; it imports no rewardlens module, not even for annotations."""
    assert [t for t, _, _ in imports("rewardlens.types", annotations=True)] == []


def test_the_version_is_a_literal_that_the_installed_metadata_agrees_with():
    """`import rewardlens` reads no package metadata (a fifth of its time, paid by every CLI error), and the
    literal is the one pyproject.toml installs, so the two cannot drift."""
    import subprocess
    import sys
    from importlib.metadata import version

    code = "import sys, rewardlens; assert 'importlib.metadata' not in sys.modules; print(rewardlens.__version__)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == rewardlens.__version__ == version("rewardlens")
