"""`summary()` returns one type everywhere: a DataFrame indexed by headline name with a `value` column
(then `low`/`high` and `n` where the result has them), docs/design.md "Results"."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import rewardlens
from rewardlens.data import Pair, check_pairs
from rewardlens.errors import DegeneratePairsWarning
from rewardlens.hacking import EditReport
from rewardlens.model import Parity
from rewardlens.model._parity import ParityCheck
from rewardlens.sae._fidelity import Fidelity
from rewardlens.stats import SUMMARY_COLUMNS, summary_frame

ROOT = Path(rewardlens.__file__).parent


def _classes_with_summary() -> list[tuple[str, str]]:
    """(module, class) of every class in the package that defines a `summary` method."""
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module = ".".join(["rewardlens", *path.relative_to(ROOT).with_suffix("").parts]).removesuffix(".__init__")
        out += [(module, node.name) for node in tree.body if isinstance(node, ast.ClassDef)
                and any(isinstance(f, ast.FunctionDef) and f.name == "summary" for f in node.body)]
    return out


CLASSES = _classes_with_summary()


def test_the_scan_finds_the_results():
    names = {c for _, c in CLASSES}
    assert {"Parity", "PairChecks", "Fidelity", "Comparison", "Faithfulness", "Circuit", "Probes"} <= names


@pytest.mark.parametrize("module, name", CLASSES)
def test_every_summary_is_declared_a_frame(module, name):
    method = getattr(importlib.import_module(module), name).summary
    assert method.__annotations__.get("return") in ("pd.DataFrame", pd.DataFrame), (
        f"{module}.{name}.summary() returns {method.__annotations__.get('return')!r}; every summary() is a "
        "pandas.DataFrame built by stats.summary_frame")


def _check(frame: pd.DataFrame) -> None:
    assert isinstance(frame, pd.DataFrame) and frame.index.is_unique
    lead = [c for c in frame.columns if c in SUMMARY_COLUMNS]
    assert lead[0] == "value" and lead == list(frame.columns[: len(lead)])


def test_summary_frame_orders_the_columns_and_refuses_no_value():
    frame = summary_frame([{"name": "a", "extra": "x", "n": 3, "high": 2.0, "low": 0.0, "value": 1.0}])
    assert list(frame.columns) == ["value", "low", "high", "n", "extra"] and frame.loc["a", "value"] == 1.0
    assert list(summary_frame([]).columns) == ["value"]
    with pytest.raises(AssertionError):
        summary_frame([{"name": "a", "rho": 1.0}])


def test_hand_built_results_summarise_as_frames():
    parity = Parity((ParityCheck("reward", 1e-7, 1e-5, 4), ParityCheck("margin", 2e-7, 1e-5, 4)), "float32")
    frame = parity.summary()
    _check(frame)
    assert frame["value"].tolist() == [1e-7, 2e-7] and frame["n"].tolist() == [4, 4]

    with pytest.warns(DegeneratePairsWarning):
        checks = check_pairs([Pair("p", "a", "b"), Pair("p", "same", "same")])
    frame = checks.summary()
    _check(frame)
    assert frame["value"].to_dict() == checks.counts

    r = np.array([1.0, 0.0, 2.0, 1.0])
    fit = Fidelity("resid_L0", "read", 0.9, 0.8, 3.0, 10, r, r + 0.5, r * 0)
    frame = fit.summary()
    _check(frame)
    assert frame.loc["mean_abs_reward_change_spliced", "value"] == 0.5 and "0.900" in fit.describe()

    before, after = np.array([1.0, 2.0, 3.0]), np.array([0.0, 0.5, 0.25])
    rep = EditReport(["a", "b", "c"], before, after, ["d", "e", "f"], before, before)
    frame = rep.summary()
    _check(frame)
    assert frame.loc["share_removed", "value"] == pytest.approx(1 - after.mean() / before.mean())
    low, high = rep.intervals()["share_removed"]
    assert (frame.loc["share_removed", "low"], frame.loc["share_removed", "high"]) == (low, high)
