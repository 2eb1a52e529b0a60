"""Degenerate pairs: found and reported once (or refused under strict), and zero margins handled
explicitly by every instrument: NaN with a reason wherever a ratio to the margin is reported."""

from __future__ import annotations

import copy
import dataclasses
import json
import warnings

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.causal import attribution_patch, faithfulness, patch
from rewardlens.data import CHECK_KINDS, Pair, PairChecks, check_pairs, check_tokens, load_pairs
from rewardlens.errors import DataError, DegeneratePairsWarning, RewardLensWarning, TokenizationError
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
    summary = checks.summary()
    assert list(summary.index) == list(CHECK_KINDS) and (summary["value"] == 0).all()
    assert summary["examples"].tolist() == [[] for _ in CHECK_KINDS]
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
    rows = checks.summary().to_dict("index")  # one row per kind, the counts and examples above
    assert list(rows) == list(CHECK_KINDS) and {k: r["value"] for k, r in rows.items()} == checks.counts
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
    assert (rep.summary()["n"] <= 2).all() and all(row["pairs"] <= 2 for row in rep.rows())


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


# ---- token checks: what only the token ids show ---------------------------------------------------

USER_ONLY = ("{% for m in messages %}{% if m['role'] == 'user' %}<|im_start|>user\n{{ m['content'] }}<|im_end|>\n"
             "{% endif %}{% endfor %}")
"""A chat template that drops every assistant turn: both sides of a pair encode to the same tokens."""
TRIMMED = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n{% endfor %}")
"""ChatML with each message's content trimmed: sides that differ only by edge whitespace encode alike."""
ANSWERS = [Pair("What is the capital of France?", "The capital of France is Paris.", "France is in Europe, I think.",
                id="fr"),
           Pair("How do I boil an egg?", "Place the egg in boiling water for nine minutes.", "Eggs are laid by hens.")]


def _templated(model, template):
    """`model` read through a copy of its tokenizer with another chat template (the user's model untouched)."""
    tok = copy.deepcopy(model.tokenizer)
    tok.chat_template = template
    return rl.wrap(model.model, tok)


def test_a_template_that_drops_the_assistant_turn_is_refused_before_any_forward(llama):
    """Before, every margin was exactly 0 and the pairs scored with 'pair accuracy 0.000'."""
    dropping = _templated(llama, USER_ONLY)
    with pytest.raises(TokenizationError) as info:
        dropping.score(ANSWERS)
    with pytest.raises(TokenizationError):
        dropping.score(ANSWERS)  # refused again: a refusal is never remembered as a pass
    assert str(info.value) == (
        "token checks: 2 of 2 pairs whose two sides differ as text but encode to the same token ids (a zero margin "
        "by construction): pair 0 (id 'fr'), pair 1; 4 of 4 sequences that do not hold their response's last "
        "tokens (the chat template drops or rewrites the assistant's turn): pair 0 (id 'fr') (chosen), "
        "pair 0 (id 'fr') (rejected), pair 1 (chosen), ...; that is every pair whose sides differ, so no score "
        "would depend on the responses. Fix: use a chat template that renders the assistant's turn "
        "(tokenizer.chat_template), raise max_length= if a left cut removed the difference, or drop those pairs "
        "(docs/scoring.md, 'Token checks')")


def test_a_pair_whose_sides_encode_alike_is_named_in_one_warning(llama):
    trimmed = _templated(llama, TRIMMED)
    pairs = [*ANSWERS, Pair("Say hi.", "Hello there, my friend.", "Hello there, my friend.  ", id="ws")]
    with pytest.warns(DegeneratePairsWarning) as record:
        scores = trimmed.score(pairs)
    (message,) = [str(w.message) for w in record if "token checks" in str(w.message)]
    assert message == (
        "token checks: 1 of 3 pairs whose two sides differ as text but encode to the same token ids (a zero margin "
        "by construction): pair 2 (id 'ws'). Fix: use a chat template that renders the assistant's turn "
        "(tokenizer.chat_template), raise max_length= if a left cut removed the difference, or drop those pairs "
        "(docs/scoring.md, 'Token checks')")
    assert scores[4] == scores[5]  # what the warning is about: the same sequence twice
    with warnings.catch_warnings():
        warnings.simplefilter("error", DegeneratePairsWarning)
        trimmed.score(pairs)  # the same pairs checked once: no second warning
        trimmed.score(pairs[2:])  # nor on a chunk of them, which alone would be refused (its one pair is)
    with pytest.raises(TokenizationError, match=r"1 of 1 pairs whose two sides differ"):
        _templated(llama, TRIMMED).score(pairs[2:])  # as it is, first, on a model that has not seen the set


def test_check_tokens_finds_each_kind_on_ids():
    pairs = [Pair("p", "a b c d", "e f g h", id="x"), Pair("p", "same", "same"), Pair("p", "i j k", "l m n")]
    # Responses tokenized alone: 4, 1 and 3 tokens; only the tokens between the first and last are searched.
    responses = [[1, 2, 3, 4], [5, 6, 7, 8], [9], [9], [10, 11, 12], [13, 14, 15]]
    ids = [[0, 1, 2, 3, 4, 99], [0, 5, 6, 7, 8, 99],   # pair 0: both responses there
           [0, 9, 99], [0, 9, 99],                     # pair 1: identical text, identical ids; too short to look for
           [0, 50, 51, 99], [0, 50, 51, 99]]           # pair 2: texts differ, ids alike, neither response there
    reads = [5, 1, 2, 2, 3, 3]                         # pair 0 rejected: read at 1, before its tokens 6, 7 end
    checks = check_tokens(pairs, ids, responses, reads)
    assert dict(checks.found) == {"identical_tokens": ("pair 2",),
                                  "response_missing": ("pair 2 (chosen)", "pair 2 (rejected)"),
                                  "read_before_response": ("pair 0 (id 'x') (rejected)",)}
    assert dict(checks.checked) == {"identical_tokens": 2, "response_missing": 4, "read_before_response": 2}
    assert checks.everywhere() is None and not checks.ok
    with pytest.warns(DegeneratePairsWarning, match=r"1 of 2 sequences read at a token before their response's "
                                                    r"last tokens .*: pair 0 \(id 'x'\) \(rejected\)\. Fix: "):
        checks.report()
    alone = check_tokens(pairs[:1], ids[:2], responses[:2], [5, 1])
    assert alone.everywhere() is None  # one of the two sequences: a warning, not a refusal
    with pytest.raises(TokenizationError, match=r"that is every sequence whose response was found, .* Fix: pass a "
                                                r"pad_token_id= that does not occur"):
        check_tokens(pairs[:1], ids[:2], responses[:2], [1, 1]).report()
    assert check_tokens(pairs[:1], ids[:2], responses[:2], None).ok  # no read positions: not checked
