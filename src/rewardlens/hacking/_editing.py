"""`edit`: remove a concept from what the reward head reads, and save the edited model.

The head reads the final hidden state `ĥ` (after the final norm) through an affine first layer
`W ĥ + b` (the score head; the pooler's dense layer for BERT-style heads; the regression layer of
a gated ArmoRM head). Both methods are an affine eraser `r(ĥ) = ĥ − P (ĥ − μ)` of rank one, with
`P = a ⊗ c` (`a` = `along`, `c` = `read`, `c · a = 1`); erasing and then applying the layer is the
same layer with new parameters

    W' = W (I − P),    b' = b + W P μ,

so an edit is a change of one layer's weights, and the edited model is a plain Hugging Face model.

- `project`: `a = c = v̂`, the unit difference of the class means of `ĥ`, `μ = 0`: `W' = W (I − v̂v̂ᵀ)`
  reads nothing along v̂ (`W' v̂ = 0`).
- `leace` (Belrose et al. 2023): with `Σ` the covariance of `ĥ` over both sets (and unlabelled
  `background` inputs), `Σ_xz` the sets' cross-covariance with the label (1 = positive),
  `W = (Σ^{1/2})⁺`, `u = W Σ_xz`: `P = W⁺ u u⁺ W`, `μ` = the sets' pooled mean. The erased `ĥ` has
  zero cross-covariance with the label: no linear probe separates the class means.

A head without a bias (Llama score heads) cannot store `W P μ`: it shifts every reward of an input by
the same constant and leaves every margin between two responses to one prompt unchanged, so it is
dropped and recorded (`Edit.dropped_constant`, and in `rewardlens_edit.json`).
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch import nn

from ..data import Inputs, Pair
from ..errors import ArchitectureError, DataError, HeadError, UsageError, warn
from ..model import RewardModel, wrap
from ..model.internal import get_module
from ..plotting import HtmlView
from ..types import EditMethod, Text

if TYPE_CHECKING:
    import pandas as pd

METHODS: tuple[EditMethod, ...] = ("project", "leace")
METADATA = "rewardlens_edit.json"
"""The file `edit(..., out=DIR)` writes next to the model: what was erased and how."""
_RCOND = 1e-10
"""Eigenvalues of Σ below this share of the largest are treated as zero (pseudo-inverse)."""


@dataclass(frozen=True)
class Edit(HtmlView):
    """An edited copy of a reward model and the eraser it applies to the final hidden state.

    The eraser is `r(h) = h − along · (read · (h − mean))` on `h` [.., d] (the head's input):
    `direction` [d] is the unit difference of class means v̂ (positive − negative), `along` [d] and
    `read` [d] span the rank-one `eraser` P = along ⊗ read, `mean` [d] is μ (zeros for `project`).
    `dropped_constant` [k] is W P μ per output of the edited `layer` (for a score head: reward units)
    when the layer has no bias to hold it (zeros otherwise). `shrinkage` is the weight put on the
    scaled identity in Σ and `n_background` the unlabelled inputs that joined Σ (LEACE only).
    """

    model: RewardModel
    path: Path | None
    method: EditMethod
    name: str
    layer: str
    direction: np.ndarray
    direction_norm: float
    along: np.ndarray
    read: np.ndarray
    mean: np.ndarray
    dropped_constant: np.ndarray
    shrinkage: float
    n_positive: int
    n_negative: int
    n_background: int = 0

    @property
    def eraser(self) -> np.ndarray:
        """P [d, d]: the rank-one (for `project` orthogonal, for `leace` oblique) projection removed."""
        return np.outer(self.along, self.read)

    def erase(self, h: torch.Tensor) -> torch.Tensor:
        """`h − P (h − μ)` for final hidden states `h` [n, d], in fp32 on `h`'s device."""
        along, read, mean = (torch.as_tensor(x, dtype=torch.float32, device=h.device)
                             for x in (self.along, self.read, self.mean))
        h = h.float()
        return h - ((h - mean) @ read)[:, None] * along

    def to_frame(self) -> pd.DataFrame:
        """One row: what `rewardlens_edit.json` records (method, concept, layer, |μ₊ − μ₋|, ...)."""
        import pandas as pd

        return pd.DataFrame([{**_record(self), "path": None if self.path is None else str(self.path)}])


def final_hidden_states(model: RewardModel, inputs: Sequence[Text], *, batch_size: int = 16) -> torch.Tensor:
    """What the head reads, `ĥ` [n_sequences, d] in fp32 on `model.device`: the final norm's output
    at the read position. `inputs`: strings or chat conversations (as `model.score` takes them)."""
    seqs, is_pairs = model.encode(inputs)
    if is_pairs:
        raise DataError(
            "a concept set holds single texts or conversations, not preference pairs; pass e.g. "
            "[p.conversation('chosen') for p in pairs] and [p.conversation('rejected') for p in pairs]"
        )
    return model.read(seqs, batch_size=batch_size, gate=False).hidden


def _hidden_any(model: RewardModel, inputs: Inputs, batch_size: int) -> torch.Tensor:
    """ĥ [n, d] (fp64, CPU) of texts or conversations, or of both sides of preference pairs."""
    items = list(inputs)
    if items and all(isinstance(p, Pair) for p in items):
        texts: list[Text] = [p.conversation(side) for p in items if isinstance(p, Pair)
                             for side in ("chosen", "rejected")]
    else:  # texts (a list mixing pairs and texts is refused by `model.encode`)
        texts = cast("list[Text]", items)
    return final_hidden_states(model, texts, batch_size=batch_size).double().cpu()


def read_layer(model: RewardModel) -> tuple[str, nn.Linear]:
    """(module path, module) of the first linear layer that reads `ĥ`: the pooler's dense layer for
    pooler heads, else the head (the score head, or a gated head's regression layer)."""
    path = model.arch.pooler if model.arch.head_kind == "pooler" else model.arch.head
    assert path is not None  # ArchitectureMap refuses head_kind='pooler' without a pooler path
    module = get_module(model.model, path)
    if not isinstance(module, nn.Linear):
        raise HeadError(
            f"the layer that reads the final hidden state, {path!r}, is a {type(module).__name__}, not "
            "nn.Linear; an edit rewrites W and b of r = W·h + b, so it needs a linear first layer"
        )
    return path, module


def _shrinkage(x: torch.Tensor) -> float:
    """Ledoit–Wolf (2004) weight on the scaled identity for centred samples `x` [n, d] (fp64)."""
    n, d = x.shape
    s = x.T @ x / n
    m = torch.trace(s) / d
    d2 = ((s - m * torch.eye(d, dtype=x.dtype)) ** 2).sum()
    if d2 <= 0:
        return 0.0
    b2 = ((x.pow(2).sum(1) ** 2).sum() - n * (s ** 2).sum()) / n**2
    return float(torch.clamp(b2 / d2, 0.0, 1.0))


def leace_eraser(x: torch.Tensor, z: torch.Tensor, shrinkage: float | None = None,
                 background: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """Closed-form LEACE for samples `x` [n, d] and a binary label `z` [n] (fp64 on the CPU).

    Returns (along [d], read [d], mean [d], shrinkage) with P = along ⊗ read = W⁺ (WΣ_xz)(WΣ_xz)⁺ W,
    W = (Σ^{1/2})⁺, Σ shrunk to (1 − λ) Σ + λ tr(Σ)/d I. Σ is the covariance of `x` and the unlabelled
    `background` [m, d] together (the data the model will score); Σ_xz and μ come from `x` alone.
    `shrinkage` None: the Ledoit–Wolf λ, which falls towards 0 as samples grow (without it, a barely
    full-rank Σ's inverse square root amplifies its smallest, noisiest directions); a number in
    [0, 1] fixes λ. The erased `x` has zero cross-covariance with `z` for every λ and background:
    P Σ_xz = Σ_xz holds whatever Σ is whitened by.
    """
    n, d = x.shape
    mean = x.mean(0)
    sigma_xz = (x - mean).T @ (z - z.mean()) / n  # [d]
    pool = x if background is None else torch.cat([x, background])
    xc = pool - pool.mean(0)
    if shrinkage is None:
        shrinkage = _shrinkage(xc)
    if not 0.0 <= shrinkage <= 1.0:
        raise UsageError(f"shrinkage is a weight in [0, 1], got {shrinkage}")
    sigma = xc.T @ xc / len(xc)
    sigma = (1 - shrinkage) * sigma + shrinkage * torch.trace(sigma) / d * torch.eye(d, dtype=x.dtype)
    values, vectors = torch.linalg.eigh(sigma)
    keep = values > _RCOND * values.max().clamp_min(torch.finfo(x.dtype).tiny)
    v, lam = vectors[:, keep], values[keep]
    whiten = (v / lam.sqrt()) @ v.T  # W = (Σ^{1/2})⁺
    unwhiten = (v * lam.sqrt()) @ v.T  # W⁺ = Σ^{1/2}
    u = whiten @ sigma_xz
    if float(u @ u) == 0.0:
        raise DataError("the label has no covariance with the final hidden state; there is nothing to erase")
    # P = W⁺ u uᵀ W / |u|²: rank one, stored as along ⊗ read with |along| = 1.
    along, read = unwhiten @ u, whiten @ u / (u @ u)
    scale = along.norm()
    return along / scale, read * scale, mean, float(shrinkage)


def _edited_copy(model: nn.Module, path: str) -> nn.Module:
    """A copy of `model` that owns fresh tensors for the module at `path` and shares every other
    (unchanged) weight with the user's model, so an 8B model is not held twice."""
    own = {id(t) for t in get_module(model, path).parameters()}
    shared = {id(t): t for t in [*model.parameters(), *model.buffers()] if id(t) not in own}
    return copy.deepcopy(model, shared)


def _readout(model: RewardModel) -> list[float] | None:
    if model.head.readout is None or model.head.n_objectives == 1:
        return None
    return [float(x) for x in model.head.readout.cpu()]


def edit(
    model: RewardModel,
    positive: Sequence[Text],
    negative: Sequence[Text],
    *,
    method: EditMethod = "project",
    name: str = "concept",
    out: str | os.PathLike[str] | None = None,
    batch_size: int = 16,
    shrinkage: float | None = None,
    background: Inputs | None = None,
) -> Edit:
    """Erase the concept that separates `positive` from `negative` from what the head reads.

    `positive`/`negative`: strings or chat conversations with and without the concept (matched
    content works best). `method`: 'project' (remove v̂ from the read-out) or 'leace' (closed-form
    linear concept erasure). The user's model is never modified: the edit lives in a copy that shares
    the unchanged backbone weights with it (do not train one in place). With `out`, the copy is saved
    there as a normal Hugging Face folder (model, tokenizer, `rewardlens_edit.json`). LEACE only:
    `background`, unlabelled inputs like those the model will score (texts, conversations or pairs),
    joins the covariance LEACE whitens by — without it, inputs unlike the concept sets can move a lot
    (docs/editing.md); `shrinkage`, the covariance's weight on the scaled identity (None: Ledoit–Wolf).
    """
    if method not in METHODS:
        raise UsageError(f"method must be one of {METHODS}, got {method!r}")
    if (shrinkage is not None or background is not None) and method != "leace":
        raise UsageError(f"shrinkage= and background= apply to method='leace' only, got method={method!r}")
    xp = final_hidden_states(model, positive, batch_size=batch_size).double().cpu()
    xn = final_hidden_states(model, negative, batch_size=batch_size).double().cpu()
    if len(xp) < 2 or len(xn) < 2:
        raise DataError(f"a concept needs at least 2 positive and 2 negative inputs, got {len(xp)} and {len(xn)}")
    diff = xp.mean(0) - xn.mean(0)
    norm = float(diff.norm())
    if not np.isfinite(norm) or norm == 0.0:
        raise DataError(f"the positive and negative sets have the same mean final hidden state (|μ₊ − μ₋| = {norm}); "
                        "there is no concept direction to erase — check that the sets differ in the concept")
    direction = diff / norm
    if method == "project":
        along, read, mean, shrink, xb = direction, direction, torch.zeros_like(direction), 0.0, None
    else:
        x = torch.cat([xp, xn])
        z = torch.cat([torch.ones(len(xp)), torch.zeros(len(xn))]).double()
        xb = None if background is None else _hidden_any(model, background, batch_size)
        along, read, mean, shrink = leace_eraser(x, z, shrinkage, xb)
        n_cov = len(x) + (0 if xb is None else len(xb))
        if n_cov <= x.shape[1]:
            warn(f"LEACE estimated its covariance from {n_cov} inputs for a {x.shape[1]}-wide hidden state, so it is "
                 f"singular; it was shrunk towards the scaled identity (weight {shrink:.3f}). The erasure is exact on "
                 "the concept sets; pass more inputs (or background=) for one that generalises better")
    path, layer = read_layer(model)
    hf = _edited_copy(model.model, path)
    target = get_module(hf, path)
    assert isinstance(target, nn.Linear)  # a copy of `layer`, which read_layer checked
    if layer.weight.is_meta:
        raise ArchitectureError(f"the layer an edit folds into ({path}) is offloaded (on the meta device); editing "
                                "writes a new weight into it, so load the model without offloading that layer "
                                "(e.g. a device_map that keeps it on the CPU or a GPU)")
    weight = layer.weight.detach().double().cpu()  # [k, d]
    wa = weight @ along  # [k]: what the layer reads along the erased direction
    constant = wa * (read @ mean)  # [k] = W P μ
    with torch.no_grad():
        target.weight.copy_((weight - torch.outer(wa, read)).to(target.weight))
        if target.bias is not None:
            target.bias.copy_((layer.bias.detach().double().cpu() + constant).to(target.bias))
    dropped = constant.numpy() if target.bias is None else np.zeros(len(constant))
    edited = wrap(hf, model.tokenizer, arch=model.arch, readout=_readout(model), pad_token_id=model.pad_token_id,
                  max_length=model.max_length, truncation=model.truncation)
    result = Edit(
        model=edited, path=None, method=method, name=name, layer=path, direction=direction.numpy(),
        direction_norm=norm, along=along.numpy(), read=read.numpy(), mean=mean.numpy(),
        dropped_constant=dropped, shrinkage=shrink, n_positive=len(xp), n_negative=len(xn),
        n_background=0 if xb is None else len(xb),
    )
    if out is not None:
        result = save_edit(result, out, source=model)
    return result


def save_edit(result: Edit, out: str | os.PathLike[str], *, source: RewardModel | None = None) -> Edit:
    """Save the edited model, its tokenizer and `rewardlens_edit.json` to `out`; returns the Edit with
    `path` set. The folder loads with `rewardlens.load` and `AutoModelForSequenceClassification`."""
    out = Path(out).expanduser()
    origin = str(getattr((source or result.model).model.config, "_name_or_path", "") or "")
    if origin and Path(origin).exists() and Path(origin).resolve() == out.resolve():
        raise UsageError(f"out={str(out)!r} is the folder the model was loaded from; save the edit elsewhere, "
                         "the original must stay as it is")
    out.mkdir(parents=True, exist_ok=True)
    hf: Any = result.model.model  # a transformers PreTrainedModel
    hf.save_pretrained(out)
    result.model.tokenizer.save_pretrained(out)
    biasless = bool(np.any(result.dropped_constant != 0))
    meta = {**_record(result), "source": origin or None, "readout": _readout(result.model), "dropped_constant_note": (
        "the layer has no bias, so the constant W·P·μ (per head output, reward units) of the LEACE eraser was "
        "dropped: it shifts every reward of an input by the same amount and leaves margins between responses "
        "to the same prompt unchanged" if biasless else None)}
    (out / METADATA).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return replace(result, path=out)


def _record(e: Edit) -> dict[str, Any]:
    return {"method": e.method, "concept": e.name, "layer": e.layer, "direction_norm": e.direction_norm,
            "shrinkage": e.shrinkage, "n_positive": e.n_positive, "n_negative": e.n_negative,
            "n_background": e.n_background, "dropped_constant": [float(c) for c in e.dropped_constant]}
