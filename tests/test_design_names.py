"""docs/design.md, the design of record, names code: files (`model/_reads.py: Reads`), classes and their
members (`RewardModel.read_point`), faces (`rewardlens.model.internal`), `stats.x` helpers and CLI commands
(`rewardlens audit`). Every such name must exist, so a rename cannot leave the page describing code that is
gone. Read from the source with `ast` (no import of torch): a name is defined when a module binds it at top
level or a class binds it in its body (methods, properties, dataclass fields, class attributes).
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "rewardlens"
DESIGN = ROOT / "docs" / "design.md"
CITES = re.findall(r"`([^`\n]+)`", DESIGN.read_text(encoding="utf-8"))


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _bound(body: list[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.If):  # `if TYPE_CHECKING:` faces
            names |= _bound(node.body)
    return names


@cache
def _index() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module path relative to src/rewardlens → top-level names, class name → its members, over all classes)."""
    modules: dict[str, set[str]] = {}
    classes: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        tree = _tree(path)
        modules[path.relative_to(SRC).as_posix()] = _bound(tree.body)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                own = {t.attr for n in ast.walk(node) if isinstance(n, (ast.Assign, ast.AnnAssign))
                       for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                       if isinstance(t, ast.Attribute) and getattr(t.value, "id", "") == "self"}
                classes.setdefault(node.name, set()).update(_bound(node.body) | own)
    return modules, classes


def _file(cite: str) -> str | None:
    """Why `path.py[: name]` does not resolve, or None."""
    path, _, name = cite.partition(":")
    path, name = path.strip(), name.strip()
    places = (SRC, ROOT, ROOT / "tests", ROOT / "benchmarks", SRC.parent)
    found = [base / path for base in places if (base / path).is_file()]
    if path == "_name.py":  # the page's pattern for a private module, not a file
        return None
    if not found:
        return f"no file {path}"
    if name:
        head = re.split(r"[.(]", name)[0]
        if head not in _bound(_tree(found[0]).body) | {
                n.name for n in ast.walk(_tree(found[0])) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}:
            return f"{path} defines no {head}"
    return None


def _member(cite: str) -> str | None:
    """Why `Class.member` (a class defined in rewardlens) does not resolve, or None."""
    owner, member = cite.split(".", 1)
    member = re.split(r"[.(]", member)[0]
    _, classes = _index()
    if owner not in classes:
        return None  # not a class of ours (a prose `x.y`); module-style cites are checked below
    return None if member in classes[owner] else f"class {owner} has no member {member}"


def _dotted(cite: str) -> str | None:
    """Why `rewardlens.pkg[.name]`, `stats.name` or `pkg.name` (a subpackage) does not resolve, or None."""
    modules, _ = _index()
    parts = re.split(r"[(]", cite)[0].split(".")
    if parts[0] == "rewardlens":
        parts = parts[1:]
        if len(parts) == 1 and parts[0] in modules["__init__.py"]:  # a name of the top-level face
            return None
    if parts[0] == "model" and len(parts) == 2 and parts[1] in _index()[1]["RewardModel"]:
        return None  # `model.kind`: the page's name for a RewardModel instance, as in `model = rl.load(...)`
    if parts[0] in ("hacking", "sae", "causal", "exact", "model") and len(parts) == 2:
        # a subpackage's name reached through its face or a private module of it (`hacking.dose_read`)
        if any(k.startswith(parts[0] + "/") and parts[1] in v for k, v in modules.items()):
            return None
    for i in range(len(parts), 0, -1):
        for key in ("/".join(parts[:i]) + ".py", "/".join(parts[:i]) + "/__init__.py"):
            if key in modules:
                rest = parts[i:]
                return None if not rest or rest[0] in modules[key] else f"{key} binds no {rest[0]}"
    return f"no module for {cite}"


FILE = re.compile(r"^[\w/]+\.py(: [\w.()=, ]+)?$")
MEMBER = re.compile(r"^[A-Z]\w+\.[a-z_]\w*(\(.*\))?$")
DOTTED = re.compile(r"^(rewardlens(\.\w+)+|stats\.\w+(\(.*\))?|(model|exact|causal|hacking|sae|audit|data|zoo|loop|"
                    r"monitor|calibrate|bench|compare|types)\.[A-Za-z_]\w*(\.[\w]+)*(\(.*\))?)$")
CHECKS = sorted({c for c in CITES if FILE.match(c) or MEMBER.match(c) or DOTTED.match(c)})


def test_the_page_cites_code():
    """The checks below are not vacuous: the page names files, members and faces."""
    assert sum(bool(FILE.match(c)) for c in CHECKS) >= 10 and sum(bool(MEMBER.match(c)) for c in CHECKS) >= 5


@pytest.mark.parametrize("cite", CHECKS)
def test_every_name_design_md_cites_exists(cite):
    if FILE.match(cite):
        why = _file(cite)
    elif MEMBER.match(cite) and not cite.startswith(("rewardlens.",)):
        why = _member(cite)
    else:
        why = _dotted(cite)
    assert why is None, f"docs/design.md cites `{cite}`: {why}"


def test_the_commands_design_md_cites_exist():
    from rewardlens.cli import build_parser

    parser = build_parser()
    commands = set(next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices)
    cited = {c.split()[1] for c in CITES if re.match(r"^rewardlens [a-z][\w-]*", c)}
    assert cited and cited <= commands, f"docs/design.md cites commands that do not exist: {cited - commands}"


def test_the_checker_catches_a_missing_name():
    assert _file("model/_reads.py: NoSuchThing") == "model/_reads.py defines no NoSuchThing"
    assert _member("RewardModel.no_such_member") == "class RewardModel has no member no_such_member"
    assert _dotted("stats.no_such_helper") is not None
