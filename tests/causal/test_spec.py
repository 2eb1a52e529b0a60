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


EMPTY = [(0, 0), (3, 1), (-1, -3), (-2, -2), (None, 0), (-3, 0), (5, 5)]
SOME = [(0, 1), (None, -1), (0, -1), (-3, 5), (0, None), (-1, None), (None, None)]


def test_a_span_empty_in_every_sequence_is_refused_naming_it_and_the_fix():
    """Before, `0:0` reached the forward and came back as "0 positions in chosen but 0 in rejected"."""
    for span in EMPTY:
        # The yardstick: Python's own slice of every sequence's positions 0..t* is empty.
        assert all(not list(range(n))[slice(*span)] for n in range(1, 60))
        with pytest.raises(ValueError, match=rf"the span \({span[0]}, {span[1]}\) selects no position in any "
                                             r"sequence: .* so stop must lie past start; pass e\.g\. "):
            PatchSpec(positions=[(0, None), span])
    for span in SOME:  # a span some sequence fills is kept
        assert any(list(range(n))[slice(*span)] for n in range(1, 60))
        assert PatchSpec(positions=[span]).positions == (span,)


def test_spans_past_a_sequences_read_token_name_it(tiny_root):
    model = rl.load(str(tiny_root["llama"]))
    pair = DEMO_PAIRS[0]
    read = len(model.encode([pair])[0][0].ids) - 1  # a decoder without pads in its text reads its last token
    with pytest.raises(rl.errors.TokenizationError, match=rf"select no position in pair 0 \(chosen\), whose read "
                                                          rf"token is position {read}: .* positions 0 to {read};"):
        patch(model, [pair], positions=[(read + 5, read + 9)])


def test_the_command_line_says_what_is_wrong_with_0_0(tiny_root, tmp_path, capsys):
    from rewardlens.cli import main
    from rewardlens.data import save_pairs

    pairs = save_pairs(DEMO_PAIRS[:1], tmp_path / "pairs.jsonl")
    assert main(["patch", str(tiny_root["llama"]), "--pairs", str(pairs), "--positions", "0:0", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rewardlens: error: the span (0, 0) selects no position"), err
