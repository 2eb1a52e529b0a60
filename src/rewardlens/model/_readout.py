"""The reward head as exact, per-input affine rows, kept in fp32 on copies of the user's modules.

Every head rewardlens reads is affine in the final hidden state `h` once its non-linear parts
are frozen at their value on this input:
- linear (`score`): `r = W h + b`;
- pooler (BERT, DeBERTa-v2): `r = W_c act(W_p h + b_p) + b_c`; writing `act(z) = g ⊙ z` with the
  gain `g = act(z)/z` frozen gives rows `W_c diag(g) W_p` — exact at this input, like a frozen norm;
- gated (ArmoRM): `r = W h` per objective, combined by the prompt-dependent gate into
  `score = Σ_k g_k (r T)_k = r · (T g)`.
- LM-head rows (an LLM judge, a PRM that reads "+" against "−"): the difference of two vocabulary
  rows is a linear head with k = 2 and readout (1, −1); a soft-capped logit `c·tanh(z/c)` is read
  as `g·z` with the gain `g = c·tanh(z/c)/z` frozen;
- a log-probability (an implicit DPO reward): `log p(y) = z_y − log Σ_v exp z_v`; with this input's
  next-token distribution `p` frozen it is the affine row `β·(e_y − ē)·h − β·H`, exact, where
  `ē = Σ_v p_v e_v` is the mean row under `p` and `H` the entropy: the row is centred, so a write
  that moves every logit alike (and no probability) reads 0, and the constant is bounded by `β log V`.
A readout turns the k objective values into the scalar being explained.
"""

from __future__ import annotations

import copy
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np
import torch
from torch import Tensor, nn
from transformers.activations import ACT2FN

from ..errors import HeadError
from ..types import Readout
from ._arch import ArchitectureMap, get_module, hf_config
from ._norms import resident_fp32

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def _labels(config: PretrainedConfig, k: int) -> list[str]:
    """Objective names: config.objective_names, else id2label when it names all k outputs."""
    if k == 1:
        return ["reward"]
    names = getattr(config, "objective_names", None)
    if names and len(names) == k:
        return [str(n) for n in names]
    id2label = getattr(config, "id2label", None) or {}
    if len(id2label) == k:
        return [str(id2label[i]) for i in range(k)]
    return [f"objective_{i}" for i in range(k)]


def _linear(model: nn.Module, path: str, what: str) -> nn.Linear:
    module = get_module(model, path)
    if not isinstance(module, nn.Linear):
        raise HeadError(
            f"the {what} {path!r} is a {type(module).__name__}, not nn.Linear; rewardlens decomposes "
            "heads of the form r = W·h + b exactly. For a non-linear head, register a map whose head "
            "points at its final linear layer and treat the rest as part of the backbone."
        )
    return module


@dataclass
class Head:
    """fp32 head: `weight` [k, d], `bias` [k], optional pooler, gate and fixed readout [k]."""

    weight: Tensor
    bias: Tensor
    labels: list[str]
    readout: Tensor | None = None
    pooler_weight: Tensor | None = None
    pooler_bias: Tensor | None = None
    pooler_act: nn.Module | None = None
    gating: nn.Module | None = None
    transform: Tensor | None = None
    softcap: float | None = None
    """LM heads with soft-capped logits (Gemma-2/3): values are `c·tanh(z/c)`."""
    log_prob: bool = False
    """`weight` is the whole vocabulary [V, d] and the head reads `scale · log p(target)`."""
    scale: float = 1.0
    """The log-probability's factor (DPO's β)."""
    tokens: tuple[int, int] | None = None
    """LM heads read as two vocabulary rows: their token ids (the model's own logits keep all V)."""

    @classmethod
    def from_model(
        cls, model: nn.Module, arch: ArchitectureMap, readout: Readout, device: torch.device
    ) -> Head:
        def f32(t: Tensor) -> Tensor:
            return resident_fp32(t, device, "the reward head")

        config = hf_config(model)
        lin = _linear(model, arch.head, "reward head")
        k = lin.out_features
        bias = f32(lin.bias) if lin.bias is not None else torch.zeros(k, device=device)
        head = cls(f32(lin.weight), bias, _labels(config, k))
        if arch.head_kind == "pooler":
            assert arch.pooler is not None  # ArchitectureMap.__post_init__ requires it for pooler heads
            pooler = _linear(model, arch.pooler, "pooler dense layer")
            head.pooler_weight, head.pooler_bias = f32(pooler.weight), f32(pooler.bias)
            head.pooler_act = ACT2FN[getattr(config, "pooler_hidden_act", None) or arch.pooler_act]
        if arch.head_kind == "gated":
            assert arch.gate is not None  # ArchitectureMap.__post_init__ requires it for gated heads
            head.gating = copy.deepcopy(get_module(model, arch.gate)).to(device=device, dtype=torch.float32).eval()
            head.transform = f32(cast(Tensor, model.reward_transform_matrix))  # ArmoRM's frozen k×k Parameter
        head.readout = head._readout_vector(readout, arch)
        return head

    @classmethod
    def from_lm_head(
        cls, model: nn.Module, path: str, device: torch.device, *, tokens: tuple[int, int] | None = None,
        labels: list[str] | None = None, scale: float = 1.0,
    ) -> Head:
        """An LM head read as rows `tokens` (k = 2, readout +1/−1: their logits' difference), or, with
        `tokens=None`, as `scale · log p(target)` over the whole vocabulary (targets given per read)."""
        lin = _linear(model, path, "language-model head")
        cap = getattr(hf_config(model), "final_logit_softcapping", None)
        weight = lin.weight if tokens is None else lin.weight[list(tokens)]
        f32 = lambda t: resident_fp32(t, device, "the language-model head")  # noqa: E731
        k = weight.shape[0]
        bias = torch.zeros(k, device=device) if lin.bias is None else f32(
            lin.bias if tokens is None else lin.bias[list(tokens)])
        if tokens is None:
            return cls(f32(weight), bias, ["log_prob"], torch.ones(1, device=device), softcap=cap, log_prob=True,
                       scale=scale)
        return cls(f32(weight), bias, labels or [str(t) for t in tokens],
                   torch.tensor([1.0, -1.0], device=device), softcap=cap, tokens=tokens)

    def own(self, logits: Tensor, targets: Tensor | None = None) -> Tensor:
        """What the model's own output says this head reads, from its logits at the read rows [m, V]
        (LM and token-classification models; a sequence classifier's logits are the values): [m, k]."""
        logits = logits.float()
        if self.log_prob:
            picked = torch.log_softmax(logits, -1).gather(-1, self._targets(targets, logits)[:, None])
            return self.scale * picked
        return logits if self.tokens is None else logits[:, list(self.tokens)]

    @property
    def n_objectives(self) -> int:
        return 1 if self.log_prob else self.weight.shape[0]

    def _readout_vector(self, readout: Readout, arch: ArchitectureMap) -> Tensor | None:
        k = self.n_objectives
        if isinstance(readout, (bool, np.bool_)):
            raise HeadError(f"readout={readout!r} is a bool; pass an objective index, a label or {k} weights",
                            option="readout")
        if isinstance(readout, numbers.Integral):
            readout = int(readout)
        if readout is None:
            if k == 1 or arch.head_kind == "gated":
                return None if arch.head_kind == "gated" else torch.ones(1, device=self.weight.device)
            raise HeadError(
                f"the head has {k} outputs {self.labels} and no readout says which scalar to explain; "
                f"pass readout=<objective index or label> or readout=<list of {k} weights> to rewardlens.load",
                option="readout"
            )
        if isinstance(readout, str):
            if readout not in self.labels:
                raise HeadError(f"readout {readout!r} is not one of the head's labels {self.labels}", option="readout")
            readout = self.labels.index(readout)
        if isinstance(readout, int):
            if not 0 <= readout < k:
                raise HeadError(f"readout index {readout} out of range for a head with {k} outputs", option="readout")
            vec = torch.zeros(k)
            vec[readout] = 1.0
            return vec.to(self.weight.device)
        vec = torch.as_tensor(readout, dtype=torch.float32).flatten()
        if vec.numel() != k:
            raise HeadError(f"readout has {vec.numel()} weights but the head has {k} outputs {self.labels}",
                            option="readout")
        return vec.to(self.weight.device)

    def rows(self, h: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Exact affine map at `h` [n, d]: rows [n, k, d] and bias [n, k] with `head(h) = rows·h + bias`.
        A log-probability head reads token `targets` [n] at each row."""
        if self.log_prob:
            return self._log_prob_rows(h, self._targets(targets, h))
        rows, bias = self._affine_rows(h)
        if self.softcap is None:
            return rows, bias
        gain = _cap_gain(torch.einsum("nkd,nd->nk", rows, h) + bias, self.softcap)
        return rows * gain[..., None], bias * gain

    def _affine_rows(self, h: Tensor) -> tuple[Tensor, Tensor]:
        n = h.shape[0]
        pooler = self._pooler()
        if pooler is None:
            return self.weight.expand(n, -1, -1), self.bias.expand(n, -1)
        pooler_weight, pooler_bias, pooler_act = pooler
        z = h @ pooler_weight.T + pooler_bias
        a = pooler_act(z)
        safe = torch.where(z == 0, torch.ones_like(z), z)
        gain = torch.where(z == 0, torch.ones_like(z), a / safe)  # act(0)=0, so any gain is exact there
        scaled = self.weight[None] * gain[:, None, :]  # [n, k, d_pool]
        return scaled @ pooler_weight, scaled @ pooler_bias + self.bias

    def __call__(self, h: Tensor, targets: Tensor | None = None) -> Tensor:
        """Objective values [n, k] at final hidden states `h` [n, d] (the head's true function); a
        log-probability head reads token `targets` [n] at each row."""
        if self.log_prob:
            return self.scale * self._log_probs(h, self._targets(targets, h))[:, None]
        pooler = self._pooler()
        if pooler is not None:
            pooler_weight, pooler_bias, pooler_act = pooler
            h = pooler_act(h @ pooler_weight.T + pooler_bias)
        # A product and a sum per row, not a matrix product: BLAS may round two identical rows of one
        # batch differently (by row block), and two identical sequences must score identically.
        z = (h[:, None, :] * self.weight[None]).sum(-1) + self.bias
        return z if self.softcap is None else self.softcap * torch.tanh(z / self.softcap)

    def _targets(self, targets: Tensor | None, h: Tensor) -> Tensor:
        if targets is None or targets.shape[0] != h.shape[0]:
            raise HeadError(
                "a log-probability head reads one target token per read row; this instrument did not pass "
                "them (it does not support log-probability read-outs yet)")
        return targets.to(h.device)

    def _log_prob_rows(self, h: Tensor, targets: Tensor, chunk: int = 1024) -> tuple[Tensor, Tensor]:
        """rows [n, 1, d] `β·(g_y·e_y − ē)` and bias [n, 1] `β·(g_y·b_y − b̄ − H)`, exact at `h`: `ē = Σ_v p_v g_v e_v`
        and `b̄ = Σ_v p_v g_v b_v` are the mean row and bias under the next-token distribution `p`, `H` its entropy,
        with `p` and the soft-cap gains `g` frozen at `h`; computed `chunk` rows at a time, so [chunk, V] at most."""
        parts = [self._centred_rows(h[i:i + chunk], targets[i:i + chunk]) for i in range(0, h.shape[0], chunk)]
        rows, bias = torch.cat([r for r, _ in parts]), torch.cat([b for _, b in parts])
        return self.scale * rows[:, None], self.scale * bias[:, None]

    def _centred_rows(self, h: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """One chunk of `_log_prob_rows` before the scale β: rows [c, d], bias [c]."""
        z = h @ self.weight.T + self.bias
        gain = None if self.softcap is None else _cap_gain(z, self.softcap)
        capped = z if gain is None else gain * z
        p = torch.softmax(capped, -1)
        # Σ_v p_v·capped_v − LSE = −H: what the centring moves out of the rows into the constant.
        minus_entropy = (p * capped).sum(-1) - torch.logsumexp(capped, -1)
        weight = p if gain is None else p * gain  # each raw row's share of the mean row
        g_y = torch.ones_like(minus_entropy) if gain is None else gain.gather(-1, targets[:, None])[:, 0]
        rows = g_y[:, None] * self.weight[targets] - weight @ self.weight
        return rows, g_y * self.bias[targets] - weight @ self.bias + minus_entropy

    def _log_probs(self, h: Tensor, targets: Tensor, chunk: int = 1024) -> Tensor:
        """`log p(target)` [n] at `h` [n, d] over the (capped) logits, `chunk` rows at a time: the head's true
        function, which the frozen rows equal at `h` and which gradients flow through."""
        out = []
        for i in range(0, h.shape[0], chunk):
            z = h[i:i + chunk] @ self.weight.T + self.bias
            capped = z if self.softcap is None else self.softcap * torch.tanh(z / self.softcap)
            out.append(capped.gather(-1, targets[i:i + chunk, None])[:, 0] - torch.logsumexp(capped, -1))
        return torch.cat(out)

    def _pooler(self) -> tuple[Tensor, Tensor, nn.Module] | None:
        """(weight [d_pool, d], bias [d_pool], activation) of a pooler head, or None without a pooler."""
        if self.pooler_weight is None:
            return None
        assert self.pooler_bias is not None and self.pooler_act is not None  # from_model sets the pooler whole
        return self.pooler_weight, self.pooler_bias, self.pooler_act

    def coefficients(self, n: int, gate_hidden: Tensor | None = None) -> Tensor:
        """Readout weights [n, k] that turn objective values into the scalar reward."""
        if self.readout is not None:
            return self.readout.expand(n, -1)
        if gate_hidden is None:
            raise HeadError("a gated head needs the hidden state at the gate position")
        assert self.gating is not None and self.transform is not None  # a head without a readout is gated
        with torch.no_grad():
            gate = self.gating(gate_hidden)
        return gate @ self.transform.T


def _cap_gain(z: Tensor, cap: float) -> Tensor:
    """`g = c·tanh(z/c)/z`, so `c·tanh(z/c) = g·z` (1 at z = 0, where both sides are 0)."""
    safe = torch.where(z == 0, torch.ones_like(z), z)
    return torch.where(z == 0, torch.ones_like(z), cap * torch.tanh(z / cap) / safe)
