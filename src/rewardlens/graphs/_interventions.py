"""Check a graph's claims in the real model: ablate, clamp or steer features, predicted beside real.

Real: the model runs on the graph's sequence with every MLP replaced by its transcoder and its error at
this input added back (so, untouched, it is the model to the bit), attention and norms live; the chosen
feature's activation at its position is set (`ablate` → 0, `clamp` → value, `steer` → activation + value),
every other feature is re-encoded from what its MLP now receives. The reward moves by `real`.

Predicted, from the graph alone (frozen attention, norms and active set): `direct` — the feature's edge to
the reward scaled by the change, `Δa · A[r, f] / a_f`; `graph` — the change carried through every path of
the graph, each feature downstream moving by its pre-activation's change (`Δa_t = Σ_s A[t, s] / a_s · Δa_s`,
in layer order; features past the node cap and error nodes are held). Each intervention is run on its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from ..errors import UsageError
from ..model import RewardModel
from ..model.internal import Batch, Tokenized, first_output, hidden_arg
from ..plotting import HtmlView
from ..sae.internal import mlp_modules

if TYPE_CHECKING:
    import pandas as pd

    from ._shape import GraphLike

MODES = ("ablate", "clamp", "steer")


@dataclass(frozen=True)
class InterventionCheck(HtmlView):
    """One row per intervention: node, mode, value, the activation before and after, the graph's predictions
    (`direct`, `graph`) and the `real` change of the reward."""

    rows: list[dict[str, Any]]
    reward: float

    def to_frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(self.rows)


def intervene(g: GraphLike, model: RewardModel, transcoders: Any,
              interventions: Mapping[str, tuple[str, float] | str]) -> InterventionCheck:
    """Run each of `interventions` (node name → `"ablate"`, `("clamp", v)` or `("steer", dv)`) in the real model and
    predict it from `g` (module docstring)."""
    if g.basis != "transcoders" or "margin" in g.nodes.names:
        raise UsageError("interventions check one side's transcoder graph (pair_graph.chosen or .rejected)",
                         option="graph")
    index = {name: i for i, name in enumerate(g.nodes.names)}
    plan = []
    for name, spec in interventions.items():
        mode, value = (spec, 0.0) if isinstance(spec, str) else spec
        if mode not in MODES:
            raise UsageError(f"intervention mode must be one of {MODES}, got {mode!r} for {name!r}", option="mode")
        if name not in index or g.nodes.kind[index[name]] != 0:
            raise UsageError(f"{name!r} is not a feature node of this graph; pick one from graph.to_frame()[0]",
                             option="interventions")
        plan.append((name, mode, float(value)))
    batch, errors = _batch(g, model), dict[int, Tensor]()
    reward = _reward(model, transcoders, batch, None, errors)
    rows = []
    for name, mode, value in plan:
        i = index[name]
        a = float(g.nodes.activation[i])
        new = 0.0 if mode == "ablate" else value if mode == "clamp" else a + value
        change = (int(g.nodes.layer[i]), int(g.nodes.position[i]), int(g.nodes.feature[i]), new)
        real = _reward(model, transcoders, batch, change, errors) - reward
        direct, through = _predicted(g, i, new - a)
        rows.append({"node": name, "mode": mode, "value": value, "activation": a, "new_activation": new,
                     "direct": direct, "graph": through, "real": real})
    return InterventionCheck(rows, reward)


def _batch(g: GraphLike, model: RewardModel) -> Batch:
    tokens = np.nonzero(g.nodes.kind == 2)[0]
    ids = [int(t) for t in g.nodes.feature[tokens[np.argsort(g.nodes.position[tokens])]]]
    (_, batch), = model.batches([Tokenized(ids)], 1)
    return batch


def _predicted(g: GraphLike, node: int, delta: float) -> tuple[float, float]:
    """(direct, through every path) change of the reward for feature `node` moving by `delta`."""
    a = np.where(g.nodes.kind == 0, g.nodes.activation, np.nan)
    per_unit = np.where(np.isfinite(a) & (a != 0), g.adjacency / np.where(a == 0, 1.0, a), 0.0)  # [R, N]
    moves = np.zeros(len(g.nodes.names))
    moves[node] = delta
    order = sorted(range(len(g.rows) - 1), key=lambda r: int(g.nodes.layer[g.rows[r]]))
    for r in order:
        target = int(g.rows[r])
        if target != node:
            moves[target] = float(per_unit[r] @ moves)
    return float(per_unit[-1, node] * delta), float(per_unit[-1] @ moves)


def _reward(model: RewardModel, transcoders: Any, batch: Batch, change: tuple[int, int, int, float] | None,
            errors: dict[int, Tensor]) -> float:
    with _spliced(model, transcoders, change, errors):
        captured = model.run(batch, model.final_points(batch))
    out, coef = model.head_readout(captured, batch)
    return float((out * coef).sum())


@contextlib.contextmanager
def _spliced(model: RewardModel, transcoders: Any, change: tuple[int, int, int, float] | None,
             errors: dict[int, Tensor]) -> Iterator[None]:
    """Every MLP replaced by its transcoder plus its error on the clean run (recorded when `change` is None)."""
    handles = []
    inputs: dict[int, Tensor] = {}

    def keep(layer: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        inputs[layer] = hidden_arg(args, kwargs)

    def hook(layer: int, out: Any) -> Any:
        x, y = inputs.pop(layer), first_output(out)
        tc = transcoders[layer]
        acts = tc.encode(x.float())
        if change is None:
            errors[layer] = y.float() - tc.decode(acts, x.float())
        elif change[0] == layer:
            acts[0, change[1], change[2]] = change[3]
        new = (tc.decode(acts, x.float()) + errors[layer]).to(y.dtype)
        return (new, *out[1:]) if isinstance(out, tuple) else new

    try:
        for layer in transcoders:  # the MLP's input and output modules (one module on pre-norm layouts)
            source, target = mlp_modules(model, layer)
            handles.append(source.register_forward_pre_hook(
                lambda _m, a, k, layer=layer: keep(layer, a, k), with_kwargs=True))
            handles.append(target.register_forward_hook(lambda _m, _a, o, layer=layer: hook(layer, o)))
        with torch.no_grad():
            yield
    finally:
        for h in handles:
            h.remove()
