"""The expert level of a mixture-of-experts MLP: each expert's exact contribution to the reward.

At the read position a sparse block writes `y = Σ_e g_e(x)·E_e(x) [+ σ(w_s·x)·S(x)]` (model layer:
`expert_writes`, which proves the terms sum to the captured output). With the router's weights
`g_e(x)` frozen at their values on this input, like a norm's scale, expert e's value along the
read-out vector u is `u · g_e(x)·E_e(x)`, and the values sum to the sublayer's `u · y`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import ArchitectureError
from ..model import RewardModel, Trace, TraceKey
from ..model.internal import expert_writes


def expert_values(model: RewardModel, tr: Trace, layer: int, u: Tensor) -> Tensor:
    """Values [n, k, P] of `layer`'s sparse block read along `u` [n, k, d], one per expert (`expert_parts` order).

    Needs the block's input in the trace (`TraceKey.mlp_act(layer)`: traced with `neurons` holding `layer`)."""
    post = model.arch.mlp_post_norm
    if post is not None:
        raise ArchitectureError(
            f"map {model.arch.name!r} applies the post-norm {post!r} to layer {layer}'s mixture-of-experts "
            "output; rewardlens splits a sparse block into experts only when its output is added as is. "
            "Use level='sublayer' or 'head' (the whole block stays one exact part)"
        )
    writes = expert_writes(model, layer, tr[TraceKey.mlp_act(layer)], tr[TraceKey.mlp(layer)])  # [n, P, d]
    return torch.einsum("nkd,npd->nkp", u, writes)
