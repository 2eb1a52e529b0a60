"""`compare`: two reward models on the same pairs, side by side.

Behaviour is compared for any two models: how their rewards and margins rank the pairs (Spearman,
with percentile bootstrap CIs over pairs), how often they pick the same winner, where each one's
preference crystallizes (the lens on relative depth l/L), how each spreads its margin over depth
(the exact sublayer attribution, aligned by relative depth), how alike their lens curves take shape
(the seed paper's formation correlation; `types.SEED_PAPER`, arXiv:2604.26130), and optionally the probe
profile.

Directions are compared only when both models write into the same residual basis: same hidden
size, same number of layers, the same tokenizer vocabulary and token-embedding matrices that
match (mean row cosine ≥ `EMBEDDING_MATCH`). A reward model fine-tuned from a backbone keeps its
embeddings almost unchanged and passes; a model trained from another initialisation does not,
even with the same shapes — a coordinate of its residual stream means something else, so a
cosine across the two would be a number without a meaning. When the check fails, `refused` says
which part failed and with what values; the behavioural comparison is still made.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from ..data import Pair, margin
from ..data.internal import metering, pair_rows, progress_bar
from ..errors import DataError, UsageError
from ..exact import attribute, lens
from ..model import Part, RewardModel
from ..stats import bootstrap_ci, spearman, wilson
from ._result import EMBEDDING_MATCH, Basis, Comparison, ModelSide


def _side(model: RewardModel, pairs: list[Pair], label: str, fraction: float, probes: bool,
          probe_items: Sequence[Any] | None, seed: int, n_boot: int, batch_size: int,
          step: Callable[[str], object] = lambda _name: None, progress: bool = False) -> ModelSide:
    """Lens and sublayer attribution of every pair (one batched pass each), probes if asked;
    `step(name)` before each."""
    step(f"{label}: lens")
    ln = lens(model, pairs, batch_size=batch_size)
    step(f"{label}: attribution")
    att = attribute(model, pairs, level="sublayer", batch_size=batch_size, per_objective=False)
    profile = np.zeros(model.n_layers + 1)
    for name, column in zip(att.names, att.margin.mean(0)):
        profile[Part.parse(name).depth] += column
    pr = None
    if probes:
        from ..hacking import probe

        step(f"{label}: probes")
        with metering(lambda _rows: None):  # the probes' own bar counts their sequences
            pr = probe(model, probe_items, seed=seed, n_boot=n_boot, batch_size=batch_size, progress=progress)
    return ModelSide(label=label, model=repr(model), reward=att.reward, lens_linear=ln.margin("linear"),
                     lens_normed=ln.margin("normed"), crystallization_linear=ln.crystallization("linear", fraction),
                     crystallization_normed=ln.crystallization("normed", fraction), profile=profile, probes=pr,
                     near_zero=ln.near_zero_margin())


def _embeddings(model: RewardModel) -> torch.Tensor | None:
    hf: Any = model.model  # a transformers PreTrainedModel
    try:
        weight = hf.get_input_embeddings().weight
    except (AttributeError, NotImplementedError):
        return None
    return None if weight.is_meta else weight.detach()


def shared_basis(a: RewardModel, b: RewardModel, threshold: float = EMBEDDING_MATCH) -> Basis:
    """Run the structural checks (module docstring) on two models; see `Basis`."""
    hidden, layers = (a.d_model, b.d_model), (a.n_layers, b.n_layers)
    same_vocab = a.tokenizer.get_vocab() == b.tokenizer.get_vocab()
    why = []
    if hidden[0] != hidden[1]:
        why.append(f"hidden sizes differ: {hidden[0]} vs {hidden[1]}")
    if layers[0] != layers[1]:
        why.append(f"layer counts differ: {layers[0]} vs {layers[1]}")
    if not same_vocab:
        why.append(f"tokenizer vocabularies differ ({len(a.tokenizer.get_vocab())} vs "
                   f"{len(b.tokenizer.get_vocab())} entries, or the same size with other ids)")
    ea, eb = _embeddings(a), _embeddings(b)
    cos = float("nan")
    if ea is None or eb is None:
        why.append("a token-embedding matrix is not readable (no get_input_embeddings, or offloaded)")
    elif ea.shape != eb.shape:
        why.append(f"token-embedding matrices differ in shape: {tuple(ea.shape)} vs {tuple(eb.shape)}")
    else:
        # In chunks, in fp32 on the CPU: two 128k × 4096 matrices need not be copied whole.
        cosines = []
        for start in range(0, ea.shape[0], 8192):
            x, y = (e[start : start + 8192].float().cpu() for e in (ea, eb))
            nx, ny = x.norm(dim=1), y.norm(dim=1)
            c = (x * y).sum(1) / (nx * ny).clamp_min(1e-30)
            cosines.append(torch.where((nx == 0) & (ny == 0), torch.ones_like(c), c))  # unused rows match
        cos = float(torch.cat(cosines).mean())
        if not cos >= threshold:
            why.append(f"token embeddings differ: mean row cosine {cos:.3f} < {threshold}")
    refused = None
    if why:
        refused = "; ".join(why) + " — residual directions live in different spaces; compare behaviour only"
    return Basis(hidden, layers, same_vocab, cos, refused)


def _cosine(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Row-wise cosine of [..., d] arrays (NaN where a row is zero)."""
    norm = np.linalg.norm(x, axis=-1) * np.linalg.norm(y, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norm > 0, (x * y).sum(-1) / norm, np.nan)


def _directions(model: RewardModel, pairs: list[Pair], batch_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean chosen − rejected residual at t* per depth [L+1, d], effective read-out rows [2n, d],
    the same pulled back through the final norm [2n, d]) from one batched pass."""
    labels = ["embed", *map(str, range(model.n_layers))]
    reading = model.read(model.encode(pairs)[0], layers=labels, batch_size=batch_size, readout=True)
    resid, readout = torch.stack([reading.layers[label] for label in labels], 1), reading.readout
    assert readout is not None  # read with readout=True
    residual_readout = readout
    if model.arch.final_norm is not None:  # pre-norm: the last layer's output is the final norm's input
        residual_readout = model.norm(model.arch.final_norm).pullback(readout[:, None], resid[:, -1])[0][:, 0]
    diff = margin(resid).mean(0)
    return diff.cpu().numpy(), readout.cpu().numpy(), residual_readout.cpu().numpy()


def _grid(n_layers_a: int, n_layers_b: int) -> np.ndarray:
    """The common relative-depth grid of two models [max(L_a, L_b) + 1]: the deeper model's depths l / L."""
    return np.linspace(0.0, 1.0, max(n_layers_a, n_layers_b) + 1)


def formation_correlation(lens_a: np.ndarray, lens_b: np.ndarray, undefined: np.ndarray | None = None) -> np.ndarray:
    """Per-pair formation correlation of two models' lens curves (the seed paper's statistic) [n].

    `lens_a` [n, L_a+1], `lens_b` [n, L_b+1]: chosen − rejected margin by depth (0 = embeddings).
    Each curve is divided by its own final margin, `m_l / m_L` (so both end at 1 and a negative
    final margin flips its curve), put on relative depth l / L and linearly interpolated onto the
    deeper model's depths (`_grid`; no interpolation with equal layer counts), and the two curves'
    Pearson r is taken. NaN for a pair whose final margin is zero in either model or flagged in
    `undefined` [n] (near zero: dividing by it would be noise), and where either normalised curve
    is flat (no shape to correlate; the seed code returned 0 there)."""
    lens_a, lens_b = np.asarray(lens_a, dtype=np.float64), np.asarray(lens_b, dtype=np.float64)
    if lens_a.ndim != 2 or lens_b.ndim != 2 or len(lens_a) != len(lens_b) or min(lens_a.shape[1], lens_b.shape[1]) < 2:
        raise UsageError(f"need two lens margin arrays [n, L+1] over the same n pairs with L >= 1, got shapes "
                         f"{lens_a.shape} and {lens_b.shape}")
    skip = np.zeros(len(lens_a), dtype=bool) if undefined is None else np.asarray(undefined, dtype=bool)
    skip = skip | (lens_a[:, -1] == 0) | (lens_b[:, -1] == 0)
    grid = _grid(lens_a.shape[1] - 1, lens_b.shape[1] - 1)
    on_grid = lambda curve: np.interp(grid, np.linspace(0.0, 1.0, len(curve)), curve / curve[-1])
    return np.array([np.nan if s else _pearson(on_grid(x), on_grid(y)) for x, y, s in zip(lens_a, lens_b, skip)])


def _accuracy_ci(margins: np.ndarray) -> tuple[float, float]:
    """Wilson interval of the pair accuracy over the finite margins [n], as every accuracy (`finite_accuracy`:
    a non-finite margin is left out, never a loss; a bootstrap of a proportion collapses at 0 and 1)."""
    m = np.asarray(margins, dtype=np.float64)
    m = m[np.isfinite(m)]
    return wilson(int(np.sum(m > 0)), len(m))


def _interval(stat: Callable[[np.ndarray], float], n: int, n_boot: int, seed: int) -> tuple[float, float]:
    """Bootstrap CI of `stat(pair indices)` resampling pairs (stats.bootstrap_ci over the indices)."""
    return bootstrap_ci(np.arange(n, dtype=np.float64), stat=lambda idx: stat(idx.astype(int)), n_boot=n_boot,
                        seed=seed)


def compare(
    model_a: RewardModel | str | os.PathLike[str],
    model_b: RewardModel | str | os.PathLike[str],
    pairs: Sequence[Pair],
    *,
    labels: tuple[str, str] = ("A", "B"),
    fraction: float = 0.5,
    probes: bool = False,
    probe_items: Sequence[Any] | None = None,
    n_boot: int = 2000,
    seed: int = 0,
    batch_size: int = 8,
    progress: bool = False,
) -> Comparison:
    """Compare two reward models on the same preference `pairs`; returns a `Comparison`.

    Models may be `RewardModel`s or folders / hub ids (opened with `rewardlens.load`). `fraction`:
    crystallization threshold (share of the final margin). `probes`: also run `rewardlens.probe`
    on both (on `probe_items`, default the built-in items). Every analysis runs batched over all
    pairs; directions are compared only when `shared_basis` accepts the two models. `progress`: a
    tqdm bar on stderr that moves per sequence each batch loop runs (lens, attribution, directions),
    naming the analysis it is in; the probes, when asked, show their own bar.
    """
    from ..model import load

    pairs = list(pairs)
    if not pairs or not all(isinstance(p, Pair) for p in pairs):
        kinds = sorted({type(p).__name__ for p in pairs})
        raise DataError(f"compare needs a non-empty list of rewardlens.Pair (margins need both sides), got "
                        f"{len(pairs)} items of type {kinds}; load them with rewardlens.load_pairs")
    if len(labels) != 2 or labels[0] == labels[1] or not 0 < fraction <= 1 or n_boot < 1:
        raise UsageError(f"need two different labels, fraction in (0, 1] and n_boot >= 1; got labels={labels!r}, "
                         f"fraction={fraction}, n_boot={n_boot}")
    ma, mb = (m if isinstance(m, RewardModel) else load(str(m)) for m in (model_a, model_b))
    sides = 1 if mb is ma else 2
    # Counted in sequences, as the batch loops run them (`metering`): lens and attribution read each of
    # the 2n sequences once a side; the residual directions, when the basis is shared, once more.
    bar = progress_bar(2 * 2 * len(pairs) * sides, "compare", progress, unit="seq")

    def step(name: str) -> None:
        bar.set_postfix_str(name)

    run = [0.0]

    def moved(rows: float) -> None:  # a long batch reports its layers' shares: the bar shows whole sequences
        run[0] += rows
        if int(run[0]) > bar.n:
            bar.update(int(run[0]) - bar.n)

    with metering(moved):
        return _compared(ma, mb, pairs, labels, fraction, probes, probe_items, n_boot, seed, batch_size, progress,
                         bar, step)


def _compared(ma: RewardModel, mb: RewardModel, pairs: list[Pair], labels: tuple[str, str], fraction: float,
              probes: bool, probe_items: Sequence[Any] | None, n_boot: int, seed: int, batch_size: int,
              progress: bool, bar: Any, step: Callable[[str], None]) -> Comparison:
    """`compare`'s work, once its arguments are checked and the models loaded; `bar` moves per sequence."""

    a = _side(ma, pairs, labels[0], fraction, probes, probe_items, seed, n_boot, batch_size, step, progress)
    # The same object twice (a sanity baseline) needs no second run.
    b = replace(a, label=labels[1]) if mb is ma else _side(mb, pairs, labels[1], fraction, probes, probe_items,
                                                            seed, n_boot, batch_size, step, progress)
    n = len(pairs)
    rows = pair_rows  # a bootstrap draw of pairs → the rows of both their sides
    same = (np.sign(a.margin) == np.sign(b.margin)).astype(np.float64)
    diff = np.stack([b.crystallization_linear - a.crystallization_linear,
                     b.crystallization_normed - a.crystallization_normed])
    diff_mean = np.array([np.nanmean(d) if np.isfinite(d).any() else np.nan for d in diff])
    grid = _grid(a.n_layers, b.n_layers)
    undefined = a.near_zero | b.near_zero
    formation = np.stack([formation_correlation(a.lens_linear, b.lens_linear, undefined),
                          formation_correlation(a.lens_normed, b.lens_normed, undefined)])
    profile_a, profile_b = np.interp(grid, a.depth, a.profile), np.interp(grid, b.depth, b.profile)
    probe_rho = float("nan")
    if probes:
        assert a.probes is not None and b.probes is not None  # probes=True ran them on both sides
        probe_rho = spearman(a.probes.mean, b.probes.mean)
    basis = shared_basis(ma, mb)
    readout_cos = residual_cos = float("nan")
    direction_cos = np.array([])
    if basis.shared:
        step("directions")
        bar.total += 2 * 2 * len(pairs)
        bar.refresh()
        diff_a, read_a, rread_a = _directions(ma, pairs, batch_size)
        diff_b, read_b, rread_b = _directions(mb, pairs, batch_size)
        readout_cos = float(np.nanmean(_cosine(read_a, read_b)))
        residual_cos = float(np.nanmean(_cosine(rread_a, rread_b)))
        direction_cos = _cosine(diff_a, diff_b)
    bar.close()
    return Comparison(
        a=a, b=b, pair_ids=[p.id if p.id is not None else str(i) for i, p in enumerate(pairs)], fraction=fraction,
        spearman_reward=spearman(a.reward, b.reward),
        spearman_reward_ci=_interval(lambda i: spearman(a.reward[rows(i)], b.reward[rows(i)]), n, n_boot, seed),
        spearman_margin=spearman(a.margin, b.margin),
        spearman_margin_ci=_interval(lambda i: spearman(a.margin[i], b.margin[i]), n, n_boot, seed),
        agreement=float(same.mean()), agreement_ci=bootstrap_ci(same, n_boot=n_boot, seed=seed),
        accuracy_ci=np.array([_accuracy_ci(s.margin) for s in (a, b)]),
        depth_difference=diff_mean, depth_difference_ci=np.array([bootstrap_ci(d, n_boot=n_boot, seed=seed)
                                                                  for d in diff]),
        grid=grid, profile_a=profile_a, profile_b=profile_b,
        profile_correlation=_pearson(profile_a, profile_b), formation_pairs=formation,
        formation_correlation=np.array([np.nanmean(f) if np.isfinite(f).any() else np.nan for f in formation]),
        formation_correlation_ci=np.array([bootstrap_ci(f, n_boot=n_boot, seed=seed) for f in formation]),
        probe_spearman=probe_rho, basis=basis,
        readout_cosine=readout_cos, residual_readout_cosine=residual_cos, direction_cosine=direction_cos,
    )


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson r of two profiles; NaN when either is constant (no shape to correlate)."""
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])
