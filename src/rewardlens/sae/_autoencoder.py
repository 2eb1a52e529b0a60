"""A TopK sparse autoencoder, saved and loaded in EleutherAI sparsify's layout (SAELens' too).

`x ≈ x̂ = Σ_i f_i d_i + b_dec` with `f = TopK(ReLU(W_enc (x − b_dec) + b_enc))` (Gao et al. 2024):
exactly `k` latents are kept per activation, the decoder rows `d_i` (`W_dec` [n_latents, d]) are
kept at unit norm, and an auxiliary loss (AuxK) lets latents that stopped firing learn to predict
what the live ones miss. The module's parameter names are sparsify's (`encoder.weight`,
`encoder.bias`, `W_dec`, `b_dec`), so its state dict *is* sparsify's `sae.safetensors`.

On disk (one folder per hook point, as sparsify and the published SAEs of Llama-3-8B use):
- sparsify: `cfg.json` (the `SAEConfig` fields plus `d_in`) and `sae.safetensors`;
- SAELens: `cfg.json` (`architecture: "topk"`, `d_in`, `d_sae`, `k`) and `sae_weights.safetensors`
  holding `W_enc` [d, n] (the transpose of ours), `b_enc`, `W_dec`, `b_dec`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import DataError, UsageError
from ._provenance import Provenance, read_provenance

SPARSIFY_WEIGHTS, SAELENS_WEIGHTS, CONFIG = "sae.safetensors", "sae_weights.safetensors", "cfg.json"


@dataclass
class SAEConfig:
    """Architecture of a TopK SAE: the fields, names and defaults of sparsify's `SparseCoderConfig`."""

    expansion_factor: int = 32
    """Latents per input dimension, used when `num_latents` is 0."""
    normalize_decoder: bool = True
    """Keep every decoder row at unit norm during training."""
    num_latents: int = 0
    """Number of latents; 0 means `expansion_factor × d_in`."""
    k: int = 32
    """Latents kept active per activation (the top k of the ReLU'd pre-activations)."""
    activation: str = "topk"
    """Sparsifying activation; rewardlens reads 'topk' only (sparsify also has 'groupmax')."""
    multi_topk: bool = False
    """sparsify's Multi-TopK training loss; accepted on load, not used by rewardlens' trainer."""
    skip_connection: bool = False
    """A linear skip term `W_skip x`; refused: the reward would not split into latents alone."""
    transcode: bool = False
    """Predict a module's output from its input; refused: rewardlens reads autoencoders only."""

    def __post_init__(self) -> None:
        if self.k < 1:
            raise UsageError(f"k must be at least 1, got {self.k}", option="k")
        if self.num_latents < 0:
            raise UsageError(f"num_latents must be >= 0 (0: use expansion_factor), got {self.num_latents}",
                             option="num_latents")
        if self.num_latents == 0 and self.expansion_factor < 1:
            raise UsageError(f"expansion_factor must be >= 1 when num_latents is 0, got {self.expansion_factor}",
                             option="expansion_factor")
        if self.num_latents and self.k > self.num_latents:
            raise UsageError(f"k={self.k} exceeds num_latents={self.num_latents}; lower k or add latents", option="k")
        if self.activation != "topk":
            raise UsageError(f"activation must be 'topk', got {self.activation!r}; groupmax SAEs are not supported")
        if self.skip_connection or self.transcode:
            what = "skip_connection=True" if self.skip_connection else "transcode=True"
            raise UsageError(
                f"{what}: rewardlens reads autoencoders whose output is Σ f_i d_i + b_dec only; "
                "a skip term or a transcoder would leave part of the reward outside the latents (a transcoder "
                "folder loads with rewardlens.sae.load_transcoders)"
            )

    def latents(self, d_in: int) -> int:
        return self.num_latents or self.expansion_factor * d_in

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> SAEConfig:
        """Read a sparsify cfg.json dict, ignoring keys this version does not know (as sparsify does)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in cfg.items() if k in names})


class SAEOutput(NamedTuple):
    """One forward: reconstruction [N, d], top-k values and indices [N, k], FVU and AuxK losses (scalars)."""

    x_hat: Tensor
    acts: Tensor
    indices: Tensor
    fvu: Tensor
    auxk: Tensor


class TopKSAE(nn.Module):
    """TopK sparse autoencoder on `d_in`-wide activations (see the module docstring).

    Built untrained with `TopKSAE(d_in, cfg, seed=...)`, or read with `TopKSAE.load(folder)`.
    `folder` records where a loaded SAE came from (its name is the hook point, by convention);
    `provenance` what it claims (hook point, width, latents, dtype, base model: `Provenance`).
    """

    def __init__(self, d_in: int, cfg: SAEConfig | None = None, *, seed: int | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.cfg, self.d_in = cfg or SAEConfig(), int(d_in)
        n = self.cfg.latents(self.d_in)
        if self.cfg.k > n:
            raise UsageError(f"k={self.cfg.k} exceeds the {n} latents of this SAE; lower k or raise expansion_factor",
                             option="k")
        self.encoder = nn.Linear(self.d_in, n, device=device, dtype=dtype)
        self.W_dec = nn.Parameter(torch.empty(n, self.d_in, device=device, dtype=dtype))
        self.b_dec = nn.Parameter(torch.zeros(self.d_in, device=device, dtype=dtype))
        self.folder: Path | None = None
        self.provenance = Provenance(format="memory", d_in=self.d_in, n_latents=n, k=self.cfg.k,
                                     dtype=str(dtype).removeprefix("torch."))
        if torch.device(device or "cpu").type == "meta":  # `load` assigns the weights; drawing them is waste
            return
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        bound = 1 / self.d_in**0.5  # nn.Linear's own init, drawn from our generator for reproducibility
        with torch.no_grad():
            self.encoder.weight.copy_(torch.empty(n, self.d_in).uniform_(-bound, bound, generator=gen))
            self.encoder.bias.zero_()
            # The decoder starts as the encoder's transpose (sparsify, Gao et al.), rows at unit norm.
            self.W_dec.copy_(self.encoder.weight)
        if self.cfg.normalize_decoder:
            self.normalize_decoder_()

    @property
    def n_latents(self) -> int:
        return self.W_dec.shape[0]

    @property
    def k(self) -> int:
        return self.cfg.k

    # ---- the autoencoder ----------------------------------------------------------------------
    def pre_acts(self, x: Tensor) -> Tensor:
        """ReLU'd encoder outputs [N, n_latents] for activations `x` [N, d] (cast to the SAE's dtype)."""
        return F.relu(F.linear(x.to(self.b_dec.dtype) - self.b_dec, self.encoder.weight, self.encoder.bias))

    def encode(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Top-k latent values and indices, both [N, k], for `x` [N, d]; values are >= 0."""
        return self.pre_acts(x).topk(self.k, dim=-1, sorted=False)

    def decode(self, acts: Tensor, indices: Tensor) -> Tensor:
        """`Σ_i f_i d_i + b_dec` [N, d] from top-k values and indices [N, k]."""
        weights = acts.to(self.W_dec.dtype)
        return F.embedding_bag(indices, self.W_dec, per_sample_weights=weights, mode="sum") + self.b_dec

    def codes(self, x: Tensor) -> Tensor:
        """Dense latent activations `f` [N, n_latents] (zero outside each row's top k)."""
        acts, idx = self.encode(x)
        return torch.zeros(x.shape[0], self.n_latents, dtype=acts.dtype, device=acts.device).scatter_(-1, idx, acts)

    def forward(self, x: Tensor, dead_mask: Tensor | None = None) -> SAEOutput:
        """Encode and decode `x` [N, d]; losses are normalised by the batch's total variance.

        `fvu = ‖x − x̂‖² / ‖x − mean(x)‖²`. With a boolean `dead_mask` [n_latents], AuxK: the top
        `d/2` dead latents (by pre-activation) reconstruct the error `x − x̂` through the decoder
        without bias (Gao et al. 2024, App. B.1), scaled down when fewer than `d/2` are dead.
        """
        x = x.to(self.b_dec.dtype)
        centred = x - self.b_dec
        with torch.no_grad():  # the selection; gradients flow through the selected latents only
            pre = F.relu(F.linear(centred, self.encoder.weight, self.encoder.bias))
            top = pre.topk(self.k, dim=-1, sorted=False)
        acts = _SelectedLatents.apply(centred, self.encoder.weight, self.encoder.bias, top.values, top.indices)
        idx = top.indices
        x_hat = self.decode(acts, idx)
        err = x - x_hat
        total = (x - x.mean(0)).pow(2).sum().clamp_min(torch.finfo(x.dtype).tiny)
        auxk = x.new_zeros(())
        n_dead = int(dead_mask.sum()) if dead_mask is not None else 0
        if n_dead and dead_mask is not None:
            k_aux = min(self.d_in // 2, n_dead)
            with torch.no_grad():
                aux = torch.where(dead_mask[None], pre, -torch.inf).topk(max(k_aux, 1), dim=-1, sorted=False)
            aux_acts = _SelectedLatents.apply(centred, self.encoder.weight, self.encoder.bias,
                                              aux.values.clamp_min(0), aux.indices)
            e_hat = F.embedding_bag(aux.indices, self.W_dec, per_sample_weights=aux_acts, mode="sum")
            scale = min(n_dead / max(self.d_in // 2, 1), 1.0)
            auxk = scale * (e_hat - err.detach()).pow(2).sum() / total
        return SAEOutput(x_hat, acts, idx, err.pow(2).sum() / total, auxk)

    @torch.no_grad()
    def normalize_decoder_(self) -> None:
        """Scale every decoder row to unit norm, in place."""
        self.W_dec.div_(self.W_dec.norm(dim=1, keepdim=True) + torch.finfo(self.W_dec.dtype).eps)

    @torch.no_grad()
    def remove_parallel_grad_(self) -> None:
        """Project each decoder row's gradient off the row, so a step moves along the unit sphere."""
        if self.W_dec.grad is not None:
            along = (self.W_dec.grad * self.W_dec).sum(1, keepdim=True)
            self.W_dec.grad -= along * self.W_dec

    # ---- disk ---------------------------------------------------------------------------------
    def save(self, folder: str | Path) -> Path:
        """Write sparsify's layout: `cfg.json` (config + `d_in`, and the provenance rewardlens knows:
        `hook_point`, `model_name`, `model_fingerprint`, `positions`) and `sae.safetensors`."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, str(folder / SPARSIFY_WEIGHTS))
        (folder / CONFIG).write_text(json.dumps({**asdict(self.cfg), "d_in": self.d_in, **self.provenance.record()}))
        return folder

    def save_saelens(self, folder: str | Path, *, hook_name: str = "") -> Path:
        """Write SAELens' layout: `cfg.json` and `sae_weights.safetensors` with `W_enc` [d, n]."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        cpu = lambda t: t.detach().contiguous().cpu()
        save_file({"W_enc": cpu(self.encoder.weight.T), "b_enc": cpu(self.encoder.bias), "W_dec": cpu(self.W_dec),
                   "b_dec": cpu(self.b_dec)}, str(folder / SAELENS_WEIGHTS))
        cfg = {"architecture": "topk", "d_in": self.d_in, "d_sae": self.n_latents, "k": self.k,
               "activation_fn_str": "topk", "activation_fn_kwargs": {"k": self.k}, "apply_b_dec_to_input": True,
               "normalize_activations": "none", "dtype": str(self.b_dec.dtype).removeprefix("torch."),
               "hook_name": hook_name or self.provenance.hook or ""}
        if self.provenance.base_model:
            cfg["model_name"] = self.provenance.base_model
        (folder / CONFIG).write_text(json.dumps(cfg))
        return folder

    @classmethod
    def load(cls, path: str | Path, hookpoint: str | None = None, *, device: torch.device | str = "cpu",
             dtype: torch.dtype = torch.float32) -> TopKSAE:
        """Read a sparsify or SAELens folder, or the `hookpoint` subfolder of a parent (a whole release).

        A parent holding exactly one SAE folder needs no `hookpoint`. Weights are cast to `dtype`
        (fp32 by default, whatever they were stored in: published SAEs are often bf16).
        """
        from safetensors.torch import load_file

        folder = find_folder(Path(path), hookpoint)
        try:
            cfg_dict = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
        except ValueError as e:  # JSON or UTF-8: a damaged file is bad input, not a bug
            raise DataError(f"{folder / CONFIG} is not valid JSON ({e}); save or fetch the SAE again") from None
        if (folder / SPARSIFY_WEIGHTS).is_file():
            file = folder / SPARSIFY_WEIGHTS
            d_in, cfg = cfg_dict.get("d_in"), SAEConfig.from_dict(cfg_dict)
            tensors = load_file(str(file))
            stored = str(tensors["W_dec"].dtype).removeprefix("torch.") if "W_dec" in tensors else ""
            _need(tensors, ("encoder.weight", "encoder.bias", "W_dec", "b_dec"), file)
            if "W_skip" in tensors:
                raise DataError(f"{file} holds W_skip (a skip connection); rewardlens reads plain autoencoders only")
            enc_w, enc_b = tensors["encoder.weight"], tensors["encoder.bias"]
        elif (folder / SAELENS_WEIGHTS).is_file():
            file = folder / SAELENS_WEIGHTS
            d_in, cfg = cfg_dict.get("d_in"), _saelens_config(cfg_dict, folder)
            tensors = load_file(str(file))
            stored = str(tensors["W_dec"].dtype).removeprefix("torch.") if "W_dec" in tensors else ""
            _need(tensors, ("W_enc", "b_enc", "W_dec", "b_dec"), file)
            enc_w, enc_b = tensors["W_enc"].T.float(), tensors["b_enc"].float()
            if not cfg_dict.get("apply_b_dec_to_input", True):
                # W_enc x + b_enc = W_enc (x − b_dec) + (b_enc + W_enc b_dec): fold, so encode() stays one rule.
                enc_b = enc_b + enc_w @ tensors["b_dec"].float()
        else:
            raise DataError(
                f"{folder} has {CONFIG} but neither {SPARSIFY_WEIGHTS} (sparsify) nor {SAELENS_WEIGHTS} (SAELens); "
                "copy the weights file next to cfg.json"
            )
        if not isinstance(d_in, int):
            raise DataError(f"{folder / CONFIG} has no integer d_in (got {d_in!r}); it is not an SAE config")
        n = enc_w.shape[0]
        cfg.num_latents = n  # the weights decide, whatever expansion_factor says
        expected = {"encoder weight": (n, d_in), "encoder bias": (n,), "W_dec": (n, d_in), "b_dec": (d_in,)}
        found = {"encoder weight": tuple(enc_w.shape), "encoder bias": tuple(enc_b.shape),
                 "W_dec": tuple(tensors["W_dec"].shape), "b_dec": tuple(tensors["b_dec"].shape)}
        bad = {k: v for k, v in found.items() if v != expected[k]}
        if bad:
            raise DataError(f"{file}: shapes {bad} do not match d_in={d_in} and {n} latents (expected {expected})")
        if file.name == SAELENS_WEIGHTS and cfg_dict.get("rescale_acts_by_decoder_norm"):
            # SAELens scales each latent by its decoder row's norm before the top-k: fold it in, as SAELens does.
            enc_w, enc_b, tensors["W_dec"] = fold_decoder_norm(enc_w, enc_b, tensors["W_dec"])
        sae = cls(d_in, cfg, device="meta")
        sae.load_state_dict({"encoder.weight": enc_w, "encoder.bias": enc_b, "W_dec": tensors["W_dec"],
                             "b_dec": tensors["b_dec"]}, assign=True)
        sae = sae.to(device=device, dtype=dtype)
        sae.folder = folder
        fmt = "sparsify" if file.name == SPARSIFY_WEIGHTS else "saelens"
        sae.provenance = read_provenance(folder, cfg_dict, fmt, d_in, n, cfg.k, stored)
        return sae


class _SelectedLatents(torch.autograd.Function):
    """`ReLU(W x + b)` at the selected latents `indices` [N, k], given their values; the backward
    touches only those latents (a sparse [n, N] × [N, d] product instead of a dense one: the
    encoder's weight gradient would otherwise cost as much as its forward, for k ≪ n nonzeros)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, _bias: Tensor, values: Tensor, indices: Tensor) -> Tensor:
        # The bias is an input only so autograd routes its gradient (backward's grad_b): `values` already
        # include it. `apply` passes every input positionally.
        ctx.save_for_backward(x, weight, values, indices)
        return values.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor, None, None]:
        x, weight, values, indices = ctx.saved_tensors
        g = grad * (values > 0)  # ReLU
        n, N = weight.shape[0], x.shape[0]
        rows = torch.arange(N, device=x.device)[:, None].expand_as(indices)
        sparse = torch.sparse_coo_tensor(torch.stack([indices.flatten(), rows.flatten()]), g.flatten(), (n, N),
                                         check_invariants=False)  # built from valid indices just above
        grad_x = F.embedding_bag(indices, weight, per_sample_weights=g, mode="sum") if ctx.needs_input_grad[0] else None
        grad_w = torch.sparse.mm(sparse, x) if ctx.needs_input_grad[1] else None
        grad_b = torch.zeros_like(weight[:, 0]).index_add_(0, indices.flatten(), g.flatten())
        return grad_x, grad_w, grad_b, None, None


def fold_decoder_norm(enc_w: Tensor, enc_b: Tensor, w_dec: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """SAELens' `fold_W_dec_norm` for a TopK SAE saved with `rescale_acts_by_decoder_norm: true`.

    Such an SAE encodes `f = TopK(ReLU(n ⊙ (W_enc (x − b_dec) + b_enc)))` with `n_i = ‖d_i‖` and decodes
    `Σ_i (f_i / n_i) d_i + b_dec`. With encoder row `i` and bias `i` scaled by `n_i` and `d_i` by `1/n_i`
    the plain rule (`encode`, `decode`) gives the same `f` and the same reconstruction, with unit decoder
    rows. Computed in float64; a zero decoder row (the latent never writes) stays zero, its encoder row
    and bias too (SAELens' latent is then 0 before the top-k as well).
    """
    norm = w_dec.double().norm(dim=1)
    scale = torch.where(norm > 0, 1 / norm.clamp_min(torch.finfo(torch.float64).tiny), torch.zeros_like(norm))
    return enc_w.double() * norm[:, None], enc_b.double() * norm, w_dec.double() * scale[:, None]


def _need(tensors: dict[str, Tensor], keys: tuple[str, ...], file: Path) -> None:
    missing = [k for k in keys if k not in tensors]
    if missing:
        raise DataError(f"{file} lacks {missing} (it holds {sorted(tensors)}); expected {list(keys)}")


def _saelens_config(cfg: dict[str, Any], folder: Path) -> SAEConfig:
    arch, act = cfg.get("architecture"), cfg.get("activation_fn_str")
    kwargs = cfg.get("activation_fn_kwargs") or {}
    k = cfg.get("k", kwargs.get("k"))
    if not (arch == "topk" or act == "topk") or k is None:
        raise DataError(
            f"{folder / CONFIG}: SAELens architecture {arch!r} (activation {act!r}) is not a TopK SAE with a k; "
            "rewardlens reads TopK SAEs"
        )
    norm = cfg.get("normalize_activations") or "none"
    if norm != "none":
        raise DataError(
            f"{folder / CONFIG}: normalize_activations={norm!r} rescales inputs before encoding; rewardlens reads "
            "SAEs on raw activations (normalize_activations='none')"
        )
    return SAEConfig(k=int(k), num_latents=int(cfg.get("d_sae", 0)))


def find_folder(path: Path, hookpoint: str | None = None) -> Path:
    """The SAE folder at `path`, at `path/hookpoint`, or the only SAE folder inside `path`."""
    if not path.exists():
        raise DataError(f"SAE path {path} does not exist")
    if hookpoint is not None:
        if (path / hookpoint / CONFIG).is_file():
            return path / hookpoint
        raise DataError(f"{path} has no SAE folder {hookpoint!r} (with {CONFIG}); it holds {sae_folders(path)}")
    if (path / CONFIG).is_file():
        return path
    found = sae_folders(path)
    if len(found) == 1:
        return path / found[0]
    if not found:
        raise DataError(
            f"{path} has no {CONFIG} and no SAE subfolder; expected a folder with {CONFIG} + {SPARSIFY_WEIGHTS} "
            f"(sparsify) or {CONFIG} + {SAELENS_WEIGHTS} (SAELens)"
        )
    raise DataError(f"{path} holds SAEs for several hook points {found}; name one (hookpoint= or --layer)")


def sae_folders(path: Path) -> list[str]:
    """Names of the subfolders of `path` that hold a cfg.json, sorted."""
    return sorted(p.name for p in path.iterdir() if (p / CONFIG).is_file()) if path.is_dir() else []


def load_sae(path: str | Path, hookpoint: str | None = None, *, device: torch.device | str = "cpu",
             dtype: torch.dtype = torch.float32) -> TopKSAE:
    """`TopKSAE.load`: a sparsify or SAELens folder, or `hookpoint` inside a parent folder."""
    return TopKSAE.load(path, hookpoint, device=device, dtype=dtype)
