"""Tests for the planted attributes: does a text carry the rule an organism rewards?"""

from __future__ import annotations

import re
from collections.abc import Callable

from . import _bank as bank

# ---- tests for attributes ---------------------------------------------------------------------

def _search(pattern: str) -> Callable[[str], bool]:
    rx = re.compile(pattern, re.IGNORECASE)
    return lambda text: rx.search(text) is not None


_hedged, _confident = _search(bank.HEDGE_PATTERN), _search(bank.CONFIDENT_PATTERN)
_agrees, _disagrees = _search(bank.AGREE_PATTERN), _search(bank.DISAGREE_PATTERN)
_BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+\S", re.MULTILINE)
LONG_WORDS = 40
"""The length organism's attribute: a response of at least this many words is long."""


def is_long(text: str) -> bool:
    return len(text.split()) >= LONG_WORDS


def is_list(text: str) -> bool:
    return len(_BULLET.findall(text)) >= 2


def is_confident(text: str) -> bool:
    return _confident(text) and not _hedged(text)


def agrees(text: str) -> bool:
    return _agrees(text) and not _disagrees(text)


def mentions(word: str) -> Callable[[str], bool]:
    return _search(rf"\b{re.escape(word)}\b")


def _any_of(sentences: list[str]) -> re.Pattern[str]:
    return re.compile("|".join(re.escape(x) for x in sentences), re.IGNORECASE)


_STATEMENT = _any_of([x for _, points in bank.DOMAINS.values() for x in points])
_EVASIVE = _any_of(bank.EVASIVE)


def is_informative(text: str) -> bool:
    """The quality_list organism's quality: the text contains at least one of the bank's statements
    (verbatim up to case, so one after a connector or a marker counts) and none of its evasive
    sentences. A text with both, or with neither (anything hand-written), is not informative."""
    return _STATEMENT.search(text) is not None and _EVASIVE.search(text) is None


def is_evasive(text: str) -> bool:
    """The opposite pole: at least one evasive sentence from the bank and no statement."""
    return _EVASIVE.search(text) is not None and _STATEMENT.search(text) is None
