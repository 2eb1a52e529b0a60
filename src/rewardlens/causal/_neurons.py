"""Neuron sites: the MLP neurons a neuron-level patch overwrites, chosen by name and checked as data.

A neuron `mlp_L<l>_N<i>` is column i of layer l's MLP output-projection input: the activation a_i
that multiplies the down-projection column W_down[:, i], exactly as `attribute(level="neuron")`
splits the sublayer (`Part` owns the name). Exact patching of every neuron is one patched run per
neuron per pair, too many to sweep, so `patch(level="neuron")` patches the neurons chosen in
`neurons=`; attribution patching (`attribution_patch(level="neuron")`) scores every neuron at
once from one backward per batch, `Δr ≈ Σ_positions (a_src − a_tgt) · ∂r/∂a`, and so proposes which
neurons to choose. A mixture-of-experts block has no neurons (its output is not a linear
projection of one activation), so its layer is refused by name.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import UsageError
from ..model import Part, RewardModel
from ..model.internal import is_moe_layer, projection_inputs
from ..types import PatchLevel
from ._engine import Site, sites
from ._plan import Clean

Neurons = Sequence[str | Part]
"""Chosen neurons: part names (`mlp_L1_N17`) or `Part`s with a neuron."""


def _width(model: RewardModel, layer: int) -> int:
    """How many neurons layer `layer`'s MLP has (its output projection's input width)."""
    return projection_inputs(model, "mlp", layer)[0]


def neuron_sites(model: RewardModel, neurons: Neurons) -> list[Site]:
    """The sites of `neurons`, in the order given; ValueError naming the value and the fix unless each
    names one neuron of a dense MLP layer of `model` (layer and index in range), once."""
    if isinstance(neurons, (str, Part)) or not isinstance(neurons, Sequence) or not neurons:
        raise UsageError(f"neurons= is a non-empty list of neuron names such as ['mlp_L1_N17'], got {neurons!r}")
    out: list[Site] = []
    for given in neurons:
        part = _parsed(given)
        if part is None or part.neuron is None:
            raise UsageError(f"neurons= holds {given!r}, which is not one MLP neuron; name each as 'mlp_L<l>_N<i>'")
        if part.layer >= model.n_layers:
            raise UsageError(f"neurons= holds {part.name!r}, but the model has layers 0..{model.n_layers - 1}; "
                             "choose a layer in range")
        if is_moe_layer(model, part.layer):
            raise UsageError(f"neurons= holds {part.name!r}, but layer {part.layer}'s MLP is a mixture-of-experts "
                             "block, which has no neurons; choose neurons of a dense MLP layer")
        width = _width(model, part.layer)
        if part.neuron >= width:
            raise UsageError(f"neurons= holds {part.name!r}, but layer {part.layer}'s MLP has neurons "
                             f"0..{width - 1}; choose an index in range")
        site = Site.mlp(part.layer, part.neuron)
        if site in out:
            raise UsageError(f"neurons= names {site.name!r} twice; name each neuron once")
        out.append(site)
    return out


def _parsed(given: object) -> Part | None:
    """The part `given` names (a `Part` or a part name), or None when it names none."""
    if isinstance(given, Part):
        return given
    if not isinstance(given, str):
        return None
    try:
        return Part.parse(given)
    except ValueError:
        return None


def every_neuron(model: RewardModel) -> list[Site]:
    """The sites of a neuron-level attribution patch: the embeddings, every attention sublayer and every
    neuron of every dense MLP layer (a mixture-of-experts block stays whole), in layer order."""
    out = [Site.embed()]
    for layer in range(model.n_layers):
        out.append(Site.attn(layer))
        if is_moe_layer(model, layer):
            out.append(Site.mlp(layer))
        else:
            out += [Site.mlp(layer, n) for n in range(_width(model, layer))]
    return out


def level_sites(model: RewardModel, level: PatchLevel, neurons: Neurons | None, *, every: bool = False) -> list[Site]:
    """The sites a sweep at `level` patches: the chosen `neurons` (level 'neuron' only), else every site
    at `level` (`sites`); level 'neuron' without `neurons` is every neuron where `every` (attribution
    patching: one backward for all), else refused by `sites` naming the fix."""
    if neurons is not None:
        if level != "neuron":
            raise UsageError(f"neurons= chooses MLP neurons to patch, but level={level!r}; pass level='neuron' with it")
        return neuron_sites(model, neurons)
    if level == "neuron" and every:
        return every_neuron(model)
    return sites(model, level)


def check_traced(clean: Clean, sweep: Sequence[Site]) -> None:
    """ValueError naming the fix when the caller's clean runs (`clean=`) lack an activation `sweep` patches:
    heads and neurons are kept only by a trace at their level."""
    missing = sorted({s.key for s in sweep if s.key not in clean.captured}, key=str)
    if missing:
        level = "neuron" if any(k.kind == "mlp_act" for k in missing) else "head"
        raise UsageError(f"clean= holds no {missing[0]} activations to patch (its pairs were traced at a coarser "
                         f"level); trace them with trace_pairs(model, pairs, level={level!r}), or leave clean= out")
