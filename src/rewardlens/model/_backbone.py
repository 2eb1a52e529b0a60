"""`Backbone`: what the batch loop and the mixture-of-experts split need of a `RewardModel`, as a protocol.

Those modules sit below `RewardModel` (it is built from them), so they name the few members they read
here instead of importing the class: the model layer has no import cycle, not even for annotations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ._arch import ArchitectureMap
    from ._tokens import Batch


class Backbone(Protocol):
    """A reward model as its batch loop and its expert split see it (`RewardModel` is one)."""

    model: nn.Module
    """The wrapped Hugging Face model."""
    arch: ArchitectureMap
    """Its architecture map."""
    device: torch.device
    """Where its head runs and every captured point lands."""

    @property
    def backbone(self) -> nn.Module:
        """The Hugging Face backbone (the model without its head)."""
        ...

    @property
    def layers(self) -> nn.ModuleList:
        """The transformer layers, in order."""
        ...

    def layer_module(self, layer: int, path: str) -> nn.Module:
        """The module at `path` inside layer `layer`."""
        ...

    def batch_kwargs(self, batch: Batch) -> dict[str, Any]:
        """The backbone's keyword arguments for `batch`."""
        ...
