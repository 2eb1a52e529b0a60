"""The calibration suite: its scorecard on the organisms, its grading rules, and `rewardlens calibrate`."""

import json
import re

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

# Known limitations, measured and reported but not counted (docs/organisms.md, SAE ground truth): no single SAE
# feature removes most of the planted margin (the rule is split over about five co-firing features; the planted
# group's joint ablation row, graded, removes most of it), and the keyword's reward feature fires after the word,
# never on it.
KNOWN = {("list", "mean ablation effect of reward feature #1"),
         ("keyword", "mean ablation effect of reward feature #1"),
         ("keyword", "share of reward feature #1 (*)'s top-10 context peaks inside the planted word"),
         # frozen attention cannot express a rule that is *which token a head attends to* (docs/graphs.md)
         ("two_step", "share of * pairs whose pruned margin graph's top path runs from a token where the sides "
                      "differ")}


def _known(row):
    return any(row.organism == o and re.fullmatch(re.escape(c).replace(r"\*", r"\d+") + ".*", row.check)
               for o, c in KNOWN)


@pytest.fixture(scope="module")
def card(organisms):
    return calibrate(n_pairs=60)


def test_scorecard_passes_every_threshold(card):
    failures = [(r.instrument, r.organism, r.check, r.value) for r in card.failures]
    assert card.passed and not failures, failures
    # Exactly the known limitations are marked known, and each still fails, as measured: a known row that starts
    # passing (or a new row marked known) shows up here.
    assert {(r.organism, r.check) for r in card.rows if r.known} == {(r.organism, r.check) for r in card.rows
                                                                     if _known(r)}
    assert len(card.known_failures) == len(KNOWN) and all(r.result == "known" for r in card.known_failures)
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


def test_sae_ground_truth_is_graded_on_both_organisms(card):
    """Issue 28 item 5: reward feature #1 of each organism's SAE is found (its contexts), ablated and labelled."""
    rows = {(r.organism, re.sub(r"\(\d+\)", "(f)", r.check)): r for r in card.rows if r.instrument == "sae"}
    head = "reward feature #1 (f)"
    for name, span in (("list", "bullet lines"), ("keyword", "planted word")):
        inside = rows[name, f"share of {head}'s top-10 context peaks inside the {span}"]
        after = rows[name, f"share of {head}'s top-10 context peaks inside or after the {span}"]
        ablated = rows[name, f"mean ablation effect of {head} as a share of the mean clean margin"]
        rho = rows[name, f"Spearman ρ of {head} with the {name!r} attribute axis"]
        rank = rows[name, f"rank of the {name!r} axis by ρ with {head} among ['list', 'keyword', 'length']"]
        assert after.passed and after.value >= 0.8 and rho.passed and rho.value >= 0.5 and rank.value == 1
        # The feature carries a real share of the margin, but not most of it: reported, failing.
        assert 0.1 < ablated.value < 0.5 and not ablated.passed
        assert inside.passed is (name == "list")
        # The planted group (the top-8 by margin that the card ties to the own axis), ablated jointly, removes
        # most of it: graded, not a known limitation; the rule is split over several features.
        rule = f"top-8 features by margin with ρ ≥ 0.5 on the {name!r} axis"
        group = rows[name, f"mean joint ablation effect of the planted group ({rule}) as a share of the mean clean "
                           "margin"]
        size = rows[name, f"size of the planted group ({rule})"]
        assert group.passed and not group.known and group.value >= 0.5 and group.value > ablated.value + 0.3
        assert size.passed and 2 <= size.value <= 8
    assert rows["keyword", f"share of {head}'s top-10 context peaks inside the planted word"].value == 0.0


def test_scorecard_round_trips_through_json(card, tmp_path):
    text = card.to_json(tmp_path / "card.json")
    data = json.loads((tmp_path / "card.json").read_text())
    assert data == json.loads(text) and data["passed"] is card.passed
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


def test_a_known_limitation_is_reported_but_not_counted(capsys):
    """A failing row marked `known` leaves the scorecard passed and the command's exit 0, but is printed with
    its reason; an unmarked failing row still fails both."""
    from rewardlens.cli.organisms import COMMANDS

    known = Grade.of("sae", "list", "ablation share", 0.3, 0.5, known="split over five features")
    fails = Grade.of("sae", "list", "another share", 0.3, 0.5)
    ok = Grade.of("sae", "list", "rho", 0.9, 0.5)
    assert (known.result, fails.result, ok.result) == ("known", "FAIL", "pass")
    good, bad = Scorecard((ok, known), {"seconds": 1.0}), Scorecard((ok, known, fails), {"seconds": 1.0})
    assert good.passed and good.failures == [] and good.known_failures == [known]
    assert not bad.passed and bad.failures == [fails]
    command = COMMANDS[0]
    assert command.exit_code is not None
    assert command.exit_code({**good.to_dict(), "out": None}) == 0
    assert command.exit_code({**bad.to_dict(), "out": None}) == 1
    command.show({**good.to_dict(), "out": None})
    out = capsys.readouterr().out
    assert "1/2 checks passed" in out and "1 known limitations failed as expected" in out
    assert "known: list: ablation share: split over five features" in out


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
