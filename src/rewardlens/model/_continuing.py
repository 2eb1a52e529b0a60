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
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import torch
from torch import Tensor, nn

from ._arch import hf_config
from ._hooks import eval_mode

if TYPE_CHECKING:
    from ._core import RewardModel
    from ._tokens import Batch, Tokenized


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
    gap = (mine - want.to(mine.device)).float().norm(dim=-1) / want.float().norm(dim=-1).clamp_min(1e-12).to(
        mine.device)
    return bool(torch.isfinite(gap).all() and gap.max() <= tol)


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


def proofs_resolve(model: RewardModel) -> bool:
    """Whether a continuation's proof (agreement with the clean run to about 1e-4) can tell a wrong cache
    row, position or mask from rounding at this model's dtype: fp32 and fp64. In bf16 or fp16 the same
    computation in another shape already differs by ~1e-3, and on a small model a position off by one
    by only a few times that, so a user that loses work when a proof fails does not try one there."""
    return next(model.model.parameters()).dtype in (torch.float32, torch.float64)


def continuable(model: RewardModel, seqs: list[Tokenized]) -> bool:
    """Whether tokens of `seqs` may continue a clean run's cache on this model, and a proof can tell a bug
    from rounding: the one test every continuing user asks first (each still proves itself per batch)."""
    return cache_name(model) is not None and not_continuable(model, seqs) is None and proofs_resolve(model)


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
