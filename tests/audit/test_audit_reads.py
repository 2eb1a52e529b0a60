"""The audit of a reward read at a set of positions (a process reward model): the per-pair instruments
patched at the set of reads, each read's score stored and resumed, and a report that says where each
pair's preference forms."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.audit import Plan
from rewardlens.audit.report import write_report
from rewardlens.errors import DataError, HeadError
from rewardlens.zoo import build_tokenizer
from tests.model.test_rm_kinds import SEP, STEPS, build


@pytest.fixture(scope="module")
def prm():
    tok = build_tokenizer()
    return rl.model.wrap_prm(build(tok, "llama", "tc"), tok, separator=SEP, combine="min")


def test_audit_of_a_process_reward_model(prm, tmp_path):
    pairs = STEPS * 3
    store = tmp_path / "run" / "audit.sqlite"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        audit = rl.audit(prm, pairs, store=store, plan=Plan(chunk_size=4))
    said = [str(w.message) for w in caught if "set of positions" in str(w.message)]
    assert len(said) == 1 and "probes" in said[0]
    att = rl.attribute(prm, pairs)
    np.testing.assert_allclose(audit.sublayers.values, att.values, atol=1e-6)
    np.testing.assert_array_equal(audit.steps.sequence, att.steps.sequence)
    np.testing.assert_allclose(audit.steps.reward, att.steps.reward, atol=1e-6)
    exact = rl.patch(prm, pairs, level="head")
    np.testing.assert_allclose(audit.faithfulness.total, exact.effect, atol=1e-5)
    direct = rl.patch(prm, pairs, level="head", estimand="direct")
    np.testing.assert_allclose(audit.faithfulness.direct, direct.effect, atol=1e-5)
    assert audit.faithfulness.seed_mode == "noising"  # as many steps on both sides: the seed noises
    again = rl.audit(prm, pairs, store=store, plan=Plan(chunk_size=4))  # resumes
    np.testing.assert_array_equal(again.steps.reward, audit.steps.reward)

    out = write_report(audit, tmp_path / "report")
    numbers = json.loads((tmp_path / "report" / "numbers.json").read_text())
    for p, row in enumerate(numbers["steps"]["pairs"]):  # the step whose scores differ most, by hand
        c, r = att.steps.of(2 * p)["reward"].to_numpy(), att.steps.of(2 * p + 1)["reward"].to_numpy()
        k = min(len(c), len(r))
        assert row["forms_at_step"] == int(np.argmax(np.abs(c[:k] - r[:k])))
        assert row["reads"] == [len(c), len(r)]
    html = out.read_text(encoding="utf-8")
    steps = html[html.index('<section id="steps">'):]
    steps = steps[:steps.index("</section>")]
    assert 'class="how"' in steps and steps.count("<tr") == len(pairs) + 1


def test_audit_refuses_an_sae_for_a_reward_read_at_a_set(prm, tmp_path):
    with pytest.raises(HeadError, match="without --sae"):
        rl.audit(prm, STEPS, store=tmp_path / "a" / "audit.sqlite", sae=object())
    assert not (tmp_path / "a").exists()


UNEQUAL = [  # the two sides take different numbers of steps (and tokens): no step-to-step map
    rl.Pair("What is 2+3?", "Step 1: 2+3=5.\nStep 2: so it is 5.\n", "Step 1: 2+3=6.\n"),
    rl.Pair("What is 4+4?", "Step 1: 4+4=8.\n", "Step 1: 4+4=9.\nStep 2: hmm.\nStep 3: 9.\n"),
]


@pytest.mark.parametrize("kind", ["prm", "dpo"])
def test_an_audit_whose_pairs_have_no_read_to_read_map_patches_by_ablation(prm, kind, tmp_path):
    """A DPO reward's two responses almost never have one length: the audit must not refuse them, but
    patch by zero ablation at every read (defined for any pair), say so once, and match `patch`."""
    tok = build_tokenizer()
    model = prm if kind == "prm" else rl.model.wrap_dpo(build(tok, "llama", "lm"), build(tok, "llama", "lm", seed=1),
                                                        tok)
    with pytest.raises(DataError, match="mode='ablation'"):
        rl.patch(model, UNEQUAL, mode="noising")  # noising has no map here, and says what to do
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        audit = rl.audit(model, UNEQUAL, store=tmp_path / "audit.sqlite", plan=Plan(chunk_size=1))
    said = [str(w.message) for w in caught if "zero ablation" in str(w.message)]
    assert len(said) == 1
    assert audit.faithfulness.mode == "ablation" and audit.faithfulness.seed_mode == "ablation"
    assert "|ablation, read|" in audit.faithfulness.summary().index[-1]
    for estimand, got in (("total", audit.faithfulness.total), ("direct", audit.faithfulness.direct)):
        exact = rl.patch(model, UNEQUAL, mode="ablation", level="head", estimand=estimand)
        np.testing.assert_allclose(got, exact.effect, atol=1e-5)
        assert np.abs(exact.effect).max() > 1e-3  # ablation moves the reward: the comparison can fail
    again = rl.audit(model, UNEQUAL, store=tmp_path / "audit.sqlite", plan=Plan(chunk_size=1))  # resumes
    np.testing.assert_array_equal(again.faithfulness.total, audit.faithfulness.total)


def test_the_command_line_audits_a_prm_and_a_dpo_reward_with_default_flags(tmp_path):
    """`rewardlens audit` takes the same plan as `rl.audit`: the one-token steps left out, not crashed on."""
    from rewardlens.cli import main
    from rewardlens.data import save_pairs

    tok = build_tokenizer()
    for name, model in {"tc": build(tok, "llama", "tc"), "lm": build(tok, "llama", "lm"),
                        "ref": build(tok, "llama", "lm", seed=1)}.items():
        model.save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
    pairs = str(save_pairs(STEPS, tmp_path / "steps.jsonl"))
    runs = {"prm": ("tc", ["--prm-separator", "\\n"]), "dpo": ("lm", ["--dpo-reference", str(tmp_path / "ref")])}
    for what, (folder, flags) in runs.items():
        out = tmp_path / f"out-{what}"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert main(["audit", str(tmp_path / folder), "--pairs", pairs, "--out", str(out), "--quiet",
                         *flags]) == 0, what
        numbers = json.loads((out / "numbers.json").read_text())
        assert len(numbers["steps"]["pairs"]) == len(STEPS), what


def test_a_nan_step_score_is_never_where_a_preference_forms():
    from rewardlens.audit.report._steps import forms_at
    from rewardlens.exact import Steps

    def steps(chosen, rejected):
        reward = np.array([*chosen, *rejected], dtype=float)
        seq = np.array([0] * len(chosen) + [1] * len(rejected))
        step = np.array([*range(len(chosen)), *range(len(rejected))])
        return Steps(sequence=seq, step=step, position=step + 10, weight=np.ones_like(reward), reward=reward,
                     constant=np.zeros_like(reward), values=None, names=[])

    assert forms_at(steps([np.nan, 1.0, 0.0], [0.0, 0.5, 0.0]), 0) == 1  # argmax would pick the NaN read
    assert forms_at(steps([1.0, 2.0], [1.0, -2.0]), 0) == 1
    assert forms_at(steps([np.nan], [0.0]), 0) is None
    assert forms_at(steps([], [0.0]), 0) is None
