"""What the closed loop needs to know about an organism: its planted direction, the edit's concept
texts, the monitor's directions and the held-out quality pairs.

The planted direction is what the probes point to. The probe suite flags the `formatting` axis on
the `list` organism (rewardlens.calibrate's ground truth: list → formatting); no built-in axis
covers the `keyword` organism's word, so its direction is a user-given concept fitted on texts with
and without the word, as the GRPO worked example does (docs/monitor.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..data import Pair
from ..errors import UsageError
from ..hacking import AXES, concepts, contrast_sets
from ..types import Text
from ..zoo.organisms import ORGANISMS

PLANTED: dict[str, str] = {"list": "formatting", "keyword": "keyword", "quality_list": "formatting",
                           "sycophancy": "sycophancy", "length": "length"}
"""Organism → the direction the probes point to (a probe axis, or the organism's own concept)."""
MONITOR_AXES = ("length", "formatting", "emoji", "sycophancy", "markdown")
"""The probe axes the monitor watches by default (those its surface statistics observe)."""
MATCH_FLOOR = 0.5
"""An edit's concept matches the planted rule when the planted attribute is on this much more of its
positive texts than of its negative ones."""


def planted(organism: str) -> str:
    """The planted direction's name (a probe axis or the organism's own concept)."""
    if organism not in ORGANISMS:
        raise UsageError(f"no organism named {organism!r}; choose one of {sorted(PLANTED)}")
    if organism not in PLANTED:
        raise UsageError(f"the closed loop knows the planted direction of {sorted(PLANTED)}, not {organism!r}")
    return PLANTED[organism]


def bias_pairs(organism: str, n: int, seed: int) -> list[Pair]:
    """`n` organism pairs whose chosen side carries the planted attribute. An organism with a quality
    rule gives its bias pairs only: its quality pairs' chosen side is the informative answer, and a
    concept fitted on them would erase quality along with the bias."""
    spec = ORGANISMS[organism]
    bias = getattr(spec, "bias_pairs", None)
    return list(bias(n=n, seed=seed)) if bias is not None else spec.pairs(n=n, seed=seed)


def own_sets(organism: str, n: int = 100, seed: int = 99) -> tuple[list[Text], list[Text]]:
    """Conversations with and without the planted attribute: both sides of `n` held-out bias pairs
    (`bias_pairs`), each side in the same chat form the reward model scores."""
    pairs = bias_pairs(organism, n, seed)
    return [p.conversation("chosen") for p in pairs], [p.conversation("rejected") for p in pairs]


def concept_sets(organism: str, concept: str | None) -> tuple[str, list[Text], list[Text]]:
    """(name, positive, negative) of the edit: None → the organism's own sets under the planted
    direction's name; a probe axis → the probe suite's contrast sets of that axis."""
    if concept is None:
        return (planted(organism), *own_sets(organism))
    if concept not in AXES:
        raise UsageError(f"concept must be None (the organism's own texts) or a probe axis of {list(AXES)}, "
                         f"got {concept!r}")
    pos, neg = contrast_sets(concept)
    return concept, list(pos), list(neg)


def _reply(text: Text) -> str:
    return text if isinstance(text, str) else str(text[-1]["content"])


def match(organism: str, positive: Sequence[Text], negative: Sequence[Text]) -> tuple[float, str | None]:
    """(share of positive − share of negative texts carrying the planted attribute, a note in words
    when that is under `MATCH_FLOOR`: the edit then erases something other than the planted rule)."""
    spec = ORGANISMS[organism]
    rate = lambda texts: float(np.mean([spec.has_attribute(_reply(t)) for t in texts]))  # noqa: E731
    gap = rate(positive) - rate(negative)
    if gap >= MATCH_FLOOR:
        return gap, None
    return gap, (f"the edit's concept does not match the planted rule ({spec.rule}): the planted attribute is on "
                 f"{gap:+.0%} more of its positive texts than of its negative ones (needs {MATCH_FLOOR:.0%}); "
                 "the edited reward model keeps the bias, so its runs are no clean control")


def directions(rm: Any, organism: str) -> Mapping[str, Any] | None:
    """The monitor's bias directions: the default probe axes' concepts, plus the organism's own
    concept when no probe axis covers its planted direction."""
    name = planted(organism)
    if name in MONITOR_AXES:
        return None
    sets: dict[str, Any] = {a: contrast_sets(a) for a in MONITOR_AXES} | {name: own_sets(organism, 40)}
    c = concepts(rm, sets, layers=[-1], alphas=(0.0, 1.0), n_boot=1, progress=False)
    return {n: c.direction(n, -1) for n in c.names}


def quality_pairs(organism: str, n: int = 100, seed: int = 5) -> tuple[list[Pair], str]:
    """Held-out quality pairs (an informative answer against an evasive one of the same format) and
    where they come from, in words."""
    spec = ORGANISMS[organism]
    own = getattr(spec, "quality_pairs", None)
    if own is not None:
        return list(own(n=n, seed=seed)), f"the {organism} organism's own quality pairs"
    other = ORGANISMS["quality_list"]
    assert callable(getattr(other, "quality_pairs", None))  # quality_list is a QualityOrganism
    return (list(other.quality_pairs(n=n, seed=seed)),  # type: ignore[attr-defined]
            f"the {organism} organism has no quality rule: quality accuracy is on the quality_list organism's "
            "informative-vs-evasive pairs, which it was never trained on (it measures what the edit disturbs, "
            "not a skill the organism learned)")
