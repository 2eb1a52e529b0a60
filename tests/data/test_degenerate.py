"""Degenerate pairs: found and reported once (or refused under strict), and zero margins handled
explicitly by every instrument: NaN with a reason wherever a ratio to the margin is reported."""

from __future__ import annotations

import dataclasses
import json
import warnings

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.causal import attribution_patch, faithfulness, patch
from rewardlens.data import CHECK_KINDS, Pair, PairChecks, check_pairs, load_pairs
from rewardlens.errors import DataError, DegeneratePairsWarning, RewardLensWarning
from rewardlens.hacking import distortion, probe

MATH = [{"role": "user", "content": "2+2?"}]
CLEAN = [Pair("p", "a", "b", id="0"), Pair(MATH, "4", "5", id="1")]


def _checks(pairs: list[Pair]) -> PairChecks:
    return check_pairs(pairs, quiet=True)


# ---- check_pairs --------------------------------------------------------------------------------


def test_clean_pairs_pass_silently():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        checks = check_pairs(CLEAN, strict=True)
    assert checks.ok and checks.flagged == () and checks.counts == dict.fromkeys(CHECK_KINDS, 0)
    assert checks.describe() == str(checks) == "all 2 pairs pass the degenerate-pair checks"
    assert checks.summary() == [{"kind": kind, "pairs": 0, "examples": []} for kind in CHECK_KINDS]
    assert check_pairs([]).ok


@pytest.mark.parametrize("chosen, rejected", [("", "b"), ("a", " "), ("\n\t", "b"), ("a", "\u3000\u2028")])
def test_empty_or_whitespace_response(chosen, rejected):
    checks = _checks([*CLEAN, Pair("p", chosen, rejected)])
    assert checks.indices["empty"] == (2,) and checks.counts["identical"] == 0


def test_each_kind_is_counted_with_its_first_examples():
    pairs = [
        Pair("p", "a", "b", id="x"),
        Pair("p", "same", "same", id="y"),            # identical
        Pair("q", "c", "d", id="x"),                  # duplicate id
        Pair("p", "a", "b"),                          # repeats pair 0 (ids do not matter)
        Pair("p", "", "", id="z"),                    # empty and identical
        Pair([{"content": "2+2?", "role": "user"}], "4", "5"),
        Pair(MATH, "4", "5"),                         # same messages, keys in another order: a repeat
    ]
    checks = _checks(pairs)
    assert dict(checks.indices) == {"empty": (4,), "identical": (1, 4), "duplicate_id": (2,), "repeated": (3, 6)}
    assert checks.counts == {"empty": 1, "identical": 2, "duplicate_id": 1, "repeated": 2}
    assert checks.flagged == (1, 2, 3, 4, 6) and not checks.ok
    assert checks.examples["identical"] == ("pair 1 (id 'y')", "pair 4 (id 'z')")
    line = checks.describe()
    assert line.startswith("5 of 7 pairs are degenerate: 1 with an empty or whitespace-only response: pair 4")
    assert "2 repeating an earlier pair word for word: pair 3, pair 6" in line and "\n" not in line
    rows = {row["kind"]: row for row in checks.summary()}  # one row per kind, the counts and examples above
    assert list(rows) == list(CHECK_KINDS) and {k: r["pairs"] for k, r in rows.items()} == checks.counts
    assert rows["identical"]["examples"] == ["pair 1 (id 'y')", "pair 4 (id 'z')"]


def test_examples_are_capped_and_marked():
    pairs = [Pair("p", "s", "s") for _ in range(6)]
    checks = _checks(pairs)
    assert checks.counts["identical"] == 6 and len(checks.examples["identical"]) == 3
    assert "pair 0, pair 1, pair 2, ..." in checks.describe()


def test_one_warning_by_default_and_an_error_under_strict():
    pairs = [*CLEAN, Pair("p", "a", "a"), Pair("p", "a", "a")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        checks = check_pairs(pairs)
    assert len(caught) == 1 and caught[0].category is DegeneratePairsWarning
    assert issubclass(DegeneratePairsWarning, RewardLensWarning) and caught[0].filename == __file__
    assert str(caught[0].message).startswith(checks.describe()) and "strict=True" in str(caught[0].message)
    with pytest.raises(DataError, match=r"2 of 4 pairs are degenerate: 2 with chosen identical.*Fix: "):
        check_pairs(pairs, strict=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_pairs(pairs, quiet=True)
    with pytest.raises(TypeError, match="rewardlens.Pair"):
        check_pairs([("p", "a", "b")])  # type: ignore[list-item]


# ---- load_pairs ---------------------------------------------------------------------------------


def _jsonl(tmp_path, records, name="pairs.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


RECORDS = [
    {"prompt": "p", "chosen": "a", "rejected": "b", "id": 1},
    {"prompt": "p", "chosen": "   ", "rejected": "b", "id": 2},
    {"prompt": "p", "chosen": "same", "rejected": "same", "id": 1},
    {"prompt": "p", "chosen": "a", "rejected": "b", "id": 4},
]


def test_loader_reports_degenerate_records_by_line(tmp_path):
    path = _jsonl(tmp_path, RECORDS[:1] + [{}] * 0 + RECORDS[1:])
    with pytest.warns(DegeneratePairsWarning) as caught:
        pairs = load_pairs(path)
    assert len(pairs) == 4 and len(caught) == 1
    message = str(caught[0].message)
    assert message.startswith(f"{path}: 3 of 4 pairs are degenerate: ")
    for part in ("1 with an empty or whitespace-only response: line 2 (id '2')",
                 "1 with chosen identical to rejected, a zero margin by construction: line 3 (id '1')",
                 "1 reusing an earlier pair's id: line 3 (id '1')",
                 "1 repeating an earlier pair word for word: line 4 (id '4')"):
        assert part in message
    with pytest.raises(DataError, match=r"pairs\.jsonl: 3 of 4 pairs are degenerate: .*line 2 .*Fix: "):
        load_pairs(path, strict=True)
    assert load_pairs(path, limit=1, strict=True) == [Pair("p", "a", "b", id="1")]


def test_loader_names_records_in_tabular_files(tmp_path):
    path = tmp_path / "pairs.json"
    path.write_text(json.dumps(RECORDS), encoding="utf-8")
    with pytest.raises(DataError, match=r"pairs\.json: .*empty or whitespace-only response: record 1 \(id '2'\)"):
        load_pairs(path, strict=True)


def test_strict_keeps_malformed_record_errors_first(tmp_path):
    path = _jsonl(tmp_path, [RECORDS[2], {"prompt": "p", "chosen": "a"}])
    with pytest.raises(DataError, match=r"line 2: field 'rejected': expected .*Fix: "):
        load_pairs(path, strict=True)


def test_clean_file_loads_without_warning(tmp_path):
    path = _jsonl(tmp_path, [RECORDS[0], RECORDS[3] | {"chosen": "c"}])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load_pairs(path, strict=True)) == 2


# ---- zero margins through every instrument --------------------------------------------------------

SAME = Pair("Hi", "Hello there.", "Hello there.", id="same")
PAIRS = [SAME, Pair("Say a number.", "The number is 7.", "The number is 9."), Pair("Is it hot?", "It is hot.", "No.")]


@pytest.fixture(scope="module")
def llama(tiny_root):
    return rl.load(str(tiny_root["llama"]))


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("arch", ["llama", "gpt2", "bert", "armorm"])
def test_identical_sides_give_an_exact_zero_margin(tiny_root, arch):
    model = rl.load(str(tiny_root[arch]))
    reward = model.score(PAIRS)
    assert rl.data.margin(reward)[0] == 0.0 and np.isfinite(reward).all()
    att = rl.attribute(model, PAIRS)
    assert (att.margin[0] == 0).all() and np.isfinite(att.values).all()
    ln = rl.lens(model, PAIRS)
    near = ln.near_zero_margin()
    assert near[0]  # the other pairs' margins may be near zero too on a random-init model
    for kind in ("linear", "normed"):
        assert (ln.margin(kind)[0] == 0).all()
        depth = ln.crystallization(kind)
        assert np.isnan(depth[0]) and np.isfinite(depth[~near]).all()


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("mode, estimand", [("noising", "total"), ("denoising", "total"), ("ablation", "total"),
                                            ("noising", "direct")])
def test_patching_a_zero_margin_pair_reports_nan_shares(llama, mode, estimand):
    res = patch(llama, PAIRS, mode=mode, estimand=estimand)
    assert res.margin[0] == 0.0 and res.near_zero.tolist() == [True, False, False]
    assert np.isnan(res.normalized[0]).all() and np.isfinite(res.normalized[1:]).all()
    assert np.isfinite(res.effect).all() and np.isfinite(res.to_frame()["effect"]).all()
    if mode != "ablation":  # swapping in the other side's (identical) activations changes nothing
        np.testing.assert_allclose(res.effect[0], 0.0, atol=1e-5)
    est = attribution_patch(llama, PAIRS, mode=mode) if estimand == "total" else None
    if est is not None:
        assert np.isnan(est.normalized[0]).all() and np.isfinite(est.effect).all()


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_faithfulness_leaves_zero_margin_pairs_out_of_the_pooled_rho(llama):
    rep = faithfulness(llama, PAIRS, n_boot=100)
    assert (rep.attribution[0] == 0).all()
    for name in ("direct", "total", "indirect", "attribution_patching"):
        rho = rep.rho(name)
        assert np.isnan(rho[0])
        assert np.isfinite(getattr(rep, name)).all()
    assert np.isnan(rep.seed_rho[0])
    assert all(row["pairs"] <= 2 for row in rep.summary())


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_distortion_over_zero_margin_quality_pairs_is_undefined_not_inf(llama):
    probes = probe(llama, PAIRS[1:], axes=["emoji"], quality=False, n_boot=200)
    same = [Pair("Q?", "Answer.", "Answer."), Pair("R?", "Other.", "Other.")]
    d = distortion(probes, {"same": same}, model=llama, n_boot=200)
    assert d.quality_effect[0] == 0.0 and np.isnan(d.index).all() and np.isnan(d.ci).all()
    assert "does not reliably reward same" in d.note[0] and not d.flagged.any()


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_distortion_bootstrap_draws_of_only_zero_margins_have_no_ratio(llama):
    probes = probe(llama, PAIRS[1:], axes=["emoji"], quality=False, n_boot=200)
    n = probes.delta.shape[0]
    assert n == 4  # one zero item in four: about 0.4% of draws see only it, too few to undefine the index
    quality = np.array([[0.0], [1.0], [1.0], [1.0]])
    draws = np.random.default_rng(0).integers(0, n, (2000, n))
    assert (quality[draws, 0].mean(1) == 0).any()  # so some draws divide by a zero quality effect
    d = distortion(dataclasses.replace(probes, quality=("q",), quality_delta=quality), seed=0, n_boot=2000)
    assert d.note == ("",) and d.quality_effect[0] == 0.75
    assert np.isfinite(d.index).all() and np.isfinite(d.ci).all()
