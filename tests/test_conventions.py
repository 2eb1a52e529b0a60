"""Conventions held by code, read from the source with `ast`: each has one owner, and nobody else writes it.

- The row layout (rows alternate chosen, rejected): only `data/_rows.py` slices rows with step 2
  (`[0::2]`, `[1::2]`, `[::2]`) or indexes a pair's rows as `[2 * i]`, `[2 * i + 1]`, `[2 * a:2 * b]`;
  everyone else calls `chosen`, `rejected`, `margin`, `side` (`rewardlens.data`) or `interleave`,
  `rows_of`, `pair_rows`, `pair_span` (`rewardlens.data.internal`).
- Part names (`attn_L3_H2`, `mlp_L1_N17`, ...): only `model/_parts.py` (`Part`) formats them in an
  f-string or parses them with `split("_L")`-style string surgery; everyone else uses `Part.name`/`Part.parse`.

The effect sign (clean margin − patched margin) is owned by `data.effect`; its callers are checked by
the tests of the results that use it (a sign error flips a number the naive oracle pins).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import rewardlens

ROOT = Path(rewardlens.__file__).parent
ROW_OWNER = "data/_rows.py"
PART_OWNER = "model/_parts.py"
# Folders exempt while they are being written (none today: every folder asks the owners).
PENDING: tuple[str, ...] = ()
# A part-name fragment right before an interpolated field: `attn_L{l}`, `_H{h}`, `_N{i}`, `_E{e}`.
PART_FRAGMENT = re.compile(r"(?:^|[^A-Za-z0-9])(?:attn|mlp)?_[LHNE]$")
PART_SEPARATORS = ("_L", "_H", "_N", "_E")
SPLITTERS = {"split", "rsplit", "partition", "rpartition"}


def _files() -> list[str]:
    return sorted(p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.py"))


def _exempt(rel: str, owner: str) -> bool:
    return rel == owner or rel.startswith(PENDING)


def _row_slices(tree: ast.AST) -> list[int]:
    """Lines slicing with step 2 from row 0 or 1 (`[0::2]`, `[1::2]`, `[::2]`): the row layout by hand."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Slice) and node.upper is None and isinstance(node.step, ast.Constant) \
                and node.step.value == 2 and (node.lower is None or (
                    isinstance(node.lower, ast.Constant) and node.lower.value in (0, 1))):
            out.append(node.lineno)
    return out


def _twice(node: ast.expr | None) -> bool:
    """`2 * x`, `2 * x + 1` or `2 * x + side` (either order): a pair index turned into a row by hand."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return any(_twice(s) and not isinstance(s.op, ast.Add) for s in (node.left, node.right)
                   if isinstance(s, ast.BinOp))
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and any(
        isinstance(s, ast.Constant) and s.value == 2 for s in (node.left, node.right))


def _pair_indexing(tree: ast.AST) -> list[int]:
    """Lines indexing rows by a pair's number: `x[2 * i]`, `x[2 * i + 1]`, `x[2 * a:2 * b]`."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript):
            index = node.slice
            if _twice(index) or (isinstance(index, ast.Slice) and (_twice(index.lower) or _twice(index.upper))):
                out.append(node.lineno)
    return out


def _part_names(tree: ast.AST) -> list[int]:
    """Lines that format a part name in an f-string or cut one apart at `_L`, `_H`, `_N`, `_E`."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            for text, nxt in zip(node.values, node.values[1:]):
                if isinstance(text, ast.Constant) and isinstance(text.value, str) and \
                        isinstance(nxt, ast.FormattedValue) and PART_FRAGMENT.search(text.value):
                    out.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SPLITTERS \
                and node.args and isinstance(node.args[0], ast.Constant) \
                and str(node.args[0].value).startswith(PART_SEPARATORS):
            out.append(node.lineno)
    return out


@pytest.mark.parametrize("rel", _files())
def test_only_the_owners_write_the_row_layout_and_part_names(rel):
    tree = ast.parse((ROOT / rel).read_text(encoding="utf-8"))
    if not _exempt(rel, ROW_OWNER):
        lines = _row_slices(tree) + _pair_indexing(tree)
        assert not lines, (f"{rel} slices rows by hand at lines {lines}; use rewardlens.data's chosen/rejected/"
                           "margin/side/interleave (data/_rows.py owns the row layout)")
    if not _exempt(rel, PART_OWNER):
        lines = _part_names(tree)
        assert not lines, (f"{rel} formats or parses a part name by hand at lines {lines}; use Part(...).name "
                           "or Part.parse (model/_parts.py owns part names)")


def test_the_scan_sees_what_it_forbids():
    code = ("a = r[0::2] - r[1::2]\nb = x[:, ::2]\nc = f'attn_L{l}_H{h}'\nd = f'mlp_L{l}'\n"
            "e = name.split('_L')[1]\nf = r[::per]\ng = f'layer {l}'\nh = r[2:4]\n")
    tree = ast.parse(code)
    assert sorted(set(_row_slices(tree))) == [1, 2]
    assert sorted(set(_part_names(tree))) == [3, 4, 5]
    rows = ast.parse("a = s[2 * i]\nb = s[2 * i + 1]\nc = s[2 * a:2 * b]\nd = s[i + 1]\ne = s[2 + i]\n"
                     "f = s[1 + 2 * k]\ng = s[2 * i + side]\n")
    assert sorted(set(_pair_indexing(rows))) == [1, 2, 3, 6, 7]
