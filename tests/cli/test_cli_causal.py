"""`rewardlens patch` and `rewardlens faithfulness`, run in-process on a real folder and pairs file."""

import json

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.causal import patch
from rewardlens.cli import main
from rewardlens.cli.causal import positions
from rewardlens.zoo import DEMO_PAIRS


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_patch_json_matches_the_api(capsys, tiny_root, demo_file):
    path = str(tiny_root["qwen2"])
    out = _json(capsys, ["patch", path, "--pairs", demo_file, "--json", "--level", "head", "--all-parts",
                         "--divergence", "--atp", "--top", "5"])
    res = patch(rl.load(path), DEMO_PAIRS, level="head")
    first = out["pairs"][0]["effects"]
    for name in ("attn_L1_H2", "mlp_L0"):
        assert first[name] == pytest.approx(float(res.effect[0, res.names.index(name)]), abs=1e-6)
    assert [t["part"] for t in out["top_parts"]] == [n for n, _ in res.top(5)]
    assert 0 <= out["reliability"]["flagged_share"] <= 1
    assert out["attribution_patching_agreement"]["k"] == 5


def test_patch_and_faithfulness_tables(capsys, tiny_root, demo_file):
    path = str(tiny_root["llama"])
    assert main(["patch", path, "--pairs", demo_file, "--mode", "ablation", "--ablation", "mean"]) == 0
    text = capsys.readouterr().out
    assert "ablation" in text and "mlp_L" in text
    assert main(["faithfulness", path, "--pairs", demo_file, "--boot", "50"]) == 0
    text = capsys.readouterr().out
    assert "attribution vs direct" in text and "−0.256" in text
    assert "total computed by engine cached_read_sweep" in text and "direct computed by engine direct_rewards" in text
    out = _json(capsys, ["faithfulness", path, "--pairs", demo_file, "--boot", "50", "--json"])
    assert out["seed_positions"] == "read" and len(out["pairs"]) == len(DEMO_PAIRS)
    assert np.isfinite(out["summary"][0]["rho"])
    assert set(out["engines"]) == {"total", "seed_effect", "direct", "attribution_patching"}
    assert out["engines"]["total"] == str(rl.faithfulness(rl.load(path), DEMO_PAIRS, n_boot=10).provenance["total"])


def test_positions_option_parses_and_refuses(capsys, tiny_root, demo_file):
    assert positions("-4:") == [(-4, None)] and positions("0:3,-2:") == [(0, 3), (-2, None)]
    assert main(["patch", str(tiny_root["llama"]), "--pairs", demo_file, "--positions", "all"]) == 2
    assert "token-aligned" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["patch", str(tiny_root["llama"]), "--pairs", demo_file, "--positions", "x"])


def test_audit_and_patch_list_the_same_top_parts(capsys, tiny_root, demo_file, tmp_path):
    """One ranking rule (`stats.top_parts`): the audit's table of top parts is `rewardlens patch`'s at the
    audit's level, mode and positions, and every number in it is the patching result's own mean."""
    path = str(tiny_root["llama"])
    audited = _json(capsys, ["audit", path, "--pairs", demo_file, "--json", "--out", str(tmp_path),
                             "--no-probes", "--no-concepts", "--no-divergence", "--no-tokens", "--quiet",
                             "--top", "6"])
    patched = _json(capsys, ["patch", path, "--pairs", demo_file, "--json", "--level", "head", "--top", "6"])
    assert [t["part"] for t in audited["top_parts"]] == [t["part"] for t in patched["top_parts"]]
    res = patch(rl.load(path), DEMO_PAIRS, level="head")
    for t in audited["top_parts"]:
        assert t["total_effect"] == pytest.approx(float(res.effect[:, res.names.index(t["part"])].mean()), abs=1e-6)
    # The rule is mean |effect|, not |mean effect|: the two orders differ on this model's parts.
    size, mean = np.abs(res.effect).mean(0), np.abs(res.effect.mean(0))
    assert [res.names[i] for i in np.argsort(-size, kind="stable")[:6]] == [t["part"] for t in audited["top_parts"]]
    stored = json.loads((tmp_path / "numbers.json").read_text())["top_parts"]
    assert [t["part"] for t in stored] == [t["part"] for t in audited["top_parts"]]  # printed = stored
    assert not np.array_equal(np.argsort(-size, kind="stable"), np.argsort(-mean, kind="stable"))
