"""Frozen attention as `P v` (graphs/_pattern.py): against transformers' own kernels and autograd through them."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.models.llama.modeling_llama import eager_attention_forward

from rewardlens.graphs._pattern import Patterns


class _Module(torch.nn.Module):
    """What the kernels read off the attention module: GQA groups, causality, eval mode."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups, self.is_causal = groups, True
        self.eval()


def _inputs(copies: int, length: int, heads: int = 6, kv_heads: int = 2, dim: int = 8) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, heads, length, dim, generator=gen).expand(copies, -1, -1, -1)  # copies of one sequence
    k = torch.randn(1, kv_heads, length, dim, generator=gen).expand(copies, -1, -1, -1)
    v = torch.randn(copies, kv_heads, length, dim, generator=gen, requires_grad=True)
    return q, k, v


def _causal_mask(copies: int, length: int) -> torch.Tensor:
    mask = torch.full((length, length), float("-inf")).triu(1)
    return mask.expand(copies, 1, length, length)


KERNELS: dict[str, tuple[Any, bool]] = {"sdpa": (sdpa_attention_forward, False),
                                        "eager": (eager_attention_forward, True)}


@pytest.mark.parametrize("name", list(KERNELS))
@pytest.mark.parametrize("length", [5, 19])  # shorter and longer than the head dim: one and several identity blocks
def test_pattern_times_value_is_the_kernel_and_its_backward_is_autograd_through_it(name, length):
    kernel, needs_mask = KERNELS[name]
    module, copies = _Module(groups=3), 4
    q, k, v = _inputs(copies, length)
    args = (_causal_mask(copies, length) if needs_mask else None,)
    kwargs = {"scaling": 0.3, "dropout": 0.0}
    patterns = Patterns()
    first, _ = patterns((0, 0), True, kernel, module, q, k, v, *args, **kwargs)
    assert patterns.p[(0, 0)] is not None  # the check passed: this kernel is P v
    ref = kernel(module, q, k, v, *args, **kwargs)[0]
    assert torch.equal(first, ref.detach())  # the first run's values are the kernel's own
    later, _ = patterns((0, 0), False, kernel, module, q, k, v, *args, **kwargs)
    torch.testing.assert_close(later, ref, rtol=1e-5, atol=1e-6)
    cot = torch.randn_like(ref)
    want, = torch.autograd.grad(ref, v, cot)
    for out in (first, later):
        got, = torch.autograd.grad(out, v, cot)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_a_kernel_that_is_not_linear_in_its_values_keeps_the_kernel():
    def squared(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any,
                **kwargs: Any) -> tuple[torch.Tensor, None]:
        out, _ = sdpa_attention_forward(module, query, key, value, *args, **kwargs)
        return out**2, None

    module, copies, length = _Module(groups=3), 2, 7
    q, k, v = _inputs(copies, length)
    patterns = Patterns()
    out, _ = patterns((0, 0), True, squared, module, q, k, v, None)
    assert patterns.p[(0, 0)] is None
    ref = squared(module, q, k, v, None)[0]
    torch.testing.assert_close(out, ref)
    cot = torch.randn_like(ref)
    torch.testing.assert_close(torch.autograd.grad(out, v, cot)[0], torch.autograd.grad(ref, v, cot)[0])
