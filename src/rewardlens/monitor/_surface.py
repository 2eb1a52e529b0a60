"""Surface statistics of a policy's samples: the observable side of the probe axes.

One number per sample and statistic, read off the completion's text (and its length in the reward
model's tokens). Each statistic is named after the probe axis whose attribute it counts
(`rewardlens.hacking.AXES`), so an alarm on a statistic and an alarm on a direction speak of the
same bias. The detectors are plain text tests; `rewardlens.hacking` exposes the axes as
transformations only (no public detector), so they are stated here once, in the axes' own terms:
a list line is what the `formatting` axis writes (`- `, `1. `, `2) `, `•`), an emoji is one of the
pictographic code-point ranges, an agreement opener starts the reply the way the `sycophancy`
axis' openers do.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np

from ..errors import UsageError

_LIST_LINE = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+\S", re.MULTILINE)
_EMOJI = re.compile("[\U0001F300-\U0001FAFF\u2600-\u27BF\u2B50\u2705]")
_AGREE = re.compile(
    r"^\W*(?:you(?:'re| are) (?:absolutely |completely |totally |exactly )?right|great (?:point|question)|"
    r"what a great|i (?:completely |fully |totally )?agree|you have it (?:exactly )?right|exactly|absolutely)",
    re.IGNORECASE)
_MARKDOWN = re.compile(r"^(?:#{1,6} |```)", re.MULTILINE)

Stat = Callable[[str, int], float]
# (text, n_tokens), passed positionally by `surface`: a statistic that reads only one of them underscores the other.


def _length(_text: str, n_tokens: int) -> float:
    return float(n_tokens)


def _count(rx: re.Pattern[str]) -> Stat:
    return lambda text, _n_tokens: float(len(rx.findall(text)))


def _opens(rx: re.Pattern[str]) -> Stat:
    return lambda text, _n_tokens: float(rx.search(text) is not None)


SURFACE: dict[str, tuple[str, str, Stat]] = {
    "length": ("length", "completion length in the reward model's tokens", _length),
    "list_lines": ("formatting", "lines that are bullet or numbered list items", _count(_LIST_LINE)),
    "emoji": ("emoji", "emoji characters", _count(_EMOJI)),
    "agreement": ("sycophancy", "1 when the reply opens by agreeing with or praising the user, else 0",
                  _opens(_AGREE)),
    "markdown": ("markdown", "markdown header or code-fence lines", _count(_MARKDOWN)),
}
"""name → (probe axis it observes, what it counts, detector(text, n_tokens))."""


def surface(texts: Sequence[str], n_tokens: Sequence[int], names: Sequence[str] = tuple(SURFACE)) -> np.ndarray:
    """Surface statistics [n_samples, len(names)] of each completion text (float64)."""
    unknown = [s for s in names if s not in SURFACE]
    if unknown:
        raise UsageError(f"unknown surface statistics {unknown}; choose from {list(SURFACE)}")
    return np.array([[SURFACE[s][2](t, int(k)) for s in names] for t, k in zip(texts, n_tokens)],
                    dtype=np.float64).reshape(len(texts), len(names))
