"""`rewardlens circuit` in-process on a tiny folder and a pairs file."""

import json
import re

import numpy as np
import pytest

from rewardlens.cli import main
from rewardlens.data import save_pairs
from rewardlens.zoo import DEMO_PAIRS


def test_circuit_command_prints_edges_and_the_circuit(capsys, tiny_root, tmp_path):
    pairs = str(save_pairs(DEMO_PAIRS[:2], tmp_path / "pairs.jsonl"))
    assert main(["circuit", str(tiny_root["llama"]), "--pairs", pairs, "--method", "eap", "--top", "3",
                 "--quiet", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["top_edges"]) == 3 and len(out["circuit"]["kept"]) == 3
    assert out["circuit"]["curve"][-1]["share"] == 1.0 or abs(out["circuit"]["curve"][-1]["share"] - 1) < 1e-4
    assert main(["circuit", str(tiny_root["llama"]), "--pairs", pairs, "--top", "2", "--quiet"]) == 0
    assert "carries" in capsys.readouterr().out


def test_circuit_command_at_head_level_evaluates_the_head_circuit(capsys, tiny_root, tmp_path):
    """`--level head` evaluates the head-level circuit: its share is `rl.circuit(level='head')` on the same pairs."""
    import rewardlens as rl

    pairs = str(save_pairs(DEMO_PAIRS[:2], tmp_path / "pairs.jsonl"))
    assert main(["circuit", str(tiny_root["llama"]), "--pairs", pairs, "--method", "eap", "--level", "head",
                 "--top", "3", "--quiet", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    direct = rl.circuit(rl.load(str(tiny_root["llama"])), DEMO_PAIRS[:2], method="eap", level="head", top=3)
    assert out["circuit"]["level"] == "head" and direct.level == "head"
    assert [(k["upstream"], k["downstream"]) for k in out["circuit"]["kept"]] == [(u, d) for u, d, _ in direct.kept]
    assert abs(out["circuit"]["share"] - direct.share) < 1e-6
    assert np.allclose([p["share"] for p in out["circuit"]["curve"]], direct.shares, atol=1e-6)
    assert main(["circuit", str(tiny_root["llama"]), "--pairs", pairs, "--method", "eap", "--level", "head",
                 "--top", "3", "--quiet"]) == 0
    assert f"head-level circuit of 3 edges carries {direct.share:.1%}" in capsys.readouterr().out


def test_circuit_command_corrupts_every_position_and_verifies_the_top_edges(capsys, organisms, tmp_path):
    """On the two_step organism (token-aligned sides) the planted first hop moves only when the positions
    before the read token are corrupted: `--positions all` keeps it, the default read token does not;
    `--verify` scores the top edges by path patching, each equal to `rl.path_patch` on that edge alone."""
    import rewardlens as rl
    from rewardlens.zoo.organisms import ORGANISMS

    folder, chosen = str(organisms[("two_step", 1.0)]), ORGANISMS["two_step"].pairs(20, seed=1)
    pairs = str(save_pairs(chosen, tmp_path / "pairs.jsonl"))
    planted = ORGANISMS["two_step"].planted_path
    argv = ["circuit", folder, "--pairs", pairs, "--level", "head", "--top", "4", "--quiet", "--json"]

    def kept(*extra):
        assert main([*argv, *extra]) == 0
        out = json.loads(capsys.readouterr().out)
        return out, [(k["upstream"], k["downstream"]) for k in out["circuit"]["kept"]]

    assert planted not in kept()[1]  # the read token alone: only the last hop moves
    out, edges = kept("--positions", "all")
    assert planted in edges and out["positions"] == "all"
    out, edges = kept("--positions", "all", "--verify", "4")
    model = rl.load(folder)
    for e in out["circuit"]["kept"]:
        assert e["exact"]
        truth = rl.path_patch(model, chosen, senders=[e["upstream"]], receivers=[e["downstream"]], positions="all")
        assert abs(e["score"] - float(truth.effect.mean())) < 1e-5
    direct = rl.circuit(model, chosen, level="head", top=4, positions="all", verify=4)
    assert edges == [(u, d) for u, d, _ in direct.kept] and planted in edges
    assert all(e["exact"] for e in out["top_edges"]) and out["circuit"]["verified"] == direct.verified > 0
    assert main([*argv[:-1], "--positions", "all", "--verify", "2"]) == 0
    text = capsys.readouterr().out
    assert "the top 2 by exact path patching" in text
    assert int(re.search(r"; (\d) of its edge scores are exact", text).group(1)) >= 2
    out, _ = kept("--positions", "all", "--receivers", "qkv")  # each head's q, k and v inputs apart
    assert {e["downstream"][-2:] for e in out["top_edges"] if "_H" in e["downstream"]} <= {"_q", "_k", "_v"}
    assert any("_H" in e["downstream"] for e in out["top_edges"])


def test_circuit_command_refuses_what_the_library_refuses(capsys, tiny_root, tmp_path):
    pairs = str(save_pairs(DEMO_PAIRS[:2], tmp_path / "pairs.jsonl"))
    folder = str(tiny_root["llama"])
    assert main(["circuit", folder, "--pairs", pairs, "--receivers", "qkv", "--quiet"]) == 2
    assert "pass --level head too" in capsys.readouterr().err
    for bad in (["--verify", "-1"], ["--positions", "1-2"]):
        with pytest.raises(SystemExit) as exc:
            main(["circuit", folder, "--pairs", pairs, *bad])
        assert exc.value.code == 2
