"""Grader of neuron-level patching on a planted-neuron organism: attribution patching of every MLP neuron
(one backward) must rank the planted neurons first, and exact patching of them must recover the effect.

No trained organism keeps its rule in a few MLP neurons, so one is made from the 'circuit' organism, whose
rule lives only in one head (`attn_L1_H2`), by surgery on a copy: the head's write is turned into a private
direction p (orthogonal to the reward's readout direction û, so the head no longer moves the reward
directly: w_O ← p (ûᵀ W_O)), and three neurons of the same layer's MLP read p and write û,

    up_n = a · p / g,   gate_n = b · p / g,   W_down[:, n] = c_n · û

(g: the MLP's input-norm weight, so up_n · x = a · p·h / σ). The rule now reaches the reward only through
those neurons: zeroing their down-projection columns removes the margin (the answer key), and each neuron
carries its share c_n / Σc. The sizes keep the final norm far from saturation, so the neurons' effects add up.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from ..causal import attribution_patch, patch
from ..model import Part, RewardModel, wrap
from ..model.internal import get_module
from ..zoo.organisms import ORGANISMS, forward_margins
from ._core import Grade, OrganismBench

HOST = "circuit"
"""The organism the neurons are planted in (its rule lives in one head of the last layer)."""
NEURONS = (11, 47, 90)
"""The planted neurons' indices in the host head's layer's MLP."""
UP, GATE, DOWN = 0.3, 1.0, (0.045, 0.03, 0.015)
"""Weight scales a, b and c_n of the planted neurons (each neuron's share of the margin: c_n / Σc)."""
RECOVERED = 0.1
"""How far the planted neurons' summed exact effects may sit from the effect of removing them together (share)."""


def plant_neurons(host: RewardModel, head: str) -> tuple[RewardModel, list[str]]:
    """A copy of `host` (a Llama organism whose rule lives in `head`) whose rule runs through `NEURONS` of
    that head's layer (module docstring), wrapped and verified, and the planted neurons' part names."""
    part = Part.parse(head)
    assert part.head is not None  # the host organism plants its rule in one head
    hf = copy.deepcopy(host.model)
    layer = host.layers[part.layer]
    o_proj, mlp = _weight(host.layer_module(part.layer, host.arch.attn_out)), get_module(layer, "mlp")
    u = (host.head.weight[0].cpu() * _weight(get_module(host.model, host.arch.final_norm or "")).detach().float().cpu())
    u_hat = u / u.norm()
    p = torch.randn(u.shape[0], generator=torch.Generator().manual_seed(0))
    p = p - (p @ u_hat) * u_hat
    p = p / p.norm()
    size = o_proj.shape[1] // host.n_heads
    cols = slice(part.head * size, (part.head + 1) * size)
    copy_of = dict(zip(host.model.parameters(), hf.parameters()))  # host parameter → the copy's
    g = _weight(get_module(layer, "post_attention_layernorm")).detach().float().cpu()
    with torch.no_grad():
        w_o = copy_of[o_proj]
        w_o[:, cols] = torch.outer(p, u_hat @ w_o[:, cols].float().cpu()).to(w_o)
        up, gate, down = (copy_of[_weight(get_module(mlp, name))] for name in ("up_proj", "gate_proj", "down_proj"))
        for n, c in zip(NEURONS, DOWN):
            up[n] = (UP * p / g).to(up)
            gate[n] = (GATE * p / g).to(gate)
            down[:, n] = (c * u_hat).to(down)
    return wrap(hf, host.tokenizer), [Part.mlp(part.layer, n).name for n in NEURONS]


def _weight(module: nn.Module) -> nn.Parameter:
    """A module's `weight` parameter (the organisms' Llama: every projection and norm has one)."""
    weight = module.weight
    assert isinstance(weight, nn.Parameter), f"{type(module).__name__} has no weight parameter"
    return weight


def grade_neurons(bench: OrganismBench) -> list[Grade]:
    """Neuron-level patching on the planted-neuron organism (`plant_neurons` of 'circuit'): the rule lives in
    the planted neurons (margin left with them removed); attribution patching of every neuron ranks them first
    among neurons and estimates their exact effects; exact patching of the chosen neurons (zero ablation, each
    alone) sums to the effect of removing all of them in the model's own forward."""
    if HOST not in bench.organisms:
        return []
    head = ORGANISMS[HOST].planted_part
    assert head is not None  # the circuit organism plants its rule in one head
    model, planted = plant_neurons(bench.model(HOST), head)
    pairs = bench.pairs(HOST)[:40]
    name = f"{HOST}+neurons"
    full = forward_margins(model.model, model.tokenizer, pairs)[:, 0]
    removed = copy.deepcopy(model.model)
    down = _weight(model.layer_module(Part.parse(planted[0]).layer, model.arch.mlp_out))
    with torch.no_grad():
        dict(zip(model.model.parameters(), removed.parameters()))[down][:, list(NEURONS)] = 0
    cut = forward_margins(removed, model.tokenizer, pairs)[:, 0]
    rows = [Grade.of("organism", name, f"|mean margin| left with {', '.join(planted)} removed, as a share",
                     abs(cut.mean() / full.mean()), 0.05, "<=")]
    atp = attribution_patch(model, pairs, level="neuron", mode="ablation")
    neurons = [i for i, n in enumerate(atp.names) if Part.parse(n).neuron is not None]
    mean = atp.effect.mean(0)
    order = [atp.names[neurons[i]] for i in np.argsort(-mean[neurons], kind="stable")]
    worst = max(order.index(n) + 1 for n in planted)
    rows.append(Grade.of("attribution patching", name, f"worst rank of the {len(planted)} planted neurons among "
                         f"{len(neurons)} neurons by mean ablation effect (neuron level)", worst, len(planted), "<="))
    exact = patch(model, pairs, level="neuron", neurons=planted, mode="ablation")
    each = exact.effect.mean(0)
    estimate = mean[[atp.names.index(n) for n in planted]]
    rows.append(Grade.of("attribution patching", name, "max relative gap to exact patching over the planted "
                         "neurons' mean ablation effects", float(np.abs(estimate - each).max() / np.abs(each).max()),
                         0.1, "<="))
    joint = float((full - cut).mean())
    rows.append(Grade.of("patching", name, "|sum of the planted neurons' exact mean ablation effects / mean margin "
                         "they carry together - 1| (neuron level)", abs(each.sum() / joint - 1), RECOVERED, "<="))
    return rows

