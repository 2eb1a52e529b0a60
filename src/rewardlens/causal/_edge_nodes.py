"""The edge graph: which upstream parts write and which downstream node inputs read (`nodes`), at
sublayer or head level, and the models edge instruments can run on (`check_model`)."""

from __future__ import annotations

from typing import Literal

from torch import Tensor

from ..errors import ArchitectureError, CircuitError, UsageError
from ..model import RewardModel
from ._engine import Site
from ._receivers import QKV, QKVS, Receiver

Level = Literal["sublayer", "head"]


def nodes(model: RewardModel, level: Level, qkv: bool) -> tuple[list[Site], list[Receiver]]:
    """Every upstream part (embeddings, then per layer attention or its heads, then the MLP) and every
    downstream node input (per layer attention, its heads or their q/k/v, the MLP, then 'reward')."""
    if level not in ("sublayer", "head"):
        raise UsageError(f"level must be 'sublayer' or 'head', got {level!r}", option="level")
    if qkv and level != "head":
        raise CircuitError("qkv=True makes a head's query, key and value inputs separate nodes, but level is "
                           f"{level!r}, whose nodes are whole sublayers; pass level='head' or drop qkv")
    ups: list[Site] = [Site.embed()]
    downs: list[Receiver] = []
    inputs: tuple[QKV | None, ...] = QKVS if qkv else (None,)
    if level == "head" and _grouped(model):  # one key/value head serves several query heads: only q is a head's own
        inputs = ("q",)
    for layer in range(model.n_layers):
        if level == "head":
            ups += [Site.attn(layer, h) for h in range(model.n_heads)]
            downs += [Receiver("head", layer, h, x) for h in range(model.n_heads)
                      for x in inputs]
        else:
            ups.append(Site.attn(layer))
            downs.append(Receiver("attn", layer))
        ups.append(Site.mlp(layer))
        downs.append(Receiver("mlp", layer))
    return ups, [*downs, Receiver.reward()]


def _grouped(model: RewardModel) -> bool:
    """Whether the key projection is narrower than the query projection (grouped-query attention)."""
    q, k = model.arch.attn_q, model.arch.attn_k
    if q is None or k is None:
        return False
    wk, wq = model.layer_module(0, k).weight, model.layer_module(0, q).weight
    assert isinstance(wk, Tensor) and isinstance(wq, Tensor)
    return wk.shape[0] != wq.shape[0]


def check_model(model: RewardModel, what: str) -> None:
    """Edge instruments read the reward at one token of a sequential layout (one CircuitError/ArchitectureError)."""
    if model.reads.multi:
        raise CircuitError(f"{what} reads the reward at one token; this model reads it at a set of positions "
                           "(PRM steps, DPO tokens): use rl.patch, which patches at every read")
    if model.arch.layout == "parallel":
        raise ArchitectureError(f"{what}: map {model.arch.name!r} has a parallel layout (attention and MLP read "
                                "one input), so one sublayer's input cannot take a gradient alone; use rl.path_patch")
