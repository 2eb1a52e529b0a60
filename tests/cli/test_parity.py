"""`rewardlens parity`: prints every check, exits 0 within tolerance, and fails loudly (exit 1, one line
naming the check, its value and the tolerance) when a planted wrong read token breaks parity."""

import json
import re
from dataclasses import replace

import pytest

import rewardlens as rl
from rewardlens.cli import main
from rewardlens.cli import parity as cli_parity
from rewardlens.data import save_pairs
from rewardlens.model import _core, parity
from rewardlens.model.internal import PARITY_CHECKS as CHECKS


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory, pairs):
    return str(save_pairs(pairs, tmp_path_factory.mktemp("parity") / "pairs.jsonl"))


def test_every_check_printed_and_passed(capsys, tiny_root, pairs_file):
    assert main(["parity", str(tiny_root["gpt2"]), "--pairs", pairs_file]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in CHECKS) and "every check within tolerance" in out and "FAILED" not in out


def test_json_is_the_library_summary(capsys, tiny_root, pairs_file, pairs):
    assert main(["parity", str(tiny_root["llama"]), "--pairs", pairs_file, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    ours = parity(rl.load(str(tiny_root["llama"])), pairs).to_frame().to_dict("records")
    assert out["passed"] is True and out["dtype"] == "float32"
    assert [c["name"] for c in out["checks"]] == list(CHECKS)
    for got, want in zip(out["checks"], ours):
        assert got["difference"] == pytest.approx(want["difference"], abs=1e-7)
        assert got["tolerance"] == pytest.approx(want["tolerance"])


def test_a_wrong_read_token_fails_loudly(monkeypatch, capsys, tiny_root, pairs_file):
    collate, load = _core.collate, cli_parity.load_model

    def loaded_then_planted(args):  # after load: the load-time proof `verify` would refuse it first
        model = load(args)
        monkeypatch.setattr(_core, "collate", lambda seqs, **kw: replace(b := collate(seqs, **kw),
                                                                         read_at=b.read_at - 1))
        return model

    monkeypatch.setattr(cli_parity, "load_model", loaded_then_planted)
    assert main(["parity", str(tiny_root["llama"]), "--pairs", pairs_file]) == 1
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.startswith("rewardlens: parity: check trl_read")]
    # 1e-4 scaled by the rewards' size (max(1, max |reward|)), the value far above it
    value = r"\d\.\d{3}e[-+]0[0-2]"  # a wrong token moves the reward by O(0.01-1)
    assert len(lines) == 1 and re.search(rf"difference\| {value} > tolerance \d\.\de-04 \(float32\)$", lines[0])
    assert "parity FAILED" in captured.out
