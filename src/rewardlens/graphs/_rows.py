"""Rows of the attribution graph's adjacency: every source's direct effect on a batch of targets at once.

A target is the reward (its read-out vector `u` at the read position `t*`: `r = u · x_L[t*] + c`) or a
feature's pre-activation (its encoder vector at its MLP's input and position). Because the frozen model
is affine in its sources, one backward pass with a batch of cotangents (`is_grads_batched`) gives each
target's gradient with respect to every source leaf; a source's edge is its value times that gradient:
`a_f · (W_dec[f] · g_l[p])` for a feature, `err_l[p] · g_l[p]` for an error, `e[p] · g_0[p]` for a token.

Columns are laid out as circuit-tracer lays out its adjacency: every active feature (layer by layer,
in the basis' order), then the error nodes (layer-major, then position), then the tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ._frozen import Frozen, Run


@dataclass(frozen=True)
class Target:
    """One row: the reward (`layer` = -1) or feature `index` (into the layer's active set) of `layer`."""

    layer: int
    index: int = -1


class Rows:
    """Computes rows for one frozen run; knows the column layout (module docstring)."""

    def __init__(self, frozen: Frozen, run: Run, u: Tensor, read_at: int) -> None:
        self.frozen, self.run, self.u, self.read_at = frozen, run, u, read_at
        self.basis = frozen.basis
        self.layers = list(range(frozen.model.n_layers))
        self.counts = [len(self.basis.active[layer]) for layer in self.layers]
        self.offsets = [sum(self.counts[:i]) for i in range(len(self.counts) + 1)]
        self.n_features = self.offsets[-1]
        self.length = run.embed_delta.shape[1]
        self.n_errors = len(self.layers) * self.length
        self.n_columns = self.n_features + self.n_errors + self.length

    def column(self, layer: int, index: int) -> int:
        """The column of feature `index` of `layer`'s active set."""
        return self.offsets[layer] + index

    def feature_of(self, column: int) -> Target:
        layer = next(i for i in self.layers if self.offsets[i + 1] > column)
        return Target(layer, column - self.offsets[layer])

    def __call__(self, targets: list[Target]) -> Tensor:
        """Rows [len(targets), n_columns] (fp32): each target's incoming edges from every source."""
        run, basis, n = self.run, self.basis, len(targets)
        outputs: list[Tensor] = []
        cotangents: list[Tensor] = []
        by_layer: dict[int, list[int]] = {}
        for b, t in enumerate(targets):
            by_layer.setdefault(t.layer, []).append(b)
        for layer, rows in by_layer.items():
            tensor = run.final if layer < 0 else run.targets[layer]
            assert tensor is not None
            cot = torch.zeros_like(tensor)  # row b carries target b; rows past the batch stay 0
            rows_t = torch.tensor(rows, device=tensor.device)
            if layer < 0:
                cot[rows_t, self.read_at] = self.u.to(cot.dtype)
            else:
                act = basis.active[layer]
                index = torch.tensor([targets[b].index for b in rows], device=tensor.device)
                cot[rows_t, act.pos[index]] = basis.inject(layer, act.ids[index]).to(cot.dtype)
            outputs.append(tensor)
            cotangents.append(cot)
        leaves = [run.embed_delta, *(run.deltas[layer] for layer in self.layers)]
        got = torch.autograd.grad(outputs, leaves, cotangents, retain_graph=True, allow_unused=True)
        grads = [None if g is None else g[:n] for g in got]
        embed = self.frozen.embed0
        assert embed is not None
        features, errors = [], []
        for layer in self.layers:  # no gradient: every target sits at or below this layer, its edges are 0
            g = grads[1 + layer]
            features.append(basis.feature_edges(layer, g) if g is not None else self._zeros(n, self.counts[layer]))
            errors.append(basis.error_edges(layer, g) if g is not None else self._zeros(n, self.length))
        token_grad = grads[0]
        tokens = (torch.einsum("btd,td->bt", token_grad.float(), embed.float()[0]) if token_grad is not None
                  else self._zeros(n, self.length))
        return torch.cat([*features, *errors, tokens], dim=1).detach()

    def _zeros(self, n: int, width: int) -> Tensor:
        return torch.zeros(n, width, device=self.run.embed_delta.device)
