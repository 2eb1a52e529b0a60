"""`PatchSpec`: one validated value for a patch's five choices, taken by `patch`, `attribution_patch`,
`faithfulness` and the audit's run key."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.causal import PatchSpec, attribution_patch, faithfulness, patch
from rewardlens.zoo import DEMO_PAIRS


def test_defaults_and_the_canonical_name():
    spec = PatchSpec()
    assert (spec.mode, spec.ablation, spec.positions, spec.level, spec.estimand) == (
        "noising", "zero", "read", "sublayer", "total")
    assert spec.name == "sublayer/noising/read/total"
    assert PatchSpec(mode="ablation", ablation="mean", level="head").name == "head/ablation-mean/read/total"
    spans = PatchSpec(positions=[(-4, None), [0, 2]])
    assert spans.positions == ((-4, None), (0, 2)) and spans.spans and spans.name.endswith("spans[-4:][0:2]/total")
    assert hash(spans) == hash(PatchSpec(positions=((-4, None), (0, 2))))  # frozen, hashable, normalised
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.mode = "denoising"  # type: ignore[misc]


@pytest.mark.parametrize(("field", "value", "match"), [
    ("mode", "noise", "mode must be one of"), ("ablation", "median", "ablation must be one of"),
    ("level", "expert", "level must be one of"), ("estimand", "indirect", "estimand must be one of"),
    ("positions", "last", "positions must be one of"), ("positions", [], "non-empty list"),
    ("positions", [(1, 2, 3)], "a span is"), ("positions", [("a", None)], "a span is"),
])
def test_bad_choices_are_refused_naming_the_value(field, value, match):
    with pytest.raises(ValueError, match=match):
        PatchSpec(**{field: value})


def test_patch_with_a_spec_equals_patch_with_keywords(tiny_root):
    model = rl.load(str(tiny_root["llama"]))
    spec = PatchSpec(mode="denoising", level="head", estimand="direct")
    by_spec = patch(model, DEMO_PAIRS[:3], spec=spec)
    by_keywords = patch(model, DEMO_PAIRS[:3], mode="denoising", level="head", estimand="direct")
    assert by_spec.names == by_keywords.names and by_spec.mode == "denoising" and by_spec.estimand == "direct"
    np.testing.assert_array_equal(by_spec.effect, by_keywords.effect)
    with pytest.raises(ValueError, match="either as spec= or as keywords"):
        patch(model, DEMO_PAIRS[:3], spec=spec, mode="ablation")
    with pytest.raises(ValueError, match="estimates total effects"):
        attribution_patch(model, DEMO_PAIRS[:3], spec=spec)


def test_faithfulness_names_how_it_patched(tiny_root):
    model = rl.load(str(tiny_root["llama"]))
    f = faithfulness(model, DEMO_PAIRS[:3], level="head", n_boot=10)
    assert f.spec == PatchSpec(level="head") and f.seed_spec == PatchSpec(positions=f.seed_positions)
    np.testing.assert_allclose(f.total, patch(model, DEMO_PAIRS[:3], spec=f.spec).effect, rtol=1e-5, atol=1e-6)
