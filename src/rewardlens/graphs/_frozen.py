"""The local replacement model of one sequence: the model's own forward, hooked to be affine in its sources.

Everything is frozen at this input by hooks on the user's modules (removed on exit; nothing of the model
changes, no layer is re-implemented):

- attention patterns: every attention kernel the model fetches from transformers' `AttentionInterface`
  is called with the queries and keys of the first run, detached, so `softmax(q·k)` is a constant and
  the kernel's output is linear in its values. Attention outside that interface (DeBERTa-v2, whose map
  names `attn_values`) is frozen one step earlier: every call of the query and key projections
  (`attn_q`, `attn_k`; DeBERTa also projects its relative embeddings through them) returns the first
  run's output, detached, so every score (content and relative) is a constant and the context is linear
  in the values;
- norm scales: every norm module's output becomes `y₀ + J (x − x₀)`, `J = diag(γ s₀)` (RMS) or
  `diag(γ s₀) C` (LayerNorm) — the module's own output at `x₀`, its frozen-scale map elsewhere
  (model/_norms.py's `NormParams`, checked against the module's output on the spot);
- every MLP: replaced by its basis (graphs/_basis.py) — a transcoder's feature writes and error, or the
  MLP's neurons with their gates frozen.

The sources — token embeddings (layer 0's input), feature writes and errors — enter as their values
plus a zero leaf `delta`, so the gradient of a target with respect to `delta` is that target's row of
the Jacobian. The graph run holds `copies` identical rows (circuit-tracer's batching): one backward pass
then serves `copies` targets, row b carrying target b's cotangent. The copies' forward runs on the weights
detached (`torch.func.functional_call`: autograd then keeps no layer's input for a weight gradient), and
its query and key projections compute one row (their outputs are frozen). A second run with every source at
zero (`zero=True`, one row) gives each target's constant: what biases alone produce through the frozen model.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from ..errors import ArchitectureError
from ..model import RewardModel
from ..model.internal import Batch, eval_mode, first_output, get_module, hidden_arg
from ._norm_freeze import NormFreezer
from ._pattern import Patterns

Output = Tensor | tuple[Any, ...] | list[Any]


@dataclass
class Run:
    """One run of the frozen model: the source leaves and the tensors targets read."""

    embed_delta: Tensor
    """[B, T, d] zero leaf added to layer 0's input (the embeddings' source)."""
    deltas: dict[int, Tensor] = field(default_factory=dict)
    """Per layer, the basis' zero source leaf (MLP output [B, T, d], or neuron activations [B, T, m])."""
    targets: dict[int, Tensor] = field(default_factory=dict)
    """Per layer, the tensor feature pre-activations are read from (MLP input, or linearised activations)."""
    final: Tensor | None = None
    """[B, T, d] the residual the head reads (the final norm's input)."""


def check_model(model: RewardModel) -> None:
    """Refuse, in one line, a model whose forward these hooks cannot freeze: attention outside transformers'
    `AttentionInterface` (the map names `attn_values`) whose map names no separate query and key projections."""
    arch = model.arch
    if by_projection(model) and (arch.attn_q is None or arch.attn_k is None):
        raise ArchitectureError(
            f"{arch.name!r}'s attention does not go through transformers' AttentionInterface (its map names "
            f"attn_values={arch.attn_values!r}), so attribution graphs freeze its pattern at the query and key "
            f"projections, but the map names attn_q={arch.attn_q!r}, attn_k={arch.attn_k!r}; register a map "
            "naming both (docs/architectures.md)")


def by_projection(model: RewardModel) -> bool:
    """Whether the attention pattern is frozen at the query and key projections (attention outside
    transformers' `AttentionInterface`, DeBERTa-v2) rather than at the kernel's queries and keys."""
    return model.arch.attn_values is not None


class Frozen:
    """The hooks that freeze one sequence's forward, and the values its first run recorded."""

    def __init__(self, model: RewardModel, batch: Batch, basis: Any) -> None:
        check_model(model)
        self.model, self.batch, self.basis = model, batch, basis
        self.norms = NormFreezer(model)
        self.qk: dict[tuple[int, int], tuple[Tensor, Tensor]] = {}
        self.projected: dict[tuple[int, int], Tensor] = {}
        """Attention outside `AttentionInterface`: each query/key projection call's first-run output [1, ...]."""
        self.patterns = Patterns()
        """Attention through `AttentionInterface`: each call's pattern as a matrix, read on the first run."""
        self._rows: dict[int, int] = {}
        """Per query/key projection module, the rows of the call under way (its input is cut to one row)."""
        self.embed0: Tensor | None = None
        self.first = True
        self._calls: dict[int, int] = {}

    def _call(self, module: nn.Module) -> tuple[int, int]:
        """(module id, how many times it was called before in this run): a frozen value's key."""
        n = self._calls.get(id(module), 0)
        self._calls[id(module)] = n + 1
        return id(module), n

    def forward(self, zero: bool = False, copies: int = 1) -> Run:
        """Run the frozen model once on `copies` rows of the sequence (with autograd on unless `zero`),
        returning its leaves and targets."""
        model, batch = self.model, _copies(self.batch, copies)
        dtype = next(model.model.parameters()).dtype
        length = batch.input_ids.shape[1]
        delta = torch.zeros(copies, length, model.d_model, device=model.device, dtype=dtype, requires_grad=not zero)
        run = Run(embed_delta=delta)
        self._calls = {}
        with contextlib.ExitStack() as stack:
            stack.enter_context(eval_mode(model.model))
            stack.enter_context(torch.set_grad_enabled(not zero))
            if not by_projection(model):  # else the query/key projections' hooks (`_hooks`) freeze the pattern
                stack.enter_context(self._attention())
            stack.enter_context(_hooked(self._hooks(run, zero)))
            # the weights detached: autograd then keeps no layer's input for a weight gradient nobody asks for
            # (only the source leaves' are); the user's parameters are swapped back on return, untouched
            weights = {name: p.detach() for name, p in model.backbone.named_parameters()}
            torch.func.functional_call(model.backbone, weights, args=(), kwargs=model.batch_kwargs(batch))
        if self.first and by_projection(model) and not self.projected:
            raise ArchitectureError(
                f"{model.arch.name!r} never called its query/key projections ({model.arch.attn_q!r}, "
                f"{model.arch.attn_k!r}), so its attention patterns cannot be frozen; fix the map's attn_q/attn_k")
        self.first = False
        return run

    def _hooks(self, run: Run, zero: bool) -> list[tuple[nn.Module, str, Callable[..., Any]]]:
        model = self.model
        hooks: list[tuple[nn.Module, str, Callable[..., Any]]] = [(model.layers[0], "pre", functools.partial(
            self._embed, run, zero))]
        for module in self.norms.modules:
            hooks.append((module, "post", functools.partial(self._norm, module)))
        arch = model.arch
        if arch.attn_q is not None and arch.attn_k is not None:  # always so by_projection (check_model)
            for layer in range(model.n_layers):
                for path in (arch.attn_q, arch.attn_k):
                    module = layer_module(model, layer, path)
                    hooks.append((module, "pre", functools.partial(self._one_row, module)))
                    hooks.append((module, "post", functools.partial(self._projection, module)))
        hooks += self.basis.hooks(run, zero)
        final = model.final_point(self.batch.read_at)
        hooks.append((final.module, "pre" if final.where == "in" else "post",
                      functools.partial(self._final, run, final.where)))
        return hooks

    def _embed(self, run: Run, zero: bool, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
        x = hidden_arg(args, kwargs)
        if self.first:
            self.embed0 = x.detach()[:1]
        assert self.embed0 is not None
        base = torch.zeros_like(self.embed0) if zero else self.embed0
        return base + run.embed_delta.to(base.dtype)

    def _final(self, run: Run, where: str, args: tuple[Any, ...], kwargs: dict[str, Any],
               out: Output | None = None) -> None:
        run.final = hidden_arg(args, kwargs) if where == "in" else first_output(out)  # type: ignore[arg-type]

    def _norm(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Output
              ) -> Tensor | None:
        x = hidden_arg(args, kwargs)
        if x.dim() < 3:
            # Every hidden state is [batch, T, ...]; an input without the batch dimension is a table of
            # parameters (DeBERTa-v2's LayerNorm of its relative embeddings, `rel_embeddings.weight` [2k, d]),
            # the same in every run and reached by no source, so the module's own output is already exact and
            # constant (and freezing it per row, `x[:1]`, would cut the table to its first row).
            return None
        key = self._call(module)
        return self.norms.frozen(module, key, x, first_output(out), self.first)

    def _one_row(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
        """A query or key projection computes the first row only, detached (`_projection` expands it back): every
        row is the same sequence, and the pattern is frozen, so no gradient flows through queries or keys."""
        x = hidden_arg(args, kwargs)
        if x.dim() < 3:  # not a hidden state [batch, T, d] (as `_norm`)
            return None
        self._rows[id(module)] = x.shape[0]
        return x.detach()[:1]

    def _projection(self, module: nn.Module, _args: tuple[Any, ...], _kwargs: dict[str, Any], out: Output
                    ) -> Tensor:
        """A query or key projection's output, computed on one row, expanded to the call's rows. Attention outside
        `AttentionInterface`: each call replaced by the first run's (detached), so the scores built from it, and
        the softmax over them, are constants (through the interface, `_attention` freezes them)."""
        y = first_output(out)
        rows = self._rows.pop(id(module), y.shape[0])
        if by_projection(self.model):
            key = self._call(module)
            if self.first:
                self.projected[key] = y.detach()[:1]
            y = self.projected[key]
        return y.expand(rows, *y.shape[1:])

    @contextlib.contextmanager
    def _attention(self) -> Iterator[None]:
        """Every attention kernel call gets the first run's queries and keys, detached: its pattern is fixed.
        Where the kernel's output is proven to be `P v` on the first run, later runs compute that matmul instead
        (graphs/_pattern.py: the backward is then `Pᵀ g` alone)."""
        from transformers.modeling_utils import AttentionInterface

        original = AttentionInterface.get_interface
        frozen, patterns = self, self.patterns

        def wrapped(kernel: Callable[..., Any], module: Any, query: Tensor, key: Tensor, value: Tensor,
                    *args: Any, **kwargs: Any) -> Any:
            slot = frozen._call(module)
            if frozen.first:
                frozen.qk[slot] = (query.detach()[:1], key.detach()[:1])
            q, k = (t.expand(value.shape[0], *t.shape[1:]) for t in frozen.qk[slot])
            return patterns(slot, frozen.first, kernel, module, q, k, value, *args, **kwargs)

        def get_interface(self: Any, impl: str, default: Callable[..., Any]) -> Callable[..., Any]:
            return functools.partial(wrapped, original(self, impl, default))

        AttentionInterface.get_interface = get_interface  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            AttentionInterface.get_interface = original  # type: ignore[method-assign]
        if self.first and not self.qk:
            raise ArchitectureError(
                f"{self.model.arch.name!r} called no attention kernel through transformers' AttentionInterface, so "
                "its attention patterns cannot be frozen; attribution graphs support models whose attention does")


@contextlib.contextmanager
def _hooked(hooks: list[tuple[nn.Module, str, Callable[..., Any]]]) -> Iterator[None]:
    """Register `(module, 'pre'|'post', fn)`: a pre-hook `fn(args, kwargs)` returning the new hidden input (or
    None), a post-hook `fn(args, kwargs, out)` returning the new hidden output (or None). Removed on exit."""

    def pre(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        new = fn(args, kwargs)
        if new is None:
            return None
        return ((new, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": new})

    def post(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], out: Output) -> Any:
        new = fn(args, kwargs, out)
        if new is None:
            return None
        return (new, *out[1:]) if isinstance(out, tuple) else new

    handles: list[RemovableHandle] = []
    try:
        for module, where, fn in hooks:
            if where == "pre":
                handles.append(module.register_forward_pre_hook(
                    lambda _m, a, k, fn=fn: pre(fn, a, k), with_kwargs=True))
            else:
                handles.append(module.register_forward_hook(
                    lambda _m, a, k, o, fn=fn: post(fn, a, k, o), with_kwargs=True))
        yield
    finally:
        for handle in handles:
            handle.remove()


def _copies(batch: Batch, copies: int) -> Batch:
    """`batch` (one row) repeated `copies` times."""
    if copies == 1:
        return batch
    def rep(t: Tensor) -> Tensor:
        return t.expand(copies, *t.shape[1:])

    types = None if batch.token_type_ids is None else rep(batch.token_type_ids)
    return replace(batch, input_ids=rep(batch.input_ids), attention_mask=rep(batch.attention_mask),
                   position_ids=rep(batch.position_ids), token_type_ids=types, read_at=batch.read_at.expand(copies))


def layer_module(model: RewardModel, layer: int, path: str) -> nn.Module:
    """A module inside layer `layer` by its path relative to the layer."""
    return get_module(model.layers[layer], path)
