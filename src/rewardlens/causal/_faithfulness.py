"""`faithfulness`: observational attribution next to the three causal estimands, per pair and pooled.

For each pair and part: *attribution* (the part's exact direct contribution to the chosen −
rejected margin: observational), *direct* (path-frozen patching: causal), *total* (activation
patching) and *indirect* = total − direct; plus attribution patching, the first-order estimate of
total. Spearman ρ between attribution and each is computed per pair over parts, then pooled as a
mean with a bootstrap interval over pairs. The seed paper's headline statistic (`types.SEED_PAPER`:
Nadaf, reward-lens, arXiv:2604.26130) is reported its own way: per pair, Spearman between |attribution|
and |whole-sequence noising effect| over the sublayers, averaged (its reported values: ρ = −0.256
Skywork-Reward-Llama-3.1-8B, −0.027 ArmoRM).
No ratio to a margin is taken. A pair whose attribution (or effect) is the same for every part,
such as a pair whose chosen equals its rejected (all zero), has no rank order: its ρ is NaN and
pooling leaves it out; `summary` counts the pairs with a defined ρ.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, get_args

import numpy as np

from ..data import Pair
from ..data.internal import counting, stage
from ..errors import UsageError
from ..model import Part, RewardModel
from ..model.internal import Tokenized
from ..plotting import HtmlView
from ..stats import bootstrap_ci, rank_agreement, rowwise_spearman, summary_frame, top_parts
from ..types import Mode, PatchLevel, Positions, Stored, Versus
from ._attribution_patching import attribution_patch
from ._divergence import NaturalFit
from ._engine import sites
from ._patching import Patching, patch
from ._plan import Clean, encode_pairs
from ._reads_patch import mode_for
from ._registry import Provenance
from ._spec import PatchSpec, spec_of
from ._traced import Traced, trace_pairs

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

ESTIMANDS: tuple[Versus, ...] = get_args(Versus)
SEED_POSITIONS: tuple[Positions, ...] = ("all", "read")  # "prefix" is the paper's own statistic (`paper=True`)


@dataclass(frozen=True)
class Faithfulness(HtmlView):
    """Attribution and the causal estimands, each [n_pairs, P] over `names`, in reward units.

    `seed_attribution`, `seed_effect` [n_pairs, S] are the sublayer-level attribution and noising
    effect behind the seed paper's statistic; `seed_positions` says whether the effect patched the
    whole sequence ('all', token-aligned pairs) or only the read token ('read', when some pair is
    not token-aligned).
    """

    _html_rank = "total"

    names: list[str]
    pair_ids: list[str]
    attribution: np.ndarray
    direct: np.ndarray
    total: np.ndarray
    attribution_patching: np.ndarray
    seed_attribution: np.ndarray
    seed_effect: np.ndarray
    seed_positions: Positions
    mode: Mode
    level: PatchLevel
    n_boot: int = 2000
    seed: int = 0
    seed_mode: Mode = "noising"
    """How `seed_effect` patched: noising, or zero ablation for a reward read at a set of positions whose
    pairs have no read-to-read map (`patch_mode`)."""
    paper_attribution: np.ndarray | None = None
    """[n_pairs, 2L] sublayer attribution over the attention and MLP sublayers (no embeddings), when
    the paper's way was asked for (`faithfulness(paper=True)`); else None."""
    paper_effect: np.ndarray | None = None
    """[n_pairs, 2L] prefix-noising effect of the same sublayers (`patch(positions='prefix')`), or None."""
    provenance: dict[str, Provenance] | None = None
    """How each patched field was computed, by field name (`total`, `seed_effect`, `direct`,
    `attribution_patching`, `paper_effect` when computed): the `Provenance` of the patch run behind it (the
    engine that ran, those that declined and why, the proof's verdict). `total` and `seed_effect` share one
    sweep where both patch the read token in one mode. None on a result made before it was recorded. Read back
    from the audit's store, which keeps each pair's record (`STORED.per_chunk`), pairs of chunks that ran
    different engines join into one record per field (`joined`)."""

    STORED: ClassVar[Stored] = Stored(
        per_pair=("attribution", "direct", "total", "attribution_patching", "seed_attribution", "seed_effect",
                  "paper_attribution", "paper_effect"), derived=("pair_ids",), per_chunk=("provenance",))
    """How the audit's store keeps a faithfulness report (`types.Stored`)."""

    def __post_init__(self) -> None:
        prov = self.provenance
        if isinstance(prov, list):  # read back from the audit's store: each pair's plain record, in pair order
            prov = {name: joined([Provenance.of(p[name]) for p in prov]) for name in prov[0]} if prov else None
        elif prov is not None:  # plain records (`dataclasses.asdict`), or Provenances already
            prov = {name: p if isinstance(p, Provenance) else Provenance.of(p) for name, p in prov.items()}
        object.__setattr__(self, "provenance", prov)

    @property
    def spec(self) -> PatchSpec:
        """How `total` and `direct` patched (read positions; `direct` with estimand 'direct')."""
        return PatchSpec(mode=self.mode, level=self.level)

    @property
    def seed_spec(self) -> PatchSpec:
        """How `seed_effect` patched: sublayers, at `seed_positions`, in `seed_mode`."""
        return PatchSpec(mode=self.seed_mode, positions=self.seed_positions)

    @property
    def indirect(self) -> np.ndarray:
        """Total − direct [n_pairs, P]: the part's effect through later layers."""
        return self.total - self.direct

    def rho(self, estimand: Versus) -> np.ndarray:
        """Per-pair Spearman ρ [n_pairs] between attribution and `estimand` across parts."""
        if estimand not in ESTIMANDS:
            raise UsageError(f"estimand must be one of {ESTIMANDS}, got {estimand!r}", option="estimand")
        return rowwise_spearman(self.attribution, getattr(self, estimand))

    def pooled(self, estimand: Versus) -> tuple[float, float, float]:
        """(mean ρ over pairs, bootstrap interval low, high) for `estimand`; NaN if undefined."""
        return _mean_ci(self.rho(estimand), self.n_boot, self.seed)

    @property
    def seed_rho(self) -> np.ndarray:
        """Per pair: Spearman between |attribution| and |noising effect| over sublayers [n_pairs]."""
        return rowwise_spearman(np.abs(self.seed_attribution), np.abs(self.seed_effect))

    def seed_statistic(self) -> tuple[float, float, float]:
        """The seed paper's statistic (mean of `seed_rho`) with a bootstrap interval over pairs."""
        return _mean_ci(self.seed_rho, self.n_boot, self.seed)

    @property
    def paper_rho(self) -> np.ndarray:
        """Per pair, the paper's way: Spearman between |attribution| and |prefix-noising effect| over
        the attention and MLP sublayers [n_pairs]; all NaN when it was not computed."""
        if self.paper_attribution is None or self.paper_effect is None:
            return np.full(len(self.pair_ids), np.nan)
        return rowwise_spearman(np.abs(self.paper_attribution), np.abs(self.paper_effect))

    def paper_statistic(self) -> tuple[float, float, float]:
        """The seed paper's statistic computed its way (`paper_rho`'s mean, bootstrap interval);
        NaN when `faithfulness(paper=True)` was not asked for."""
        return _mean_ci(self.paper_rho, self.n_boot, self.seed)

    def top(self, n: int = 10, rows: np.ndarray | None = None) -> list[int]:
        """Indices into `names` of the `n` parts with the largest mean |total effect| over pairs (NaN last,
        ties in part order): the rule `Patching.top` ranks by (`stats.top_parts`), so the audit's list of
        top parts is `rewardlens patch`'s for the same pairs and level. `rows`: a mask [n_pairs] of the pairs
        to rank over (the audit's counted ones: a pair with a non-finite effect would make every mean NaN)."""
        return [int(i) for i in top_parts(self.total if rows is None else self.total[rows], n)]

    def agreement(self, k: int = 10) -> dict[str, float]:
        """How well attribution patching ranks parts against exact total patching."""
        return rank_agreement(self.total, self.attribution_patching, k)

    def summary(self) -> pd.DataFrame:
        """One row per estimand (then the seed statistics), indexed by `comparison` (`stats.summary_frame`):
        `value` the mean ρ with attribution, `low`, `high` its interval, `n` the pairs with a defined ρ."""
        lead = {"rho": "value", "lo": "low", "hi": "high", "pairs": "n"}
        return summary_frame([{lead.get(k, k): v for k, v in row.items()} for row in self.rows()], name="comparison")

    def rows(self) -> list[dict[str, Any]]:
        """`summary()` as plain dicts (`comparison`, `rho`, `lo`, `hi`, `pairs`): what `--json` writes."""
        rows = []
        for name in ESTIMANDS:
            mean, lo, hi = self.pooled(name)
            rows.append({"comparison": f"attribution vs {name}", "rho": mean, "lo": lo, "hi": hi,
                         "pairs": int(np.isfinite(self.rho(name)).sum())})
        mean, lo, hi = self.seed_statistic()
        rows.append({"comparison": f"seed statistic |attribution| vs |{self.seed_mode}, {self.seed_positions}|",
                     "rho": mean, "lo": lo, "hi": hi, "pairs": int(np.isfinite(self.seed_rho).sum())})
        if self.paper_effect is not None:
            mean, lo, hi = self.paper_statistic()
            rows.append({"comparison": "seed statistic, the paper's way: |attribution| vs |noising, prefix| over "
                         "attention and MLP sublayers", "rho": mean, "lo": lo, "hi": hi,
                         "pairs": int(np.isfinite(self.paper_rho).sum())})
        return rows

    def to_frame(self) -> pd.DataFrame:
        """Long table: one row per (pair, part) with attribution and every estimand."""
        import pandas as pd

        n, p = self.attribution.shape
        frame = pd.DataFrame({"pair": np.repeat(self.pair_ids, p), "part": np.tile(self.names, n),
                              "attribution": self.attribution.ravel()})
        for name in ESTIMANDS:
            frame[name] = getattr(self, name).ravel()
        return frame

    def plot(self, max_points: int = 20_000, ax: Sequence[Axes] | None = None) -> Figure:
        """Attribution (margin contribution) against the direct (path-frozen) and the total patching
        effect, one panel each: a point per (pair, part) coloured by part kind, y = x dotted, the
        pooled Spearman ρ and its interval in the title. `ax`: two axes (direct, total) to draw into
        (their figure is returned), else a new figure. Past `max_points` points a fixed random subset
        is drawn (ρ in the titles uses every point)."""
        from matplotlib.lines import Line2D

        from ..plotting import finish, panels

        axes, made = panels(ax, (1, 2), (9, 3.6), "Faithfulness.plot")
        colors = {"embed": "tab:green", "attn": "tab:blue", "mlp": "tab:red"}
        kinds = np.broadcast_to(np.array([Part.parse(n).kind for n in self.names]), self.attribution.shape).ravel()
        keep = np.arange(kinds.size)
        if keep.size > max_points:
            keep = np.sort(np.random.default_rng(0).choice(keep, max_points, replace=False))
        # One scatter per panel, coloured per point; the legend names each kind present.
        present = [k for k in colors if (kinds[keep] == k).any()]
        legend = [Line2D([], [], ls="none", marker="o", ms=4, color=colors[k], label=k) for k in present]
        shown: tuple[Versus, ...] = ("direct", "total")
        for a, name in zip(axes, shown):
            effect = getattr(self, name).ravel()
            a.scatter(self.attribution.ravel()[keep], effect[keep], s=10, alpha=0.65, edgecolors="none",
                      c=[colors[k] for k in kinds[keep]])
            both = np.concatenate([self.attribution.ravel(), effect])
            both = both[np.isfinite(both)]
            handles = list(legend)
            if len(both):
                lim = (float(both.min()), float(both.max()))
                handles += a.plot(lim, lim, color="gray", lw=0.8, ls=":", label="y = x")
            a.axhline(0, color="gray", lw=0.5)
            a.axvline(0, color="gray", lw=0.5)
            mean, lo, hi = self.pooled(name)
            a.set_title(f"{name} effect: pooled ρ = {mean:.2f} [{lo:.2f}, {hi:.2f}]", fontsize=10)
            a.set_xlabel("attribution, chosen − rejected (reward units)")
            a.set_ylabel(f"{name} patching effect ({self.mode}, reward units)")
            a.legend(handles=handles, fontsize=7, loc="upper left")  # not "best": it scans every point
        return finish(axes[0], made)


def joined(records: Sequence[Provenance]) -> Provenance:
    """One `Provenance` for a field computed chunk by chunk (`records`: one per pair, or per chunk): the record
    itself when every chunk ran alike; else the engines that ran, the proofs, and every decline (each once, in
    order of first appearance) joined, forced when any chunk was."""
    distinct = list(dict.fromkeys(records))
    if len(distinct) == 1:
        return distinct[0]
    engines = dict.fromkeys(p.engine for p in distinct)
    proofs = dict.fromkeys(p.proof for p in distinct if p.proof)
    return Provenance(" / ".join(engines), tuple(dict.fromkeys(d for p in distinct for d in p.declined)),
                      "; ".join(proofs) or None, any(p.forced for p in distinct))


def _mean_ci(values: np.ndarray, n_boot: int, seed: int) -> tuple[float, float, float]:
    finite = values[np.isfinite(values)]
    if not len(finite):
        return float("nan"), float("nan"), float("nan")
    lo, hi = bootstrap_ci(finite, n_boot=n_boot, seed=seed)
    return float(finite.mean()), lo, hi


def aligned(model: RewardModel, pairs: Sequence[Pair], seqs: Sequence[Tokenized] | None = None) -> bool:
    """Whether every pair's two sides have the same number of tokens (whole-sequence patching needs it);
    never for a reward read at a set of positions, which is patched at that set. `seqs`: the pairs'
    token ids (`encode_pairs`) when the caller has them."""
    if model.reads.multi:
        return False
    seqs = encode_pairs(model, pairs) if seqs is None else seqs
    return all(len(seqs[i].ids) == len(seqs[i + 1].ids) for i in range(0, len(seqs), 2))


def faithfulness(
    model: RewardModel,
    pairs: Sequence[Pair],
    *,
    level: PatchLevel = "sublayer",
    mode: Mode | None = None,
    n_boot: int = 2000,
    seed: int = 0,
    batch_size: int = 8,
    seed_positions: Positions | None = None,
    paper: bool = False,
    traced: Traced | None = None,
    progress: bool = False,
    spec: PatchSpec | None = None,
) -> Faithfulness:
    """Attribution, path-frozen, total and attribution patching (read position) side by side, with
    ρ per pair and pooled, and the seed paper's statistic (whole-sequence noising where pairs are
    token-aligned, else read-position noising, as `seed_positions` says). `seed_positions` fixes
    that choice ('all' needs token-aligned pairs); a run split into chunks passes the choice made
    for all its pairs, so every chunk computes the same statistic.

    `paper=True` also computes the statistic exactly the paper's way (`paper_statistic`): over the
    attention and MLP sublayers only, against prefix noising (`positions='prefix'`, aligned from
    the start over the shorter side; it warns naming pairs whose read token it leaves unpatched).
    It costs one patched forward of the chosen sides per sublayer.

    The pairs are traced once (`trace_pairs`) and every estimand starts from those clean runs;
    `traced`: clean runs the caller already has (at `level`, or at head level for any level). `mode`
    None is `patch`'s default (noising, or zero ablation where a set of reads has no read-to-read map).
    `spec`: the mode and level as one `PatchSpec` instead of those keywords (the estimands are compared at the
    read token, so its positions must be 'read', its estimand 'total' and its ablation 'zero').
    """
    return scored_faithfulness(model, pairs, None, level=level, mode=mode, n_boot=n_boot, seed=seed,
                               batch_size=batch_size, seed_positions=seed_positions, paper=paper, traced=traced,
                               progress=progress, spec=spec)[0]


def scored_faithfulness(
    model: RewardModel,
    pairs: Sequence[Pair],
    natural: NaturalFit | None,
    *,
    level: PatchLevel = "sublayer",
    mode: Mode | None = None,
    n_boot: int = 2000,
    seed: int = 0,
    batch_size: int = 8,
    seed_positions: Positions | None = None,
    paper: bool = False,
    traced: Traced | None = None,
    progress: bool = False,
    spec: PatchSpec | None = None,
) -> tuple[Faithfulness, Patching]:
    """`faithfulness` (the same options), and the `Patching` behind its `total`. `natural`: a fit of the
    natural read-position residuals (`NaturalFit`) the read-position sweep scores its patched runs against
    (`patch(divergence=True, natural=...)`), so the total's `Patching` carries divergence scores: how the audit
    scores the sweep faithfulness ran instead of patching the same heads again. None: no scores."""
    with counting("faithfulness", progress):
        if spec is not None:
            spec = spec_of(spec, mode=mode, level=level)
            if spec.positions != "read" or spec.estimand != "total" or spec.ablation != "zero":
                raise UsageError(f"faithfulness compares every estimand at the read token, so spec= takes a mode "
                                 f"and a level only; got {spec}: pass PatchSpec(mode=..., level=...)", option="spec")
            mode, level = spec.mode, spec.level
        if level == "neuron":  # before any forward: exact patching of every neuron is one run per neuron
            raise UsageError("faithfulness patches every part exactly, and level='neuron' would be one patched run "
                             "per MLP neuron; use level='head' or 'sublayer', or rank the neurons with "
                             "attribution_patch(..., level='neuron') and patch the top ones with patch(neurons=...)",
                             option="level")
        if seed_positions is not None and seed_positions not in SEED_POSITIONS:
            raise UsageError(f"seed_positions must be None, 'all' or 'read', got {seed_positions!r}",
                             option="seed_positions")
        if traced is None:
            stage("clean trace")
            traced = trace_pairs(model, pairs, level=level, batch_size=batch_size)
        elif traced.level != level and traced.level != "head":
            raise UsageError(f"traced runs at level {traced.level!r} cannot serve level={level!r}; trace at "
                             f"level='head' (it serves both) or at {level!r}", option="level")
        clean = traced.clean
        mode = mode_for(model, pairs, mode, clean.seqs)
        att, sub_att = traced.attribution(level), traced.attribution("sublayer")
        positions: Positions = seed_positions or ("all" if aligned(model, pairs, clean.seqs) else "read")
        spec = PatchSpec(mode=mode, level=level)
        seeds = PatchSpec(mode=_seeds_in(model, mode), positions=positions)
        # Attribution patching first: it takes (and frees) the trace's recordings of the targets' layer
        # inputs, so they are not held through the sweep, where the peak memory is; their caches (smaller)
        # stay for the sweep, which continues them instead of running the targets again, and frees each.
        stage("attribution patching")
        atp = attribution_patch(model, pairs, spec=spec, batch_size=batch_size, clean=clean)
        stage("read-position sweep")
        total, seed_patch = _total_and_seed(model, pairs, spec, seeds, batch_size, clean, natural)
        direct = patch(model, pairs, spec=replace(spec, estimand="direct"), batch_size=batch_size, clean=clean)
        index = [att.names.index(n) for n in total.names]
        paper_att = paper_effect = None
        runs = {"total": total, "seed_effect": seed_patch, "direct": direct, "attribution_patching": atp}
        if paper and not model.reads.multi:  # prefix noising is not defined for a set of reads
            stage("prefix sweep (the paper's way)")
            prefix = patch(model, pairs, spec=PatchSpec(positions="prefix"), batch_size=batch_size, clean=clean)
            keep = [j for j, name in enumerate(prefix.names) if Part.parse(name).kind != "embed"]
            paper_att = sub_att.margin[:, [sub_att.names.index(prefix.names[j]) for j in keep]]
            paper_effect = prefix.effect[:, keep]
            runs["paper_effect"] = prefix
        seed_index = [sub_att.names.index(n) for n in seed_patch.names]
        return Faithfulness(
            names=total.names, pair_ids=total.pair_ids, attribution=att.margin[:, index], direct=direct.effect,
            total=total.effect, attribution_patching=atp.effect, seed_attribution=sub_att.margin[:, seed_index],
            seed_effect=seed_patch.effect, seed_positions=positions, mode=mode, level=level, n_boot=n_boot, seed=seed,
            seed_mode=_seeds_in(model, mode),
            paper_attribution=paper_att, paper_effect=paper_effect,
            provenance={name: run.provenance for name, run in runs.items() if run.provenance is not None},
        ), total


def _seeds_in(model: RewardModel, mode: Mode) -> Mode:
    """The seed statistic's mode: noising, but zero ablation for a reward read at a set of positions
    patched by ablation (its pairs may have no read-to-read map for noising)."""
    return "ablation" if model.reads.multi and mode == "ablation" else "noising"


def _total_and_seed(model: RewardModel, pairs: Sequence[Pair], spec: PatchSpec, seed: PatchSpec, batch_size: int,
                    clean: Clean, natural: NaturalFit | None = None) -> tuple[Patching, Patching]:
    """The total read-position effects at `level` and the sublayer noising effects behind the seed
    statistic. Both at the read position in noising mode: one sweep over the union of the two
    levels' sites (they share the embeddings and MLPs; the attention sublayers join the heads). A
    reward read at a set of positions seeds in the run's mode: ablation is asked for it exactly when
    its pairs have no read-to-read map for noising (`patch_mode`). `natural`: the total's patched runs are
    scored against it (divergence)."""
    scored = natural is not None
    if seed.positions != "read" or spec.mode != seed.mode:
        total = patch(model, pairs, spec=spec, batch_size=batch_size, clean=clean, divergence=scored, natural=natural)
        return total, patch(model, pairs, spec=seed, batch_size=batch_size, clean=clean)
    fine, coarse = sites(model, spec.level), sites(model, "sublayer")
    have = set(fine)
    union = fine + [site for site in coarse if site not in have]
    both = patch(model, pairs, spec=spec, batch_size=batch_size, clean=clean, sweep=union, divergence=scored,
                 natural=natural)
    return both.select([s.name for s in fine], spec.level), both.select([s.name for s in coarse], "sublayer")
