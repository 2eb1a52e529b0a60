"""One exception hierarchy. Messages name the invariant, the value received and the fix."""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType


class RewardLensError(Exception):
    """Base class of every error rewardlens raises on purpose (bad input; never a bug).

    `option`: the keyword argument at fault or named as the fix (e.g. "max_length"), or None. It is
    data, so the command line names its own flag for it without parsing the message.
    """

    def __init__(self, *args: object, option: str | None = None) -> None:
        super().__init__(*args)
        self.option = option


class ArchitectureError(RewardLensError):
    """The model's structure does not match any map, or a map does not fit the loaded model."""


class SAEMismatchError(ArchitectureError):
    """An SAE does not belong to the model or hook point it is applied to: another width, a layer the
    model lacks, another hook kind, or another base model (the message names both and the override)."""


class HeadError(RewardLensError):
    """The reward head is not one rewardlens can read exactly (not linear, wrong shape, no readout)."""


class ModelLoadError(RewardLensError):
    """A model cannot be loaded safely, or what would load cannot give a finite reward: pickle-only
    weights without `allow_pickle=True`, a pickle torch's safe unpickler refuses, custom code
    (`auto_map`) that is missing or not trusted, non-finite weights or a non-finite check forward."""


class MissingDependencyError(RewardLensError, ImportError):
    """An optional package a feature needs is not installed; the message names the extra to install.

    Also an `ImportError`, so code that already catches a failed import keeps working."""


class TokenizationError(RewardLensError):
    """An input cannot be tokenized safely (truncation would cut the read token, no pad token...)."""


class UsageError(RewardLensError, ValueError):
    """A bad argument: the message names the option, the value received and the fix.

    `UsageError(message, option="level")`: `.option` carries the offending argument as data (the
    keyword the caller passed), or None when no single option is at fault; the CLI maps it to its
    flag, so message wording is never parsed. Also a `ValueError`, so code that catches a bad value
    keeps working.
    """


class DataError(RewardLensError, ValueError):
    """A preference-pair file or record is malformed; the message names file, row and field.

    Also a `ValueError` (bad input), like `UsageError`, but about data rather than an argument."""


class CircuitError(UsageError):
    """A path or circuit that cannot exist: no senders or receivers, a receiver that reads the stream
    before its sender writes to it, an empty circuit. A `UsageError`, so also a `ValueError`."""


class ClosureError(RewardLensError):
    """An exact decomposition failed to sum to the model's reward within tolerance."""


class NonFiniteError(RewardLensError):
    """No pair has a finite reward (and finite parts): every number left to count is NaN or infinite.

    A weight of the model is non-finite, or the forward overflows in the backbone's dtype. Raised
    instead of a table of NaN or an accuracy of 0 (`rewardlens.model.internal.finite_pairs`).
    """


class StoreError(RewardLensError):
    """The results store is unreadable, incomplete for what was asked, holds a damaged unit (its
    checksum fails; a rerun computes it again), or two shards disagree."""


class StoreLockedError(StoreError):
    """Another process held the results store's lock for longer than the store's timeout.

    Its own class because a lock is transient: the store is fine, and the fix is to wait, never to
    replace the file (SQLite's "database is locked" never means a damaged file).
    """


class RunLockedError(StoreError):
    """Another run holds the output folder's run lock; the message names its pid and start time."""


class OutOfMemoryError(RewardLensError, MemoryError):
    """Some sequences did not fit in accelerator memory even one per batch, and were skipped.

    Raised at the end of the batch loop, after every other row was computed, so it names all of
    them at once: `labels` ("pair 3 (chosen)"), `rows` (their numbers in the instrument's input:
    with pairs, 2i is pair i's chosen side and 2i+1 its rejected one) and `pairs` (the pair
    numbers, None when the input was not pairs). The call returns no result: drop those pairs and
    call again (the audit records them as skipped), or shorten them.
    """

    def __init__(self, labels: list[str], rows: list[int], pairs: list[int] | None) -> None:
        self.labels, self.rows, self.pairs = labels, rows, pairs
        shown = ", ".join(labels[:10]) + (f" and {len(labels) - 10} more" if len(labels) > 10 else "")
        super().__init__(
            f"{len(labels)} sequence(s) did not fit in accelerator memory even one per batch: {shown}; every "
            "other sequence was computed, but an instrument returns all rows or none. Drop those pairs "
            "(OutOfMemoryError.pairs) and call again, shorten them (max_length= with truncation='left'), or "
            "spread the model over devices (device_map=) or load it in a smaller dtype"
        )

    def __reduce__(self) -> tuple[type, tuple[list[str], list[int], list[int] | None]]:
        return type(self), (self.labels, self.rows, self.pairs)  # picklable (worker processes)


class RewardLensWarning(UserWarning):
    """Something deliberate but surprising happened (e.g. pad = eos moved the read token)."""


class DegeneratePairsWarning(RewardLensWarning):
    """Some preference pairs are degenerate (empty response, identical sides, duplicate id or pair).

    A subclass so a caller can filter, record or escalate exactly this warning; `strict=True` on
    `load_pairs`/`check_pairs` raises the same report as a `DataError`.
    """


def warn(message: str) -> None:
    """Warn with `RewardLensWarning`, attributed to the caller's caller (the user's line, not ours)."""
    warnings.warn(message, RewardLensWarning, stacklevel=3)


def require(module: str, need: str, fix: str) -> ModuleType:
    """`module`, imported; or a `MissingDependencyError` saying what needs it (`need`, a sentence's start)
    and how to install it (`fix`), raised before any work starts."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependencyError(f"{need}, which needs the {module.split('.')[0]!r} package, not installed; "
                                     f"fix: {fix}") from None
