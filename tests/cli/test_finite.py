"""No silent wrong numbers from non-finite rewards on the command line: `score` names the NaN pairs and
counts the others, `--json` is strict JSON (null, never NaN), a model with no finite reward exits
non-zero naming the cause, and a saturated model (every margin exactly 0) says so."""

from __future__ import annotations

import json

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.cli import main
from rewardlens.data import margin, save_pairs
from rewardlens.errors import RewardLensWarning
from rewardlens.model.internal import SATURATED
from tests.helpers import finite


def strict(text: str) -> dict:
    def refuse(token: str) -> None:
        raise AssertionError(f"{token} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def nan_model(tiny_root, tokenizer, tmp_path_factory) -> str:
    return str(finite.nan_word_model(tiny_root["llama"], tmp_path_factory.mktemp("injected") / "m", tokenizer))


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("pairs")
    return {"some": str(save_pairs(finite.pairs(6, bad={3, 5}), root / "some.jsonl")),
            "all": str(save_pairs(finite.pairs(3, bad={1, 2, 3}), root / "all.jsonl"))}


def _wins(model: str) -> int:
    m = margin(rl.load(model).score(finite.pairs(6, bad={3, 5})))
    return int(np.sum(m[[0, 1, 3, 5]] > 0))


def test_score_names_the_nan_pairs_and_counts_the_others(capsys, nan_model, files):
    assert main(["score", nan_model, "--pairs", files["some"]]) == 0
    out = capsys.readouterr().out
    wins = _wins(nan_model)
    assert (f"pair accuracy: {wins / 4:.3f} over 4 of 6 pairs; 2 pairs with non-finite rewards excluded: p3, p5"
            in out)
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("p")}
    assert "non-finite" in rows["p3"] and rows["p3"].rstrip().endswith("excluded") and "excluded" not in rows["p4"]
    assert "nan" not in out


def test_json_is_strict_with_null_for_nan(capsys, nan_model, files):
    assert main(["score", nan_model, "--pairs", files["some"], "--json"]) == 0
    got = strict(capsys.readouterr().out)
    by = {p["id"]: p for p in got["pairs"]}
    assert by["p3"]["chosen"] is None and by["p3"]["margin"] is None and not by["p3"]["counted"]
    assert got["excluded"] == ["p3", "p5"] and got["counted"] == 4
    assert got["accuracy"] == pytest.approx(_wins(nan_model) / 4)
    # every command's --json goes through the one writer: the lens' NaN margins are null too
    assert main(["lens", nan_model, "--pairs", files["some"], "--json"]) == 0
    lens = strict(capsys.readouterr().out)
    assert lens["pairs"][2]["linear_margin"][-1] is None and lens["pairs"][3]["linear_margin"][-1] is not None


def test_no_finite_reward_exits_non_zero_naming_the_cause(capsys, nan_model, files):
    assert main(["score", nan_model, "--pairs", files["all"]]) == 2
    captured = capsys.readouterr()
    assert not captured.out
    assert ("every reward is NaN: a weight of the model is non-finite or overflows in float32; check the weights"
            in captured.err)


def test_a_saturated_model_says_so(capsys, monkeypatch, tiny_root, files):
    # A down-projection at 1e30 after loading: x² overflows in every norm, every reward is the constant.
    saturated = finite.overflowing(rl.load(str(tiny_root["llama"])))
    monkeypatch.setattr("rewardlens.cli.base.load_model", lambda args: saturated)
    with pytest.warns(RewardLensWarning, match="every margin is exactly 0"):
        assert main(["score", str(tiny_root["llama"]), "--pairs", files["some"]]) == 0
    assert f"pair accuracy: 0.000 over 6 pairs; {SATURATED}" in capsys.readouterr().out


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_audit_of_a_model_with_nan_rewards_on_some_pairs_runs_and_names_them(capsys, nan_model, files, tmp_path):
    """The audit's patching engines prove themselves against the clean run; a NaN clean run proved nothing and
    ended in torch's "atol must be greater than or equal to zero" traceback before the summary could count."""
    code = main(["audit", nan_model, "--pairs", files["some"], "--out", str(tmp_path / "out"), "--no-probes",
                 "--no-concepts", "--quiet"])
    got = capsys.readouterr()
    out = got.out
    assert code == 0, got.err
    assert "over 4 of 6 pairs (95% Wilson interval" in out
    assert "; 2 pairs with non-finite rewards excluded: p3, p5" in out
    top = out[out.index("top parts by"):].splitlines()[3]  # the first part's row: numbers over the counted pairs
    assert "None" not in top and "nan" not in top
    numbers = strict((tmp_path / "out" / "numbers.json").read_text(encoding="utf-8"))
    assert numbers["scores"]["excluded"] == ["p3", "p5"] and numbers["scores"]["counted"] == 4
