"""Circuits by edge ablation: every edge is the clean run, no edge the fully corrupted read token."""

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.errors import CircuitError


@pytest.fixture(scope="module")
def found(tiny_root, pairs):
    return rl.circuit(rl.load(str(tiny_root["llama"])), pairs, method="eap", top=3)


def test_every_edge_is_the_clean_run_and_no_edge_the_corrupted_read(found):
    every = found.sizes.index(len(found.ranked))
    np.testing.assert_allclose(found.margins[every], found.clean, atol=1e-5)
    # read-position noising with no edge kept: every node reads the rejected side's writes at the read
    # token, so the reward read there is the rejected side's own: margin 0 (by hand)
    np.testing.assert_allclose(found.empty, 0.0, atol=1e-5)
    assert found.sizes[0] == 0 and len(found.kept) == 3 and found.kept == found.ranked[:3]
    frame = found.to_frame()
    assert frame["share"].iloc[every] == pytest.approx(1.0, abs=1e-5)
    assert '"share"' in found.to_json()


def test_smallest_and_bad_input(found, tiny_root, pairs):
    assert len(found.smallest(0.99)) <= len(found.ranked)
    with pytest.raises(CircuitError, match="no evaluated circuit reaches a share of 2"):
        found.smallest(2.0)
    model = rl.load(str(tiny_root["llama"]))
    with pytest.raises(CircuitError, match="at least one edge"):
        rl.circuit(model, pairs, method="eap", top=0)
    with pytest.raises(ValueError, match="exactly one of top="):
        rl.circuit(model, pairs, method="eap")
    with pytest.raises(CircuitError, match="sublayer-level"):
        rl.circuit(model, pairs, edges=rl.edges(model, pairs, level="head"), top=2)
