"""`PatchSpec`: what one patching run does, validated once and carried whole.

A patch is five choices (docs/design.md §5): the mode (noising, denoising, ablation), what an ablation
inserts (zeros or a reference mean), the positions (the read token, all, the shared prefix, or spans
counted back from the read token), the level (sublayers, heads or MLP neurons) and the estimand (total, or the
path-frozen direct effect). `patch`, `attribution_patch`, `faithfulness`, the engines' plan and the
audit's run key all take this one value, so the choices are checked in one place and named in one way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast, get_args

from ..errors import UsageError
from ..types import Ablation, Estimand, Mode, PatchLevel, Positions, Spans

MODES: tuple[Mode, ...] = get_args(Mode)
ABLATIONS: tuple[Ablation, ...] = get_args(Ablation)
PATCH_ESTIMANDS: tuple[Estimand, ...] = get_args(Estimand)
PATCH_LEVELS: tuple[PatchLevel, ...] = get_args(PatchLevel)
POSITIONS: tuple[Positions, ...] = get_args(Positions)


@dataclass(frozen=True)
class PatchSpec:
    """One patching run's choices; invalid values are refused at construction, naming the fix."""

    mode: Mode = "noising"
    """'noising' (run chosen, insert rejected's), 'denoising' (the reverse) or 'ablation' (both sides)."""
    ablation: Ablation = "zero"
    """What 'ablation' inserts: zeros, or the mean over a reference set ('mean'); unused by other modes."""
    positions: Positions | Spans = "read"
    """'read', 'all', 'prefix', or spans `[(start, stop), ...]` of the positions up to the read token."""
    level: PatchLevel = "sublayer"
    """The parts patched: embeddings and sublayers, or embeddings, heads and MLPs ('head'), or MLP neurons
    ('neuron': those chosen by `patch(neurons=)`, or every one by attribution patching)."""
    estimand: Estimand = "total"
    """'total' (the patch flows through every later layer) or 'direct' (later parts held at clean)."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise UsageError(f"mode must be one of {MODES}, got {self.mode!r}", option="mode")
        if self.ablation not in ABLATIONS:
            raise UsageError(f"ablation must be one of {ABLATIONS}, got {self.ablation!r}", option="ablation")
        if self.level not in PATCH_LEVELS:
            raise UsageError(f"level must be one of {PATCH_LEVELS}, got {self.level!r}", option="level")
        if self.estimand not in PATCH_ESTIMANDS:
            raise UsageError(f"estimand must be one of {PATCH_ESTIMANDS}, got {self.estimand!r}", option="estimand")
        object.__setattr__(self, "positions", _positions(self.positions))

    @property
    def spans(self) -> bool:
        """Whether `positions` is a list of spans rather than a named rule."""
        return not isinstance(self.positions, str)

    @property
    def name(self) -> str:
        """A canonical label of every choice (`head/ablation-mean/read/total`): what a run key records."""
        mode = f"ablation-{self.ablation}" if self.mode == "ablation" else self.mode
        where = self.positions if isinstance(self.positions, str) else "spans" + "".join(
            f"[{'' if a is None else a}:{'' if b is None else b}]" for a, b in self.positions)
        return f"{self.level}/{mode}/{where}/{self.estimand}"


def spec_of(spec: PatchSpec | None, **given: object) -> PatchSpec:
    """The run's `PatchSpec`: `spec` when given (then every keyword choice must be left at its default, or
    None), else one built, and so validated, from the keyword choices."""
    if spec is None:
        return PatchSpec(**given)  # type: ignore[arg-type]  # the keywords' own annotations hold each value
    default = PatchSpec()
    clash = {k: v for k, v in given.items() if v is not None and v != getattr(default, k)}
    if clash:
        raise UsageError(f"pass the patch's choices either as spec= or as keywords, not both: spec={spec} and "
                         + ", ".join(f"{k}={v!r}" for k, v in clash.items()))
    return spec


def _positions(positions: Positions | Spans) -> Positions | Spans:
    """A named rule as it is; spans as a tuple of (start, stop) pairs of ints or None (hashable, frozen)."""
    if isinstance(positions, str):
        if positions not in POSITIONS:
            raise UsageError(f"positions must be one of {POSITIONS} or spans such as [(-4, None)], got {positions!r}",
                             option="positions")
        return positions
    if not isinstance(positions, Sequence) or not positions:
        raise UsageError(f"positions must be one of {POSITIONS} or a non-empty list of (start, stop) spans, "
                         f"got {positions!r}", option="positions")
    spans: list[tuple[int | None, int | None]] = []
    for span in positions:
        ok = isinstance(span, Sequence) and not isinstance(span, str) and len(span) == 2 and all(
            b is None or (isinstance(b, int) and not isinstance(b, bool)) for b in span)
        if not ok:
            raise UsageError(f"a span is (start, stop) with ints or None, counted like a slice of the positions up "
                             f"to the read token (negative: back from it), got {span!r} in positions={positions!r}",
                             option="positions")
        start, stop = cast("tuple[int | None, int | None]", (span[0], span[1]))  # checked just above
        if _empty(start, stop):
            one = 0 if start is None else start
            raise UsageError(
                f"the span ({start}, {stop}) selects no position in any sequence: a span (start, stop) takes the "
                "positions start to stop-1, like a slice of those up to the read token (negative: back from it), "
                f"so stop must lie past start; pass e.g. ({one}, {one + 1 or None}) for one position, or "
                "(-4, None) for the last four up to the read token")
        spans.append((start, stop))
    return tuple(spans)


def _empty(start: int | None, stop: int | None) -> bool:
    """Whether the slice [start:stop] of any sequence's positions 0..t* is empty (t* ≥ 0): a stop of 0, or a
    stop at or before a start counted from the same end."""
    if stop is None:
        return False
    return stop == 0 or (start is not None and (start >= 0) == (stop >= 0) and stop <= start)
