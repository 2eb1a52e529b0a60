"""Train per-layer TopK transcoders on an MLP's (input, output) pairs, captured with hooks (the model is never
modified): the SAE trainer's recipe (sae/_train.py) with the source and target hook points apart.

For each chosen layer `l`, hooks record what the MLP receives (`mlp_in`, after the pre-MLP norm) and
what it returns (`mlp_out`) — `mlp_modules`: the MLP module on pre-norm layouts, the map's `mlp_in` and
`mlp_out` modules on post-norm ones — at every non-pad token but each sequence's first `skip_first` (a
decoder's first token is an attention sink whose activations are ~100× the rest). One model
forward feeds every layer. Chunks are pooled in a shuffle buffer and each layer's transcoder takes
Adam steps on

    FVU = ‖y − ŷ‖² / ‖y − ȳ‖²      (ŷ = TopK(ReLU(x W_enc + b_enc)) W_dec + b_dec (+ x W_skip))

plus AuxK (Gao et al. 2024, as sparsify): latents that have not fired for `dead_after` tokens learn
to predict the residual `y − ŷ`. The decoder starts at zero and `b_dec` at the first batch's mean
output (sparsify's transcoder initialisation); the learning rate is sparsify's `2e-4 / √(d_sae/2¹⁴)`
unless given. Each epoch reruns the model (memory holds the buffer, not the data set).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data import Inputs
from ..data.internal import progress_bar
from ..errors import UsageError
from ..model import RewardModel
from ..model.internal import Batch, get_module, rewriting
from ..plotting import HtmlView
from ..stats import summary_frame
from ._activations import skip_first_for, token_mask
from ._provenance import model_fingerprint, model_name
from ._transcoder import Transcoder, TranscoderConfig, Transcoders

if TYPE_CHECKING:
    import pandas as pd


def mlp_paths(model: RewardModel) -> tuple[str, str]:
    """(input module, output module) paths inside a layer: the MLP's input is what the first receives, its
    output what the second returns. Pre-norm layouts: both the MLP module, the parent of the map's `mlp_out`
    projection (the block itself for a mixture of experts). Post-norm layouts, whose MLP sits in no module
    of its own (BERT's `output` adds the residual and normalises): the map's `mlp_in` (BERT's `intermediate`,
    the up-projection and activation) and the `mlp_out` projection (its output, before dropout, residual
    and norm)."""
    arch = model.arch
    if arch.mlp_in is not None:  # ArchitectureMap.__post_init__ requires it for post_norm
        return arch.mlp_in, arch.mlp_out
    whole = arch.mlp_out.rsplit(".", 1)[0] if "." in arch.mlp_out else arch.mlp_out
    return whole, whole


def mlp_modules(model: RewardModel, layer: int) -> tuple[nn.Module, nn.Module]:
    """Layer `layer`'s (input module, output module) (`mlp_paths`): the MLP's input `mlp_in` is the first's
    input, its output `mlp_out` the second's output (sae/_transcoder.py). One module on pre-norm layouts."""
    if not 0 <= layer < model.n_layers:
        raise UsageError(f"layer must be in 0..{model.n_layers - 1}, got {layer}", option="layers")
    source, target = mlp_paths(model)
    block = model.layers[layer]
    return get_module(block, source), get_module(block, target)


def mlp_module(model: RewardModel, layer: int) -> nn.Module:
    """The module whose input is layer `layer`'s MLP input: the whole MLP on pre-norm layouts (its output is
    the MLP's output too), the map's `mlp_in` on post-norm ones (`mlp_modules` gives the output module)."""
    return mlp_modules(model, layer)[0]


def check_layers(model: RewardModel, layers: list[int] | None) -> list[int]:
    """The layers to train (all when None), sorted, each checked to exist."""
    chosen = list(range(model.n_layers)) if layers is None else sorted(set(layers))
    bad = [layer for layer in chosen if not 0 <= layer < model.n_layers]
    if bad or not chosen:
        raise UsageError(f"layers must be a non-empty subset of 0..{model.n_layers - 1}, got {layers}", option="layers")
    return chosen


@contextlib.contextmanager
def capturing_mlps(model: RewardModel, layers: list[int], mask: Tensor,
                   out: dict[int, list[tuple[Tensor, Tensor]]]) -> Iterator[None]:
    """During the forward inside, append each layer's (MLP input, MLP output) rows at `mask` [b, T], in fp32."""
    seen: dict[int, Tensor] = {}

    def grab_in(v: Tensor, layer: int) -> None:
        seen[layer] = v[mask.to(v.device)].detach().float()

    def grab_out(v: Tensor, layer: int) -> None:
        out.setdefault(layer, []).append((seen.pop(layer), v[mask.to(v.device)].detach().float()))

    hooks = []
    for layer in layers:
        source, target = mlp_modules(model, layer)
        hooks += [(source, "in", lambda v, layer=layer: grab_in(v, layer)),
                  (target, "out", lambda v, layer=layer: grab_out(v, layer))]
    with rewriting(hooks):
        yield


def mlp_pairs(model: RewardModel, inputs: Inputs, layers: list[int], *, skip_first: int | None = None,
              batch_size: int = 8) -> Iterator[tuple[np.ndarray, Batch, Tensor, dict[int, tuple[Tensor, Tensor]]]]:
    """Per model batch: its rows (indices into `inputs`' sequences), the batch, its token mask [b, T] and each
    layer's (MLP input, output) [n, d] at the mask."""
    skip = skip_first_for(model, skip_first)
    seqs, is_pairs = model.encode(inputs)
    for rows, batch in model.batches(seqs, batch_size, is_pairs=is_pairs):
        mask = token_mask(batch, skip)
        got: dict[int, list[tuple[Tensor, Tensor]]] = {}
        with torch.no_grad(), capturing_mlps(model, layers, mask, got):
            model.run(batch, {})
        yield rows, batch, mask, {layer: got[layer][0] for layer in layers}


@dataclass
class TranscoderTrainConfig:
    """How to train transcoders (sparsify's `TrainConfig` fields, for an (input, output) pair of hooks)."""

    d_sae: int = 0
    """Features per layer; 0: `expansion_factor × d_model`."""
    expansion_factor: int = 8
    k: int = 32
    """Features kept per token (TopK)."""
    skip: bool = False
    """Learn a linear skip term `x W_skip` too (sparsify's skip transcoders)."""
    batch_size: int = 1024
    """Tokens per optimiser step."""
    epochs: int = 1
    lr: float | None = None
    """Adam's learning rate; None: `2e-4 / sqrt(d_sae / 2**14)` (sparsify's rule)."""
    lr_warmup_steps: int = 50
    auxk_alpha: float = 1 / 32
    dead_after: int = 100_000
    """A feature is dead once it has not fired for this many tokens (AuxK then trains it)."""
    buffer_rows: int = 1 << 15
    """Tokens pooled and shuffled before their steps (memory: `buffer_rows × 2 d × layers` floats)."""
    skip_first: int | None = None
    """Leave out each sequence's first tokens; None: 1 for decoders (the attention sink), 0 for encoders."""
    model_batch_size: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("expansion_factor", "k", "batch_size", "epochs", "dead_after", "model_batch_size"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name} must be at least 1, got {getattr(self, name)}", option=name)
        if self.d_sae < 0 or (self.lr is not None and not self.lr > 0) or self.buffer_rows < self.batch_size:
            raise UsageError(f"need d_sae >= 0 (got {self.d_sae}), lr > 0 or None (got {self.lr}) and buffer_rows >= "
                             f"batch_size (got {self.buffer_rows} < {self.batch_size})")

    def width(self, d_model: int) -> int:
        return self.d_sae or self.expansion_factor * d_model


@dataclass(frozen=True)
class TranscoderTraining(HtmlView):
    """Trained transcoders and their history: per layer, the FVU of each step [steps] (numpy)."""

    transcoders: Transcoders
    fvu: dict[int, np.ndarray]
    dead_fraction: dict[int, float]
    """Per layer, the share of features that had not fired for `dead_after` tokens at the end."""
    n_tokens: int
    """Tokens trained on per layer, over all epochs."""
    seconds: float
    """Wall time, model forwards included."""
    config: TranscoderTrainConfig = field(default_factory=TranscoderTrainConfig)

    @property
    def tokens_per_second(self) -> float:
        return self.n_tokens / max(self.seconds, 1e-9)

    def to_frame(self) -> pd.DataFrame:
        """One row per layer: final FVU (mean of the last tenth of the steps), dead fraction, steps."""
        import pandas as pd

        rows = []
        for layer, h in self.fvu.items():
            tail = h[-max(len(h) // 10, 1):] if len(h) else h
            rows.append({"layer": layer, "final_fvu": float(tail.mean()) if len(tail) else float("nan"),
                         "dead_fraction": self.dead_fraction[layer], "steps": len(h)})
        return pd.DataFrame(rows)

    def summary(self) -> pd.DataFrame:
        """One row per number (`stats.summary_frame`): each layer's final FVU and dead fraction, the tokens
        trained on and the throughput (`n` the tokens per layer)."""
        frame = self.to_frame()
        rows = [{"name": f"{what}_layer_{r['layer']}", "value": r[what], "n": self.n_tokens}
                for r in frame.to_dict("records") for what in ("final_fvu", "dead_fraction")]
        return summary_frame([*rows, {"name": "tokens_per_second", "value": self.tokens_per_second,
                                      "n": self.n_tokens}])

    def describe(self) -> str:
        """One line: how many transcoders, on how many tokens, how fast."""
        return (f"trained {len(self.fvu)} transcoder(s) of {self.transcoders.d_sae} features on {self.n_tokens} tokens "
                f"in {self.seconds:.1f} s ({self.tokens_per_second:.0f} tokens/s)")


class _Layer:
    """One layer's transcoder, its optimiser and its dead-feature counter."""

    def __init__(self, tc: Transcoder, lr: float, device: torch.device) -> None:
        self.tc, self.lr = tc, lr
        self.opt = torch.optim.Adam(tc.parameters(), lr=lr)
        self.since = torch.zeros(tc.d_sae, dtype=torch.long, device=device)
        self.history: list[Tensor] = []
        self.started = False

    def step(self, x: Tensor, y: Tensor, cfg: TranscoderTrainConfig, warmup: int) -> None:
        tc = self.tc
        if not self.started:  # sparsify: the decoder bias starts at the output's mean
            with torch.no_grad():
                tc.b_dec.copy_(y.mean(0))
            self.started = True
        pre = tc.pre(x)
        top = F.relu(pre).topk(tc.k, dim=-1, sorted=False)
        acts = torch.zeros_like(pre).scatter(-1, top.indices, top.values)
        err = y - tc.decode(acts, x)
        total = (y - y.mean(0)).pow(2).sum().clamp_min(torch.finfo(y.dtype).tiny)
        fvu = err.pow(2).sum() / total
        loss = fvu
        dead = self.since >= cfg.dead_after
        n_dead = int(dead.sum())
        if cfg.auxk_alpha > 0 and n_dead:
            k_aux = min(tc.cfg.d_out // 2, n_dead)
            aux = torch.where(dead[None], pre, -torch.inf).topk(max(k_aux, 1), dim=-1, sorted=False)
            aux_acts = torch.zeros_like(pre).scatter(-1, aux.indices, F.relu(aux.values))
            scale = min(n_dead / max(tc.cfg.d_out // 2, 1), 1.0)
            loss = loss + cfg.auxk_alpha * scale * (aux_acts @ tc.W_dec - err.detach()).pow(2).sum() / total
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        for group in self.opt.param_groups:
            group["lr"] = self.lr * min(1.0, (len(self.history) + 1) / max(warmup, 1))
        self.opt.step()
        self.since += len(x)
        self.since[top.indices[top.values > 0]] = 0
        self.history.append(fvu.detach())


def train_transcoders(model: RewardModel, inputs: Inputs, *, layers: list[int] | None = None,
                      config: TranscoderTrainConfig | None = None, progress: bool = False) -> TranscoderTraining:
    """Train one transcoder per layer in `layers` (all by default) on `inputs` (texts or pairs: both sides
    are read), as the module docstring says. The model is run under hooks only, never modified."""
    cfg = config or TranscoderTrainConfig()
    chosen = check_layers(model, layers)
    d, device = model.d_model, model.device
    width = cfg.width(d)
    if cfg.k > width:
        raise UsageError(f"k={cfg.k} exceeds the {width} features per layer; lower k or raise d_sae", option="k")
    name, fingerprint = model_name(model), model_fingerprint(model)
    lr = cfg.lr or 2e-4 / (width / 2**14) ** 0.5
    state = {layer: _Layer(Transcoder(TranscoderConfig(layer=layer, d_in=d, d_out=d, d_sae=width, k=cfg.k,
                                                       skip=cfg.skip, base_model=name or None,
                                                       model_fingerprint=fingerprint,
                                                       skip_first=skip_first_for(model, cfg.skip_first)),
                                      seed=cfg.seed + layer, device=device), lr, device) for layer in chosen}
    n_seqs = len(model.encode(inputs)[0])
    gen = torch.Generator().manual_seed(cfg.seed)
    seen, start = 0, time.perf_counter()
    warmup = cfg.lr_warmup_steps
    with progress_bar(cfg.epochs * n_seqs, "transcoders: training", progress, unit="seq") as bar:
        for _ in range(cfg.epochs):
            buffer: dict[int, list[tuple[Tensor, Tensor]]] = {layer: [] for layer in chosen}
            rows = 0
            for _rows, batch, _mask, pairs in mlp_pairs(model, inputs, chosen, skip_first=cfg.skip_first,
                                                 batch_size=cfg.model_batch_size):
                bar.update(batch.input_ids.shape[0])
                for layer, pair in pairs.items():
                    buffer[layer].append(pair)
                rows += len(pairs[chosen[0]][0])
                if rows >= cfg.buffer_rows:
                    seen += _drain(state, buffer, cfg, gen, warmup, keep_rest=True)
                    rows = sum(len(x) for x, _ in buffer[chosen[0]])
            seen += _drain(state, buffer, cfg, gen, warmup, keep_rest=False)
    for s in state.values():
        s.tc.eval()
        s.tc.requires_grad_(False)
    fvu = {layer: torch.stack(s.history).cpu().numpy() if s.history else np.zeros(0) for layer, s in state.items()}
    dead = {layer: float((s.since >= cfg.dead_after).float().mean()) for layer, s in state.items()}
    tcs = Transcoders({layer: s.tc for layer, s in state.items()})
    return TranscoderTraining(tcs, fvu, dead, seen, time.perf_counter() - start, cfg)


def _drain(state: dict[int, _Layer], buffer: dict[int, list[tuple[Tensor, Tensor]]], cfg: TranscoderTrainConfig,
           gen: torch.Generator, warmup: int, *, keep_rest: bool) -> int:
    """Shuffle the buffered tokens (one permutation for every layer) and step on full batches; with `keep_rest`
    the remainder stays buffered, else it is a last, smaller step. Returns the tokens stepped on."""
    layers = list(state)
    if not buffer[layers[0]]:
        return 0
    xs = {layer: torch.cat([x for x, _ in buffer[layer]]) for layer in layers}
    ys = {layer: torch.cat([y for _, y in buffer[layer]]) for layer in layers}
    n = len(xs[layers[0]])
    order = torch.randperm(n, generator=gen).to(xs[layers[0]].device)
    full = n - n % cfg.batch_size if keep_rest else n
    for lo in range(0, full, cfg.batch_size):
        idx = order[lo:min(lo + cfg.batch_size, full)]
        if len(idx) < 2:  # a variance needs two tokens
            continue
        for layer, s in state.items():
            s.step(xs[layer][idx], ys[layer][idx], cfg, warmup)
    rest = order[full:]
    for layer in layers:
        buffer[layer] = [(xs[layer][rest], ys[layer][rest])] if len(rest) else []
    return full
