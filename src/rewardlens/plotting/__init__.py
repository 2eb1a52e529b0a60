"""The base layer's plotting rule: every result's `plot(..., ax=None)` draws into the caller's axes, or
into a new figure (`plotting/_axes.py`). It imports no other rewardlens module, and matplotlib only
when a figure is made."""

from ._axes import finish as finish
from ._axes import one_panel as one_panel
from ._axes import panels as panels

__all__ = ["finish", "one_panel", "panels"]
