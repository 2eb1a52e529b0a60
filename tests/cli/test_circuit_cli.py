"""`rewardlens circuit` in-process on a tiny folder and a pairs file."""

import json

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
