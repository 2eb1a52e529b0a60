"""Train a TopK SAE on streamed activations, and measure one (FVU, L0, dead latents) in one pass.

The recipe is Gao et al. 2024 as sparsify implements it: Adam with `lr = 2e-4 / sqrt(n / 2^14)`,
`b_dec` started at the geometric median of the first batch, the FVU loss, decoder rows held at
unit norm (gradient projected off each row, rows renormalised after each step), and AuxK on the
latents that have not fired for `dead_after` activations.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch
from torch import Tensor

from ..data.internal import progress_bar
from ..errors import UsageError, warn
from ..plotting import HtmlView
from ._activations import Activations, shuffled
from ._autoencoder import SAEConfig, TopKSAE
from ._provenance import trained_provenance

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


class Source(Protocol):
    """What an SAE trains on (`ActivationSource`, `ShardedActivations`): `Activations` chunks, again on
    every iteration, of width `d_in`, `n_rows` in all."""

    d_in: int
    n_rows: int

    def __iter__(self) -> Iterator[Activations]: ...


@dataclass
class TrainConfig:
    """How to train an SAE at one hook point (sparsify's `TrainConfig`, reduced to what a stream needs)."""

    sae: SAEConfig = field(default_factory=SAEConfig)
    """Architecture of the SAE to train (ignored when an `init` SAE is given)."""
    batch_size: int = 4096
    """Activations per optimizer step."""
    epochs: int = 1
    """Passes over the activation source (each reruns the model, or rereads the shard cache or the activations
    `hold_activations` keeps in memory)."""
    lr: float | None = None
    """Adam learning rate; None: `2e-4 / sqrt(n_latents / 2**14)` (sparsify's rule)."""
    lr_warmup_steps: int = 100
    """Steps over which the learning rate rises linearly from 0 (at most a tenth of the run)."""
    auxk_alpha: float = 1 / 32
    """Weight of the AuxK loss that revives dead latents (Gao et al.); 0 turns it off."""
    dead_after: int | None = None
    """A latent is dead once it has not fired for this many activations; None: min(10M, one epoch)."""
    buffer_rows: int = 1 << 16
    """Shuffle buffer, in activations (memory: `buffer_rows × d` floats)."""
    max_norm_ratio: float | None = 10.0
    """Leave out activations whose norm exceeds this multiple of the first chunk's median norm:
    massive activations (attention sinks, ~100× the median in SmolLM2) would dominate the loss.
    None keeps everything."""
    seed: int = 0
    """Seeds the SAE's initialisation and the shuffling."""

    def __post_init__(self) -> None:
        if isinstance(self.sae, dict):
            self.sae = SAEConfig(**self.sae)
        for name in ("batch_size", "epochs", "buffer_rows"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.lr is not None and not self.lr > 0:
            raise UsageError(f"lr must be > 0 (or None for sparsify's rule), got {self.lr}")
        if self.lr_warmup_steps < 0 or self.auxk_alpha < 0:
            raise UsageError(f"lr_warmup_steps and auxk_alpha must be >= 0, "
                             f"got {self.lr_warmup_steps}, {self.auxk_alpha}")
        if self.dead_after is not None and self.dead_after < 1:
            raise UsageError(f"dead_after must be at least 1 activation (or None), got {self.dead_after}")
        if self.max_norm_ratio is not None and not self.max_norm_ratio > 1:
            raise UsageError(f"max_norm_ratio must be > 1 (or None to keep every activation), "
                             f"got {self.max_norm_ratio}")
        if self.buffer_rows < self.batch_size:
            raise UsageError(f"buffer_rows ({self.buffer_rows}) must be at least batch_size ({self.batch_size})")


@dataclass(frozen=True)
class TrainResult(HtmlView):
    """A trained SAE and its history: per step `fvu`, `auxk` and `dead_fraction` [steps] (numpy)."""

    sae: TopKSAE
    fvu: np.ndarray
    auxk: np.ndarray
    dead_fraction: np.ndarray
    n_activations: int
    """Activations trained on, over all epochs."""
    seconds: float
    """Wall time of training, activation capture (or shard reads) included."""
    max_norm: float | None = None
    """The norm above which activations were left out (`max_norm_ratio` × the first chunk's median)."""
    n_dropped: int = 0
    """Activations left out for their norm, over all epochs."""

    @property
    def activations_per_second(self) -> float:
        return self.n_activations / max(self.seconds, 1e-9)

    def to_frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame({"step": np.arange(len(self.fvu)), "fvu": self.fvu, "auxk": self.auxk,
                             "dead_fraction": self.dead_fraction})

    def plot(self, ax: Axes | None = None) -> Figure:
        """FVU and dead fraction against the step; into `ax` when given (its figure is returned), else a
        new figure."""
        from ..plotting import finish, one_panel

        ax, made = one_panel(ax, (6, 3))
        ax.plot(self.fvu, label="FVU")
        ax.plot(self.dead_fraction, label="dead fraction")
        ax.set_xlabel("step")
        ax.legend()
        return finish(ax, made)


def geometric_median(x: Tensor, iters: int = 20) -> Tensor:
    """Weiszfeld's iteration for the point minimising the summed distance to the rows of `x` [N, d]."""
    y = x.mean(0)
    for _ in range(iters):
        w = 1 / (x - y).norm(dim=1).clamp_min(1e-8)
        y = (w[:, None] * x).sum(0) / w.sum()
    return y


class _NormFilter:
    """Pass chunks through, without rows whose norm exceeds `ratio` × the first chunk's median norm."""

    def __init__(self, source: Iterable[Activations], ratio: float | None, max_norm: float | None = None) -> None:
        self.source, self.ratio, self.max_norm, self.dropped = source, ratio, max_norm, 0

    def __iter__(self) -> Iterator[Activations]:
        for chunk in self.source:
            if self.ratio is None and self.max_norm is None:
                yield chunk
                continue
            norms = chunk.x.norm(dim=1)
            if self.max_norm is None:
                assert self.ratio is not None  # with neither, the chunk passed whole above
                self.max_norm = self.ratio * float(norms.median())
            keep = norms <= self.max_norm
            self.dropped += int((~keep).sum())
            yield Activations(chunk.x[keep], chunk.seq[keep.cpu()], chunk.pos[keep.cpu()])


def _device_of(source: Source) -> torch.device:
    model = getattr(source, "model", None)
    return model.device if model is not None else torch.device("cpu")


def train_sae(source: Source, cfg: TrainConfig | None = None, *, init: TopKSAE | None = None,
              device: torch.device | str | None = None, progress: bool = False) -> TrainResult:
    """Train a TopK SAE on `source` (an `ActivationSource` or `ShardedActivations`: anything that
    iterates `Activations` chunks and has `d_in` and `n_rows`), holding at most a shuffle buffer.

    `init` continues training a copy of an existing SAE (never the caller's own object). `progress`:
    a tqdm bar on stderr over the activations of every epoch, one update per optimiser step.
    """
    cfg = cfg or TrainConfig()
    device = torch.device(device) if device is not None else _device_of(source)
    if init is not None:
        import copy

        sae = copy.deepcopy(init).to(device=device, dtype=torch.float32)
    else:
        sae = TopKSAE(source.d_in, cfg.sae, seed=cfg.seed, device=device)
    if sae.d_in != source.d_in:
        raise UsageError(f"the SAE reads width {sae.d_in} but the activations have width {source.d_in}")
    origin = getattr(source, "origin", None)  # activation sources say which model and point they read
    if origin is not None:
        sae.provenance = trained_provenance(sae.provenance, origin())
    sae.train()
    lr = cfg.lr or 2e-4 / (sae.n_latents / 2**14) ** 0.5
    opt = torch.optim.Adam(sae.parameters(), lr=lr)
    dead_after = cfg.dead_after or min(10_000_000, max(source.n_rows, 1))
    # A short run (small preference sets are common) must not spend itself warming up.
    warmup = min(cfg.lr_warmup_steps, cfg.epochs * -(-source.n_rows // cfg.batch_size) // 10)
    since = torch.zeros(sae.n_latents, dtype=torch.long, device=device)
    gen = torch.Generator().manual_seed(cfg.seed)
    data = _NormFilter(source, cfg.max_norm_ratio)
    fvu: list[Tensor] = []
    auxk: list[Tensor] = []
    dead: list[Tensor] = []
    seen, start = 0, time.perf_counter()
    bar = progress_bar(cfg.epochs * source.n_rows, "sae: training", progress, unit="act")
    for _ in range(cfg.epochs):
        for x in shuffled(data, cfg.batch_size, cfg.buffer_rows, gen, device):
            if seen == 0 and init is None:
                with torch.no_grad():
                    sae.b_dec.copy_(geometric_median(x))
            dead_mask = since >= dead_after
            out = sae(x, dead_mask if cfg.auxk_alpha > 0 else None)
            loss = out.fvu + cfg.auxk_alpha * out.auxk
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if sae.cfg.normalize_decoder:
                sae.remove_parallel_grad_()
            for group in opt.param_groups:
                group["lr"] = lr * min(1.0, (len(fvu) + 1) / max(warmup, 1))
            opt.step()
            if sae.cfg.normalize_decoder:
                sae.normalize_decoder_()
            since += len(x)
            since[out.indices[out.acts > 0]] = 0
            seen += len(x)
            # Kept as tensors: converting each step would wait for the GPU every step.
            fvu.append(out.fvu.detach())
            auxk.append(out.auxk.detach())
            dead.append(dead_mask.float().mean())
            bar.update(len(x))
    bar.close()
    sae.eval()
    _warn_if_short(len(fvu), seen, sae.n_latents, sae.cfg.k, cfg)
    h_fvu, h_auxk, h_dead = (torch.stack(h).cpu().numpy() if h else np.zeros(0) for h in (fvu, auxk, dead))
    return TrainResult(sae, h_fvu, h_auxk, h_dead, seen, time.perf_counter() - start, data.max_norm, data.dropped)


MIN_STEPS = 100
"""Fewer optimiser steps than this and `train_sae` warns (see `_warn_if_short`)."""
MIN_FIRINGS = 10
"""Fewer expected firings per latent than this and `train_sae` warns (see `_warn_if_short`)."""


def _warn_if_short(steps: int, seen: int, n_latents: int, k: int, cfg: TrainConfig) -> None:
    """Warn when a run was too short to have trained its latents, naming the parameters and flags.

    Two floors, each a property of the optimiser or of the latents, not of the data:
    - `MIN_STEPS` (100) optimiser steps. Adam moves each weight by about `lr` per step, so `s`
      steps move it by at most `s × lr` (2e-4 at 16k latents): under 100 steps the SAE is still
      mostly its random initialisation, and sparsify's recipe, which this one follows, warms the
      learning rate up over 100 steps and then runs thousands.
    - `MIN_FIRINGS` (10) expected firings per latent, `activations × k / n_latents`: a latent is
      trained only by the activations it fires on, so below ~10 most latents have had too few
      gradient signals to settle on a direction (and the dead-latent count means little).
    """
    firings = seen * k / max(n_latents, 1)
    if steps >= MIN_STEPS and firings >= MIN_FIRINGS:
        return
    warn(f"SAE training ran {steps} optimiser step(s) on {seen} activations ({firings:.3g} expected firings "
         f"per latent over {n_latents} latents); at least {MIN_STEPS} steps and {MIN_FIRINGS} firings per latent "
         f"are needed to train the latents, so this SAE is mostly its initialisation. Fix: more steps (a "
         f"smaller batch_size, now {cfg.batch_size}, or more epochs, now {cfg.epochs}: CLI --sae-batch-size, "
         f"--epochs), fewer latents (SAEConfig num_latents / expansion_factor: --latents, --expansion-factor), "
         f"or more activations (a larger --pairs file without --limit; positions='all': --positions all)")


@dataclass(frozen=True)
class SAEStats:
    """How well an SAE fits a set of activations: `fvu`, mean `l0`, `dead_fraction` (latents that
    never fired) and each latent's firing `frequency` [n_latents], over `n_rows` activations."""

    fvu: float
    l0: float
    dead_fraction: float
    frequency: np.ndarray
    n_rows: int
    n_dropped: int = 0
    """Activations left out for a norm above `max_norm`."""

    @property
    def explained_variance(self) -> float:
        """1 − FVU: the fraction of the activations' variance (about their mean) the SAE reconstructs."""
        return 1.0 - self.fvu


@torch.no_grad()
def evaluate(sae: TopKSAE, source: Iterable[Activations], *, device: torch.device | str | None = None,
             max_norm: float | None = None,
             visit: Callable[[Activations, Tensor, Tensor], None] | None = None) -> SAEStats:
    """FVU, L0 and dead latents of `sae` over every activation of `source`, in one streamed pass.

    Sums are kept in float64 so the variance about the mean (`Σ‖x‖² − ‖Σx‖²/N`) does not cancel.
    `max_norm` leaves out what training left out (`TrainResult.max_norm`); default: nothing.
    `visit(chunk, acts, indices)` sees each chunk's top-k codes too (feature reports use it).
    """
    data = _NormFilter(source, None, max_norm)
    device = torch.device(device) if device is not None else sae.b_dec.device
    s1 = torch.zeros(sae.d_in, dtype=torch.float64, device=device)
    s2 = err = active = torch.zeros((), dtype=torch.float64, device=device)
    fired = torch.zeros(sae.n_latents, dtype=torch.float64, device=device)
    n = 0
    for chunk in data:
        x = chunk.x.to(device=device, dtype=sae.b_dec.dtype)
        acts, idx = sae.encode(x)
        x_hat = sae.decode(acts, idx)
        if visit is not None:
            visit(chunk, acts, idx)
        xd = x.double()
        s1 += xd.sum(0)
        s2 = s2 + xd.pow(2).sum()
        err = err + (xd - x_hat.double()).pow(2).sum()
        on = acts > 0
        active = active + on.sum()
        fired.index_add_(0, idx[on], torch.ones(int(on.sum()), dtype=torch.float64, device=device))
        n += len(x)
    if n == 0:
        raise UsageError("the activation source yielded no activations")
    total = float(s2 - s1.pow(2).sum() / n)
    freq = (fired / n).cpu().numpy()
    return SAEStats(float(err) / max(total, 1e-30), float(active) / n, float((freq == 0).mean()), freq, n,
                    data.dropped)
