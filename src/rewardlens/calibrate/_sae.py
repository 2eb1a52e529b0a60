"""SAE ground truth: on the `keyword` and `list` organisms, the reward feature an SAE finds is the planted rule.

One TopK SAE per organism, trained once (seeded) on its last layer and shared with `grade_sae`'s
detection checks. Reward feature #1 is the top feature by mean margin attribution on the held-out
pairs (the attribution's own ranking, chosen before anything below is looked at). Graded:

- **contexts**: of its top `N_CONTEXTS` corpus contexts (`feature_report` cards over both organisms'
  pairs), the share whose peak token lies *inside* the planted span (the word 'Importantly'; a bullet
  line, the line break that opens it included), and the share inside it *or after it* (the text read
  through the peak token already carries the attribute: a causal model's feature can only know that);
- **ablation**: `feature_patch(edit="ablate")` of that one feature: mean total effect as a share of the
  mean clean margin;
- **label**: its card's Spearman ρ with the planted attribute's axis (`text_axes` over the organisms'
  own attribute tests), and that axis' rank among the axes of the other attributes;
- **group ablation**: the *planted group*, fixed by a rule before it is measured: of the top
  `GROUP_MAX` features by mean margin attribution (the same ranking), those whose card's ρ with the
  organism's own axis is ≥ `AXIS_RHO` (the label row's threshold). They are ablated jointly
  (`feature_patch(groups=...)`, one edit removing every member at the read token); graded: mean total
  effect over the mean clean margin ≥ `ABLATED_SHARE`; reported: the group's size (a row that
  always passes, ≤ `GROUP_MAX` by construction).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..data import margin
from ..model import RewardModel, TraceKey
from ..zoo.organisms import ORGANISMS
from ._core import Grade, OrganismBench

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from ..sae import FeatureCard, TopKSAE

TRUTH = ("list", "keyword")
"""The organisms whose planted rule an SAE feature is graded against."""
AXES = ("list", "keyword", "length")
"""The organisms whose attribute tests become the cards' probe axes: each truth organism's own and wrong ones."""
N_CONTEXTS = 10
"""Top contexts read per feature: a share of 0.8 allows two misses."""
CONTEXT_SHARE = 0.8
"""A feature unrelated to the rule peaks in the span at its base rate: of the calibration corpus' tokens about
0.18 lie in a bullet line and 0.003 in the word, 0.11-0.2 at or after the attribute (0.47 at most over
responses alone, tests/calibrate/test_sae.py)."""
ABLATED_SHARE = 0.5
"""'Removes most of the planted margin'."""
AXIS_RHO = 0.5
"""Spearman ρ of the feature's per-sequence peak with the planted attribute's 0/1 axis."""
GROUP_MAX = 8
"""The planted group is drawn from this many top features by margin attribution."""
_WORD = re.compile(r"\w+")
SPLIT = ("no single feature of this SAE carries the rule: it is split over about five co-firing features, "
         "each 0.15-0.31 of the margin; ablated jointly, the planted group removes most of it (the group "
         "ablation row; docs/organisms.md, SAE ground truth)")
"""The known limitation behind the single-feature ablation rows: measured and reported, not counted."""
AFTER_THE_WORD = ("a feature read at the read token fires after the planted word, recording that it was read, "
                  "not on the word itself (docs/organisms.md, SAE ground truth)")
"""The known limitation behind the keyword's strict context row."""


def train_for(bench: OrganismBench, name: str, layer: int | None = None) -> tuple[RewardModel, int, TopKSAE]:
    """(model, layer, SAE): a TopK SAE (×4, k=8) on every token of `name`'s residual after `layer` (default: the
    last layer) over 200 pairs of a stream neither training nor the bench's pairs use, 3 epochs, seeded by the
    bench."""
    from ..sae import ActivationSource, SAEConfig, TrainConfig, train_sae

    spec, model = ORGANISMS[name], bench.model(name)
    layer = model.n_layers - 1 if layer is None else layer
    source = ActivationSource(model, spec.pairs(n=200, seed=bench.seed + 2, strength=1.0), TraceKey.resid(layer),
                              positions="all")
    with torch.random.fork_rng():  # seeded training without resetting the caller's random state
        torch.manual_seed(bench.seed)
        sae = train_sae(source, TrainConfig(sae=SAEConfig(expansion_factor=4, k=8), batch_size=256, epochs=3)).sae
    return model, layer, sae


def _unit(name: str, text: str, start: int, end: int) -> str:
    """The planted unit around characters start..end: the word ('keyword') or the line, a line break counted
    in the line it opens ('list')."""
    if name == "keyword":
        return next((m.group() for m in _WORD.finditer(text) if m.start() < end and start < m.end()), "")
    anchor = start + 1 if text[start:end].startswith("\n") else start
    lo, hi = text.rfind("\n", 0, anchor) + 1, text.find("\n", anchor)
    return text[lo:hi if hi >= 0 else len(text)]


def _inside(name: str, unit: str) -> bool:
    """Whether the unit is the planted span, by the organism's own test (one owner of the attribute): the word
    passes `mentions`; one line passes `is_list` (two bullet lines or more) when written twice."""
    spec = ORGANISMS[name]
    return bool(unit) and spec.has_attribute(unit if name == "keyword" else unit + "\n" + unit)


def placement(tokenizer: PreTrainedTokenizerBase, name: str, ids: list[int], position: int) -> tuple[bool, bool]:
    """(token `position` of `ids` lies inside the planted span, inside it or after it) under organism `name`'s
    rule: after means the text decoded through that token already passes the organism's test. Characters
    are located by decoding prefixes, the way the cards decode their windows."""
    start, end = len(tokenizer.decode(ids[:position])), len(tokenizer.decode(ids[:position + 1]))
    inside = _inside(name, _unit(name, str(tokenizer.decode(ids)), start, end))
    return inside, inside or ORGANISMS[name].has_attribute(str(tokenizer.decode(ids[:position + 1])))


def planted_group(cards: Sequence[FeatureCard], name: str) -> list[int]:
    """The planted group: the cards' features (top by margin attribution, in that order) whose ρ with organism
    `name`'s own attribute axis is ≥ `AXIS_RHO` (NaN, undefined, never counts)."""
    return [c.feature for c in cards if np.isfinite(c.correlations[name]) and c.correlations[name] >= AXIS_RHO]


def ground_truth(bench: OrganismBench, name: str, model: RewardModel, layer: int, sae: TopKSAE) -> list[Grade]:
    """The module docstring's rows for organism `name` and its trained `sae` at `layer`."""
    from ..sae import attribute_features, feature_patch, feature_report, text_axes

    pairs = bench.pairs(name)
    att = attribute_features(model, sae, pairs, layer=layer, fit=None)
    feature = att.top(1, by="margin")[0][0]
    corpus = [p for o in TRUTH for p in ORGANISMS[o].pairs(40, seed=bench.seed + 4)]
    axes = text_axes(model, corpus, **{o: ORGANISMS[o].has_attribute for o in AXES})
    cards = feature_report(model, sae, att, corpus, top=GROUP_MAX, n_contexts=N_CONTEXTS, axes=axes).cards.cards
    card, group = cards[0], planted_group(cards, name)
    assert card.feature == feature  # one ranking: the attribution's
    texts = [s.ids for s in model.encode(corpus)[0]]  # a context's `input` indexes the corpus' sequences
    where = np.array([placement(model.tokenizer, name, texts[c.input], c.position) for c in card.contexts],
                     dtype=bool).reshape(-1, 2)
    # One call: column 0 is feature #1 alone, column 1 (if any feature qualified) the planted group, jointly.
    ablated = feature_patch(model, sae, pairs, layer=layer, groups=[[feature], *([group] if group else [])],
                            edit="ablate", n_boot=1)
    clean = margin(ablated.clean)
    share = ablated.total.mean(0) / clean.mean()
    rho = {a: card.correlations[a] for a in AXES}
    order = sorted(AXES, key=lambda a: -rho[a] if np.isfinite(rho[a]) else np.inf)
    span = "planted word" if name == "keyword" else "bullet lines"
    head = f"reward feature #1 ({feature})"
    rule = f"top-{GROUP_MAX} features by margin with ρ ≥ {AXIS_RHO} on the {name!r} axis"
    # Contexts that never fired count as misses: the share is over N_CONTEXTS, not over those found.
    return [
        Grade.of("sae", name, f"share of {head}'s top-{N_CONTEXTS} context peaks inside the {span}",
                 where[:, 0].sum() / N_CONTEXTS, CONTEXT_SHARE, known=AFTER_THE_WORD if name == "keyword" else ""),
        Grade.of("sae", name, f"share of {head}'s top-{N_CONTEXTS} context peaks inside or after the {span}",
                 where[:, 1].sum() / N_CONTEXTS, CONTEXT_SHARE),
        Grade.of("sae", name, f"mean ablation effect of {head} as a share of the mean clean margin",
                 float(share[0]), ABLATED_SHARE, known=SPLIT),
        Grade.of("sae", name, f"Spearman ρ of {head} with the {name!r} attribute axis", rho[name], AXIS_RHO),
        Grade.of("sae", name, f"rank of the {name!r} axis by ρ with {head} among {list(AXES)}",
                 order.index(name) + 1, 1, "<="),
        Grade.of("sae", name, f"mean joint ablation effect of the planted group ({rule}) as a share of the mean "
                 "clean margin", float(share[1]) if group else np.nan, ABLATED_SHARE),
        # Informational: ≤ GROUP_MAX by construction; an empty group fails the row above (NaN).
        Grade.of("sae", name, f"size of the planted group ({rule})", len(group), GROUP_MAX, "<="),
    ]
