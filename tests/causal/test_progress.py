"""Progress on the long causal steps (issue 20): `patch`, `attribution_patch` and `faithfulness` show a
bar that every batch loop inside advances, off by default, and the numbers do not depend on it."""

import numpy as np

import rewardlens as rl
from rewardlens.causal import faithfulness, patch
from rewardlens.data.internal import counting, tick
from rewardlens.zoo import DEMO_PAIRS


def test_patch_and_faithfulness_count_their_batches_on_stderr(tiny_root, capsys):
    model = rl.load(str(tiny_root["llama"]))
    quiet = patch(model, DEMO_PAIRS[:3], level="head")
    capsys.readouterr()
    loud = patch(model, DEMO_PAIRS[:3], level="head", progress=True)
    err = capsys.readouterr().err
    assert "patch" in err and "batch" in err
    np.testing.assert_array_equal(loud.effect, quiet.effect)
    faithfulness(model, DEMO_PAIRS[:3], n_boot=20, progress=True)
    err = capsys.readouterr().err
    assert "faithfulness" in err and "attribution patching" in err  # the bar names the step it is in
    faithfulness(model, DEMO_PAIRS[:3], n_boot=20)
    assert capsys.readouterr().err == ""


def test_a_counting_block_inside_another_keeps_the_outer_bar():
    with counting("outer", True) as outer:
        with counting("inner", True) as inner:
            tick(3)
        assert inner is outer and outer.n == 3
    tick()  # outside any block: nothing to advance, no error
