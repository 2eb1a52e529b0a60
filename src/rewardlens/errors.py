"""One exception hierarchy. Messages name the invariant, the value received and the fix."""

from __future__ import annotations

import warnings


class RewardLensError(Exception):
    """Base class of every error rewardlens raises on purpose."""


class ArchitectureError(RewardLensError):
    """The model's structure does not match any map, or a map does not fit the loaded model."""


class HeadError(RewardLensError):
    """The reward head is not one rewardlens can read exactly (not linear, wrong shape, no readout)."""


class TokenizationError(RewardLensError):
    """An input cannot be tokenized safely (truncation would cut the read token, no pad token...)."""


class DataError(RewardLensError):
    """A preference-pair file or record is malformed; the message names file, row and field."""


class ClosureError(RewardLensError):
    """An exact decomposition failed to sum to the model's reward within tolerance."""


class StoreError(RewardLensError):
    """The results store is unreadable, incomplete for what was asked, or two shards disagree."""


class RewardLensWarning(UserWarning):
    """Something deliberate but surprising happened (e.g. pad = eos moved the read token)."""


def warn(message: str) -> None:
    warnings.warn(message, RewardLensWarning, stacklevel=3)
