"""`conflict`: do a reward model's terms pull its preferences apart on real pairs?

A *term* is either one objective of a multi-output head (its T-transformed objective for a gated,
ArmoRM-style head) or a user-defined concept given as a set of preference pairs. For every two
terms it reports the cosine of their effective directions (in the space the head reads and, when
the final norm has a gain, in the scale-normalised residual space), the Spearman correlation of
their per-pair margins, and the *decisive disagreement share*: the share of pairs on which both
terms are decisive and point opposite ways. Each pair of terms is named aligned, orthogonal,
conflicting or mixed from bootstrap intervals over pairs; docs/conflict.md states the rules.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from ..data import Pair, margin
from ..errors import UsageError
from ..model import RewardModel
from ..plotting import HtmlView
from ..stats import spearman, spearman_matrix

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

RELATIONS = ("aligned", "orthogonal", "conflicting", "mixed")
_BOOT_BLOCK = 4_000_000
"""Bootstrap draws are processed in blocks of about this many [draw, pair, term] entries."""


@dataclass(frozen=True)
class Conflicts(HtmlView):
    """Pairwise relations of k terms measured on `n_pairs` preference pairs.

    `cosine` [k, k]: cosine of the terms' effective directions in the space the head reads (the
    final norm's output). `cosine_residual` [k, k] or None: the same in the scale-normalised
    residual space (the final norm's input with its scale applied, centred for LayerNorm, before
    the gain γ), where the residual stream writes; None when the model has no final norm.
    `vectors` [k, d]: the effective directions themselves, in the space the head reads (head rows
    for objectives, mean ĥ differences for user terms; `direction_note` says which).
    `margins` [n_pairs, k]: each pair's chosen − rejected margin along each term (`margin_units`).
    `spearman`, `disagree`, `agree` [k, k] and their 95% percentile bootstrap intervals over pairs
    `*_ci` [k, k, 2]; `relation` [k, k] labels ('self' on the diagonal).
    """

    _html_rank = "cosine"

    names: list[str]
    source: str
    direction_note: str
    margin_units: str
    pair_ids: list[str]
    term_sizes: dict[str, int] | None
    vectors: np.ndarray
    cosine: np.ndarray
    cosine_residual: np.ndarray | None
    margins: np.ndarray
    spearman: np.ndarray
    spearman_ci: np.ndarray
    disagree: np.ndarray
    disagree_ci: np.ndarray
    agree: np.ndarray
    agree_ci: np.ndarray
    relation: np.ndarray
    tol: float
    min_share: float
    n_boot: int
    seed: int

    @property
    def n_pairs(self) -> int:
        return int(self.margins.shape[0])

    def index(self, name: str) -> int:
        if name not in self.names:
            raise UsageError(f"no term named {name!r}; the terms are {self.names}")
        return self.names.index(name)

    def pair(self, a: str, b: str) -> dict[str, Any]:
        """Every statistic of terms `a` and `b` as one JSON-ready row (see `pairs_table`)."""
        i, j = self.index(a), self.index(b)
        f = lambda x: None if not np.isfinite(x) else float(x)
        row = {"term_a": a, "term_b": b, "cosine": f(self.cosine[i, j]),
               "cosine_residual": None if self.cosine_residual is None else f(self.cosine_residual[i, j])}
        for stat in ("spearman", "disagree", "agree"):
            ci = getattr(self, f"{stat}_ci")[i, j]
            row.update({stat: f(getattr(self, stat)[i, j]), f"{stat}_lo": f(ci[0]), f"{stat}_hi": f(ci[1])})
        row["relation"] = str(self.relation[i, j])
        return row

    def pairs_table(self) -> list[dict[str, Any]]:
        """One row per unordered pair of terms, in the order of `names`."""
        k = len(self.names)
        return [self.pair(self.names[i], self.names[j]) for i in range(k) for j in range(i + 1, k)]

    def to_frame(self) -> pd.DataFrame:
        """`pairs_table` as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame(self.pairs_table())

    def plot(self, ax: Sequence[Axes] | None = None) -> Figure:
        """Heatmaps [k, k]: cosine of the terms' effective directions (left), and the share of pairs on
        which two terms are both decisive and point opposite ways, with each pair's relation (right);
        NaN cells grey. `ax`: two axes (left, right) to draw into (their figure is returned), else a
        new figure."""
        import matplotlib

        from ..plotting import finish, panels

        k = len(self.names)
        axes, made = panels(ax, (1, 2), (4 + 0.6 * k * 2, 3 + 0.5 * k), "Conflicts.plot")
        for a, values, title, cmap, lim in (
            (axes[0], self.cosine, "cosine (space the head reads)", "RdBu_r", (-1, 1)),
            (axes[1], self.disagree, "decisive disagreement share", "Reds", (0, 1)),
        ):
            shown = matplotlib.colormaps[cmap].with_extremes(bad="#eeeeee")
            im = a.imshow(np.ma.masked_invalid(values), cmap=shown, vmin=lim[0], vmax=lim[1])
            a.set_xticks(range(k), self.names, rotation=90, fontsize=7)
            a.set_yticks(range(k), self.names, fontsize=7)
            a.set_title(title, fontsize=10)
            a.figure.colorbar(im, ax=a, shrink=0.85)
        for i in range(k):
            for j in range(k):
                if i != j:
                    axes[1].text(j, i, str(self.relation[i, j])[:5], ha="center", va="center", fontsize=7)
        return finish(axes[0], made)


# ---- statistics on margins (pure numpy, exposed for tests) -------------------------------------

def shares(margins: np.ndarray, tol: float) -> tuple[np.ndarray, np.ndarray]:
    """(decisive disagreement, decisive agreement) shares [k, k] of margins [n, k].

    Term i is decisive on a pair when |m_i| ≥ tol × mean over pairs of |m_i|; a pair counts as a
    disagreement of (i, j) when both are decisive and m_i·m_j < 0, an agreement when m_i·m_j > 0.
    """
    d, a = _shares(np.asarray(margins, dtype=np.float64)[None], tol)
    return d[0], a[0]


def _shares(m: np.ndarray, tol: float) -> tuple[np.ndarray, np.ndarray]:
    """Batched `shares`: m [B, n, k] → ([B, k, k], [B, k, k]); thresholds per draw."""
    decisive = np.abs(m) >= tol * np.abs(m).mean(1, keepdims=True)
    pos = (decisive & (m > 0)).astype(np.float64)
    neg = (decisive & (m < 0)).astype(np.float64)
    n = m.shape[1]
    agree = (np.einsum("bni,bnj->bij", pos, pos) + np.einsum("bni,bnj->bij", neg, neg)) / n
    disagree = (np.einsum("bni,bnj->bij", pos, neg) + np.einsum("bni,bnj->bij", neg, pos)) / n
    return disagree, agree


def bootstrap(margins: np.ndarray, tol: float, n_boot: int, seed: int, level: float = 0.95) -> dict[str, np.ndarray]:
    """Percentile bootstrap intervals over pairs [k, k, 2] for 'spearman', 'disagree', 'agree'.

    Vectorised over draws (stats.bootstrap_ci would call a Python statistic k²·n_boot times);
    the decisiveness thresholds are recomputed in every resample, as the point estimate does.
    """
    m = np.asarray(margins, dtype=np.float64)
    n, k = m.shape
    rng = np.random.default_rng(seed)
    draws: dict[str, list[np.ndarray]] = {"spearman": [], "disagree": [], "agree": []}
    block = max(1, _BOOT_BLOCK // max(1, n * k))
    for start in range(0, n_boot, block):
        idx = rng.integers(0, n, (min(block, n_boot - start), n))
        mb = m[idx]  # [b, n, k]
        d, a = _shares(mb, tol)
        draws["disagree"].append(d)
        draws["agree"].append(a)
        draws["spearman"].append(spearman_matrix(mb))
    tail = (1 - level) / 2
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN cell (constant margins) stays NaN
        for name, parts in draws.items():
            x = np.concatenate(parts)
            out[name] = np.stack([np.nanquantile(x, tail, axis=0), np.nanquantile(x, 1 - tail, axis=0)], -1)
    return out


def relations(disagree_ci: np.ndarray, agree_ci: np.ndarray, min_share: float) -> np.ndarray:
    """Labels [k, k] from the intervals [k, k, 2] (see docs/conflict.md); 'self' on the diagonal.

    conflicting: disagreement's lower bound > min_share; aligned: agreement's lower bound >
    min_share and disagreement's upper bound < min_share; orthogonal: both upper bounds <
    min_share; mixed: anything else (including undefined intervals).
    """
    k = disagree_ci.shape[0]
    out = np.full((k, k), "mixed", dtype=object)
    d_lo, d_hi, a_lo, a_hi = disagree_ci[..., 0], disagree_ci[..., 1], agree_ci[..., 0], agree_ci[..., 1]
    out[(d_hi < min_share) & (a_hi < min_share)] = "orthogonal"
    out[(a_lo > min_share) & (d_hi < min_share)] = "aligned"
    out[d_lo > min_share] = "conflicting"
    np.fill_diagonal(out, "self")
    return out


# ---- the forward pass ---------------------------------------------------------------------------

def _as_pairs(obj: object, what: str) -> list[Pair]:
    items = list(obj) if isinstance(obj, (list, tuple)) else None
    if items is None or not all(isinstance(p, Pair) for p in items):
        raise UsageError(f"{what} must be a list of rewardlens.Pair, got {type(obj).__name__}; "
                         "read files with rewardlens.load_pairs")
    return items


def _cosine(u: Tensor) -> np.ndarray:
    """Cosine matrix [k, k] of the rows of u [k, d] (NaN for a zero row)."""
    u = u.double()
    norm = u.norm(dim=1)
    cos = (u @ u.T) / (norm[:, None] * norm[None, :])
    return cos.cpu().numpy()


def _normalised_residual(model: RewardModel, x: Tensor) -> Tensor:
    """The final norm's input x [n, d] with its scale applied (centred for LayerNorm), before γ and β."""
    assert model.arch.final_norm is not None  # the caller checked the model has a final norm
    params = model.norm(model.arch.final_norm)
    if params.kind == "layer":
        x = x - x.mean(-1, keepdim=True)
    return x * params.scale(x)[:, None]


def _forward(model: RewardModel, pairs: list[Pair], batch_size: int, *, keep_hidden: bool,
             pool_rows: bool) -> dict[str, Tensor]:
    """One batched pass over all sequences (pairs interleaved): objective values [N, k], and as asked
    the head's input ĥ [N, d] and normalised residual [N, d] (CPU, fp32), and the sum of the head's
    rows over all sequences [k, d] (pooler heads)."""
    reading = model.read(model.encode(pairs)[0], batch_size=batch_size, gate=False)
    out = {"values": reading.values.cpu()}
    if keep_hidden:
        out["hidden"] = reading.hidden.cpu()
        if model.arch.final_norm is not None:
            out["residual"] = _normalised_residual(model, reading.final).cpu()
    k, d = model.head.n_objectives, model.d_model
    rows_sum = torch.zeros(k, d, device=model.device, dtype=torch.float32)
    if pool_rows:  # batch by batch: a pooler head's rows [N, k, d] need not all sit in memory at once
        for start in range(0, len(reading.hidden), batch_size):
            rows_sum += model.head.rows(reading.hidden[start:start + batch_size])[0].sum(0)
    out["rows_sum"] = rows_sum
    return out


def _from_objectives(model: RewardModel, pairs: list[Pair], batch_size: int) -> dict[str, Any]:
    """The head's objectives as terms: names, rows [k, d] in the head's input space, margins [n, k]."""
    head, n = model.head, len(pairs)
    if head.n_objectives < 2:
        raise UsageError(
            "the head has a single output, so it has no objectives to compare; pass "
            "terms={'name': pairs, ...} with at least two user-defined terms (pair sets; on the command "
            "line, --term NAME=FILE twice)")
    fwd = _forward(model, pairs, batch_size, keep_hidden=False, pool_rows=head.pooler_weight is not None)
    values = fwd["values"].to(model.device)
    if head.pooler_weight is not None:
        rows = fwd["rows_sum"] / (2 * n)
        note = (f"pooler head: rows W_c·diag(act(z)/z)·W_p depend on the input; averaged over the "
                f"{2 * n} sequences of the pairs")
    else:
        rows = head.weight
        note = "head rows (the same for every input)"
    if head.transform is not None:
        # ArmoRM: score = Σ_k g_k (r T)_k, so the k-th term is (r T)_k with rows (Tᵀ W)_k.
        values, rows = values @ head.transform, head.transform.T @ rows
        note = "T-transformed head rows Tᵀ·W (gated head: the terms the gate mixes)"
    return {
        "names": list(head.labels), "source": "objectives", "direction_note": note,
        "margin_units": "objective values (reward units per objective)", "term_sizes": None,
        "margins": margin(values).double().cpu().numpy(),
        "vectors": rows.double().cpu().numpy(), "cosine": _cosine(rows),
        "cosine_residual": None if model.arch.final_norm is None else _cosine(_residual_rows(model, rows)),
    }


def _from_terms(model: RewardModel, pairs: list[Pair], terms: object, batch_size: int) -> dict[str, Any]:
    """User terms: directions [k, d] = mean ĥ difference over each term's pairs; margins [n, k] =
    each evaluation pair's ĥ difference on the unit directions."""
    if not isinstance(terms, dict) or len(terms) < 2:
        got = len(terms) if isinstance(terms, dict) else type(terms).__name__
        raise UsageError(f"terms must be a dict of at least two {{name: pairs}}, got {got}; a conflict "
                         "needs two terms to compare")
    term_pairs = {str(name): _as_pairs(p, f"term {name!r}") for name, p in terms.items()}
    empty = [name for name, p in term_pairs.items() if not p]
    if empty:
        raise UsageError(f"term {empty[0]!r} has no pairs; give each term at least one pair (better: tens)")
    n = len(pairs)
    # One pass over the evaluation pairs and every term's pairs together.
    fwd = _forward(model, pairs + [p for ps in term_pairs.values() for p in ps], batch_size,
                   keep_hidden=True, pool_rows=False)
    bounds = list(itertools.pairwise(np.cumsum([n] + [len(p) for p in term_pairs.values()])))
    diff = margin(fwd["hidden"])  # [n_all_pairs, d]
    dirs = torch.stack([diff[a:b].mean(0) for a, b in bounds])
    flat = [name for name, v in zip(term_pairs, dirs) if not v.norm() > 0]
    if flat:
        raise UsageError(f"term {flat[0]!r} has no direction: its chosen and rejected sides give the same final "
                         "hidden state on average; give it pairs that differ in the concept")
    unit = dirs.double() / dirs.double().norm(dim=1, keepdim=True)
    resid = None
    if "residual" in fwd:
        rdiff = margin(fwd["residual"])
        resid = _cosine(torch.stack([rdiff[a:b].mean(0) for a, b in bounds]))
    return {
        "names": list(term_pairs), "source": "terms",
        "direction_note": "mean of ĥ_chosen − ĥ_rejected over each term's pairs",
        "margin_units": "ĥ units (final hidden state difference projected on the term's unit direction)",
        "term_sizes": {name: len(p) for name, p in term_pairs.items()},
        "margins": (diff[:n].double() @ unit.T).numpy(), "vectors": dirs.double().numpy(),
        "cosine": _cosine(dirs), "cosine_residual": resid,
    }


def _residual_rows(model: RewardModel, rows: Tensor) -> Tensor:
    """Read-out rows [k, d] pulled back through the final norm's gain: w ⊙ γ, centred for LayerNorm."""
    assert model.arch.final_norm is not None  # the caller checked the model has a final norm
    params = model.norm(model.arch.final_norm)
    u = rows * params.gamma
    return u - u.mean(-1, keepdim=True) if params.kind == "layer" else u


def conflict(
    model: RewardModel,
    pairs: Sequence[Pair],
    *,
    terms: dict[str, list[Pair]] | None = None,
    tol: float = 0.5,
    min_share: float = 0.05,
    n_boot: int = 2000,
    seed: int = 0,
    batch_size: int = 16,
) -> Conflicts:
    """Pairwise relations of a model's reward terms on `pairs` (see `Conflicts`, docs/conflict.md).

    Terms are the head's objectives (k ≥ 2 outputs; T-transformed for a gated head), or, with
    `terms={name: pairs}`, user concepts: a term's direction is the mean over its pairs of
    ĥ_chosen − ĥ_rejected (ĥ: the final hidden state the head reads, at the read position) and a
    pair's margin along it is its ĥ difference projected on the unit direction. `tol`: a term is
    decisive on a pair when |margin| ≥ tol × its mean |margin|; `min_share`: the share a relation
    must clear (95% bootstrap intervals over pairs, `n_boot` draws from `seed`). One batched
    pass over every sequence (evaluation and term pairs together).
    """
    if not tol >= 0:
        raise UsageError(f"tol is a fraction of a term's mean |margin|, >= 0; got {tol}")
    if not 0 < min_share < 1:
        raise UsageError(f"min_share is a share of pairs in (0, 1), got {min_share}")
    if n_boot < 100:
        raise UsageError(f"n_boot must be at least 100 for 95% intervals to mean anything, got {n_boot}",
                         option="n_boot")
    pairs = _as_pairs(pairs, "pairs")
    if len(pairs) < 3:
        raise UsageError(f"conflict needs at least 3 pairs (a rank correlation is undefined below), got {len(pairs)}")
    if terms is None:
        found = _from_objectives(model, pairs, batch_size)
    else:
        found = _from_terms(model, pairs, terms, batch_size)
    margins, names = found["margins"], found["names"]
    k = len(names)
    rho = np.array([[spearman(margins[:, i], margins[:, j]) for j in range(k)] for i in range(k)])
    disagree, agree = shares(margins, tol)
    ci = bootstrap(margins, tol, n_boot, seed)
    return Conflicts(
        **found, pair_ids=[p.id if p.id is not None else str(i) for i, p in enumerate(pairs)],
        spearman=rho, spearman_ci=ci["spearman"],
        disagree=disagree, disagree_ci=ci["disagree"], agree=agree, agree_ci=ci["agree"],
        relation=relations(ci["disagree"], ci["agree"], min_share), tol=float(tol), min_share=float(min_share),
        n_boot=int(n_boot), seed=int(seed),
    )
