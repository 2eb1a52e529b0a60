"""The graphs' plumbing for the workflows that drive them (the audit's `--graph`): the check that a model's
forward can be frozen, so a run refuses before it computes anything else, and a feature card's `Context`, so a
stored page is written again without the model. Users call `rewardlens.graph`."""

from ._frozen import check_model as check_model
from ._page import Context as Context

__all__ = ["Context", "check_model"]
