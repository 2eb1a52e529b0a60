"""How well a transcoder set stands in for the MLPs it replaces: per-layer explained variance of the MLP output,
and the reward recovered when every covered MLP is replaced at once (error terms dropped).

Over the positions `P` (every non-pad token but each sequence's first `skip_first`, as training: by default
what the set's training recorded, `internal.skip_first_for`), per layer `l` with MLP input `x` and output `y`:

    explained variance_l = 1 − Σ_P ‖y − T_l(x)‖² / Σ_P ‖y − ȳ‖²     (clean inputs: each layer on its own)

and three forwards per batch give the rewards `r` (clean), `r_T` (every covered MLP's output at `P`
replaced by its transcoder's, each reading the input the replaced model gives it: errors compound as
in a replacement model) and `r_0` (those outputs zeroed):

    reward recovered = 1 − mean_n |r_T − r| / mean_n |r_0 − r|

1: a perfect stand-in; 0: as bad as deleting the MLPs; NaN when deleting them moves no reward.
The first `skip_first` tokens keep their exact MLP output (the attention sink the transcoders never saw).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from ..data import Inputs
from ..model import RewardModel
from ..model.internal import Batch, rewriting
from ..plotting import HtmlView
from ..stats import summary_frame
from ._activations import skip_first_for
from ._transcoder import Transcoder, Transcoders
from ._transcoder_load import check_transcoders
from ._transcoder_train import mlp_modules, mlp_pairs

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class TranscoderFidelity(HtmlView):
    """Per-layer fit and the whole set's reward recovered (module docstring); rewards per sequence [n]."""

    layers: tuple[int, ...]
    explained_variance: dict[int, float]
    l0: dict[int, float]
    reward_recovered: float
    n_tokens: int
    reward: np.ndarray
    replaced: np.ndarray
    zeroed: np.ndarray

    def to_frame(self) -> pd.DataFrame:
        """One row per layer: explained variance of the MLP output and mean active features per token."""
        import pandas as pd

        return pd.DataFrame({"layer": list(self.layers),
                             "explained_variance": [self.explained_variance[la] for la in self.layers],
                             "l0": [self.l0[la] for la in self.layers]})

    def summary(self) -> pd.DataFrame:
        """One row per number (`stats.summary_frame`): each layer's explained variance of the MLP output and
        mean active features, then the reward recovered with every MLP replaced; `n` the tokens or sequences."""
        rows = [{"name": f"{what}_layer_{la}", "value": getattr(self, what)[la], "n": self.n_tokens}
                for la in self.layers for what in ("explained_variance", "l0")]
        return summary_frame([*rows, {"name": "reward_recovered", "value": self.reward_recovered,
                                      "n": len(self.reward)}])

    def describe(self) -> str:
        """One line: the per-layer explained variance range and the reward recovered."""
        ev = [self.explained_variance[la] for la in self.layers]
        rec = "n/a (zeroing moves no reward)" if math.isnan(self.reward_recovered) else f"{self.reward_recovered:.3f}"
        return (f"transcoders at layers {list(self.layers)} ({self.n_tokens} tokens): explained variance of the MLP "
                f"output {min(ev):.3f}..{max(ev):.3f} (mean {float(np.mean(ev)):.3f}); reward recovered with every "
                f"MLP replaced {rec} (mean |Δr| replaced {float(np.abs(self.replaced - self.reward).mean()):.4g}, "
                f"zeroed {float(np.abs(self.zeroed - self.reward).mean()):.4g})")

    def __str__(self) -> str:
        return self.describe()


def transcoder_fidelity(model: RewardModel, transcoders: Transcoders, inputs: Inputs, *,
                        skip_first: int | None = None, batch_size: int = 8,
                        trust_base_model: bool = False) -> TranscoderFidelity:
    """Explained variance per layer and reward recovered of `transcoders` on `inputs` (module docstring)."""
    check_transcoders(model, transcoders, trust_base_model=trust_base_model)
    layers = list(transcoders.layers)
    tcs = {la: transcoders[la] for la in layers}
    dev = {la: tc.W_enc.device for la, tc in tcs.items()}
    sums = {la: np.zeros(4) for la in layers}  # Σ‖y‖², Σ‖y − ŷ‖², n, Σ active; Σy kept apart
    s1 = {la: torch.zeros(model.d_model, dtype=torch.float64) for la in layers}
    rewards: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    with torch.no_grad():
        skip = skip_first_for(model, skip_first, transcoders)  # as they were trained, when their training recorded it
        for rows, batch, mask, pairs in mlp_pairs(model, inputs, layers, skip_first=skip, batch_size=batch_size):
            for la, (x, y) in pairs.items():
                acts = tcs[la].encode(x.to(dev[la]))
                y_hat = tcs[la].decode(acts, x.to(dev[la])).to(y.device)
                yd = y.double()
                sums[la] += [float(yd.pow(2).sum()), float((yd - y_hat.double()).pow(2).sum()), len(y),
                             float((acts != 0).sum())]
                s1[la] += yd.sum(0).cpu()
            r = _reward(model, batch, [])
            r_t = _reward(model, batch, [(la, mask, _transcode(tcs[la])) for la in layers])
            r_0 = _reward(model, batch, [(la, mask, torch.zeros_like) for la in layers])
            rewards.append((np.asarray(rows), r, r_t, r_0))
    ev: dict[int, float] = {}
    l0: dict[int, float] = {}
    for la in layers:
        sq, err, n, active = sums[la]
        total = sq - float(s1[la].pow(2).sum()) / max(n, 1)
        ev[la] = float(1 - err / total) if total > 0 else math.nan
        l0[la] = float(active / max(n, 1))
    order = np.argsort(np.concatenate([row[0] for row in rewards]))  # back to the inputs' order
    r, r_t, r_0 = (np.concatenate([row[i] for row in rewards])[order] for i in (1, 2, 3))
    ablated = float(np.abs(r_0 - r).mean())
    recovered = 1 - float(np.abs(r_t - r).mean()) / ablated if ablated > 0 else math.nan
    return TranscoderFidelity(tuple(layers), ev, l0, recovered, int(sums[layers[0]][2]), r, r_t, r_0)


def _transcode(tc: Transcoder) -> Callable[[Tensor, Tensor], Tensor]:
    def fn(y: Tensor, x: Tensor) -> Tensor:
        return tc(x.to(tc.W_enc.dtype)).to(y.dtype)

    return fn


def _reward(model: RewardModel, batch: Batch,
            replace: list[tuple[int, Tensor, Callable[..., Tensor]]]) -> np.ndarray:
    """The scalar reward [b] of one forward of `batch`, each listed layer's MLP output at its mask replaced by
    `fn(output, input)` (`fn(output)` for torch.zeros_like)."""
    hooks: list[tuple[torch.nn.Module, str, Callable[[Tensor], Tensor | None]]] = []
    for layer, mask, fn in replace:
        (source, target), seen = mlp_modules(model, layer), dict[str, Tensor]()

        def grab(v: Tensor, seen: dict[str, Tensor] = seen) -> None:
            seen["x"] = v

        def put(v: Tensor, seen: dict[str, Tensor] = seen, mask: Tensor = mask,
                fn: Callable[..., Tensor] = fn) -> Tensor:
            out, m = v.clone(), mask.to(v.device)
            new = fn(v[m]) if fn is torch.zeros_like else fn(v[m], seen["x"][m])
            out[m] = new.to(v.dtype)
            return out

        hooks += [(source, "in", grab), (target, "out", put)]
    with rewriting(hooks):
        values, weights = model.head_readout(model.run(batch, model.final_points(batch)))
    return (values * weights).sum(-1).double().cpu().numpy()
