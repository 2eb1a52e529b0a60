"""Graders of the foundation and causal instruments: the organisms themselves, attribution, the
lens, patching (total, path-frozen, attribution patching) and TopK SAEs."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..causal import attribution_patch, patch
from ..data import Pair, margin
from ..data.internal import is_chosen
from ..exact import attribute, lens
from ..model import Part, RewardModel
from ..stats import auroc
from ..types import Level, PatchLevel
from ..zoo.organisms import ORGANISMS, ablated, forward_margins
from ._core import ACCURACY, Grade, OrganismBench, circuits, localisation, strength_response, sublayer_of
from ._sae import TRUTH, ground_truth, train_for
from ._upstream import upstream

if TYPE_CHECKING:
    from ..sae import TopKSAE


def grade_organisms(bench: OrganismBench) -> list[Grade]:
    """The answer key itself: every organism learned its rule (held-out accuracy), and the circuit
    organism's rule lives only in its planted part (ablating it removes the margin)."""
    rows = []
    for name in bench.organisms:
        spec, model = ORGANISMS[name], bench.model(name)
        pairs = bench.pairs(name)
        values = model.objectives(pairs)
        labels, diff = spec.labels(pairs), margin(values)
        for k, objective in enumerate(spec.objectives):
            decided = labels[:, k] != 0
            acc = float(np.mean(np.sign(diff[decided, k]) == labels[decided, k]))
            what = "held-out pair accuracy" + (f" ({objective})" if len(spec.objectives) > 1 else "")
            rows.append(Grade.of("organism", name, what, acc, ACCURACY))
    for name in circuits(bench):
        part, model, pairs = ORGANISMS[name].planted_part, bench.model(name), bench.pairs(name)
        assert part is not None  # circuits() keeps the organisms with a planted part
        full = forward_margins(model.model, model.tokenizer, pairs)[:, 0].mean()
        cut = forward_margins(ablated(model.model, part), model.tokenizer, pairs)[:, 0].mean()
        rows.append(Grade.of("organism", name, f"|mean margin| left with {part} ablated, as a share",
                             abs(cut / full), 0.05, "<="))
    return rows


def grade_attribution(bench: OrganismBench) -> list[Grade]:
    """Exact attribution: closes on every organism; ranks the planted part first at sublayer and
    head level; its contribution rises with planted strength (Spearman = 1)."""
    rows = []
    for name in bench.organisms:
        att = attribute(bench.model(name), bench.pairs(name)[:20])
        rows.append(Grade.of("attribution", name, "max |reward - (sum of parts + constant)|",
                             float(np.abs(att.residual_error).max()), 1e-4, "<="))
    for name in circuits(bench):
        part, pairs = ORGANISMS[name].planted_part, bench.pairs(name)
        assert part is not None  # circuits() keeps the organisms with a planted part
        targets: list[tuple[Level, str]] = [("sublayer", sublayer_of(part)), ("head", part)]
        for level, target in targets:
            att = attribute(bench.model(name), pairs, level=level)
            rows += localisation("attribution", name, att.names, att.margin.mean(0), target, level)

        def on_part(model: RewardModel, part: str = part, pairs: list[Pair] = pairs) -> float:
            att = attribute(model, pairs, level="head")
            return float(att.margin.mean(0)[att.names.index(part)])

        rows.append(strength_response(bench, "attribution", name, f"mean margin on {part}", on_part))
    return rows


def grade_lens(bench: OrganismBench) -> list[Grade]:
    """Reward lens: the final linear-lens margin rises with planted strength, and on a circuit
    planted in layer l the margin crystallizes after layer l, not before."""
    rows = []
    for name in circuits(bench):
        part, pairs = ORGANISMS[name].planted_part, bench.pairs(name)
        assert part is not None  # circuits() keeps the organisms with a planted part

        def final_margin(m: RewardModel, pairs: list[Pair] = pairs) -> float:
            return float(lens(m, pairs).margin("linear")[:, -1].mean())

        rows.append(strength_response(bench, "lens", name, "final linear-lens margin", final_margin))
        model = bench.model(name)
        layer = Part.parse(part).layer
        depth = np.nanmedian(lens(model, pairs).crystallization("linear", 0.5))
        rows.append(Grade.of("lens", name, "median crystallization depth (linear, fraction 0.5)",
                             depth, (layer + 1) / model.n_layers, "=="))
    return rows


def grade_patching(bench: OrganismBench) -> list[Grade]:
    """Causal patching: read-position noising (total and path-frozen direct) and attribution
    patching rank the planted part first at sublayer and head level, and the planted head's
    noising effect rises with planted strength (Spearman = 1)."""
    rows = []
    for name in circuits(bench):
        part, pairs = ORGANISMS[name].planted_part, bench.pairs(name)[:40]
        assert part is not None  # circuits() keeps the organisms with a planted part
        model = bench.model(name)
        levels: list[tuple[PatchLevel, str]] = [("sublayer", sublayer_of(part)), ("head", part)]
        for level, target in levels:
            for instrument, result in (
                ("patching", patch(model, pairs, level=level)),
                ("path-frozen patching", patch(model, pairs, level=level, estimand="direct")),
                ("attribution patching", attribution_patch(model, pairs, level=level)),
            ):
                rows += localisation(instrument, name, result.names, result.effect.mean(0), target, level,
                                     by="mean noising effect")

        def effect(model: RewardModel, part: str = part, pairs: list[Pair] = pairs) -> float:
            result = patch(model, pairs, level="head")
            return float(result.effect.mean(0)[result.names.index(part)])

        rows.append(strength_response(bench, "patching", name, f"mean noising effect of {part}", effect))
    return rows


def grade_sae(bench: OrganismBench) -> list[Grade]:
    """TopK SAEs on the last layer of the 'list' and 'keyword' organisms, one each, trained once
    (`_sae.train_for`). On 'list': the features that write the most reward on held-out pairs detect
    the bullet list on pairs where a coin put it on either side (AUROC), and do not detect which side
    was chosen (AUROC near 0.5). On both: the ground-truth rows of `_sae.ground_truth` (reward
    feature #1's contexts, ablation and probe-axis label against the planted rule), and `_upstream`'s (a
    second SAE at layer 0: the most effective latent, a planted upstream one included, is the first-order
    total ranking's #1)."""
    rows = []
    for name in [n for n in TRUTH if n in bench.organisms]:
        model, layer, sae = train_for(bench, name)
        if name == "list":
            rows += _detects_list(bench, model, layer, sae)
        rows += ground_truth(bench, name, model, layer, sae)
        rows += upstream(bench, name)
    return rows


def _detects_list(bench: OrganismBench, model: RewardModel, layer: int, sae: TopKSAE) -> list[Grade]:
    """The 'list' rows of `grade_sae`: the top-3 reward features against the planted attribute and the side."""
    from ..sae import attribute_features

    spec = ORGANISMS["list"]
    top = [f for f, _ in attribute_features(model, sae, bench.pairs("list")[:60], layer=layer).top(3, by="margin")]
    mixed_pairs = spec.pairs(n=100, seed=bench.seed + 3, strength=0.0)
    mixed = attribute_features(model, sae, mixed_pairs, layer=layer)
    has_list = np.array([spec.has_attribute(t) for p in mixed_pairs for t in (p.chosen, p.rejected)])
    chosen_rows = is_chosen(len(has_list))
    rows = []
    for rank, feature in enumerate(top, 1):
        column = list(mixed.features).index(feature) if feature in mixed.features else None
        acts = mixed.activations[:, column] if column is not None else np.zeros(len(has_list))
        rows.append(Grade.of("sae", "list", f"AUROC of reward feature #{rank} for the planted attribute",
                             auroc(acts, has_list), 0.95))
        rows.append(Grade.of("sae", "list", f"|AUROC − 0.5| of reward feature #{rank} for the chosen side",
                             abs(auroc(acts, chosen_rows) - 0.5), 0.25, "<="))
    return rows
