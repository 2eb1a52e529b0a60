"""`rewardlens circuit` in-process on a tiny folder and a pairs file."""

import json

import numpy as np

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
