"""A continuation's proof at low precision (model/_continuing.py: `proof_tol`): in bf16 and fp16 the
allowance is calibrated once per model, and granted only where a continuation one position off misses by
POWER times it; then the shared reads, the trace's caches, the read token's backward and the cached
sweep continue clean runs in bf16 too, to bf16 precision of the plain paths."""

import importlib

import numpy as np
import pytest
import torch

import rewardlens as rl
from rewardlens.causal import attribution_patch, trace_pairs
from rewardlens.model.internal import (
    Point,
    Tokenized,
    cache_name,
    cached_forward,
    capture,
    collate,
    continuable,
    continuation_mask,
    eval_mode,
    fork_cache,
    proof_tol,
)
from rewardlens.zoo.realmodels import dpo_pairs, load_reward_model
from tests.helpers.tiny import ARCHS, PAIRS

CONTINUING = importlib.import_module("rewardlens.model._continuing")
SHARED = importlib.import_module("rewardlens.model._shared_reads")
DECODERS = [a for a in ARCHS if a not in ("bert", "deberta-v2", "roberta", "xlm-roberta")]
LOW = [torch.bfloat16, torch.float16]


def _continued_gaps(model: rl.RewardModel, ids: list[int]) -> tuple[float, float]:
    """Relative gaps (largest over layers) of the last token of `ids` continued on the cache of those before
    it, at its own position and one on, from the clean run: written here from the model's own cache, apart
    from the calibration, on a sequence the calibration never saw."""
    n, device = len(ids), model.device
    batch = collate([Tokenized(ids)], pad_id=model.pad_token_id, side="right", first=False, device=device)
    at = {layer: Point(module, "out", torch.tensor([n - 1])) for layer, module in enumerate(model.layers)}
    with capture(at, device) as want:
        cache = cached_forward(model, batch)
    dtype = next(model.model.parameters()).dtype
    gaps = []
    for position in (n - 1, n):
        kwargs = model.forward_kwargs(input_ids=batch.input_ids[:, -1:], position_ids=torch.tensor([[position]]),
                                      attention_mask=continuation_mask(torch.tensor([n - 1]), n, 1, dtype),
                                      use_cache=True, **{cache_name(model): fork_cache(cache)})
        first = {layer: Point(module, "out", torch.tensor([0])) for layer, module in enumerate(model.layers)}
        with torch.no_grad(), eval_mode(model.model), capture(first, device) as got:
            model.backbone(**kwargs)
        gaps.append(max((got[k] - want[k]).norm().item() / want[k].norm().item() for k in want))
    return gaps[0], gaps[1]


def test_fp32_and_fp64_allow_1e_4_without_calibrating(tiny_root, monkeypatch):
    calls: list[object] = []
    monkeypatch.setattr(CONTINUING, "calibrate_proof", lambda m: calls.append(m))
    for dtype in (torch.float32, torch.float64):
        assert proof_tol(rl.load(str(tiny_root["llama"]), dtype=dtype)) == 1e-4
    assert calls == [], "a high-precision proof is not calibrated"


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("arch", DECODERS)
def test_a_low_precision_allowance_passes_a_right_continuation_and_fails_one_off_by_one(tiny_root, arch, dtype):
    """On a sequence of the model's own tokenizer (not the calibration's), where the model is granted an
    allowance: the right continuation lies within it and the one a position off beyond it. Where it is
    refused, nothing continues a cache in that dtype."""
    model = rl.load(str(tiny_root[arch]), dtype=dtype)
    seqs, _ = model.encode(PAIRS)
    tol = proof_tol(model)
    if tol is None:
        assert not continuable(model, seqs)
        return
    assert tol >= CONTINUING.FLOOR_EPS * torch.finfo(dtype).eps
    for seq in seqs[:4]:
        right, wrong = _continued_gaps(model, seq.ids)
        assert right <= tol < wrong, f"{arch}: right {right:.2e}, allowance {tol:.2e}, one off {wrong:.2e}"
    assert continuable(model, seqs)


def test_the_fixtures_hold_both_outcomes_in_bf16(tiny_root):
    """Random-init models barely see positions, so some are refused in bf16 and some granted: both branches
    of every user run in this suite."""
    got = {arch: proof_tol(rl.load(str(tiny_root[arch]), dtype=torch.bfloat16)) is not None for arch in DECODERS}
    assert any(got.values()) and not all(got.values()), got


def test_the_calibration_runs_once_per_model_and_dtype(tiny_root, monkeypatch):
    calls: list[torch.dtype] = []
    real = CONTINUING.calibrate_proof
    monkeypatch.setattr(CONTINUING, "calibrate_proof",
                        lambda m: calls.append(next(m.model.parameters()).dtype) or real(m))
    model = rl.load(str(tiny_root["gpt2"]), dtype=torch.bfloat16)
    first = proof_tol(model)
    assert [proof_tol(model) for _ in range(3)] == [first] * 3
    assert calls == [torch.bfloat16]
    proof_tol(rl.load(str(tiny_root["gpt2"]), dtype=torch.bfloat16))
    assert calls == [torch.bfloat16] * 2, "another model is calibrated on its own"


def test_a_model_whose_cache_cannot_be_continued_is_refused(tiny_root):
    assert proof_tol(rl.load(str(tiny_root["bert"]), dtype=torch.bfloat16)) is None


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("arch", ["gpt2", "qwen3", "llama"])
def test_in_bf16_shared_reads_continue_where_granted_and_read_as_the_plain_loop(tiny_root, arch, monkeypatch):
    model = rl.load(str(tiny_root[arch]), dtype=torch.bfloat16)
    seqs, _ = model.encode([PAIRS[0].conversation(s) for s in ("chosen", "rejected")] * 3)
    continued: list[int] = []
    real = SHARED._continue
    monkeypatch.setattr(SHARED, "_continue", lambda *a, **k: continued.append(len(a[4])) or real(*a, **k))
    got = SHARED.read_sharing(model, seqs, layers=["0"], batch_size=4, readout=False)
    want = model.read(seqs, layers=["0"], batch_size=4, readout=False)
    assert bool(continued) == (proof_tol(model) is not None), "shared exactly where the proof is granted"
    for name in ("final", "reward"):
        a, b = getattr(got, name).float().numpy(), getattr(want, name).float().numpy()
        assert _rel(a, b) < 2e-2, f"{arch} {name}: {_rel(a, b):.2e}"


@pytest.mark.parametrize("arch", ["gpt2", "qwen3", "llama"])
def test_in_bf16_the_trace_keeps_caches_where_granted_and_patches_as_without(tiny_root, arch):
    """Where bf16 proofs are granted the trace keeps its targets' caches, attribution patching's backward and
    the read sweep continue them, and the effects match a trace that kept nothing to bf16 precision."""
    model = rl.load(str(tiny_root[arch]), dtype=torch.bfloat16)
    plain = trace_pairs(model, PAIRS, level="head")
    want_ap = attribution_patch(model, PAIRS, level="head", clean=plain.clean)
    want = rl.causal.patch(model, PAIRS, level="head", clean=plain.clean)
    shared = trace_pairs(model, PAIRS, level="head", record="noising")
    held = shared.clean.recorded
    assert held is not None
    got_ap = attribution_patch(model, PAIRS, level="head", clean=shared.clean)
    assert bool(held.where) == (proof_tol(model) is not None), "caches kept exactly where the proof is granted"
    got = rl.causal.patch(model, PAIRS, level="head", clean=shared.clean)
    scale = np.abs(want.effect).max()
    assert scale > 1e-3, "effects worth comparing"
    assert np.abs(got.effect - want.effect).max() < 5e-2 * scale
    assert np.abs(got_ap.effect - want_ap.effect).max() < 5e-2 * np.abs(want_ap.effect).max()


def test_the_real_smollm2_rm_is_granted_in_bf16_and_its_allowance_tells_one_position_off():
    """A trained model sees positions: SmolLM2-135M's bf16 proof is granted, and on its own held-out text the
    right continuation lies within the allowance and one a position off beyond it."""
    model = load_reward_model("smollm2-dpo", dtype=torch.bfloat16)
    tol = proof_tol(model)
    assert tol is not None and tol < 0.1
    seqs, _ = model.encode(dpo_pairs("test")[:2])
    for seq in seqs:
        right, wrong = _continued_gaps(model, seq.ids)
        assert right <= tol < wrong, f"right {right:.2e}, allowance {tol:.2e}, one off {wrong:.2e}"
