"""The probes' group-sequential item budget (`probe(stages=)`): where it stops and why, statistics equal to
`probe` on exactly the items of the stage it stopped at, each sequence scored once across stages, and the
audit's and the CLI's `--probe-items` (a number, 'all', or the staged default)."""

import json

import numpy as np
import pytest

import rewardlens as rl
import rewardlens.hacking._probes as probes_module
from rewardlens.audit import Plan
from rewardlens.calibrate import bank_items
from rewardlens.cli import build_parser, main
from rewardlens.cli import probes as cli_probes
from rewardlens.hacking import ITEMS, STAGES, probe, spread_items
from rewardlens.hacking._probe_plan import probe_plan
from rewardlens.zoo.organisms import ORGANISMS

FIELDS = ("n", "mean", "ci_low", "ci_high", "p", "q", "effect_size", "delta", "base_reward", "quality_delta")


@pytest.fixture(scope="module")
def list_model(organisms):
    return rl.load(str(organisms[("list", 1.0)]))


@pytest.fixture(scope="module")
def reference():
    return ORGANISMS["list"].pairs(40, seed=1)


def _same(staged, direct, exact):
    """`staged` holds `direct`'s statistics: bit-equal when `exact`, else to float precision (a later stage
    scores its sequences in other batches); the flags and items always equal."""
    assert staged.item_ids == direct.item_ids and staged.scale == direct.scale
    np.testing.assert_array_equal(staged.flagged, direct.flagged)
    for name in FIELDS:
        a, b = getattr(staged, name), getattr(direct, name)
        if exact:
            np.testing.assert_array_equal(a, b, err_msg=name)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=name)


def _by_hand(res, interim):
    """The decision rule as a naive loop over the axes (docs/probes.md)."""
    floor, out = res.min_effect * res.scale, []
    for j in range(len(res.axes)):
        m, lo, hi, q = res.mean[j], res.ci_low[j], res.ci_high[j], res.q[j]
        beyond = lo >= floor if m > 0 else hi <= -floor
        if q < interim and abs(m) >= floor and beyond:
            out.append("flagged")
        elif -floor < lo and hi < floor:
            out.append("negligible")
        else:
            out.append("undecided")
    return tuple(out)


def test_a_planted_bias_and_two_null_axes_stop_at_the_first_stage(list_model, reference):
    """The list organism's formatting effect is decided flagged on 20 items, and refusal and politeness are
    decided negligible: the run stops there, with the statistics of `probe` on those 20 items."""
    pool, axes = bank_items(40), ["formatting", "refusal", "politeness"]
    staged = probe(list_model, pool, axes=axes, reference=reference, scale="reference", stages=(20, 40), n_boot=400)
    assert (staged.stage, staged.stages, staged.stopped_because) == (1, (20, 40), "decided")
    assert staged.decided == ("flagged", "negligible", "negligible")
    direct = probe(list_model, spread_items(20, pool), axes=axes, reference=reference, scale="reference", n_boot=400)
    _same(staged, direct, exact=True)
    assert _by_hand(direct, 0.02 * 0.05) == staged.decided
    assert staged.budget() == ("20 items, stage 1 of 2 (20/40 items): stopped early, every axis decided "
                               "(flagged or negligible)")
    frame = staged.to_frame()
    assert list(frame.decided) == list(staged.decided) and frame.attrs["stopped_because"] == "decided"


def test_an_effect_near_the_floor_runs_every_stage_and_scores_each_sequence_once(list_model, reference, monkeypatch):
    """On all axes the list organism's length and emoji effects sit near the flag floor: undecided at 10 and
    20 items, so the run goes on to all 40, the full run's statistics; a later stage scores only its new
    sequences."""
    pool = bank_items(40)
    scored: list[int] = []
    rewards = probes_module._rewards
    monkeypatch.setattr(probes_module, "_rewards", lambda model, convs, *a, **k: (scored.append(len(convs)),
                                                                                rewards(model, convs, *a, **k))[1])
    staged = probe(list_model, pool, reference=reference, scale="reference", stages=(10, 20, 40), n_boot=400)
    monkeypatch.undo()
    assert (staged.stage, staged.stages, staged.stopped_because) == (3, (10, 20, 40), "last stage")
    second = probe(list_model, spread_items(20, pool), reference=reference, scale="reference", n_boot=400)
    assert staged.decided == _by_hand(second, 0.02 * 0.05) and "undecided" in staged.decided
    assert {"length", "emoji"} <= {a for a, d in zip(staged.axes, staged.decided) if d == "undecided"}
    full = probe(list_model, pool, reference=reference, scale="reference", n_boot=400)
    _same(staged, full, exact=False)
    # each distinct conversation of the three stages once: the union of what each stage needs, the later stages'
    # base answers first (the items' sd, here the alternative scale, is over all 40 before any axis is scored)
    keys = [set(probe_plan(spread_items(n, pool), list(staged.axes), True, 0)[0]) for n in (10, 20, 40)]
    assert len(scored) == 4 and sum(scored) == len(keys[0] | keys[1] | keys[2]) < sum(map(len, keys))
    assert scored[0] == 30 and staged.alt_scale == pytest.approx(np.std(full.base_reward, ddof=1), rel=1e-5)
    assert "ran every stage" in staged.budget() and "length" in staged.budget()


@pytest.mark.parametrize("stages, message", [
    ((40, 20), "must increase strictly"), ((1, 40), "must increase strictly"), ((20, 41), "at most the 40 items"),
    ((12, 30), "are not all among the 30"), ((), "non-empty list"), ((20.0, 40), "non-empty list of item counts"),
])
def test_bad_stages_are_refused_by_name(list_model, stages, message):
    with pytest.raises(ValueError, match=message):
        probe(list_model, bank_items(40), axes=["emoji"], stages=stages)


def test_the_default_stages_nest_over_the_built_in_items():
    groups = [spread_items(n) for n in STAGES]
    assert STAGES[-1] == len(ITEMS) and groups[-1] == list(ITEMS)
    assert all(set(map(id, a)) < set(map(id, b)) for a, b in zip(groups, groups[1:]))
    assert {it.domain for it in groups[0]} == {it.domain for it in ITEMS}  # the first stage spans every domain


def test_the_audit_plan_staged_fixed_and_full():
    assert Plan().stages() == STAGES and Plan().items() is None and Plan().suffix() == ""
    stopped = {"stages": (18, 36, 72), "stage": 2}
    assert Plan().concept_items(stopped) == spread_items(36)  # the concepts use the probes' stage
    assert Plan().concept_items(None) is None  # no probes ran: all the items
    fixed = Plan(probe_items=12)
    assert fixed.stages() is None and fixed.concept_items(stopped) == spread_items(12) == fixed.items()
    assert Plan(probe_items=72).items() == list(ITEMS) and Plan(probe_items=72).stages() is None
    for bad in (1, 73, "all", 2.0, True):
        with pytest.raises(ValueError, match="probe_items must be an int between 2"):
            Plan(probe_items=bad)


def test_probe_items_on_the_command_line(organisms, tmp_path, capsys):
    model_dir = organisms[("list", 1.0)]
    args = build_parser().parse_args(["audit", str(model_dir), "--probe-items", "all"])
    assert args.probe_items == 72
    assert build_parser().parse_args(["audit", str(model_dir)]).probe_items is None  # the staged budget
    assert build_parser().parse_args(["probe", str(model_dir), "--probe-items", "ALL"]).probe_items == 72
    with pytest.raises(SystemExit):
        build_parser().parse_args(["probe", str(model_dir), "--probe-items", "some"])
    assert "--probe-items: " in capsys.readouterr().err
    # One rule for both commands (`cli._common.check_probe_items`): under 2 refused before the model loads, over
    # the built-in items clamped with a word.
    for command, floor in (("probe", "the fewest items the paired test of an axis can use"),
                           ("audit", "the inputs a concept needs a side")):
        assert main([command, str(model_dir), "--probe-items", "1"]) == 2
        assert f"--probe-items 1 is under 2, {floor}; pass 2 to 72" in capsys.readouterr().err
    args = build_parser().parse_args(["probe", str(model_dir), "--probe-items", "73"])
    cli_probes._check(args)
    assert args.probe_items == 72
    assert capsys.readouterr().err == "rewardlens: --probe-items 73 > the 72 built-in items: using all 72\n"
    (tmp_path / "p.jsonl").write_text("")
    assert main(["probe", str(model_dir), "--pairs", str(tmp_path / "p.jsonl"), "--probe-items", "12"]) == 2
    assert ("--probe-items 12 picks built-in items, and --pairs probes your pairs' responses instead; drop one of "
            "them") in capsys.readouterr().err


def test_probe_cli_reports_the_stage(organisms, capsys):
    assert main(["probe", str(organisms[("list", 1.0)]), "--axis", "formatting", "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stages"] == list(STAGES) and out["stopped_because"] in ("decided", "last stage")
    assert out["items"] == len(spread_items(STAGES[out["stage"] - 1]))
    assert out["budget"].startswith(f"{out['items']} items, stage {out['stage']} of 3")


def test_the_audit_gives_the_concepts_the_items_of_the_probes_stage(organisms, monkeypatch):
    """`run_whole` under the staged default: the stored concepts are `concepts` on the stage the stored
    probes stopped at (n per side counts that stage's contrast rows, not all 72 items'). The interim rule
    decides every axis at the first look here (the organism's effects are not the point: where the probes
    stop is), so the stage is the first one's 18 items."""
    monkeypatch.setattr(probes_module, "decide", lambda mean, *_: ("negligible",) * len(mean))
    from rewardlens.audit import Store
    from rewardlens.audit.internal import run_whole
    from rewardlens.hacking import concepts
    from rewardlens.zoo import AUDIT_PAIRS

    model = rl.load(str(organisms[("sycophancy", 1.0)]))
    store = Store(":memory:")
    run_whole(model, AUDIT_PAIRS[:4], store, Plan(divergence=False, tokens=False))
    (probes,) = [r for key, _ in store.runs() if key.instrument == "probes" for _, r in store.records(key)]
    (stored,) = [r for key, _ in store.runs() if key.instrument.startswith("concepts") for _, r in store.records(key)]
    assert [key.instrument for key, _ in store.runs() if key.instrument.startswith("concepts")] == [
        f"concepts/stage-items-{probes['stages'][probes['stage'] - 1]}"], "stored under the name of its item set"
    chosen = spread_items(probes["stages"][probes["stage"] - 1])
    direct = concepts(model, items=chosen, batch_size=16)
    np.testing.assert_array_equal(stored["n_positive"], direct.n_positive)
    np.testing.assert_allclose(stored["cosine"], direct.cosine, rtol=1e-5, atol=1e-6)
    # every axis decided on 18 items: 18 rows, not 72
    assert (probes["stage"], probes["stopped_because"]) == (1, "decided") and stored["n_positive"].max() == 18
