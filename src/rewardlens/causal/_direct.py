"""Path-frozen (direct) patching: patch one part, hold every later part at its clean value.

No forward pass is needed. At the read position the final residual is the clean one with the
patched part's change added (pre-norm and parallel layouts), or the post-norm chain recomputed
with every later part frozen (encoders); the final norm is then applied with its scale
recomputed, and the head read with the clean readout coefficients (a gate is a later part too).
Path-frozen patching measures the direct effect causally; it differs from attribution only by
the change of the final norm's scale (docs/design.md §1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..model import RewardModel, SublayerKind, Trace, TraceKey
from ._engine import Site, head_write

SUBLAYERS: tuple[SublayerKind, ...] = ("attn", "mlp")

if TYPE_CHECKING:
    from ._plan import Clean


def direct_rewards(
    model: RewardModel, clean: Clean, targets: list[int], sweep: list[Site], values: dict[TraceKey, Tensor],
    cols: Tensor | None,
) -> Tensor:
    """Path-frozen patched rewards [n_targets, S].

    `values[key]`: the replacement activations ([w] for all rows, [n_targets, w] at the read
    position, or [n_targets, m, w] at columns `cols` [n_targets, m]). A part patched away from the
    read position has no direct effect there.
    """
    index = torch.tensor(targets, device=model.device)
    tr = Trace(None, {k: v[index] for k, v in clean.captured.items()})
    read = torch.tensor([clean.read[i] for i in targets], device=model.device)
    coef = clean.coef[index]
    out = []
    for site in sweep:
        rep, hit = _at_read(values[site.key], read, cols, len(targets))
        final = patched_final(model, tr, site, rep, hit)
        out.append((model.head(model.final_hidden(final)) * coef).sum(-1))
    return torch.stack(out, 1)


def patched_final(model: RewardModel, tr: Trace, site: Site, rep: Tensor, hit: Tensor | None = None) -> Tensor:
    """The final residual [n, d] of each trace row with `site`'s activation replaced by `rep` [n, w]
    (where `hit` [n] says so; everywhere when None) and every later part held at its clean value."""
    old, new = _part(model, tr, site, rep)
    if hit is not None:
        new = torch.where(hit[:, None], new, old)
    return _propagate(model, tr, site, old, new)


def _at_read(value: Tensor, read: Tensor, cols: Tensor | None, n: int) -> tuple[Tensor, Tensor]:
    """The replacement at each target's read position [n, w] and whether that position is patched [n]."""
    everywhere = torch.ones(n, dtype=torch.bool, device=read.device)
    if value.ndim == 1:
        hit = everywhere if cols is None else (cols.to(read.device) == read[:, None]).any(1)
        return value.expand(n, -1), hit
    if value.ndim == 2:
        return value, everywhere
    assert cols is not None  # values over positions [n, m, w] come with their columns
    match = cols.to(read.device) == read[:, None]
    return value[torch.arange(n, device=read.device), match.float().argmax(1)], match.any(1)


def post_normed(model: RewardModel, kind: SublayerKind, layer: int, raw: Tensor) -> Tensor:
    """What a sublayer adds to the residual from its raw output `raw` [..., d]: its post-norm's output
    (Gemma-2, OLMo-2), else `raw` itself."""
    path = model.arch.attn_post_norm if kind == "attn" else model.arch.mlp_post_norm
    return raw if path is None else model.norm(path, layer)(raw)


def _part(model: RewardModel, tr: Trace, site: Site, rep: Tensor) -> tuple[Tensor, Tensor]:
    """(clean, patched) value [n, d] the site's part adds to the residual at the read position."""
    if site.kind == "embed":
        return tr[TraceKey.embed()], rep
    raw = tr[TraceKey.sublayer(site.kind, site.layer)]
    if not site.column:
        new_raw = rep
    else:
        new_raw = raw + head_write(model, site, rep - tr[site.key])
    return post_normed(model, site.kind, site.layer, raw), post_normed(model, site.kind, site.layer, new_raw)


def _propagate(model: RewardModel, tr: Trace, site: Site, old: Tensor, new: Tensor) -> Tensor:
    """The final residual [n, d] with the site's part changed from `old` to `new`, later parts frozen."""
    arch = model.arch
    if arch.layout != "post_norm":
        return tr[TraceKey.final()] + (new - old)
    start = 0 if site.kind == "embed" else site.layer
    x = new if site.kind == "embed" else tr[TraceKey.at_depth(start)]  # what layer `start` reads
    attn_rnorm, mlp_rnorm = arch.residual_norms
    for layer in range(start, model.n_layers):
        parts: dict[str, Tensor] = {}
        for kind in SUBLAYERS:
            patched = site.kind == kind and site.layer == layer
            parts[kind] = new if patched else post_normed(model, kind, layer, tr[TraceKey.sublayer(kind, layer)])
        mid = model.norm(attn_rnorm, layer)(x + parts["attn"])
        x = model.norm(mlp_rnorm, layer)(mid + parts["mlp"])
    return x
