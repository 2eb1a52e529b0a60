"""`TraceKey`: one capture point of a trace, and the one owner of trace key names.

A trace (model/_trace.py) captures, at the read position, the residual stream and what writes to it:
`embed` (layer 0's input), `resid_3` (layer 3's output), `attn_3`/`mlp_3` (the raw output of the
sublayer's output projection), `attn_z_3`/`mlp_act_3` (that projection's input: heads, neurons; for a
mixture-of-experts block, the block's input), `attn_rnorm_3`/`mlp_rnorm_3` (post-norm layout: the
residual norm's input), `final` (the final norm's input, or the last layer's output) and `gate` (a
gated head: the final norm's input at the gate's position). Analysis code keys traces by `TraceKey`
values; the strings exist only at the boundary (a user's SAE hook point, a stored activation cache, a
label), and this module is the only place they are built or parsed (TransformerLens' `get_act_name`,
without its strings).
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

from ..errors import UsageError
from ._parts import SublayerKind

if TYPE_CHECKING:
    from typing_extensions import Self

TraceKind = Literal["embed", "resid", "attn", "mlp", "attn_z", "mlp_act", "attn_rnorm", "mlp_rnorm", "final", "gate"]
TRACE_KINDS: tuple[TraceKind, ...] = get_args(TraceKind)
LAYERLESS: frozenset[TraceKind] = frozenset({"embed", "final", "gate"})
"""The kinds that are one point of the whole model (no layer)."""
# Layer numbers as `name` writes them (no sign, no leading zero), so that parse(name) inverts name exactly.
_NAME = re.compile(r"(resid|attn|mlp|attn_z|mlp_act|attn_rnorm|mlp_rnorm)_(0|[1-9][0-9]*)")
_FORMS = ("'embed', 'final', 'gate', 'resid_<l>', 'attn_<l>', 'mlp_<l>', 'attn_z_<l>', 'mlp_act_<l>', "
          "'attn_rnorm_<l>' or 'mlp_rnorm_<l>' (l a layer number: 0, 1, 2, ...)")


@dataclass(frozen=True)
class TraceKey:
    """A trace point: `kind` at `layer` (None for the layer-less kinds `embed`, `final`, `gate`).

    Hashable and compared by value, so it keys the dictionaries `points`, `RewardModel.run` and
    `Trace.captured` hold; `name` is its string form (`resid_3`), `parse` the inverse.
    """

    kind: TraceKind
    """What is captured: 'embed', 'resid', 'attn', 'mlp', 'attn_z', 'mlp_act', 'attn_rnorm', 'mlp_rnorm',
    'final' or 'gate'."""
    layer: int | None = None
    """The layer (>= 0) of a layered kind; None for 'embed', 'final' and 'gate'."""

    def __post_init__(self) -> None:
        if self.kind not in TRACE_KINDS:
            raise UsageError(f"trace key kind must be one of {TRACE_KINDS}, got {self.kind!r}")
        if self.kind in LAYERLESS:
            if self.layer is not None:
                raise UsageError(f"trace key {self.kind!r} is one point of the whole model and has no layer, got "
                                 f"layer={self.layer!r}; use TraceKey.{self.kind}()")
            return
        if self.layer is None:
            raise UsageError(f"trace key {self.kind!r} needs a layer (an int >= 0), got None; "
                             f"e.g. TraceKey.{self.kind}(0)")
        if isinstance(self.layer, bool):
            raise UsageError(f"trace key layer must be an int >= 0, got {self.layer!r}")
        try:
            layer = operator.index(self.layer)  # numpy integers too, stored as a plain int (one hash, one repr)
        except TypeError:
            raise UsageError(f"trace key layer must be an int >= 0, got {self.layer!r}") from None
        if layer < 0:
            raise UsageError(f"trace key layer must be >= 0 (layers count from 0), got {layer}")
        object.__setattr__(self, "layer", layer)

    # ---- constructors --------------------------------------------------------------------------
    @classmethod
    def embed(cls) -> Self:
        """Layer 0's input: the embeddings."""
        return cls("embed")

    @classmethod
    def final(cls) -> Self:
        """The residual the head reads: the final norm's input, or the last layer's output."""
        return cls("final")

    @classmethod
    def gate(cls) -> Self:
        """A gated head's gate: the final norm's input at the gate's position."""
        return cls("gate")

    @classmethod
    def resid(cls, layer: int) -> Self:
        """Layer `layer`'s output: the residual stream after it."""
        return cls("resid", layer)

    @classmethod
    def attn(cls, layer: int) -> Self:
        """The raw output of layer `layer`'s attention output projection (before any post-norm)."""
        return cls("attn", layer)

    @classmethod
    def mlp(cls, layer: int) -> Self:
        """The raw output of layer `layer`'s MLP output projection (or mixture-of-experts block)."""
        return cls("mlp", layer)

    @classmethod
    def attn_z(cls, layer: int) -> Self:
        """The input of layer `layer`'s attention output projection: its heads' outputs, concatenated."""
        return cls("attn_z", layer)

    @classmethod
    def mlp_act(cls, layer: int) -> Self:
        """The input of layer `layer`'s MLP output projection: its neurons (a mixture-of-experts block's input)."""
        return cls("mlp_act", layer)

    @classmethod
    def attn_rnorm(cls, layer: int) -> Self:
        """Post-norm layout: the input of the residual norm after layer `layer`'s attention."""
        return cls("attn_rnorm", layer)

    @classmethod
    def mlp_rnorm(cls, layer: int) -> Self:
        """Post-norm layout: the input of the residual norm after layer `layer`'s MLP."""
        return cls("mlp_rnorm", layer)

    @classmethod
    def sublayer(cls, kind: SublayerKind, layer: int) -> Self:
        """The raw output of sublayer `kind` ('attn' or 'mlp') of `layer`: `attn(layer)` or `mlp(layer)`."""
        if kind not in ("attn", "mlp"):
            raise UsageError(f"a sublayer is 'attn' or 'mlp', got {kind!r}")
        return cls(kind, layer)

    @classmethod
    def at_depth(cls, depth: int) -> Self:
        """The residual stream at lens depth `depth` (what layer `depth` reads): `embed` at depth 0, else
        `resid(depth - 1)`."""
        if depth < 0:
            raise UsageError(f"a depth is >= 0 (0 = the embeddings, l + 1 = after layer l), got {depth}")
        return cls.embed() if depth == 0 else cls.resid(depth - 1)

    # ---- the string form -----------------------------------------------------------------------
    @classmethod
    def parse(cls, name: str) -> Self:
        """The trace key a string names (`'resid_3'`, `'embed'`); raises ValueError naming the accepted forms."""
        if not isinstance(name, str):
            raise TypeError(f"a trace key name is a string such as 'resid_3', got {type(name).__name__} {name!r}")
        if name in LAYERLESS:
            return cls(name)
        found = _NAME.fullmatch(name)
        if found is None:
            raise UsageError(f"{name!r} is not a trace key; trace keys are {_FORMS}")
        return cls(found[1], int(found[2]))  # type: ignore[arg-type]  # the pattern admits TraceKind strings only

    @property
    def name(self) -> str:
        """The string form, e.g. 'resid_3', 'attn_z_0', 'embed'."""
        return self.kind if self.layer is None else f"{self.kind}_{self.layer}"

    def __str__(self) -> str:
        return self.name
