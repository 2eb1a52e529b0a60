"""Receivers: give one node an input that differs from the residual stream, the stream unchanged.

A *receiver* names a node's input: an attention sublayer's (`attn_L3`), an MLP's (`mlp_L2`), one
head's query, key and value inputs (`attn_L3_H1`) or one of them (`attn_L3_H1_q`), or the read-out
(`reward`, the final residual). `receiving` rewires the model's own forward so that the node reads
`x + δ` (δ [B, T, d] given per row and position) while every other node, and the residual stream
itself, still see `x`. No layer is re-implemented; three kinds of hook on the model's own modules do it:

- **add** `+δ` to the residual just upstream of the node: layer `l`'s input for attention (and for
  both sublayers of a parallel layout), the attention sublayer's write for a sequential MLP (its
  residual norm's output in a post-norm encoder);
- **cancel** `−δ` at the output of the module whose output the node's sublayer adds to the residual
  (`attn_post_norm` else `attn_out`, and likewise for the MLP; in a post-norm encoder that output
  enters the residual norm together with the `x + δ` the layer was given, so the sum is `x + f(x+δ)`);
- **freeze** at its clean output every module downstream of the added δ that must not see it: the
  sibling sublayer's write in a parallel layout, and for a head receiver the q/k/v projections,
  except the receiver head's columns of its chosen inputs (the model's own projection of `N(x+δ)`).

For a pre-norm layer `x + f(N(x))`: `(x + δ) + f(N(x + δ)) − δ = x + f(N(x + δ))`, exactly the
sublayer with another input and the stream unchanged (up to float rounding of `+δ − δ`).

`receiving_all` gives several receivers their own inputs in ONE forward (circuits): sublayer receivers
and the read-out by their add/cancel hooks (they add up), and the head receivers of a layer by one
merged hook per q/k/v projection: nothing is added to the stream, and head h's columns of projection
x's output are recomputed by the model's own input module and projection from `x + δ_h` (the
projection's other columns keep what the layer computed from the current stream).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor, nn

from ..errors import ArchitectureError, UsageError
from ..model import Part, RewardModel
from ..model.internal import Point, first_output, get_module, rewriting

ReceiverKind = Literal["attn", "mlp", "head", "reward"]
QKV = Literal["q", "k", "v"]
QKVS: tuple[QKV, ...] = get_args(QKV)
Hook = tuple[nn.Module, str, Callable[[Tensor], "Tensor | None"]]
"""A `rewriting` hook: (module, 'in' or 'out', the rewrite)."""


@dataclass(frozen=True)
class Receiver:
    """A node input: `kind` 'attn' or 'mlp' (the sublayer's input at `layer`), 'head' (head `head`'s
    query, key and value inputs, or only `input`), or 'reward' (the final residual the head reads)."""

    kind: ReceiverKind
    layer: int = 0
    head: int | None = None
    input: QKV | None = None

    def __post_init__(self) -> None:
        if self.kind not in get_args(ReceiverKind):
            raise UsageError(f"receiver kind must be one of {get_args(ReceiverKind)}, got {self.kind!r}")
        if (self.kind == "head") != (self.head is not None) or self.layer < 0:
            raise UsageError(f"a 'head' receiver needs head= (and only it), at a layer >= 0; got {self!r}")
        if self.input is not None and (self.kind != "head" or self.input not in QKVS):
            raise UsageError(f"input= is 'q', 'k' or 'v' of a 'head' receiver, got {self!r}")
        if self.kind == "reward" and self.layer:
            raise UsageError("the 'reward' receiver has no layer")

    @classmethod
    def reward(cls) -> Receiver:
        return cls("reward")

    @classmethod
    def parse(cls, name: str) -> Receiver:
        """The receiver a label names: 'reward', 'attn_L3', 'mlp_L2', 'attn_L3_H1', 'attn_L3_H1_q'."""
        if name == "reward":
            return cls.reward()
        base, _, suffix = name.rpartition("_")
        qkv = suffix if base and suffix in QKVS else None
        try:
            part = Part.parse(base if qkv else name)
        except ValueError:
            part = None
        if part is None or part.kind == "embed" or not (part.is_sublayer or part.head is not None) or (
                qkv and part.head is None):
            raise UsageError(f"{name!r} is not a receiver; receivers are 'reward', 'attn_L<l>', 'mlp_L<l>', "
                             "'attn_L<l>_H<h>' and 'attn_L<l>_H<h>_q' (or _k, _v)")
        if part.head is not None:
            return cls("head", part.layer, part.head, qkv)
        return cls(part.kind, part.layer)

    @property
    def part(self) -> Part | None:
        """The part whose input this is (the head's part for a head receiver); None for 'reward'."""
        if self.kind == "reward":
            return None
        return Part.attn(self.layer, self.head) if self.kind in ("attn", "head") else Part.mlp(self.layer)

    @property
    def name(self) -> str:
        part = self.part
        if part is None:
            return "reward"
        return part.name + (f"_{self.input}" if self.input else "")

    @property
    def inputs(self) -> tuple[QKV, ...]:
        """The projections whose receiver-head columns read `x + δ` (a head receiver's)."""
        return (self.input,) if self.input else QKVS if self.kind == "head" else ()

    def __str__(self) -> str:
        return self.name


def read_depth(model: RewardModel, receiver: Receiver) -> int:
    """Where in the stream the receiver reads, in half-layers: layer l's attention reads 2l, its MLP
    2l+1 (2l in a parallel layout, beside the attention), the reward 2·L."""
    if receiver.kind == "reward":
        return 2 * model.n_layers
    late = receiver.kind == "mlp" and model.arch.layout != "parallel"
    return 2 * receiver.layer + int(late)


def write_depth(model: RewardModel, part: Part) -> int:
    """Where a part's output enters the stream, in half-layers: the embeddings 0, layer l's attention
    2l+1 (2l+2 in a parallel layout), its MLP 2l+2. A receiver sees a part iff it reads at or after it."""
    if part.kind == "embed":
        return 0
    late = part.kind == "mlp" or model.arch.layout == "parallel"
    return 2 * part.layer + 1 + int(late)


@dataclass(frozen=True)
class Wiring:
    """How `receiving` rewires one receiver: `+δ` at `add` (module, 'in' or 'out'), `−δ` at the output of
    `cancel` (None for the reward), and each `frozen` entry (key, module, columns kept or None) outputs
    the clean value `clean[key]` except on the kept columns, which keep the module's own output."""

    receiver: Receiver
    add: tuple[nn.Module, str]
    cancel: nn.Module | None
    frozen: tuple[tuple[str, nn.Module, slice | None], ...]


def sublayer_write(model: RewardModel, kind: str, layer: int) -> nn.Module:
    """The module whose output a sublayer adds to the residual (its post-norm's, where it has one)."""
    arch = model.arch
    post = arch.attn_post_norm if kind == "attn" else arch.mlp_post_norm
    out = arch.attn_out if kind == "attn" else arch.mlp_out
    return model.layer_module(layer, post or out)


def wiring(model: RewardModel, receiver: Receiver) -> Wiring:
    """The hooks that give `receiver` the input `x + δ`; refuses (ArchitectureError) a receiver that
    this model's layout cannot separate from the rest of its layer."""
    arch = model.arch
    if receiver.kind == "reward":
        final = get_module(model.model, arch.final_norm) if arch.final_norm else None
        return Wiring(receiver, (model.layers[-1], "out") if final is None else (final, "in"), None, ())
    if receiver.layer >= model.n_layers:
        raise UsageError(f"receiver {receiver.name!r} names layer {receiver.layer}, but the model has "
                         f"{model.n_layers} layers (0..{model.n_layers - 1}); pick a layer of the model")
    layer, parallel = receiver.layer, arch.layout == "parallel"
    own = "mlp" if receiver.kind == "mlp" else "attn"
    if own == "attn" or parallel:
        add: tuple[nn.Module, str] = (model.layers[layer], "in")
    elif arch.layout == "post_norm" and arch.attn_post_norm is None:  # an encoder: the residual norm's output
        add = (model.layer_module(layer, arch.residual_norms[0]), "out")
    else:
        add = (sublayer_write(model, "attn", layer), "out")
    frozen: list[tuple[str, nn.Module, slice | None]] = []
    if parallel:  # the sibling sublayer reads the same x + δ: hold its write at the clean value
        other = "mlp" if own == "attn" else "attn"
        frozen.append((other, sublayer_write(model, other, layer), None))
    if receiver.kind == "head":
        frozen += _projections(model, receiver)
    return Wiring(receiver, add, sublayer_write(model, own, layer), tuple(frozen))


def _projections(model: RewardModel, receiver: Receiver) -> list[tuple[str, nn.Module, slice | None]]:
    """Every q/k/v projection of the receiver's layer, frozen but for the head's columns of its inputs."""
    assert receiver.head is not None  # a head receiver (its __post_init__)
    arch = model.arch
    out: list[tuple[str, nn.Module, slice | None]] = []
    paths = {"q": arch.attn_q, "k": arch.attn_k, "v": arch.attn_v}
    if any(p is None for p in paths.values()):
        raise ArchitectureError(
            f"receiver {receiver.name!r}: map {arch.name!r} names no separate query/key/value projections "
            "(attn_q/attn_k/attn_v; a fused qkv projection cannot give one head's input apart); use the "
            f"sublayer receiver {Part.attn(receiver.layer).name!r} or register a map naming them")
    n_heads = model.n_heads
    if receiver.head >= n_heads:
        raise UsageError(f"receiver {receiver.name!r}: the model has {n_heads} heads (0..{n_heads - 1})")
    modules = {x: model.layer_module(receiver.layer, str(paths[x])) for x in QKVS}
    size = _width(modules["q"]) // n_heads  # the query projection holds every head, d_head columns each
    for x, module in modules.items():
        width = _width(module)
        groups = width // size if size else 0
        keep = None
        if x in receiver.inputs:
            _check_heads(model, receiver, x, groups, width, n_heads)
            keep = slice(receiver.head * size, (receiver.head + 1) * size)
        out.append((x, module, keep))
    return out


def _width(module: nn.Module) -> int:
    """Output width of a projection (a Linear's `out_features`, else its weight's rows)."""
    weight = getattr(module, "weight", None)
    return int(getattr(module, "out_features", 0) or (0 if weight is None else weight.shape[0]))


def _check_heads(model: RewardModel, receiver: Receiver, x: str, groups: int, width: int, n_heads: int) -> None:
    """A head's own columns exist only with one key/value head per query head and no norm over all heads."""
    if groups != n_heads:
        raise ArchitectureError(
            f"receiver {receiver.name!r}: the {x} projection has {groups} heads for {n_heads} query heads "
            "(grouped-query attention), so head "
            f"{receiver.head}'s {x} input is shared with other heads; use input='q' or the receiver "
            f"{Part.attn(receiver.layer).name!r}")
    attn = model.layer_module(receiver.layer, str(model.arch.attn_q).rpartition(".")[0])
    norm = getattr(attn, f"{x}_norm", None)
    if norm is not None and getattr(norm, "weight", torch.empty(0)).numel() == width and n_heads > 1:
        raise ArchitectureError(
            f"receiver {receiver.name!r}: a {x}_norm over all heads' {x} (OLMo-2) couples the heads, so one "
            f"head's {x} input cannot change alone; use the receiver {Part.attn(receiver.layer).name!r}")


def clean_points(wire: Wiring, cols: Tensor) -> dict[str, Point]:
    """Where `receiving` needs clean values: each frozen module's output at positions `cols` [B, T]
    (every position of every row), keyed as `Wiring.frozen` keys them. Capture them in a clean run."""
    return {key: Point(module, "out", cols) for key, module, _ in wire.frozen}


def _shift(x: Tensor, delta: Tensor, sign: float) -> Tensor:
    return x + sign * delta.to(device=x.device, dtype=x.dtype)


def _freeze(out: Tensor, clean: Tensor, keep: slice | None) -> Tensor:
    held = clean.to(device=out.device, dtype=out.dtype).clone()
    if keep is not None:
        held[..., keep] = out[..., keep]
    return held


@contextlib.contextmanager
def receiving(model: RewardModel, receiver: Receiver | Wiring, delta: Tensor,
              clean: Mapping[str, Tensor] | None = None) -> Iterator[None]:
    """During the forwards inside, the receiver reads `x + delta` and the residual stream stays `x`.

    `delta` [B, T, d] must match the forward's rows and (padded) positions; `clean` holds, for every
    key of `wiring(model, receiver).frozen`, that module's clean output [B, T, w] on the same rows
    (`clean_points`; nothing for a sublayer receiver of a sequential layout). Hooks are the model's
    own modules' (`rewriting`), removed on exit; the model is not modified.
    """
    wire = receiver if isinstance(receiver, Wiring) else wiring(model, receiver)
    held = dict(clean or {})
    missing = [key for key, _, _ in wire.frozen if key not in held]
    if missing:
        raise UsageError(f"receiver {wire.receiver.name!r} needs the clean outputs {missing} (clean_points); "
                         "capture them in a clean run of the same rows and pass clean=")
    hooks = [(wire.add[0], wire.add[1], functools.partial(_shift, delta=delta, sign=1.0))]
    if wire.cancel is not None:
        hooks.append((wire.cancel, "out", functools.partial(_shift, delta=delta, sign=-1.0)))
    hooks += [(module, "out", functools.partial(_freeze, clean=held[key], keep=keep))
              for key, module, keep in wire.frozen]
    with rewriting(hooks):
        yield


@contextlib.contextmanager
def receiving_all(model: RewardModel, deltas: Mapping[Receiver, Tensor]) -> Iterator[None]:
    """During the forwards inside, every receiver r reads `x + deltas[r]` ([B, T, d] each, read when the
    node runs, so a buffer may be filled in place by an earlier hook), all in one forward; the stream
    stays `x`. Sublayer receivers and 'reward' hook as in `receiving`; the head receivers of one layer
    share one hook per q/k/v projection (see the module docstring). Refused: a layout that needs frozen
    clean values (parallel: ArchitectureError), and a layer's attention receiver beside its heads', or
    one head input named twice (ValueError)."""
    hooks: list[Hook] = []
    heads: dict[int, list[tuple[Receiver, Tensor]]] = {}
    for r, delta in deltas.items():
        if r.kind == "head":
            heads.setdefault(r.layer, []).append((r, delta))
            continue
        wire = wiring(model, r)
        if wire.frozen:
            raise ArchitectureError(f"receiver {r.name!r}: map {model.arch.name!r} has a parallel layout, whose "
                                    "sibling sublayer must be held at clean values; give receivers one at a time "
                                    "(receiving)")
        hooks.append((wire.add[0], wire.add[1], functools.partial(_shift, delta=delta, sign=1.0)))
        if wire.cancel is not None:
            hooks.append((wire.cancel, "out", functools.partial(_shift, delta=delta, sign=-1.0)))
    for layer, group in heads.items():
        if Receiver("attn", layer) in deltas:
            raise UsageError(f"receivers {Part.attn(layer).name!r} and {[r.name for r, _ in group]} both read layer "
                             f"{layer}'s attention input; give either the sublayer or its heads")
        hooks += _head_group(model, layer, group)
    with rewriting(hooks):
        yield


def _head_group(model: RewardModel, layer: int, group: list[tuple[Receiver, Tensor]]) -> list[Hook]:
    """The merged hooks of one layer's head receivers: the layer's input and its children's outputs
    recorded (to find the module that feeds the projections), then per projection its input recorded
    and its output's receiver columns recomputed."""
    slots: dict[str, list[tuple[slice, Tensor]]] = {x: [] for x in QKVS}
    modules: dict[str, nn.Module] = {}
    for r, delta in group:
        for key, module, keep in wiring(model, r).frozen:  # refuses fused qkv, grouped k/v, q/k norms
            modules[key] = module
            if keep is not None:
                if any(k.start == keep.start for k, _ in slots[key]):
                    raise UsageError(f"receiver {r.name!r}: head {r.head}'s {key} input is named by another "
                                     "receiver too; give each head input once")
                slots[key].append((keep, delta))
    state: dict[str, Tensor] = {}
    seen: list[tuple[nn.Module, Tensor]] = []
    owner = model.layers[layer]
    hooks: list[Hook] = [(owner, "in", functools.partial(_layer_input, state, seen))]
    hooks += [(child, "out", functools.partial(_seen, seen, child)) for child in owner.children()]
    for x, kept in slots.items():
        if kept:
            hooks += [(modules[x], "in", functools.partial(_keep_input, state, x)),
                      (modules[x], "out", functools.partial(_recompute, owner, modules[x], state, seen, x, kept))]
    return hooks


def _layer_input(state: dict[str, Tensor], seen: list[tuple[nn.Module, Tensor]], x: Tensor) -> None:
    state["x"] = x
    seen.clear()  # children's outputs of this forward only


def _seen(seen: list[tuple[nn.Module, Tensor]], child: nn.Module, out: Tensor) -> None:
    seen.append((child, out))


def _keep_input(state: dict[str, Tensor], x: str, inp: Tensor) -> None:
    state[x] = inp


def _feeder(owner: nn.Module, state: dict[str, Tensor], seen: list[tuple[nn.Module, Tensor]],
            inp: Tensor) -> nn.Module | None:
    """The layer's child whose output the projection reads (the input norm), or None when it reads the
    layer's input itself (an encoder). Found by identity: the layer hands that tensor on unchanged."""
    if inp is state["x"]:
        return None
    for child, out in seen:  # the children that ran so far in this forward
        if out is inp:
            return child
    raise ArchitectureError(f"the q/k/v projections of {type(owner).__name__} read a tensor that is neither the "
                            "layer's input nor a direct child's output, so one head's input cannot be recomputed; "
                            "use the sublayer receiver")


def _recompute(owner: nn.Module, module: nn.Module, state: dict[str, Tensor], seen: list[tuple[nn.Module, Tensor]],
               x: str, kept: list[tuple[slice, Tensor]], out: Tensor) -> Tensor:
    """Projection output [B, T, w] with each kept head's columns from `module(feed(x + δ_h))` (the model's
    own modules, called past their hooks), all heads stacked into one call."""
    inp, b = state[x], out.shape[0]
    feed = _feeder(owner, state, seen, inp)
    shifted = torch.cat([_shift(state["x"], delta, 1.0) for _, delta in kept])  # [n·B, T, d]
    normed = shifted if feed is None else first_output(feed.forward(shifted))
    proj = module.forward(normed.to(inp.dtype))
    new = out.clone()
    for i, (keep, _) in enumerate(kept):
        new[..., keep] = proj[i * b:(i + 1) * b, ..., keep].to(out.dtype)
    return new
