"""The graph's position rule matches the transcoders' training: at each sequence's first `skip_first` tokens
(a decoder's attention sink, which training and fidelity leave out) every MLP stays whole — no feature node
there, and the error node is the MLP's exact output, read here by a plain hook on the model's own forward.
The graph still closes on the reward and on every feature."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import rewardlens as rl
from rewardlens.graphs import graph
from rewardlens.graphs._pairs import _basis
from rewardlens.graphs._side import side_graph
from rewardlens.sae.internal import mlp_module, skip_first_for
from tests.graphs.conftest import SHORT, random_transcoders
from tests.helpers.tiny import own_scores

TOL = 1e-5


@pytest.fixture(scope="module")
def llama(tiny_root):
    return rl.load(str(tiny_root["llama"]))


def _mlp_io(model, ids: list[int]) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
    """Each layer's MLP input and output [T, d] on one plain forward (the yardstick: no graph hook)."""
    ins: dict[int, torch.Tensor] = {}
    outs: dict[int, torch.Tensor] = {}
    hooks = []
    for layer in range(model.n_layers):
        m = mlp_module(model, layer)
        hooks.append(m.register_forward_pre_hook(
            lambda _m, a, k, layer=layer: ins.__setitem__(layer, (a[0] if a else k["hidden_states"])[0].detach()),
            with_kwargs=True))
        hooks.append(m.register_forward_hook(
            lambda _m, _a, o, layer=layer: outs.__setitem__(layer, (o[0] if isinstance(o, tuple) else o)[0].detach())))
    try:
        with torch.no_grad():
            model.model(input_ids=torch.tensor([ids]))
    finally:
        for h in hooks:
            h.remove()
    return ins, outs


def _closes(g) -> None:
    value, const = g.nodes.value[g.rows], g.nodes.constant[g.rows]
    scale = np.abs(g.adjacency).astype(np.float64).sum(1) + np.abs(const)
    np.testing.assert_array_less(np.abs(value - g.adjacency.astype(np.float64).sum(1) - const), TOL * scale + 1e-7)


def test_the_default_is_the_training_rule(llama, tiny_root):
    assert skip_first_for(llama) == 1  # a decoder: its attention sink
    assert skip_first_for(rl.load(str(tiny_root["bert"]))) == 0  # an encoder reads its first token
    assert skip_first_for(llama, 3) == 3
    for bad in (-1, 1.5, True):
        with pytest.raises(rl.errors.UsageError, match="skip_first"):
            skip_first_for(llama, bad)


@pytest.mark.parametrize("skip_first", [None, 2])
def test_no_feature_before_skip_first_and_the_error_there_is_the_exact_mlp_output(llama, skip_first):
    tcs = random_transcoders(llama)  # a skip term and biases away from zero: each would show at the sink
    skip = skip_first_for(llama, skip_first)
    pg = graph(llama, SHORT, tcs, max_nodes=10**6, batch_size=32, skip_first=skip_first)[0]
    theirs = own_scores(llama, [SHORT])
    for j, g in enumerate((pg.chosen, pg.rejected)):
        feats = g.nodes.kind == 0
        assert feats.any() and not (g.nodes.position[feats] < skip).any()
        assert (g.nodes.position[feats] == skip).any()  # the rule cuts at skip_first, not later
        assert g.reward == pytest.approx(theirs[j], rel=1e-5, abs=1e-6)
        _closes(g)
        x, _ = _mlp_io(llama, llama.encode(SHORT)[0][j].ids)
        for i in np.flatnonzero(feats):  # features past the sink read the MLP input the model's own forward gives
            layer, pos, f = int(g.nodes.layer[i]), int(g.nodes.position[i]), int(g.nodes.feature[i])
            assert g.nodes.value[i] == pytest.approx(float(tcs[layer].pre(x[layer][pos].float())[f].detach()),
                                                     rel=1e-5, abs=1e-6)
    assert pg.margin.closure_gap <= TOL


def test_the_error_node_before_skip_first_is_the_mlp_output_minus_nothing(llama):
    tcs = random_transcoders(llama)
    ids = llama.encode(SHORT)[0][0].ids
    (_, batch), = llama.batches([llama.encode(SHORT)[0][0]], 1)
    x, y = _mlp_io(llama, ids)
    for skip in (1, 2):
        basis = _basis(llama, tcs, "transcoders", set(), skip)
        g = side_graph(llama, batch, basis, max_nodes=10**6, batch_size=32, label="chosen")
        _closes(g)
        for layer in range(llama.n_layers):
            torch.testing.assert_close(basis.err0[layer][:skip], y[layer][:skip].float(), rtol=1e-5, atol=1e-6)
            after = y[layer][skip:].float() - tcs[layer](x[layer][skip:].float())  # transcoder's error past the sink
            torch.testing.assert_close(basis.err0[layer][skip:], after, rtol=1e-4, atol=1e-5)
    # without the rule the transcoder's own error sits at position 0: a different node
    basis = _basis(llama, tcs, "transcoders", set(), 0)
    side_graph(llama, batch, basis, max_nodes=64, batch_size=32, label="chosen")
    assert (basis.active[0].pos == 0).any()
    assert not torch.allclose(basis.err0[0][0], y[0][0].float(), atol=1e-4)


def test_skip_first_is_for_transcoders(llama):
    with pytest.raises(rl.errors.UsageError, match="skip_first"):
        graph(llama, SHORT, basis="neurons", skip_first=1)
    with pytest.raises(rl.errors.UsageError, match="skip_first"):
        graph(llama, SHORT, random_transcoders(llama), skip_first=-1)


def test_the_command_line_takes_skip_first(tiny_root, tmp_path, capsys):
    from rewardlens.cli import main
    from rewardlens.data import save_pairs
    from rewardlens.sae import load_transcoders

    llama = rl.load(str(tiny_root["llama"]))
    folder = random_transcoders(llama).save(tmp_path / "tc")
    pairs = str(save_pairs([SHORT], tmp_path / "one.jsonl"))
    argv = ["graph", str(tiny_root["llama"]), "--pairs", pairs, "--transcoders", str(folder), "--max-nodes", "16",
            "--contexts", "0"]
    tcs = load_transcoders(folder)
    seen = []
    for skip in (0, 2):  # the option reaches the graph: each run's scores are the API's at that skip_first
        capsys.readouterr()
        assert main([*argv, "--out", str(tmp_path / f"g{skip}"), "--skip-first", str(skip), "--json"]) == 0
        row = json.loads(capsys.readouterr().out)["pairs"][0]
        scores = graph(llama, SHORT, tcs, max_nodes=16, skip_first=skip)[0].margin.scores
        assert (row["replacement_score"], row["completeness_score"]) == pytest.approx(
            (scores.replacement, scores.completeness), rel=1e-5)
        seen.append(row["replacement_score"])
    assert seen[0] != seen[1]
    capsys.readouterr()
    for bad in (["--skip-first", "-1"], ["--skip-first", "1", "--basis", "neurons"]):
        argv_bad = [a for a in argv if a not in ("--transcoders", str(folder))] if "neurons" in bad else argv
        assert main([*argv_bad, "--out", str(tmp_path / "bad"), *bad]) == 2
        assert "rewardlens: error: --skip-first" in capsys.readouterr().err


def test_training_records_skip_first_and_the_graph_and_fidelity_follow_it(llama, tmp_path):
    from rewardlens.sae import TranscoderTrainConfig, load_transcoders, train_transcoders, transcoder_fidelity

    cfg = TranscoderTrainConfig(d_sae=32, k=4, batch_size=16, buffer_rows=64, skip_first=2)
    trained = train_transcoders(llama, [SHORT] * 2, layers=[0], config=cfg).transcoders
    assert trained[0].cfg.skip_first == 2
    assert load_transcoders(trained.save(tmp_path / "tc"))[0].cfg.skip_first == 2  # it round-trips on disk
    # fidelity reads the same tokens as training: with the record, as with skip_first=2 given; not as with 0
    fit = {s: transcoder_fidelity(llama, trained, [SHORT], skip_first=s).explained_variance[0] for s in (None, 2, 0)}
    assert fit[None] == fit[2] != fit[0]
    recorded = random_transcoders(llama).with_provenance(skip_first=2)
    for given, first in ((None, 2), (0, 0)):  # the record is the default; a value given wins
        g = graph(llama, SHORT, recorded, max_nodes=10**6, batch_size=32, skip_first=given)[0].chosen
        assert int(g.nodes.position[g.nodes.kind == 0].min()) == first
