"""The engine registry: every engine that accepts a patch equals the reference engine on every closure-test
architecture; the reference equals an independent hook-based loop; provenance, forcing, logging, and the
caller's clean runs left as they were."""

import logging
import warnings

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.causal import patch, trace_pairs
from rewardlens.causal._engine import sites
from rewardlens.causal._registry import REGISTRY, Job
from rewardlens.causal._spec import PatchSpec
from rewardlens.errors import RewardLensWarning, UsageError
from tests.helpers.naive import naive_patch
from tests.helpers.tiny import ARCHS

SPECS = [
    PatchSpec(),
    PatchSpec(mode="ablation", ablation="mean", level="head"),
    PatchSpec(mode="denoising", estimand="direct"),
    PatchSpec(positions="prefix"),
    PatchSpec(mode="denoising", positions="prefix", level="head"),
    PatchSpec(positions=((-3, None),), estimand="direct"),
]


def _patch(model, pairs, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RewardLensWarning)  # positions='prefix' names pairs it leaves unpatched
        return patch(model, pairs, batch_size=2, **kwargs)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_engine_that_accepts_equals_the_reference(tiny_root, pairs, arch):
    model = rl.load(str(tiny_root[arch]))
    seqs, _ = model.encode(pairs)
    ran = set()
    for spec in SPECS:
        want = _patch(model, pairs, spec=spec, engine="reference")
        job = Job(model, seqs, spec, sites(model, spec.level))
        for name, engine in REGISTRY.items():
            if name == "reference" or engine.supports(job) is not None:
                continue
            try:
                got = _patch(model, pairs, spec=spec, engine=name)
            except UsageError as exc:  # its run-time proof failed here (stepping some encoders' padded batches)
                assert "declined at run time" in str(exc)
                continue
            assert got.provenance is not None and got.provenance.engine == name and got.provenance.forced
            for side in ("chosen", "rejected", "patched_chosen", "patched_rejected"):
                np.testing.assert_allclose(getattr(got, side), getattr(want, side), atol=2e-5, rtol=1e-5,
                                           err_msg=f"{arch} {spec.name} {name} {side}")
            ran.add(name)
    assert {"direct_rewards", "stepped_sweep", "batched_sweep"} <= ran, ran
    if not model.encoder and arch not in ("armorm", "gemma3-mm"):  # a gate; a window shorter than the pairs
        assert {"suffix_sweep", "cached_read_sweep", "read_sweep"} <= ran, ran


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma2", "bert", "armorm", "gpt_neox"])
def test_the_reference_equals_a_hook_based_loop_on_the_models_own_output(tiny_root, pairs, arch):
    """The yardstick's yardstick: tests/helpers/naive.py hooks the Hugging Face modules itself, computes its
    own inserted values and reads the model's own `score`/`logits` (no library engine, plan or readout)."""
    model = rl.load(str(tiny_root[arch]))
    for spec in SPECS:
        if spec.spans:
            continue
        got = _patch(model, pairs, spec=spec, engine="reference")
        want_c, want_r = naive_patch(model, pairs, mode=spec.mode, ablation=spec.ablation, positions=spec.positions,
                                     level=spec.level, estimand=spec.estimand)
        np.testing.assert_allclose(got.patched_chosen, want_c, atol=2e-5, rtol=1e-5, err_msg=spec.name)
        np.testing.assert_allclose(got.patched_rejected, want_r, atol=2e-5, rtol=1e-5, err_msg=spec.name)
        assert np.abs(got.effect).max() > 1e-5, f"{spec.name}: every effect is zero, the check would be empty"


def test_provenance_names_the_engine_the_declines_and_the_proof(tiny_root, pairs):
    model = rl.load(str(tiny_root["llama"]))
    got = _patch(model, pairs)
    prov = got.provenance
    assert prov is not None and prov.engine in REGISTRY and not prov.forced
    assert prov.reason("direct_rewards") and "total" in prov.reason("direct_rewards")
    assert prov.reason(prov.engine) is None
    line = str(prov)
    assert "\n" not in line and prov.engine in line
    bert = _patch(rl.load(str(tiny_root["bert"])), pairs, positions="prefix").provenance
    assert bert is not None and "attends both ways" in (bert.reason("suffix_sweep") or "")


def test_forcing_an_engine_that_declines_is_refused_in_one_line(tiny_root, pairs):
    model = rl.load(str(tiny_root["llama"]))
    with pytest.raises(UsageError, match=r"^engine='direct_rewards' cannot run this patch .*total") as caught:
        _patch(model, pairs, engine="direct_rewards")
    assert "\n" not in str(caught.value) and caught.value.option == "engine"
    with pytest.raises(UsageError, match="engine must be one of"):
        _patch(model, pairs, engine="warp")


def test_the_callers_clean_runs_are_not_changed(tiny_root, pairs):
    """The read-position engines read each target's clean reward off their own unpatched copy; the result
    takes it, and the caller's traced runs keep theirs."""
    model = rl.load(str(tiny_root["llama"]))
    traced = trace_pairs(model, pairs, level="head")
    before = traced.clean.reward.clone()
    traced.clean.reward[0::2] += 1.0  # a stale reward would show in the result were it kept
    got = _patch(model, pairs, level="head", clean=traced.clean)
    assert got.provenance is not None and got.provenance.engine == "cached_read_sweep"
    np.testing.assert_allclose(traced.clean.reward[0::2].numpy(), before[0::2].numpy() + 1.0)
    np.testing.assert_allclose(got.chosen, before[0::2].numpy(), atol=2e-5)


def test_each_decision_logs_one_debug_line(tiny_root, pairs, caplog):
    model = rl.load(str(tiny_root["llama"]))
    with caplog.at_level(logging.DEBUG, logger="rewardlens"):
        got = _patch(model, pairs)
    said = [r.getMessage() for r in caplog.records if r.name == "rewardlens.causal"]
    assert got.provenance is not None
    assert any(f"{got.provenance.engine} ran" in m for m in said), said
    assert sum("declines" in m for m in said) == len(got.provenance.declined)


def test_provenance_survives_the_plain_record_a_store_keeps(tiny_root, pairs):
    """The audit's store keeps a `Patching` as plain fields (`dataclasses.asdict` for nested ones, lists for
    tuples); rebuilt from them, the result carries the same `Provenance`."""
    import dataclasses

    from rewardlens.causal import Patching

    got = _patch(rl.load(str(tiny_root["llama"])), pairs)
    record = {f.name: getattr(got, f.name) for f in dataclasses.fields(got)}
    plain = dataclasses.asdict(got.provenance)
    plain["declined"] = [list(d) for d in plain["declined"]]
    back = Patching(**{**record, "provenance": plain})
    assert back.provenance == got.provenance and isinstance(back.provenance.declined, tuple)
