"""`graph`: the attribution graphs of preference pairs — each side's, and the margin graph between them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..data import Pair
from ..data.internal import rows_of
from ..errors import UsageError
from ..model import RewardModel, verify
from ..plotting import CompositeView
from ..sae.internal import skip_first_for
from ._basis import NeuronBasis, TranscoderBasis
from ._frozen import check_model
from ._graph import AttributionGraph
from ._margin import ALIGNS, Align, margin_graph, shared_prefix
from ._side import side_graph

Basis = Literal["transcoders", "neurons"]
BASES: tuple[Basis, ...] = ("transcoders", "neurons")
MAX_NODES = 4096
"""Default cap on feature nodes with rows (circuit-tracer's `max_feature_nodes`)."""


@dataclass(frozen=True)
class PairGraph(CompositeView):
    """One pair's graphs: `chosen`, `rejected`, and `margin` (chosen − rejected, graphs/_margin.py)."""

    chosen: AttributionGraph
    rejected: AttributionGraph
    margin: AttributionGraph


def graph(
    model: RewardModel,
    pairs: Pair | Sequence[Pair],
    transcoders: Any = None,
    *,
    basis: Basis = "transcoders",
    max_nodes: int = MAX_NODES,
    batch_size: int = 32,
    align: Align = "prefix",
    exact_layers: Iterable[int] = (),
    skip_first: int | None = None,
) -> list[PairGraph]:
    """Attribution graphs of each pair over the local replacement model (docs/graphs.md).

    `transcoders`: a `rewardlens.sae.Transcoders` set covering every layer (`basis="transcoders"`), or None
    with `basis="neurons"` (the MLPs' own neurons: exact, for small models). `exact_layers`: layers whose
    MLP has no transcoder and is kept whole, as one error node per position. `skip_first`: at each sequence's
    first `skip_first` positions every MLP is kept whole the same way (no feature there), as the transcoders
    were trained and their fidelity measured (None: what their training recorded, else the default, 1 on
    decoders — the attention sink — and 0 on encoders); transcoders only. `max_nodes`: how many feature
    nodes get rows (chosen by estimated influence on the reward; the rest join the error nodes).
    `batch_size`: targets per backward pass. `align`: how the margin graph matches positions.
    """
    if isinstance(pairs, Pair):
        pairs = [pairs]
    if not isinstance(pairs, Sequence) or not pairs or not all(isinstance(p, Pair) for p in pairs):
        raise UsageError(f"graph needs rewardlens.Pair inputs (one or a list), got {type(pairs).__name__}",
                         option="pairs")
    if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 1:
        raise UsageError(f"max_nodes must be a positive number of feature nodes, got {max_nodes!r}; the default "
                         f"is {MAX_NODES}", option="max_nodes")
    if batch_size < 1:
        raise UsageError(f"batch_size must be at least 1, got {batch_size}", option="batch_size")
    if align not in ALIGNS:
        raise UsageError(f"align must be one of {ALIGNS}, got {align!r}", option="align")
    if model.reads.multi:
        raise UsageError("attribution graphs read the reward at one token; this model reads a set of positions "
                         "(a PRM or DPO read-out)", option="model")
    check_model(model)
    skip = _skip_first(model, basis, skip_first, transcoders)
    first = _basis(model, transcoders, basis, set(exact_layers), skip)  # checks the options before any forward
    if not model.verified:
        verify(model)
    seqs, _ = model.encode(list(pairs))
    out = []
    for i in range(len(pairs)):
        sides: list[AttributionGraph] = []
        rows = rows_of(i)
        for j, side in enumerate(("chosen", "rejected")):
            (_, batch), = model.batches([seqs[rows[j]]], 1)
            label = f"pair {i} ({side})"
            # a basis records its sequence's active set and frozen gates: one fresh basis per side and pair
            fresh = first if i == j == 0 else _basis(model, transcoders, basis, set(exact_layers), skip)
            sides.append(side_graph(model, batch, fresh, max_nodes=max_nodes, batch_size=batch_size, label=label))
        prefix = shared_prefix(seqs[rows[0]].ids, seqs[rows[1]].ids)
        out.append(PairGraph(sides[0], sides[1], margin_graph(sides[0], sides[1], align, prefix, f"pair {i} margin")))
    return out


def _skip_first(model: RewardModel, basis: str, skip_first: int | None, transcoders: Any) -> int:
    """The positions whose MLPs stay whole (`graph`'s `skip_first`), none for neurons. Transcoders: the value given,
    else what their training recorded (the largest, if layers differ), else the training default."""
    if basis != "transcoders":
        if skip_first:
            raise UsageError(f"skip_first={skip_first} keeps transcoders off the first tokens; basis={basis!r} is "
                             "exact at every position, so drop skip_first", option="skip_first")
        return 0
    return skip_first_for(model, skip_first, transcoders)


def _basis(model: RewardModel, transcoders: Any, basis: str, exact: set[int], skip_first: int = 0) -> Any:
    """A fresh basis for one sequence (it records that sequence's active set)."""
    if basis not in BASES:
        raise UsageError(f"basis must be one of {BASES}, got {basis!r}", option="basis")
    if basis == "neurons":
        if transcoders is not None:
            raise UsageError("basis='neurons' uses the MLPs' own neurons; drop transcoders= or use "
                             "basis='transcoders'", option="basis")
        return NeuronBasis(model)
    if transcoders is None:
        raise UsageError("basis='transcoders' needs transcoders= (rewardlens.sae.load_transcoders or "
                         "train_transcoders), or basis='neurons' for the MLPs' own neurons", option="transcoders")
    from ..sae.internal import check_transcoders

    bad = sorted(x for x in exact if not 0 <= x < model.n_layers)
    if bad:
        raise UsageError(f"exact_layers {bad} are not layers of this model (0..{model.n_layers - 1})",
                         option="exact_layers")
    check_transcoders(model, transcoders, [x for x in range(model.n_layers) if x not in exact])
    return TranscoderBasis(model, transcoders, exact, skip_first)
