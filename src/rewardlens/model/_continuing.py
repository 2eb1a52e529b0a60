"""Continuing a clean run: later tokens of a causal decoder computed against the model's own cache.

In a causal decoder position t depends on tokens 0..t alone, so what a run computes at positions
before a change is what the clean run computed there. A continuation keeps the clean run's keys and
values for those positions (the model's own `Cache`) and runs only the later tokens, with explicit
position ids and a 4-D additive mask (each new token sees the kept prefix it is allowed and the new
tokens up to itself), through the model's own modules. Every user proves it on its batch before a
number is taken from it. The read-position sweep, the suffix sweep, the read token's backward and
the shared-prefix read loop all continue clean runs from here.
"""

from __future__ import annotations

import copy
import inspect
import math
import weakref
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import torch
from torch import Tensor, nn

from ._arch import hf_config
from ._hooks import Point, capture, eval_mode
from ._oom import OOM_ERRORS
from ._tokens import Batch, Tokenized, collate

if TYPE_CHECKING:
    from ._core import RewardModel


class _Stop(Exception):
    """Raised by the first layer's pre-hook once the model has built a continuation's arguments."""


def cache_name(model: RewardModel) -> str | None:
    """The backbone's keyword for a cache (`cache` or `past_key_values`), or None: it takes none."""
    params = inspect.signature(model.backbone.forward).parameters
    return next((name for name in ("cache", "past_key_values") if name in params), None)


def cache_of(out: Any) -> Any:
    """The cache a backbone's output carries (a Hugging Face `Cache` with per-layer entries), or None."""
    cache = getattr(out, "cache", None) if hasattr(out, "cache") else getattr(out, "past_key_values", None)
    return cache if cache is not None and hasattr(cache, "layers") else None


def cached_forward(model: RewardModel, batch: Batch) -> Any:
    """One no-grad forward of `batch` that keeps the model's cache (None when it returns none); hooks the
    caller holds open (captures, taps) see it as any forward."""
    with torch.no_grad(), eval_mode(model.model):
        out = model.backbone(**{**model.batch_kwargs(batch), "use_cache": True})
    return cache_of(out)


def fork_cache(cache: Any) -> Any:
    """A copy of `cache` whose layers can grow without touching the original's tensors."""
    out = copy.copy(cache)
    out.layers = [copy.copy(layer) for layer in cache.layers]
    return out


def cache_rows(cache: Any, rows: Tensor) -> Any:
    """A copy of `cache` (per-layer `keys`/`values` [B, heads, T, dh]) holding rows `rows` [r] (repeats
    allowed); growing it (a continuation) leaves `cache`'s tensors as they are."""
    out = fork_cache(cache)
    for layer in out.layers:
        layer.keys = layer.keys[rows.to(layer.keys.device)]
        layer.values = layer.values[rows.to(layer.values.device)]
    return out


def continuation_mask(start: Tensor, width: int, span: int, dtype: torch.dtype) -> Tensor:
    """The additive mask [r, 1, span, width + span] of `span` new tokens per row continuing a cache of
    `width` positions: each sees the first `start[r]` cached positions (its prefix; not the clean run's
    own later tokens, nor pads) and the new tokens up to itself."""
    j = torch.arange(width + span, device=start.device)[None, None, :]
    i = torch.arange(span, device=start.device)[None, :, None]
    return additive_mask((j < start[:, None, None]) | ((j >= width) & (j - width <= i)), dtype)


def agrees(mine: Tensor, want: Tensor, tol: float = 1e-4) -> bool:
    """A continuation's proof: rows of `mine` and `want` [n, d] agree to `tol` relative to each row's norm
    (and are finite)."""
    gap = _gaps(mine, want.to(mine.device))
    return bool(gap.max() <= tol)  # NaN, where a row is not finite, passes no allowance


def additive_mask(allow: Tensor, dtype: torch.dtype) -> Tensor:
    """`allow` [B, q, k] (True: may attend) as the additive [B, 1, q, k] mask a model takes as given."""
    mask = torch.zeros(allow.shape, dtype=dtype, device=allow.device)
    return mask.masked_fill(~allow, torch.finfo(dtype).min)[:, None]


def continuation_args(model: RewardModel, kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The (args, kwargs) the backbone passes its layers for the continuation `kwargs` (its rotary tables,
    masks and cache positions, whatever the architecture builds): a forward started and stopped at the
    first layer."""
    seen: dict[str, Any] = {}

    def stop(_module: nn.Module, args: tuple[Any, ...], kw: dict[str, Any]) -> NoReturn:  # torch's pre-hook call
        seen["args"], seen["kwargs"] = args[1:], {k: v for k, v in kw.items() if k != "hidden_states"}
        raise _Stop

    handle = model.layers[0].register_forward_pre_hook(stop, with_kwargs=True)
    try:
        with torch.no_grad(), eval_mode(model.model):
            model.backbone(**kwargs)
    except _Stop:
        pass
    finally:
        handle.remove()
    return seen["args"], seen["kwargs"]


J = TypeVar("J")


def packed(jobs: list[J], spans: list[int], budget: int, slack: float = 1.25) -> list[list[J]]:
    """`jobs` (sorted by the positions each computes, `spans`) in batches of at most `budget` padded
    positions whose padding stays within `slack` times their real positions: continuations of very
    different lengths are not padded together."""
    out: list[list[J]] = []
    real = 0
    for job, span in zip(jobs, spans):
        if not out or (len(out[-1]) + 1) * span > min(budget, slack * (real + span)):
            out.append([job])
            real = span
        else:
            out[-1].append(job)
            real += span
    return out


CALIBRATION_TOKENS = 48
"""Length of the token sequence a low-precision model's proof is calibrated on."""
CALIBRATION_CUTS = (0.25, 0.5, 0.75, 1.0)
"""Where in it (shares of its length) a token is continued: positions vary in how much a shift shows."""
MARGIN = 3.0
"""A low-precision proof allows this many times the rounding gap its calibration measured (at least
`FLOOR_EPS` machine epsilons): a batch of other shapes rounds differently from the calibration's."""
FLOOR_EPS = 4.0
"""The least gap a low-precision proof allows, in machine epsilons of the model's dtype."""
POWER = 2.0
"""A proof resolves only where a continuation one position off misses by this many times its allowance."""
_CALIBRATED: weakref.WeakKeyDictionary[RewardModel, dict[torch.dtype, float | None]] = weakref.WeakKeyDictionary()


def proof_tol(model: RewardModel) -> float | None:
    """The relative gap (`agrees`) a continuation's proof allows on this model, or None where no allowance
    tells a continuation one position off (the subtlest bug: RoPE sees it only through the distance to
    each cached key) from rounding: 1e-4 in fp32 and fp64.

    In bf16 or fp16 the same computation in another shape already differs by ~1e-2 (SmolLM2-135M, bf16),
    so the allowance is calibrated once per model and dtype (`calibrate_proof`): MARGIN times the gap a
    right continuation shows (at least FLOOR_EPS epsilons), granted only where the one-off continuation
    misses the head's residual by POWER times that. On a random-init model, whose attention barely sees
    positions, it is None: each user then runs its plain path (a user that loses work when a proof fails
    does not try one). No engine holds hooks of its own open when it asks, so the calibration's forward
    is the model's own; an out-of-memory error propagates and leaves nothing calibrated."""
    dtype = next(model.model.parameters()).dtype
    if dtype in (torch.float32, torch.float64):
        return 1e-4
    held = _CALIBRATED.setdefault(model, {})
    if dtype not in held:
        held[dtype] = calibrate_proof(model)
    return held[dtype]


def calibrate_proof(model: RewardModel) -> float | None:
    """`proof_tol` measured on CALIBRATION_TOKENS fixed tokens (fewer under a shorter sliding window): the
    token at each of CALIBRATION_CUTS positions continued on the cache of those before it, at its own
    position and one position on. The right gap is the largest over the cuts and every layer's output (the
    shared reads and the suffix sweep prove every depth); the wrong one the smallest over the cuts at the
    residual the head reads, the one point the cached sweep and the read token's backward prove. The
    allowance, or None where the wrong gap is not POWER times it (or the model cannot continue a cache)."""
    name = cache_name(model)
    device, dtype = model.device, next(model.model.parameters()).dtype
    window = getattr(hf_config(model.model).get_text_config(), "sliding_window", None)
    n = min(CALIBRATION_TOKENS, window or CALIBRATION_TOKENS)
    cuts = torch.tensor(sorted({round(n * f) - 1 for f in CALIBRATION_CUTS} - {-1, 0}), device=device)
    try:
        ids = [(13 + 7919 * i) % _vocab(model) for i in range(n)]
        if name is None or not len(cuts) or not_continuable(model, [Tokenized(ids)]) is not None:
            return None
        batch = collate([Tokenized(ids)], pad_id=model.pad_token_id, side="right", first=False, device=device)
        one = torch.zeros(len(cuts), dtype=torch.long, device=device)
        with capture(_every_depth(model, cuts, one), device) as want:
            cache = cached_forward(model, batch)
        gaps = []
        for shift in (0, 1):
            kwargs = model.forward_kwargs(
                input_ids=batch.input_ids[0, cuts][:, None], position_ids=(cuts + shift)[:, None],
                attention_mask=continuation_mask(cuts, n, 1, dtype), use_cache=True, **{name: cache_rows(cache, one)})
            with torch.no_grad(), eval_mode(model.model), capture(_every_depth(model, one), device) as got:
                model.backbone(**kwargs)
            gaps.append({k: _gaps(got[k], want[k]) for k in want})
    except OOM_ERRORS:
        raise
    except (RuntimeError, ValueError, TypeError, KeyError, AttributeError, NotImplementedError):
        return None  # a model that cannot run a continuation: every user takes its plain path
    right = max(float(g.max()) for g in gaps[0].values())
    wrong = float(gaps[1]["final"].min())
    tol = max(MARGIN * right, FLOOR_EPS * torch.finfo(dtype).eps)
    return tol if math.isfinite(right) and wrong >= POWER * tol else None


def _every_depth(model: RewardModel, cols: Tensor, rows: Tensor | None = None) -> dict[str, Point]:
    """Points at `cols` [k] (of `rows` [k]; default, row i at cols[i]): every layer's output, and the
    residual the head reads."""
    final = model.final_point(cols)
    return {**{f"layer {i}": Point(module, "out", cols, rows) for i, module in enumerate(model.layers)},
            "final": Point(final.module, final.where, cols, rows)}


def _gaps(mine: Tensor, want: Tensor) -> Tensor:
    """Each row's relative gap of `mine` from `want` [k, d] (NaN, which no allowance passes, where not finite)."""
    gap = (mine.float() - want.float()).norm(dim=-1) / want.float().norm(dim=-1).clamp_min(1e-12)
    return torch.where(torch.isfinite(gap), gap, torch.nan)


def _vocab(model: RewardModel) -> int:
    """The model's vocabulary size, from its input embeddings (Hugging Face's own accessor)."""
    hf: Any = model.model  # a Hugging Face model (nn.Module's typing hides its methods)
    weight = getattr(hf.get_input_embeddings(), "weight", None)
    if not isinstance(weight, Tensor):
        raise AttributeError("the model's input embeddings hold no weight")
    return int(weight.shape[0])


def reproduces(model: RewardModel, mine: Tensor, want: Tensor) -> bool:
    """An engine's proof that `mine` reproduces the clean `want` [..., d]: elementwise within rtol 1e-3 and
    1e-4 of want's largest entry (finite), or, in bf16 or fp16, row by row within `proof_tol`."""
    want = want.to(mine.device).float()
    atol = 1e-4 * float(want.abs().max())
    if not math.isfinite(atol):
        return False
    if torch.allclose(mine.float(), want, rtol=1e-3, atol=atol):
        return True
    low = next(model.model.parameters()).dtype not in (torch.float32, torch.float64)
    tol = proof_tol(model) if low else None
    return tol is not None and agrees(mine.reshape(-1, mine.shape[-1]), want.reshape(-1, want.shape[-1]), tol)


def continuable(model: RewardModel, seqs: list[Tokenized]) -> bool:
    """Whether tokens of `seqs` may continue a clean run's cache on this model, and a proof can tell a bug
    from rounding: the one test every continuing user asks first (each still proves itself per batch)."""
    return cache_name(model) is not None and not_continuable(model, seqs) is None and proof_tol(model) is not None


def not_continuable(model: RewardModel, seqs: list[Tokenized]) -> str | None:
    """Why tokens of `seqs` cannot be run apart from the positions before them (None when they may:
    each user still proves it on every batch)."""
    if model.encoder:
        return "the model attends both ways, so patching the read token changes every position"
    config = hf_config(model.model)
    impl = getattr(config, "_attn_implementation", None) or ""
    if "flash" in impl:
        return f"attn_implementation={impl!r} takes no custom attention mask"
    if "position_ids" not in inspect.signature(model.backbone.forward).parameters:
        return "the backbone takes no position_ids, so copies of the read token cannot share its position"
    # A multimodal model (Gemma-3) keeps its language model's window in text_config.
    window = getattr(config.get_text_config(), "sliding_window", None)
    if window and max(len(s.ids) for s in seqs) > window:
        return f"a sequence is longer than the sliding window ({window} tokens)"
    return None
