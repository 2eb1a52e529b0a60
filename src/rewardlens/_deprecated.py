"""Names that moved keep working for one release: a module `__getattr__` (PEP 562) that finds the new
home, warns once per lookup with a `DeprecationWarning` naming it, and returns the object.

A face writes `__getattr__ = moved(__name__, {"old": "rewardlens.pkg.internal:new", ...})`; the target is
`module:attribute` (the attribute defaults to the old name). The base layer: it imports nothing of
rewardlens at module level, so every layer may use it.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def resolve(target: str) -> Any:
    """The object `module:attribute` names (imports the module)."""
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def warn(old: str, target: str, *, stacklevel: int = 3) -> None:
    """Say that `old` moved to `target` and is removed in the next release."""
    module, _, attribute = target.partition(":")
    warnings.warn(f"{old} is deprecated and will be removed in the next release; use {module}.{attribute}",
                  DeprecationWarning, stacklevel=stacklevel)


def moved(module: str, table: Mapping[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` serving each old name of `table` from its new home, with a warning.

    `table` maps an old name to `"new.module"` (same attribute name) or `"new.module:new_name"`."""
    full = {old: target if ":" in target else f"{target}:{old}" for old, target in table.items()}

    def __getattr__(name: str) -> Any:
        target = full.get(name)
        if target is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warn(f"{module}.{name}", target)
        return resolve(target)

    __getattr__.moved = full  # type: ignore[attr-defined]  # the table, for the tests that walk it
    return __getattr__


def renamed(where: str, old: str, new: str, old_value: Any, value: Any) -> Any:
    """The value a renamed keyword stands for: `value` (the new keyword's), unless the caller passed the old
    keyword (`old_value` not None), which warns and wins. A function keeps `old: T | None = None` in its
    signature for one release, so a misspelt keyword is still a TypeError."""
    if old_value is None:
        return value
    warnings.warn(f"{where}({old}=...) is deprecated and will be removed in the next release; use {new}=",
                  DeprecationWarning, stacklevel=3)
    return old_value
