"""The faces by audience (issue 43 item 3): the top level holds the mental model and nothing else, each
subpackage face lists what users call, plumbing lives in `internal` modules, and every name that moved
still resolves for one release with a DeprecationWarning naming its new home."""

from __future__ import annotations

import importlib
import re
import warnings

import pytest

import rewardlens as rl
from rewardlens import _deprecated

FACES = ["rewardlens", *(f"rewardlens.{p}" for p in ("audit", "bench", "calibrate", "causal", "compare", "data",
                                                    "exact", "hacking", "loop", "model", "monitor", "sae", "zoo",
                                                    "zoo.organisms"))]


def test_the_top_level_holds_at_most_thirty_names():
    assert len(rl.__all__) <= 30, sorted(rl.__all__)
    assert len(set(rl.__all__)) == len(rl.__all__)
    for name in rl.__all__:  # each loads, without a warning
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            assert getattr(rl, name) is not None


@pytest.mark.parametrize("name", sorted(rl._MOVED))
def test_every_old_top_level_name_still_resolves_with_a_warning(name):
    module, _, attribute = rl._MOVED[name].partition(":")
    home = getattr(importlib.import_module(module), attribute)
    with pytest.warns(DeprecationWarning, match=re.escape(f"use {module}.{attribute}")):
        assert getattr(rl, name) is home
    assert name not in rl.__all__


def test_the_old_top_level_list_is_covered():
    """The 69 names of 0.1's face: each is now on the face or in the deprecation table."""
    old = {"ArchitectureMap", "Attribution", "Audit", "Bench", "Cascades", "Circuit", "Comparison", "Concepts",
           "Conflicts", "Distortion", "Edges", "Edit", "Faithfulness", "FeaturePatch", "FeatureReport",
           "FeatureSteer", "Lens", "Monitor", "Pair", "PatchSpec", "PathPatching", "Patching", "Probes", "Reads",
           "RewardLensError", "RewardModel", "SAEConfig", "Scorecard", "Store", "TokenAttribution", "TopKSAE",
           "Trajectory", "attribute", "attribute_features", "attribution_patch", "audit", "bench", "calibrate",
           "cascade", "circuit", "compare", "concepts", "conflict", "distortion", "edges", "edit", "faithfulness",
           "feature_patch", "feature_report", "feature_steer", "lens", "load", "load_dpo", "load_judge",
           "load_pairs", "load_prm", "load_sae", "monitored_reward", "patch", "path_patch", "probe",
           "register_architecture", "tokens", "train_sae", "verify_edit", "wrap", "wrap_dpo", "wrap_judge",
           "wrap_prm"}
    assert len(old) == 69
    assert old <= set(rl.__all__) | set(rl._MOVED)


def test_a_function_named_like_its_subpackage_wins_after_the_subpackage_loads():
    importlib.import_module("rewardlens.audit")
    assert callable(rl.audit) and not isinstance(rl.audit, type(rl))


def _moved_table(face: str) -> dict[str, str]:
    hook = getattr(importlib.import_module(face), "__getattr__", None)
    return dict(getattr(hook, "moved", {}))


@pytest.mark.parametrize("face", FACES[1:])
def test_every_old_subpackage_name_still_resolves_with_a_warning(face):
    for name, target in _moved_table(face).items():
        home = _deprecated.resolve(target)
        with pytest.warns(DeprecationWarning, match=re.escape(target.replace(":", "."))):
            assert getattr(importlib.import_module(face), name) is home
        assert name not in importlib.import_module(face).__all__


PLUMBING = re.compile(r"^(stage|tick|part|counting)$|(?i:progress|meter|batch_work|lock|holder|checksum|shard)")


@pytest.mark.parametrize("face", FACES)
def test_no_face_exports_a_progress_lock_checksum_or_shard_helper(face):
    exported = importlib.import_module(face).__all__
    plumbing = [name for name in exported if PLUMBING.search(name)]
    assert not plumbing, f"{face} exports plumbing {plumbing}: move it to {face}.internal"
