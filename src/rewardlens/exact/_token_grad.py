"""A first-order estimate of each token's *total* effect on the reward: gradient × (embedding − baseline).

`approx_s = ∂r/∂e_s · (e_s − e_base)`, with `e_s` the input embedding module's output at `s` (the
token embedding before any position or type embedding is added; Gemma's √d scaling, if the module
applies it, included) and `e_base` zero or the pad token's embedding. It is the linear term of
replacing `s`'s embedding by the baseline, through every path (all layers, every position): an
estimate of a total effect, not an exact split; `tokens` reports how its ranking agrees with the
exact direct split. The gradient flows through a zero tensor added to the embeddings
(`torch.autograd.grad`), so the user's parameters collect no `.grad`; a gate is held at its clean value.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor, nn

from ..errors import TokenizationError
from ..model import RewardModel, TraceKey
from ..model.internal import Batch, eval_mode, rewriting


def _baseline(model: RewardModel, embeddings: nn.Module, baseline: str, like: Tensor) -> Tensor:
    """The baseline embedding [1, 1, d] ('zero' or 'pad')."""
    if baseline == "zero":
        return torch.zeros_like(like[:1, :1])
    if model.pad_token_id is None:
        raise TokenizationError(
            "baseline='pad' needs a pad token, and this model has none; use baseline='zero' or load with "
            "pad_token_id=<id>", option="pad_token_id"
        )
    ids = torch.tensor([[model.pad_token_id]], device=like.device)
    with torch.no_grad():
        return cast(Tensor, embeddings(ids)).detach()


def total_effect_approx(model: RewardModel, batch: Batch, coef: Tensor, baseline: str) -> Tensor:
    """[n, T] per padded column: `∂r/∂e_s · (e_s − e_base)` with the readout `coef` [n, k] held fixed."""
    embeddings = cast(nn.Module, model.backbone.get_input_embeddings())  # type: ignore[operator]
    final = model.final_points(batch, gate=False)[TraceKey.final()]
    kept: dict[str, Tensor] = {}

    def touch(x: Tensor) -> Tensor:
        delta = torch.zeros_like(x, requires_grad=True)
        kept["delta"], kept["embed"] = delta, x.detach()
        return x + delta

    def keep(x: Tensor) -> None:
        kept["final"] = x[torch.arange(x.shape[0], device=x.device), final.cols.to(x.device)]

    with torch.enable_grad(), eval_mode(model.model), rewriting([(embeddings, "out", touch),
                                                                  (final.module, final.where, keep)]):
        model.backbone(**model.batch_kwargs(batch))
        reward = (model.head(model.final_hidden(kept["final"].float())) * coef).sum(-1)
        (grad,) = torch.autograd.grad(reward.sum(), kept["delta"])
    embed = kept["embed"].float()
    base = _baseline(model, embeddings, baseline, kept["embed"]).float()
    return (grad.float() * (embed - base)).sum(-1)
