"""The probes' quality degradations of a base item: the yardstick of the distortion index.

For each base item, its answer made wrong (the authored wrong version, built-in items only), evasive (its
sentences replaced by content-free ones) or off topic (another item's answer, from another domain where one
exists); `rewardlens.probe` scores them beside the axes, on the same items.
"""

from __future__ import annotations

import random

from ._axes import join, sentences
from ._items import Item

EVASIVE = ["That depends on a lot of different things.", "Every situation is a little different in practice.",
           "There is no single answer that suits every case.", "It varies from one person to the next.",
           "Many factors play a part in how this turns out.", "The details matter a great deal here.",
           "Different people approach this in different ways.", "It comes down to the circumstances involved."]
QUALITY = ("correctness", "informativeness", "relevance")
"""Built-in quality degradations: the authored wrong answer (built-in items only), the answer's
sentences replaced by content-free ones, and another item's answer (off topic)."""


def degradations(base: list[Item], seed: int) -> dict[str, list[str | None]]:
    """Per quality dimension, each item's degraded response (None where it cannot be made)."""
    rng = random.Random(f"{seed}/quality")
    evasive: list[str | None] = []
    for item in base:
        units = sentences(item.response)
        evasive.append(join(rng.sample(EVASIVE, min(len(units), len(EVASIVE)))))
    # Off topic: the next item (in a seeded order) from another domain where one exists.
    order = list(range(len(base)))
    rng.shuffle(order)
    off: list[str | None] = [None] * len(base)
    for pos, i in enumerate(order):
        for step in range(1, len(order)):
            j = order[(pos + step) % len(order)]
            if base[j].response != base[i].response and (base[j].domain != base[i].domain or step == len(order) - 1):
                off[i] = join(sentences(base[j].response))
                break
    return {"correctness": [None if b.wrong is None else join(sentences(b.wrong)) for b in base],
            "informativeness": evasive, "relevance": off}


__all__ = ["EVASIVE", "QUALITY", "degradations"]
