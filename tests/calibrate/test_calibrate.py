"""The calibration suite: its scorecard on the organisms, its grading rules, and `rewardlens calibrate`."""

import json

import numpy as np
import pytest

from rewardlens.calibrate import (
    GRADERS,
    Grade,
    OrganismBench,
    Scorecard,
    calibrate,
    localisation,
)
from rewardlens.cli import main
from rewardlens.stats import spearman


@pytest.fixture(scope="module")
def card(organisms):
    return calibrate(n_pairs=60)


def test_scorecard_passes_every_threshold(card):
    failures = [(r.instrument, r.organism, r.check, r.value) for r in card.failures]
    assert card.passed and not failures, failures
    frame = card.to_frame()
    assert len(frame) == len(card.rows) and set(frame["instrument"]) >= {
        "organism", "attribution", "lens", "patching", "path-frozen patching", "attribution patching", "sae",
        "probes", "cascades", "distortion", "concepts", "conflict", "editing"}
    # Issue 5's instruments: planted biases flagged, the distortion index tracks planted strength.
    probes = frame[frame["instrument"] == "probes"]
    assert set(probes["organism"]) == {"length", "list", "confidence", "sycophancy", "keyword"}
    assert "Spearman(strength, formatting distortion index) over 3 strengths" in set(frame["check"])
    # Every organism's accuracy is graded; the circuit is localised at both levels and swept in strength.
    accuracy = frame[frame["check"].str.startswith("held-out pair accuracy")]
    assert set(accuracy["organism"]) == set(card.settings["organisms"]) and (accuracy["value"] >= 0.97).all()
    checks = set(frame.loc[frame["instrument"] == "attribution", "check"])
    assert {"rank of attn_L1 by mean margin (sublayer level)", "rank of attn_L1_H2 by mean margin (head level)",
            "Spearman(strength, mean margin on attn_L1_H2) over 3 strengths"} <= checks
    assert frame.loc[frame["check"].str.startswith("rank of"), "value"].eq(1).all()
    patching = set(frame.loc[frame["instrument"] == "patching", "check"])
    assert {"rank of attn_L1_H2 by mean noising effect (head level)",
            "Spearman(strength, mean noising effect of attn_L1_H2) over 3 strengths"} <= patching


def test_scorecard_round_trips_through_json(card, tmp_path):
    text = card.to_json(tmp_path / "card.json")
    data = json.loads((tmp_path / "card.json").read_text())
    assert data == json.loads(text) and data["passed"] is True
    assert [Grade(**r) for r in data["rows"]] == list(card.rows)
    assert data["settings"]["strengths"] == [0.25, 0.5, 1.0]


def test_grades_fail_when_the_instrument_is_wrong():
    names = ["embed", "attn_L0", "mlp_L0", "attn_L1", "mlp_L1"]
    right = localisation("x", "circuit", names, np.array([0.0, 0.1, 0.0, 3.0, 0.1]), "attn_L1", "sublayer")
    wrong = localisation("x", "circuit", names, np.array([2.0, 0.1, 0.0, 1.0, 0.1]), "attn_L1", "sublayer")
    assert all(r.passed for r in right) and not any(r.passed for r in wrong)
    assert wrong[0].value == 2 and wrong[1].value == pytest.approx(1.0 / 3.2)
    assert not Grade.of("x", "o", "c", float("nan"), 0.0, "<=").passed  # undefined never passes
    assert Grade.of("x", "o", "c", 0.9, 0.97).passed is False and Grade.of("x", "o", "c", 1.0, 1.0, "==").passed
    card = Scorecard((right[0], wrong[0]))
    assert not card.passed and card.failures == [wrong[0]]


def test_spearman():
    assert spearman([0.25, 0.5, 1.0], [0.4, 1.1, 9.0]) == 1.0
    assert spearman([0.25, 0.5, 1.0], [0.4, 9.0, 1.1]) == 0.5
    assert spearman([1, 2, 3], [3, 2, 1]) == -1.0
    assert np.isnan(spearman([1, 2, 3], [1, 1, 1]))


def test_suite_is_a_list_later_instruments_append_to(organisms):
    seen = []

    def grade_probe(bench):  # what a new instrument's grader looks like
        seen.append(bench.pairs("list")[0])
        return [Grade.of("probe", "list", "always", 1.0, 1.0)]

    card = calibrate(graders=[*GRADERS[:1], grade_probe], organisms=["list"], n_pairs=20)
    assert card.rows[-1].instrument == "probe" and len(seen) == 1 and card.passed
    assert {r.organism for r in card.rows} == {"list"}


def test_bench_refuses_bad_settings():
    with pytest.raises(ValueError, match="at least 3"):
        OrganismBench(strengths=(0.5, 1.0))
    with pytest.raises(ValueError, match="lenght"):
        OrganismBench(organisms=["lenght"])


def test_cli_calibrate_prints_the_table_and_writes_json(organisms, capsys, tmp_path):
    out = tmp_path / "scorecard.json"
    assert main(["calibrate", "--organism", "circuit", "--n-pairs", "30", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "rank of attn_L1_H2 by mean margin (head level)" in text and "checks passed" in text
    data = json.loads(out.read_text())
    assert data["passed"] and data["settings"]["organisms"] == ["circuit"]
    assert main(["calibrate", "--organism", "circuit", "--n-pairs", "30", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["rows"] == data["rows"]
