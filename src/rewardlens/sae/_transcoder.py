"""A per-layer TopK transcoder: an MLP's input mapped sparsely to its output, and a layer → transcoder set.

A transcoder replaces one MLP (Dunefsky et al. 2024; Paulo et al. 2025 for the skip term):

    pre(x)  = x W_enc + b_enc                       [d_sae]   (x: what the MLP module receives)
    f(x)    = TopK(ReLU(pre(x)))                    the k largest kept, the rest 0 (sparsify's rule)
    y(f, x) = f W_dec + b_dec (+ x W_skip)          [d_out]   (≈ what the MLP module returns)

The source hook `mlp_in` is the tensor the MLP module receives (after the pre-MLP norm), the
target `mlp_out` the MLP module's output (before any post-MLP norm and before the residual add); in a
post-norm encoder, whose MLP is no one module, what the map's `mlp_in` module receives and what its
`mlp_out` projection returns (before dropout, the residual and the norm; sae/_transcoder_train.py's
`mlp_modules`).
Weights are held in the orientation of this formula (`W_enc [d_in, d_sae]`, `W_dec [d_sae, d_out]`,
`W_skip [d_in, d_out]`); sparsify's and circuit-tracer's files store transposes of some of them and
the loaders (sae/_transcoder_load.py) turn them. Published ReLU and JumpReLU transcoders are read
too (`activation`): `f = ReLU(pre)`, or `f = pre · [pre > θ]`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import SAEMismatchError

Activation = Literal["topk", "relu", "jumprelu"]
ACTIVATIONS: tuple[Activation, ...] = ("topk", "relu", "jumprelu")
SOURCE_HOOK, TARGET_HOOK = "mlp_in", "mlp_out"
CONFIG, WEIGHTS, RUN_CONFIG = "cfg.json", "sae.safetensors", "config.json"
"""A layer's folder: sparsify's config and weights; the run's config beside the layers' folders."""


@dataclass(frozen=True)
class TranscoderConfig:
    """What one transcoder is: its layer, widths, sparsity and where it was trained."""

    layer: int
    """The layer whose MLP it replaces (0-based)."""
    d_in: int
    """Width of the MLP's input (the model's d_model)."""
    d_out: int
    """Width of the MLP's output (the model's d_model)."""
    d_sae: int
    """Number of features."""
    k: int
    """Features kept per token (TopK); for 'relu'/'jumprelu' transcoders, d_sae (no cap)."""
    skip: bool = False
    """A linear skip term `x W_skip` (sparsify's skip transcoders)."""
    base_model: str | None = None
    """The model it was trained on (a hub id or a folder), as `Provenance.base_model`."""
    dtype: str = "float32"
    """The dtype its weights were stored in."""
    source: str = SOURCE_HOOK
    """Input hook: 'mlp_in', the tensor the MLP module receives (after the pre-MLP norm)."""
    target: str = TARGET_HOOK
    """Output hook: 'mlp_out', the MLP module's output."""
    activation: Activation = "topk"
    """'topk' (trained here, sparsify), or 'relu'/'jumprelu' (published circuit-tracer transcoders)."""
    model_fingerprint: str | None = None
    """rewardlens' checksum of the model it was trained on (`_provenance.model_fingerprint`), if trained here."""
    skip_first: int | None = None
    """Tokens at each sequence's start it was trained without (the attention sink), if trained here; None: not
    recorded (published sets), and attribution graphs take the default (`internal.skip_first_for`)."""

    def __post_init__(self) -> None:
        if self.layer < 0 or min(self.d_in, self.d_out, self.d_sae) < 1:
            raise SAEMismatchError(f"transcoder needs layer >= 0 and positive widths, got layer={self.layer}, "
                                   f"d_in={self.d_in}, d_out={self.d_out}, d_sae={self.d_sae}")
        if not 1 <= self.k <= self.d_sae:
            raise SAEMismatchError(f"transcoder k must be in 1..d_sae={self.d_sae}, got k={self.k}; lower k")
        if self.activation not in ACTIVATIONS:
            raise SAEMismatchError(f"transcoder activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if (self.source, self.target) != (SOURCE_HOOK, TARGET_HOOK):
            raise SAEMismatchError(f"transcoders map {SOURCE_HOOK!r} to {TARGET_HOOK!r}, got {self.source!r} → "
                                   f"{self.target!r}; rewardlens replaces whole MLP modules only")


class Transcoder(nn.Module):
    """One layer's transcoder (see the module docstring): `pre`, `encode`, `decode`, `forward`."""

    def __init__(self, cfg: TranscoderConfig, *, seed: int | None = None, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.cfg = cfg
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        self.W_enc = nn.Parameter(torch.zeros(cfg.d_in, cfg.d_sae, **kw))
        self.b_enc = nn.Parameter(torch.zeros(cfg.d_sae, **kw))
        self.W_dec = nn.Parameter(torch.zeros(cfg.d_sae, cfg.d_out, **kw))
        self.b_dec = nn.Parameter(torch.zeros(cfg.d_out, **kw))
        self.W_skip: nn.Parameter | None = nn.Parameter(torch.zeros(cfg.d_in, cfg.d_out, **kw)) if cfg.skip else None
        self.threshold: Tensor | None
        self.register_buffer("threshold", torch.zeros(cfg.d_sae, **kw) if cfg.activation == "jumprelu" else None)
        if seed is None or torch.device(device or "cpu").type == "meta":
            return
        gen = torch.Generator().manual_seed(seed)
        bound = 1 / cfg.d_in**0.5  # nn.Linear's init; the decoder starts at 0 (sparsify's transcoders)
        with torch.no_grad():
            self.W_enc.copy_(torch.empty(cfg.d_in, cfg.d_sae).uniform_(-bound, bound, generator=gen))

    # ---- the transcoder -----------------------------------------------------------------------
    @property
    def layer(self) -> int:
        return self.cfg.layer

    @property
    def k(self) -> int:
        return self.cfg.k

    @property
    def d_sae(self) -> int:
        return self.cfg.d_sae

    def pre(self, x: Tensor) -> Tensor:
        """Pre-activations `x W_enc + b_enc` [..., d_sae] of MLP inputs `x` [..., d_in]."""
        return x.to(self.W_enc.dtype) @ self.W_enc + self.b_enc

    def activate(self, pre: Tensor) -> Tensor:
        """Feature activations [..., d_sae] from pre-activations: TopK of ReLU (others 0), ReLU, or JumpReLU."""
        if self.cfg.activation == "relu":
            return F.relu(pre)
        if self.cfg.activation == "jumprelu":
            assert self.threshold is not None
            return pre * (pre > self.threshold)
        top = F.relu(pre).topk(self.k, dim=-1, sorted=False)
        return torch.zeros_like(pre).scatter_(-1, top.indices, top.values)

    def encode(self, x: Tensor) -> Tensor:
        """Dense feature activations `f(x)` [..., d_sae]: at most k nonzero per row, all >= 0 for TopK."""
        return self.activate(self.pre(x))

    def decode(self, acts: Tensor, x: Tensor | None = None) -> Tensor:
        """`acts W_dec + b_dec (+ x W_skip)` [..., d_out]; `x` (the MLP input) is needed when there is a skip."""
        out = acts.to(self.W_dec.dtype) @ self.W_dec + self.b_dec
        if self.W_skip is not None:
            if x is None:
                raise SAEMismatchError(f"the layer-{self.layer} transcoder has a skip term x W_skip; pass the MLP "
                                       "input x to decode(acts, x)")
            out = out + x.to(self.W_skip.dtype) @ self.W_skip
        return out

    def skip(self, x: Tensor) -> Tensor:
        """The skip term `x W_skip` [..., d_out], zeros when there is none."""
        if self.W_skip is None:
            return x.new_zeros(*x.shape[:-1], self.cfg.d_out, dtype=self.W_dec.dtype)
        return x.to(self.W_skip.dtype) @ self.W_skip

    def forward(self, x: Tensor) -> Tensor:
        """The transcoder's estimate of the MLP's output [..., d_out] for MLP inputs `x` [..., d_in]."""
        return self.decode(self.encode(x), x)


@dataclass(frozen=True)
class TranscoderProvenance:
    """What a transcoder set claims: base model, width, dtype, layers, and where it was read from."""

    format: str
    """'rewardlens' / 'sparsify' (one cfg.json + sae.safetensors folder per layer), 'circuit-tracer', 'memory'."""
    base_model: str | None
    d_in: int
    d_sae: int
    dtype: str
    layers: tuple[int, ...]
    model_fingerprint: str | None = None
    folder: Path | None = None


class Transcoders(Mapping[int, Transcoder]):
    """Transcoders by layer (a read-only mapping), with the provenance they share; `save(dir)` writes them.

    Every member must agree on `d_in`, `d_sae` and the base model (checked on construction).
    """

    def __init__(self, transcoders: Mapping[int, Transcoder], *, format: str = "memory",
                 folder: Path | None = None) -> None:
        if not transcoders:
            raise SAEMismatchError("a transcoder set needs at least one layer's transcoder, got none")
        self._by_layer = dict(sorted(transcoders.items()))
        for layer, tc in self._by_layer.items():
            if tc.layer != layer:
                raise SAEMismatchError(f"the transcoder keyed by layer {layer} says it replaces layer {tc.layer}; "
                                       "key each transcoder by its own cfg.layer")
        first = next(iter(self._by_layer.values())).cfg
        for tc in self._by_layer.values():
            c = tc.cfg
            if (c.d_in, c.d_sae, c.base_model) != (first.d_in, first.d_sae, first.base_model):
                raise SAEMismatchError(
                    f"transcoders of one set must share d_in, width and base model; layer {c.layer} has "
                    f"({c.d_in}, {c.d_sae}, {c.base_model!r}) but layer {first.layer} has ({first.d_in}, "
                    f"{first.d_sae}, {first.base_model!r}); load each layer from the same set")
        self.provenance = TranscoderProvenance(format=format, base_model=first.base_model, d_in=first.d_in,
                                               d_sae=first.d_sae, dtype=first.dtype, layers=tuple(self._by_layer),
                                               model_fingerprint=first.model_fingerprint, folder=folder)

    def __getitem__(self, layer: int) -> Transcoder:
        if layer not in self._by_layer:
            raise KeyError(layer)
        return self._by_layer[layer]

    def __iter__(self) -> Iterator[int]:
        return iter(self._by_layer)

    def __len__(self) -> int:
        return len(self._by_layer)

    def __repr__(self) -> str:
        p = self.provenance
        return (f"Transcoders(layers={list(p.layers)}, d_sae={p.d_sae}, base_model={p.base_model!r}, "
                f"format={p.format!r})")

    @property
    def layers(self) -> tuple[int, ...]:
        return self.provenance.layers

    @property
    def d_sae(self) -> int:
        return self.provenance.d_sae

    def require(self, layers: list[int] | tuple[int, ...]) -> None:
        """Refuse, in one line, if any of `layers` has no transcoder here."""
        missing = [layer for layer in layers if layer not in self._by_layer]
        if missing:
            raise SAEMismatchError(f"no transcoder for layer(s) {missing}; this set covers {list(self.layers)} — "
                                   "train or load those layers, or treat their MLPs as exact error nodes")

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Transcoders:
        """The same set with every transcoder moved/cast (in place, as nn.Module.to does); returns self."""
        for tc in self._by_layer.values():
            tc.to(device=device, dtype=dtype)
        return self

    def with_provenance(self, **changes: Any) -> Transcoders:
        """A set whose members' configs carry `changes` (e.g. base_model=...), sharing the weights."""
        out: dict[int, Transcoder] = {}
        for layer, tc in self._by_layer.items():
            new = Transcoder(replace(tc.cfg, **changes), device="meta")
            new.load_state_dict(tc.state_dict(), assign=True)
            out[layer] = new
        return Transcoders(out, format=self.provenance.format, folder=self.provenance.folder)

    def save(self, folder: str | Path) -> Path:
        """Write one sparsify-layout folder per layer (`layers.<l>.mlp/cfg.json` + `sae.safetensors`) and a
        sparsify run `config.json` naming the base model (sae/_transcoder_load.py)."""
        return save_transcoders(self, Path(folder))


def save_transcoders(tcs: Transcoders, folder: Path) -> Path:
    """Write `tcs` in sparsify's layout with rewardlens' provenance keys (module docstring)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    hookpoints = []
    for layer, tc in tcs.items():
        c, name = tc.cfg, f"layers.{layer}.mlp"
        hookpoints.append(name)
        cpu = lambda t: t.detach().contiguous().cpu()  # noqa: E731
        state = {"encoder.weight": cpu(tc.W_enc.T), "encoder.bias": cpu(tc.b_enc), "W_dec": cpu(tc.W_dec),
                 "b_dec": cpu(tc.b_dec)}
        if tc.W_skip is not None:
            state["W_skip"] = cpu(tc.W_skip.T)
        if tc.threshold is not None:
            state["threshold"] = cpu(tc.threshold)
        sub = folder / name
        sub.mkdir(exist_ok=True)
        save_file(state, str(sub / WEIGHTS))
        cfg = {"expansion_factor": max(c.d_sae // c.d_in, 1), "normalize_decoder": False, "num_latents": c.d_sae,
               "k": c.k, "activation": c.activation, "multi_topk": False, "skip_connection": c.skip,
               "transcode": True, "d_in": c.d_in, "layer": layer, "d_out": c.d_out,
               "dtype": str(tc.W_dec.dtype).removeprefix("torch."), "source": c.source, "target": c.target}
        cfg |= {k: v for k, v in (("model_name", c.base_model), ("model_fingerprint", c.model_fingerprint)) if v}
        cfg |= {} if c.skip_first is None else {"skip_first": c.skip_first}
        (sub / CONFIG).write_text(json.dumps(cfg))
    run = {"model": tcs.provenance.base_model or "", "hookpoints": hookpoints, "transcode": True,
           "sae": {"k": tcs[tcs.layers[0]].k, "num_latents": tcs.d_sae, "transcode": True}}
    (folder / RUN_CONFIG).write_text(json.dumps(run))
    return folder
