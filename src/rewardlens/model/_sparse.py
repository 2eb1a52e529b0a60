"""Which modules are sparse mixture-of-experts blocks (a leaf: the architecture maps and the expert split
both ask it)."""

from __future__ import annotations

from torch import nn

EXPERTS = "experts"
"""The child every understood sparse block keeps its experts under (3-D fused weights in transformers 5)."""


def is_moe_block(module: nn.Module) -> bool:
    """Whether `module` is a sparse mixture-of-experts block: it has an `experts` child."""
    return isinstance(getattr(module, EXPERTS, None), nn.Module)


def moe_paths(layer: nn.Module) -> list[str]:
    """Paths (relative to `layer`) of the sparse blocks inside one transformer layer, outermost first."""
    return [name for name, module in layer.named_modules() if name and is_moe_block(module)]
