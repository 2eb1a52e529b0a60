"""`Part`: one term of the exact decomposition, and the one owner of part names.

The residual stream at the read position is a sum of parts (docs/design.md §1): the embeddings, then
every attention and MLP sublayer's output. A sublayer splits further into its heads (attention) or
neurons (MLP), plus one bias part when its output projection or post-norm adds a constant; a
mixture-of-experts MLP splits into its routed experts (each weighted by the router on this input)
and its shared expert. The public labels are strings — `embed`, `attn_L3`, `attn_L3_H2`,
`attn_L3_bias`, `mlp_L3`, `mlp_L3_N17`, `mlp_L3_bias`, `mlp_L3_E5`, `mlp_L3_shared` — and this
module is the only place they are built or parsed. Attribution graphs (rewardlens.graphs) add a
transcoder feature of an MLP under its own letter, `tc_L3_F120`, its reconstruction error `tc_L3_error`,
and a token position to any part: `embed_P5`, `mlp_L3_N17_P5`, `tc_L3_F120_P5`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from ..errors import UsageError

if TYPE_CHECKING:
    from typing_extensions import Self

PartKind = Literal["embed", "attn", "mlp"]
KINDS: tuple[PartKind, ...] = ("embed", "attn", "mlp")
SublayerKind = Literal["attn", "mlp"]
"""The two sublayers of a layer, whose output projections write the attention and MLP parts."""
_NAME = re.compile(r"(attn|mlp)_L(\d+)(?:_H(\d+)|_N(\d+)|_(bias)|_E(\d+)|_(shared))?")
_TRANSCODER = re.compile(r"tc_L(\d+)_(?:F(\d+)|(error))")
_POSITION = re.compile(r"(.+)_P(\d+)")


@dataclass(frozen=True)
class Part:
    """A part of the residual stream: `kind` at `layer`, optionally one `head`, one `neuron`, its `bias`,
    one routed `expert` or the `shared` expert (mixture-of-experts MLPs).

    The embeddings have `layer` 0 (they enter before layer 0; `depth` tells them apart).
    """

    kind: PartKind
    """'embed', 'attn' or 'mlp'."""
    layer: int = 0
    """The layer whose sublayer writes the part (0 for the embeddings)."""
    head: int | None = None
    """One attention head of the sublayer, or None."""
    neuron: int | None = None
    """One MLP neuron of the sublayer, or None."""
    bias: bool = False
    """The constant the sublayer's output projection (or post-norm) adds, split off from its heads or neurons."""
    expert: int | None = None
    """One routed expert of a mixture-of-experts MLP (its output times the router's weight), or None."""
    shared: bool = False
    """The shared expert of a mixture-of-experts MLP (Qwen2-MoE: times its sigmoid gate)."""
    feature: int | None = None
    """One transcoder feature replacing the MLP (attribution graphs), or None."""
    error: bool = False
    """The MLP's output minus its transcoder's (attribution graphs' error node)."""
    position: int | None = None
    """The token position the part writes at (attribution graphs' nodes), or None: the read position."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UsageError(f"part kind must be one of {KINDS}, got {self.kind!r}")
        if self.layer < 0:
            raise UsageError(f"part layer must be >= 0, got {self.layer}")
        if self.kind == "embed" and (self.layer or self.head is not None or self.neuron is not None or self.bias):
            raise UsageError("the embeddings part has no layer, head, neuron or bias")
        if self.head is not None and self.kind != "attn" or self.neuron is not None and self.kind != "mlp":
            raise UsageError(f"a head belongs to an attention part and a neuron to an MLP part, got {self!r}")
        if self.bias and (self.head is not None or self.neuron is not None):
            raise UsageError(f"a bias part is the sublayer's constant, not one head's or neuron's, got {self!r}")
        if (self.expert is not None or self.shared) and (self.kind != "mlp" or self.neuron is not None or self.bias):
            raise UsageError(f"an expert part belongs to an MLP part, not to a neuron or bias, got {self!r}")
        if self.expert is not None and (self.shared or self.expert < 0):
            raise UsageError(f"an expert part is one routed expert (>= 0) or the shared expert, got {self!r}")
        fine = (self.head, self.neuron, self.expert)
        if (self.feature is not None or self.error) and (self.kind != "mlp" or any(x is not None for x in fine)
                                                         or self.bias or self.shared
                                                         or (self.feature is not None and self.error)):
            raise UsageError(f"a transcoder feature or error belongs to a whole MLP part, got {self!r}")
        if self.position is not None and self.position < 0:
            raise UsageError(f"a part's position must be >= 0, got {self!r}")

    @classmethod
    def embed(cls) -> Self:
        return cls("embed")

    @classmethod
    def attn(cls, layer: int, head: int | None = None, *, bias: bool = False) -> Self:
        return cls("attn", layer, head=head, bias=bias)

    @classmethod
    def mlp(
        cls, layer: int, neuron: int | None = None, *, bias: bool = False, expert: int | None = None,
        shared: bool = False,
    ) -> Self:
        return cls("mlp", layer, neuron=neuron, bias=bias, expert=expert, shared=shared)

    @classmethod
    def transcoder(cls, layer: int, feature: int | None = None, *, error: bool = False) -> Self:
        """Feature `feature` of layer `layer`'s transcoder (`tc_L3_F120`), or its error (`tc_L3_error`)."""
        return cls("mlp", layer, feature=feature, error=error)

    def at(self, position: int) -> Self:
        """The same part at token `position` (`embed_P5`, `tc_L3_F120_P5`): an attribution graph's node."""
        return replace(self, position=position)

    @classmethod
    def parse(cls, name: str) -> Self:
        """The part a public label names; raises ValueError naming the accepted forms."""
        at = _POSITION.fullmatch(name)
        if at is not None and (at[1] == "embed" or _NAME.fullmatch(at[1]) or _TRANSCODER.fullmatch(at[1])):
            return cls.parse(at[1]).at(int(at[2]))
        if name == "embed":
            return cls.embed()
        tc = _TRANSCODER.fullmatch(name)
        if tc is not None:
            return cls.transcoder(int(tc[1]), None if tc[2] is None else int(tc[2]), error=tc[3] is not None)
        found = _NAME.fullmatch(name)
        if found is None or (found[3] and found[1] != "attn") or (
                (found[4] or found[6] or found[7]) and found[1] != "mlp"):
            raise UsageError(
                f"{name!r} is not a part name; parts are 'embed', 'attn_L<l>', 'attn_L<l>_H<h>', "
                "'attn_L<l>_bias', 'mlp_L<l>', 'mlp_L<l>_N<n>', 'mlp_L<l>_bias', 'mlp_L<l>_E<e>', 'mlp_L<l>_shared', "
                "'tc_L<l>_F<f>' or 'tc_L<l>_error', any of them optionally at a position '_P<p>'")
        index = lambda g: None if g is None else int(g)  # noqa: E731
        return cls(found[1], int(found[2]), head=index(found[3]), neuron=index(found[4]),  # type: ignore[arg-type]
                   bias=found[5] is not None, expert=index(found[6]), shared=found[7] is not None)

    @property
    def name(self) -> str:
        """The public label, e.g. 'attn_L3_H2'."""
        at = "" if self.position is None else f"_P{self.position}"
        if self.kind == "embed":
            return "embed" + at
        if self.feature is not None or self.error:
            return f"tc_L{self.layer}_" + ("error" if self.error else f"F{self.feature}") + at
        suffix = ("_bias" if self.bias else "_shared" if self.shared else f"_H{self.head}" if self.head is not None
                  else f"_N{self.neuron}" if self.neuron is not None
                  else f"_E{self.expert}" if self.expert is not None else "")
        return f"{self.kind}_L{self.layer}{suffix}{at}"

    @property
    def sublayer(self) -> Part:
        """The whole sublayer this part belongs to (itself for a sublayer or the embeddings)."""
        return Part(self.kind, self.layer)

    @property
    def depth(self) -> int:
        """The lens depth at which the part has entered the stream: 0 for the embeddings, else `layer + 1`."""
        return 0 if self.kind == "embed" else self.layer + 1

    @property
    def is_sublayer(self) -> bool:
        return (self.head is None and self.neuron is None and not self.bias and self.expert is None and not self.shared
                and self.feature is None and not self.error and self.position is None)

    def __str__(self) -> str:
        return self.name
