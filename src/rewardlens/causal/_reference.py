"""The reference engine: one forward per (target, part), the yardstick every other engine is tested against.

No batching, no padding, no copies, no cache, no stepping: each target runs alone, once per part, with
that part's activation overwritten at the plan's columns by the plan's values, and its reward read from
that run. For the path-frozen (direct) estimand every part after the patched one is held at the clean
run's output at every position (a hook replaces each later sublayer's output with the target's own clean
one), and the readout keeps the clean coefficients (a gate is a later part too), as docs/design.md §1
defines the direct effect. Slow on purpose (`S` forwards per target): `patch(engine="reference")`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..model import RewardModel, SublayerKind, TraceKey
from ..model.internal import Batch, Point, capture, collate, eval_mode, rewriting
from ._engine import Overwrite, Site, head_slice, patched, take_values
from ._plan import Clean, PatchPlan

KINDS: tuple[SublayerKind, ...] = ("attn", "mlp")


def reference_sweep(model: RewardModel, clean: Clean, plan: PatchPlan, sweep: list[Site], *, direct: bool) -> Tensor:
    """Patched rewards [n_targets, S] of the plan's targets, one forward each per part of `sweep`."""
    cols, valid, values = plan.at_columns(clean)
    out = torch.zeros(len(plan.targets), len(sweep), device=model.device)
    for j, t in enumerate(plan.targets):
        batch = collate([clean.seqs[t]], pad_id=model.pad_token_id, side="right", first=model.encoder,
                        device=model.device)
        at = cols[j : j + 1, valid[j]]  # the target's own columns [1, m_j]
        outputs = _sublayer_outputs(model, batch) if direct else {}
        for s, site in enumerate(sweep):
            value = take_values(values[site.key], torch.tensor([j]), head_slice(model, site))
            if value.ndim == 3:
                value = value[:, valid[j].to(value.device)]
            edit = Overwrite(site, torch.tensor([0]), at, value)
            frozen = [(module, "out", _Fixed(x)) for (kind, layer), (module, x) in outputs.items()
                      if _later(model, site, kind, layer)]
            with rewriting(frozen):  # registered first, so the patch and the capture see frozen outputs
                final = _run(model, batch, [edit])
            coef = clean.coef[t : t + 1] if direct else model.coefficients(final)
            out[j, s] = (model.head_values(model.final_hidden(final[TraceKey.final()]), batch) * coef).sum()
    return out


def _run(model: RewardModel, batch: Batch, edits: list[Overwrite]) -> dict[TraceKey, Tensor]:
    """One forward of `batch` with `edits`: the points its head reads."""
    points = dict(model.final_points(batch))
    with torch.no_grad(), eval_mode(model.model), capture(points, model.device) as captured, patched(model, edits):
        model.backbone(**model.batch_kwargs(batch))
    return captured


def _sublayer_outputs(model: RewardModel, batch: Batch) -> dict[tuple[SublayerKind, int], tuple[nn.Module, Tensor]]:
    """Every sublayer's output projection and its clean output [1, T, d] at every position of `batch`."""
    every = torch.arange(batch.input_ids.shape[1], device=model.device)[None]
    modules = {(kind, layer): model.layer_module(layer, model.arch.attn_out if kind == "attn" else model.arch.mlp_out)
               for layer in range(model.n_layers) for kind in KINDS}
    points = {key: Point(module, "out", every) for key, module in modules.items()}
    with torch.no_grad(), eval_mode(model.model), capture(points, model.device) as got:
        model.backbone(**model.batch_kwargs(batch))
    return {key: (modules[key], got[key]) for key in modules}


class _Fixed:
    """A hook's replacement: always `value`, in the activation's dtype and device."""

    def __init__(self, value: Tensor) -> None:
        self.value = value

    def __call__(self, x: Tensor) -> Tensor:
        return self.value.to(device=x.device, dtype=x.dtype)


def _later(model: RewardModel, site: Site, kind: SublayerKind, layer: int) -> bool:
    """Whether sublayer (`kind`, `layer`) reads the residual after `site` writes it: every later layer, and
    the same layer's MLP after its attention (not in a parallel layer, whose MLP reads the layer's input)."""
    if site.kind == "embed" or layer > site.layer:
        return True
    return layer == site.layer and site.kind == "attn" and kind == "mlp" and model.arch.layout != "parallel"
