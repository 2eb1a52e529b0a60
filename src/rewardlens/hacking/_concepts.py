"""`concepts`: directions from contrastive text sets, per layer, and their causal dose-response.

A *concept* is two sets of inputs, with and without an attribute (matched where possible: same
prompts, same content). At every layer the concept's direction is the difference of the two class
means of the residual stream `x_l` at the read position `t*`, reported two ways:
- *head space*: of the normalised residual `ĥ_l = N(x_l)` (the final norm applied to `x_l`; the
  residual itself for models without a final norm), the space the head reads. Its cosine with the
  effective read-out (the head row `w`, or `coef @ rows` for multi-objective and gated heads,
  averaged over the concept's inputs) says how much the reward can see of it there;
- *residual space*: of `x_l` itself, the direction the dose-response adds.

Separation along the head-space direction is an AUROC from cross-fitted folds: each input is
scored by a direction computed without its fold (matched inputs share a fold), so it is held out.

The dose-response is causal: at `dose_layer` the hook adds `α · scale · v̂` to the residual stream
(the layer's output, or the input of layer 0 for `embed`) at the read token or at every real token,
where `v̂` is the unit residual-space direction there. `α` is in natural units of the concept, so
slopes compare across layers, concepts and models: with `unit="difference"` (the default) one
unit is the length of the mean difference `|μ+ − μ−|` (α = 1 moves an input by one concept's worth,
as steering vectors do); with `unit="sigma"` it is `σ`, the pooled within-class standard deviation
of `x_l · v̂`. docs/concepts.md explains the default: in σ units a concept that the model does not
represent (its direction is sampling noise in high-variance, reward-read directions) gets a slope
as large as a planted one, and a strongly separated concept a small one; in difference units the
noise concept's unit shrinks with its separation (as 1/√n). The reward is the model's own (the
same number `model.score` gives); all `α` of a batch of inputs run in one forward, one `α` per row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from ..data.internal import progress_bar
from ..errors import DataError, UsageError, warn
from ..model import ReadCache, RewardModel
from ..model.internal import Tokenized, flatten_inputs, one_read_only
from ..plotting import HtmlView
from ..stats import auroc, bootstrap_ci, fit_slope, linearity, summary_frame
from ..types import Positions, Text
from ._dose import dose_read, dose_response, needs_no_forward
from ._fit import builtin_sets

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# Options of this module only (not in rewardlens.types): the dose unit and the space of a direction.
Unit = Literal["difference", "sigma"]
Space = Literal["head", "residual"]
ConceptSets = dict[str, tuple[Sequence[Text], Sequence[Text]]]
"""{name: (positive inputs, negative inputs)}: texts or chat conversations with and without a concept."""

ALPHAS = (-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0)
"""Default doses in natural units (multiples of the concept's within-class spread σ)."""
FOLDS = 5
"""Cross-fitting folds of the held-out AUROC (fewer when a set has fewer inputs)."""


@dataclass(frozen=True)
class Concepts(HtmlView):
    """Concept directions per layer and each concept's dose-response.

    Per-layer arrays are [n_concepts, n_layers_kept] over `layers` ('embed', '0', ..., in depth
    order): `cosine` (head-space direction vs the mean effective read-out), `auroc` (held-out,
    cross-fitted over `folds` folds, head space), `norm` (|mean difference| of ĥ_l), `residual_norm`
    (|mean difference| of x_l), `sigma` (pooled within-class sd of x_l · v̂, residual units).
    `directions`, `residual_directions` [n_concepts, n_layers_kept, d] are unit vectors (positive
    set minus negative set; zero, with NaN cosine and AUROC, where the sets do not differ at all,
    e.g. `embed` when every input ends in the same read token); `readout` [n_concepts, d] is the
    mean effective read-out (reward per unit of head input).

    Dose-response at `dose_layer`: `scale` [n_concepts] is the residual-space length of one unit
    of α (`unit`: 'difference' → `residual_norm`, 'sigma' → `sigma`, at the dose layer); `alphas`
    [n_alphas] always holds 0; `base` [n_concepts, n_inputs] is the reward of each dose input at
    α = 0 (what `model.score` gives); `dose` [n_concepts, n_alphas, n_inputs] is reward(α) − reward(0)
    in reward units (NaN where a concept has fewer dose inputs than the widest); `slope`
    [n_concepts] is reward per unit of α (mean of the per-input least-squares slopes), `slope_ci`
    [n_concepts, 2] its bootstrap interval over inputs, `r2` the R² of a line through the mean
    curve and `half_ratio` the mean curve's slope on α ≥ 0 over its slope on α ≤ 0 (1 when linear).

    `skipped`: built-in items left out of the built-in sets because one of their sequences does not
    fit the model's `max_length` (empty for the user's own sets).
    """

    names: tuple[str, ...]
    layers: tuple[str, ...]
    cosine: np.ndarray
    auroc: np.ndarray
    norm: np.ndarray
    residual_norm: np.ndarray
    sigma: np.ndarray
    directions: np.ndarray
    residual_directions: np.ndarray
    readout: np.ndarray
    n_positive: np.ndarray
    n_negative: np.ndarray
    dose_layer: str
    positions: Positions
    unit: Unit
    scale: np.ndarray
    alphas: np.ndarray
    base: np.ndarray
    dose: np.ndarray
    slope: np.ndarray
    slope_ci: np.ndarray
    r2: np.ndarray
    half_ratio: np.ndarray
    folds: int
    n_layers: int
    n_boot: int = 2000
    seed: int = 0
    skipped: tuple[str, ...] = ()

    @property
    def separation(self) -> np.ndarray:
        """In-sample Cohen's d along the residual direction [n_concepts, n_layers_kept]: `residual_norm / sigma`."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.sigma > 0, self.residual_norm / self.sigma, np.nan)

    def _index(self, name: str) -> int:
        if name not in self.names:
            raise UsageError(f"no concept named {name!r}; the result has {list(self.names)}")
        return self.names.index(name)

    def layer_index(self, layer: int | str) -> int:
        """Column of `layer` (an int, negative counted from the last layer, or 'embed') in the per-layer arrays."""
        label = str(layer)
        if isinstance(layer, (int, np.integer)) and -self.n_layers <= layer < 0:
            label = str(self.n_layers + int(layer))
        if label not in self.layers:
            raise UsageError(f"layer {layer!r} was not kept; this result has layers {list(self.layers)}")
        return self.layers.index(label)

    def direction(self, name: str, layer: int | str = -1, space: Space = "head") -> np.ndarray:
        """Unit direction [d] of concept `name` at `layer`: 'head' (normalised residual, what the
        head reads; what reward-model editing removes) or 'residual' (what the dose adds)."""
        if space not in ("head", "residual"):
            raise UsageError(f"space must be 'head' or 'residual', got {space!r}")
        arr = self.directions if space == "head" else self.residual_directions
        return arr[self._index(name), self.layer_index(layer)].copy()

    def summary(self) -> pd.DataFrame:
        """One row per concept, indexed by `concept` (`stats.summary_frame`): `value` the dose-response slope
        (reward per unit of α), `low`, `high` its interval, `n` the dose items, then `rows()`' other numbers."""
        lead = {"slope": "value", "slope_lo": "low", "slope_hi": "high", "n_dose": "n"}
        return summary_frame([{lead.get(k, k): v for k, v in row.items()} for row in self.rows()], name="concept")

    def rows(self) -> list[dict[str, Any]]:
        """One dict per concept: dose-response and the last kept layer's cosine and held-out AUROC (what
        `--json` and the audit's `numbers.json` write)."""
        last = len(self.layers) - 1
        return [{
            "concept": name, "dose_layer": self.dose_layer, "positions": self.positions, "unit": self.unit,
            "scale": float(self.scale[c]), "slope": float(self.slope[c]), "slope_lo": float(self.slope_ci[c, 0]),
            "slope_hi": float(self.slope_ci[c, 1]), "r2": float(self.r2[c]), "half_ratio": float(self.half_ratio[c]),
            "sigma": float(self.sigma[c, self.layer_index(self.dose_layer)]), "layer": self.layers[last],
            "cosine": float(self.cosine[c, last]), "auroc_heldout": float(self.auroc[c, last]),
            "n_positive": int(self.n_positive[c]), "n_negative": int(self.n_negative[c]),
            "n_dose": int(np.isfinite(self.dose[c, 0]).sum()), "n_skipped": len(self.skipped),
        } for c, name in enumerate(self.names)]

    def to_frame(self) -> pd.DataFrame:
        """One row per (concept, layer): cosine, held-out AUROC, norms, σ and in-sample separation;
        `frame.attrs["skipped"]` lists the built-in items that did not fit the model."""
        import pandas as pd

        c, n = self.cosine.shape
        frame = pd.DataFrame({
            "concept": np.repeat(self.names, n), "layer": np.tile(self.layers, c), "cosine": self.cosine.ravel(),
            "auroc_heldout": self.auroc.ravel(), "norm": self.norm.ravel(),
            "residual_norm": self.residual_norm.ravel(), "sigma": self.sigma.ravel(),
            "separation_insample": self.separation.ravel(),
        })
        frame.attrs["skipped"] = list(self.skipped)
        return frame

    def dose_frame(self) -> pd.DataFrame:
        """One row per (concept, α, input): Δreward in reward units (padding rows dropped)."""
        import pandas as pd

        c, a, n = self.dose.shape
        frame = pd.DataFrame({
            "concept": np.repeat(self.names, a * n), "alpha": np.tile(np.repeat(self.alphas, n), c),
            "input": np.tile(np.arange(n), c * a), "delta_reward": self.dose.ravel(),
        })
        return frame[np.isfinite(frame["delta_reward"])].reset_index(drop=True)

    def plot(self, ax: Sequence[Axes] | None = None) -> Figure:
        """Cosine with the read-out by layer (left), and the mean dose-response curve of every concept
        (right). `ax`: two axes (left, right) to draw into (their figure is returned), else a new figure."""
        from ..plotting import finish, panels

        (left, right), made = panels(ax, (1, 2), (10, 4), "Concepts.plot")
        for c, name in enumerate(self.names):
            left.plot(self.layers, self.cosine[c], marker="o", label=name)
            right.plot(self.alphas, np.nanmean(self.dose[c], axis=1), marker="o",
                       label=f"{name} ({self.slope[c]:+.3f})")
        left.set_xlabel("layer")
        left.set_ylabel("cosine with effective read-out (head space)")
        right.set_xlabel(f"α ({self.unit} units), added at layer {self.dose_layer}, {self.positions} positions")
        right.set_ylabel("Δ reward")
        right.legend(fontsize=8)
        return finish(left, made)


# ---- the computation ------------------------------------------------------------------------------

def _layer_label(model: RewardModel, layer: int | str, what: str) -> str:
    if layer == "embed":
        return "embed"
    if isinstance(layer, (bool, np.bool_)) or not isinstance(layer, (int, np.integer)) \
            or not -model.n_layers <= layer < model.n_layers:
        raise UsageError(f"{what} must be 'embed' or a layer index in [{-model.n_layers}, {model.n_layers}), "
                         f"got {layer!r}")
    return str(int(layer) % model.n_layers)


def _encode_set(model: RewardModel, name: str, side: str, inputs: Sequence[Text]) -> list[Tokenized]:
    if isinstance(inputs, (list, tuple)) and len(inputs) == 0:
        raise DataError(f"concept {name!r}: the {side} set is empty; each set needs at least 2 inputs")
    items, is_pairs = flatten_inputs(list(inputs) if isinstance(inputs, tuple) else inputs)
    if is_pairs:
        raise DataError(f"concept {name!r}: the {side} set holds rewardlens.Pair; a concept set is a list of texts "
                        "or conversations — pass [p.conversation('chosen') for p in pairs] and the rejected side")
    if len(items) < 2:
        raise DataError(f"concept {name!r}: the {side} set has {len(items)} input; at least 2 are needed for a "
                        "within-class spread")
    return model.encode(items)[0]


def _folds(n_pos: int, n_neg: int, seed: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Balanced fold ids for both sets; equal sizes share one assignment so matched inputs stay together."""
    k = min(FOLDS, n_pos, n_neg)
    rng = np.random.default_rng(seed)
    pos = rng.permutation(n_pos) % k
    neg = pos.copy() if n_neg == n_pos else rng.permutation(n_neg) % k
    return pos, neg, k


def _heldout_auroc(hp: np.ndarray, hn: np.ndarray, seed: int) -> tuple[np.ndarray, int]:
    """AUROC [n_layers] of out-of-fold projections on the fold-trained unit mean difference."""
    fp, fn, k = _folds(len(hp), len(hn), seed)
    sp, sn = np.zeros(hp.shape[:2]), np.zeros(hn.shape[:2])
    for f in range(k):
        v = hp[fp != f].mean(0) - hn[fn != f].mean(0)  # [n_layers, d]
        v /= np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-30)
        sp[fp == f] = np.einsum("nld,ld->nl", hp[fp == f], v)
        sn[fn == f] = np.einsum("nld,ld->nl", hn[fn == f], v)
    labels = np.r_[np.ones(len(hp), bool), np.zeros(len(hn), bool)]
    return np.array([auroc(np.r_[sp[:, j], sn[:, j]], labels) for j in range(hp.shape[1])]), k


def _unit(x: np.ndarray, typical: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unit rows of `x` [n_layers, d], their norms, and whether a row is a real direction: a mean
    difference under 1e-6 of the typical vector norm there is float noise (zero direction kept)."""
    norm = np.linalg.norm(x, axis=-1)
    ok = norm > 1e-6 * np.maximum(typical, 1e-30)
    return np.where(ok[:, None], x / np.maximum(norm, 1e-30)[:, None], 0.0), norm, ok


def _concept(model: RewardModel, name: str, value: object, kept: list[str], dose_label: str, unit: Unit,
             grid: np.ndarray, positions: Positions, dose_seqs: list[Tokenized] | None, seed: int,
             batch_size: int, step: Callable[[], object] = lambda: None, cache: ReadCache | None = None
             ) -> dict[str, Any]:
    """Everything about one concept: per-layer statistics and its dose-response [n_alphas, n_inputs];
    `step()` after the read and after the dose."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise DataError(f"concept {name!r}: expected (positive inputs, negative inputs), got {type(value).__name__}")
    pos, neg = (_encode_set(model, name, side, x) for side, x in zip(("positive", "negative"), value))
    if cache is None:
        reading = model.read(pos + neg, layers=kept, batch_size=batch_size, readout=True)
    else:
        cache.check(model, "concepts")
        reading = cache.read(pos + neg, batch_size=batch_size)
    step()
    resid, ro = torch.stack([reading.layers[label] for label in kept], 1), reading.readout
    assert ro is not None  # read with readout=True
    head = model.final_hidden(resid.flatten(0, 1)).view_as(resid)
    r, h = resid.double().cpu().numpy(), head.double().cpu().numpy()
    n = len(pos)
    hdir, hnorm, hok = _unit(h[:n].mean(0) - h[n:].mean(0), np.linalg.norm(h, axis=-1).mean(0))
    rdir, rnorm, rok = _unit(r[:n].mean(0) - r[n:].mean(0), np.linalg.norm(r, axis=-1).mean(0))
    readout = ro.double().cpu().numpy().mean(0)
    cosine = np.where(hok, hdir @ readout / max(np.linalg.norm(readout), 1e-30), np.nan)
    proj = np.einsum("nld,ld->nl", r, rdir)
    within = ((proj[:n] - proj[:n].mean(0)) ** 2).sum(0) + ((proj[n:] - proj[n:].mean(0)) ** 2).sum(0)
    sigma = np.sqrt(within / (len(proj) - 2))
    held, folds = _heldout_auroc(h[:n], h[n:], seed)
    j = kept.index(dose_label)
    scale = float(rnorm[j] if unit == "difference" else sigma[j])
    targets = neg if dose_seqs is None else dose_seqs
    shift = torch.as_tensor(scale * rdir[j], dtype=torch.float32, device=model.device)
    if dose_seqs is None and needs_no_forward(model, dose_label, positions):  # the negatives were just read
        base, dose = dose_read(model, reading.final[n:], reading.coefficients[n:], shift, grid)
    else:
        base, dose = dose_response(model, targets, dose_label, shift, grid, positions, batch_size)
    step()
    if not rok[j]:
        warn(f"concept {name!r}: its two sets do not differ at layer {dose_label} (at the read token), so it has "
             "no direction to dose there; its dose-response is NaN. Choose another dose_layer.")
        dose = np.full_like(dose, np.nan)
    return {"cosine": cosine, "auroc": np.where(hok, held, np.nan), "norm": hnorm, "rnorm": rnorm, "sigma": sigma,
            "hdir": hdir, "rdir": rdir, "readout": readout, "n_pos": n, "n_neg": len(neg), "scale": scale,
            "base": base, "dose": dose, "folds": folds}


def concepts(
    model: RewardModel,
    sets: ConceptSets | None = None,
    *,
    layers: Iterable[int | str] | None = None,
    dose_layer: int | str | None = None,
    alphas: Sequence[float] = ALPHAS,
    positions: Positions = "read",
    unit: Unit = "difference",
    dose_inputs: Sequence[Text] | None = None,
    items: Sequence[Any] | None = None,
    seed: int = 0,
    n_boot: int = 2000,
    batch_size: int = 16,
    progress: bool = False,
    cache: ReadCache | None = None,
) -> Concepts:
    """Concept directions per layer and the causal dose-response of each concept (module docstring).

    `sets`: {name: (positive inputs, negative inputs)}, each a list of texts or chat conversations
    with and without the concept, at least 2 each (None: the built-in contrast sets of every probe
    axis, `rewardlens.hacking.contrast_sets`). `layers`: depths to keep (ints, negative from the
    end, or 'embed'; default all; the dose layer is always kept). `dose_layer`: where α · scale · v̂
    is added (default the last layer: what the final norm and the head read, the same depth for
    every concept; its slope is the direct effect). `alphas`: doses in `unit`s ('difference' or
    'sigma'; 0 is always added, it is the baseline). `positions`: 'read' (t* only) or 'all' (every
    real token). `dose_inputs`: inputs to dose (default each concept's negative set). `batch_size`:
    sequences per forward (the dose pass runs about that many rows: inputs × alphas). `items`: with
    `sets=None`, the items the built-in sets are made from (default all built-in items; an axis that
    applies to fewer than 2 of them is left out with a warning). `progress`: a tqdm bar on stderr,
    two steps per concept (its read, its dose). `cache`: a `ReadCache` of this model shared with `probe`
    (the audit's): an input it holds is not read again.

    At the default dose layer (the last), the dose needs no forward where the readout does not move with
    it (`positions='read'`, or a head without a gate): the reward of the dosed final residual is the head's
    on it, from the clean read of the dose inputs (`dose_read`).

    Short-context models: a built-in item whose with or without sequence on any axis is longer than
    the model's `max_length` is left out of every built-in set (one warning; `Concepts.skipped`).
    With `truncation='left'` nothing is left out. The user's own sets and items are never trimmed:
    an input that does not fit raises `TokenizationError`, as any input does.
    """
    if model.reads.multi:  # before the contrast sets are tokenized: they carry no step separators
        raise one_read_only("concepts")
    if positions not in ("read", "all"):
        raise UsageError(f"positions must be 'read' (the read token t*) or 'all' (every real token), got {positions!r}",
                         option="positions")
    if unit not in ("difference", "sigma"):
        raise UsageError(f"unit must be 'difference' (|mean difference|) or 'sigma' (within-class sd), got {unit!r}")
    grid = np.array(sorted({float(a) for a in alphas} | {0.0}))
    if not np.all(np.isfinite(grid)) or len(grid) < 2:
        raise UsageError(f"alphas must be finite and hold at least one non-zero dose, got {list(alphas)}")
    if n_boot < 1:
        raise UsageError(f"n_boot must be at least 1, got {n_boot}", option="n_boot")
    dose_label = _layer_label(model, model.n_layers - 1 if dose_layer is None else dose_layer, "dose_layer")
    skipped: tuple[str, ...] = ()
    if sets is None:
        sets, skipped = builtin_sets(model, items, seed)
    elif items is not None:
        raise UsageError("items= chooses the items of the built-in sets; pass either sets or items, not both")
    if not isinstance(sets, dict) or not sets:
        raise DataError("no concept sets given; pass {name: (positive inputs, negative inputs)} or sets=None")
    all_labels = ["embed", *map(str, range(model.n_layers))]
    keep = set(all_labels) if layers is None else {_layer_label(model, x, "layers") for x in layers} | {dose_label}
    kept = [x for x in all_labels if x in keep]
    dose_seqs = None if dose_inputs is None else _encode_set(model, "dose_inputs", "dose", dose_inputs)
    with progress_bar(2 * len(sets), "concepts: read and dose", progress) as bar:
        per = [_concept(model, str(name), value, kept, dose_label, unit, grid, positions, dose_seqs, seed,
                        batch_size, lambda: bar.update(1), cache)
               for name, value in sets.items()]

    dose = np.full((len(per), len(grid), max(p["dose"].shape[1] for p in per)), np.nan)
    base = np.full((len(per), dose.shape[2]), np.nan)
    slope, r2, ratio, ci = np.zeros(len(per)), np.zeros(len(per)), np.zeros(len(per)), np.zeros((len(per), 2))
    for c, p in enumerate(per):
        dose[c, :, : p["dose"].shape[1]] = p["dose"]
        base[c, : len(p["base"])] = p["base"]
        slopes = fit_slope(grid, p["dose"])
        slope[c] = slopes.mean()
        ci[c] = bootstrap_ci(slopes, n_boot=n_boot, seed=seed)
        r2[c], ratio[c] = linearity(grid, p["dose"].mean(1))
    stack = lambda key, dtype=np.float64: np.stack([np.asarray(p[key]) for p in per]).astype(dtype)
    return Concepts(
        names=tuple(str(n) for n in sets), layers=tuple(kept), cosine=stack("cosine"), auroc=stack("auroc"),
        norm=stack("norm"), residual_norm=stack("rnorm"), sigma=stack("sigma"), directions=stack("hdir", np.float32),
        residual_directions=stack("rdir", np.float32), readout=stack("readout", np.float32),
        n_positive=stack("n_pos", np.int64), n_negative=stack("n_neg", np.int64), dose_layer=dose_label,
        positions=positions, unit=unit, scale=stack("scale"), alphas=grid, base=base, dose=dose, slope=slope,
        slope_ci=ci, r2=r2, half_ratio=ratio, folds=min(p["folds"] for p in per), n_layers=model.n_layers,
        n_boot=n_boot, seed=seed, skipped=skipped,
    )
