"""Verified edges (`verify=n`): the cheap scores propose, exact path patching scores the top candidates.

The yardstick is one `rl.path_patch` call per edge, on that edge alone."""

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.errors import CircuitError


def direct(model, pairs, u, d, **corruption):
    """Path patching of the one edge u → d: effect per pair [n_pairs]."""
    return rl.path_patch(model, pairs, senders=[u], receivers=[d], **corruption).effect[:, 0, 0]


def rank(scored, edge):
    """1-based rank of `edge` among every edge by mean |score| (the order of `Edges.top` and `circuit`)."""
    return [(u, d) for u, d, _ in scored.top(len(scored.names))].index(edge) + 1


def cell(scored, u, d):
    return scored.upstream.index(u), scored.downstream.index(d)


@pytest.fixture(scope="module")
def llama(tiny_root):
    return rl.load(str(tiny_root["llama"]))


@pytest.mark.parametrize("level, corruption, n", [
    ("sublayer", {}, 6),
    ("head", {"mode": "denoising", "positions": [(-3, None)]}, 12),  # its first 9 edges go into 'reward'
])
def test_the_first_n_edges_are_scored_by_path_patching_edge_by_edge(llama, pairs, level, corruption, n):
    plain = rl.edges(llama, pairs, method="eap", level=level, **corruption)
    checked = rl.edges(llama, pairs, method="eap", level=level, verify=n, **corruption)
    assert checked.verified is not None and checked.verified.any()  # estimated edges were among the first n
    for u, d, s in checked.top(n):
        i, j = cell(checked, u, d)
        assert checked.exact[i, j], (u, d)
        np.testing.assert_allclose(checked.score[:, i, j], direct(llama, pairs, u, d, **corruption), atol=2e-6)
        assert s == pytest.approx(checked.score[:, i, j].mean())
    estimated = checked.valid & ~checked.exact
    assert estimated.any()
    np.testing.assert_array_equal(checked.score[:, estimated], plain.score[:, estimated])  # left as scored
    assert not checked.verified[:, -1].any()  # the 'reward' column is exact already: never re-run
    np.testing.assert_array_equal(checked.score[:, :, -1], plain.score[:, :, -1])
    frame = checked.to_frame()
    assert list(frame["approximate"][: len(checked.names)]) == list(~checked.exact[checked.valid])
    # the verified scores rank: every estimate outside the first n is below the n-th exact score
    nth = np.abs(checked.flat()).mean(0)[np.argsort(-np.abs(checked.flat()).mean(0), kind="stable")[n - 1]]
    assert np.abs(checked.score[:, estimated]).mean(0).max() <= nth


def test_a_verified_circuit_keeps_exactly_scored_edges(llama, pairs):
    found = rl.circuit(llama, pairs, method="eap", top=4, verify=4)
    assert found.verified > 0 and len(found.exact) == len(found.ranked)
    for (u, d, s), exact in zip(found.kept, found.exact):
        assert exact
        assert s == pytest.approx(float(direct(llama, pairs, u, d).mean()), abs=2e-6)
    summary = found.to_dict()
    assert summary["verified"] == found.verified and all(k["exact"] for k in summary["kept"])
    assert found.summary().loc["verified", "value"] == found.verified
    # scores given, then verified by the circuit under the same corruption: the same circuit
    again = rl.circuit(llama, pairs, edges=rl.edges(llama, pairs, method="eap"), top=4, verify=4)
    assert again.kept == found.kept and again.exact == found.exact
    plain = rl.circuit(llama, pairs, method="eap", top=4)
    assert plain.verified == 0 and plain.exact == [d == "reward" for _, d, _ in plain.ranked]
    assert [k["exact"] for k in plain.to_dict()["kept"]] == [d == "reward" for _, d, _ in plain.kept]


def test_bad_verify_is_refused_by_name(llama, pairs):
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(CircuitError, match="verify is how many of the top edges"):
            rl.edges(llama, pairs, verify=bad)
        with pytest.raises(CircuitError, match="verify is how many of the top edges"):
            rl.circuit(llama, pairs, top=2, verify=bad)
    scored = rl.edges(llama, pairs)
    with pytest.raises(CircuitError, match="scored on 3 pairs"):
        scored.verify(llama, pairs[:2], 2)
    with pytest.raises(CircuitError, match="pass level='head' or drop qkv"):
        rl.edges(llama, pairs, qkv=True)
    assert rl.edges(llama, pairs, verify=0).verified is None


def test_on_the_two_step_organism_verify_scores_the_saturated_path_exactly(organisms):
    """Every position noised (token-aligned sides). EAP at the clean run overshoots the planted edge and
    misses the receiving head's key input; verified, both carry what path patching says (measured at
    seed 0, 40 pairs: planted edge 3.53 → 1.00 of the margin; key input 0.002 → 0.95, rank 8 → 2)."""
    from rewardlens.zoo.organisms import ORGANISMS

    model = rl.load(str(organisms[("two_step", 1.0)]))
    pairs = ORGANISMS["two_step"].pairs(40, seed=1)
    sender, receiver = ORGANISMS["two_step"].planted_path
    whole = rl.edges(model, pairs, method="eap", level="head", positions="all")
    checked = whole.verify(model, pairs, 10, positions="all")
    truth = direct(model, pairs, sender, receiver, positions="all")
    margin = whole.margin.mean()
    i, j = cell(whole, sender, receiver)
    assert whole.score[:, i, j].mean() > 2 * margin  # the estimate overshoots the saturated edge
    np.testing.assert_allclose(checked.score[:, i, j], truth, atol=1e-5)
    assert checked.exact[i, j] and 0.9 < truth.mean() / margin < 1.1
    key = (sender, receiver + "_k")
    split = rl.edges(model, pairs, method="eap", level="head", qkv=True, positions="all")
    verified = split.verify(model, pairs, 10, positions="all")
    i, j = cell(split, *key)
    assert abs(split.score[:, i, j].mean()) < 0.05 * margin and rank(split, key) > 3  # missed
    np.testing.assert_allclose(verified.score[:, i, j], direct(model, pairs, *key, positions="all"), atol=1e-5)
    assert verified.score[:, i, j].mean() > 0.5 * margin and rank(verified, key) <= 3  # found, exactly
