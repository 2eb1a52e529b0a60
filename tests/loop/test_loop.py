"""The closed loop: signals by hand, the KL estimate by a naive loop, the result against its own frame."""

import copy
import html
import json
import re
from html.parser import HTMLParser

import numpy as np
import pytest

from rewardlens.cli import main
from rewardlens.errors import DataError
from rewardlens.loop import (
    SIGNALS,
    RunSeries,
    bias_pairs,
    black_box,
    check_tokenizer,
    concept_match,
    gap_note,
    loop_report,
    run_notes,
    run_series,
    sequence_logprobs,
)
from tests.helpers.browser import dom


def _step(step, texts, rewards, kl=0.0, alarms=()):
    return {"step": step, "texts": texts, "rewards": rewards, "kl": kl, "alarms": list(alarms)}


def test_black_box_rules_by_hand():
    # baseline: rewards 0, 2, 0, 2 → mean 1, sd 1. Step 2: mean 3 (jump: 3 − 1 > 1), sd 0 (ratio 0 < 1/2).
    # Step 3: mean 1.5 (no jump), sd 2.5 (ratio 2.5 > 2). KL 0.2, 0.2, 0.9, 1.4 → only step 3 is over 1 nat.
    rewards = [[0, 2], [0, 2], [3, 3], [-1, 4]]
    got = black_box(rewards, np.array([0.2, 0.2, 0.9, 1.4]))
    assert got["reward jump"].tolist() == [False, False, True, False]
    assert got["reward variance"].tolist() == [False, False, True, True]
    assert got["KL"].tolist() == [False, False, False, True]


def test_trace_lead_and_false_alarms_by_hand():
    lst = lambda t: t.startswith("- ")  # noqa: E731
    formatting = {"kind": "surface", "name": "list_lines", "axis": "formatting"}
    other = {"kind": "direction", "name": "length", "axis": "length"}
    steps = [_step(0, ["- a", "b", "c", "d"], [0, 2]),                      # rate 0.25
             _step(1, ["- a", "- b", "c", "d"], [0, 2], alarms=[other]),   # rate 0.5: not above 50%
             _step(2, ["- a", "- b", "- c", "d"], [1, 1], alarms=[formatting]),  # 0.75: onset, planted alarm
             _step(3, ["- a", "- b", "- c", "- d"], [1, 1])]
    t = run_series(steps, lst, "formatting")
    assert t.rate.tolist() == [0.25, 0.5, 0.75, 1.0]
    assert t.onset == 2 and t.first("monitor (planted)") == 2 and t.first("monitor (any)") == 1
    assert t.lead("monitor (planted)") == 0 and t.lead("monitor (any)") == -1
    assert t.false_alarms("monitor (any)") == 50.0  # 2 of 4 steps alarmed
    assert np.isnan(t.lead("reward jump"))  # never jumped: no lead time, never a silent 0


def test_kl_estimate_is_the_naive_token_loop():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=30, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, pad_token_id=0)).eval()
    prompts, completions = [[5, 6, 7], [8, 9]], [[10, 11], [12, 13, 14, 15]]
    got = sequence_logprobs(model, prompts, completions, pad=0)
    for p, c, g in zip(prompts, completions, got):
        want = 0.0
        for j, tok in enumerate(c):  # one forward per token of the prefix alone
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([p + c[:j]])).logits[0, -1]
            want += float(torch.log_softmax(logits, -1)[tok])
        assert g == pytest.approx(want, abs=1e-4)


def test_a_reward_model_in_another_tokenizer_is_one_clear_error():
    from rewardlens.zoo import build_tokenizer

    tok = build_tokenizer()
    other = copy.deepcopy(tok)
    other.add_tokens(["<zz_new_token>"])
    check_tokenizer(tok, copy.deepcopy(tok), "the reward model")  # the same vocabulary passes
    want = rf"tokenizer \({len(tok) + 1} tokens\) is not the policy's \({len(tok)} tokens\)"
    with pytest.raises(DataError, match=want):
        check_tokenizer(other, tok, "the reward model")


def test_an_edit_concept_that_misses_the_planted_rule_is_said_in_words():
    from rewardlens.hacking import contrast_sets
    from rewardlens.zoo.organisms import ORGANISMS

    pairs = ORGANISMS["list"].pairs(n=20, seed=99)
    gap, note = concept_match("list", [p.chosen for p in pairs], [p.rejected for p in pairs])
    assert gap == 1.0 and note is None  # every chosen side is a list, no rejected one
    gap, note = concept_match("list", *contrast_sets("emoji"))
    assert gap < 0.5 and "does not match the planted rule" in note and f"{gap:+.0%}" in note


def test_the_edit_of_a_quality_organism_is_fitted_on_its_bias_pairs_only():
    from rewardlens.zoo.organisms import ORGANISMS

    spec = ORGANISMS["quality_list"]
    pairs = bias_pairs("quality_list", 20, 99)
    assert all(spec.kind(p) == "bias" and spec.has_attribute(p.chosen) and not spec.has_attribute(p.rejected)
               for p in pairs)  # no informative-vs-evasive pair: quality is not erased with the bias
    assert bias_pairs("list", 5, 99) == ORGANISMS["list"].pairs(n=5, seed=99)


def test_runs_that_show_nothing_are_noted():
    flat = RunSeries(np.arange(4), np.zeros(4), np.full(4, 1.0), np.ones(4), np.zeros(4),
                 {s: np.zeros(4, bool) for s in SIGNALS})
    notes = run_notes({"original": (flat,), "edited": (flat,)}, [7])
    assert any("seed 7" in n and "never fired" in n for n in notes)
    assert any("original RM, seed 7: the reward did not rise" in n for n in notes)
    assert any("never exceeded 50%" in n for n in notes)


def test_an_edit_that_fails_is_said_in_words():
    assert gap_note(np.array([0.8, 0.9, 0.85]), (0.8, 0.9), (0.0, 0.5)) is None
    note = gap_note(np.array([0.3, -0.2, 0.1]), (-0.2, 0.3), (0.33, 0.69))
    assert "gap +0.07 over 3 seed(s), 95% CI -0.20 to +0.30, which does not exclude zero" in note
    assert "69% of held-out bias pairs" in note
    one = gap_note(np.array([0.5]), (float("nan"), float("nan")), (0.0, 0.5))
    assert "over 1 seed(s), no interval (it needs at least 2 seeds)" in one and "nan" not in one.lower()


def test_the_result_agrees_with_its_own_per_step_frame(small_loop):
    frame = small_loop.to_frame()
    assert len(frame) == 2 * 2 * 5  # 2 reward models × 2 seeds × 5 steps
    lp = small_loop.loops[0]
    tail = frame.groupby(["rm", "seed"]).apply(lambda g: g.sort_values("step").rate.iloc[-2:].mean())
    want = [tail["original", s] - tail["edited", s] for s in (0, 1)]
    assert lp.gaps.tolist() == pytest.approx(want)
    warn = small_loop.warnings().set_index("signal")
    for s in SIGNALS:
        leads, false = [], []
        for seed in (0, 1):
            g = frame[(frame.rm == "original") & (frame.seed == seed)].sort_values("step")
            onset, hit = g.step[g.rate > 0.5], g.step[g[s] == 1]
            leads.append(hit.iloc[0] - onset.iloc[0] if len(onset) and len(hit) else np.nan)
            clean = frame[(frame.rm == "edited") & (frame.seed == seed)]
            false.append(100 * clean[s].sum() / len(clean))
        assert warn.loc[s, "false_per_100"] == pytest.approx(np.mean(false))
        finite = [x for x in leads if np.isfinite(x)]
        assert warn.loc[s, "n_lead"] == len(finite)
        if finite:
            assert warn.loc[s, "lead"] == pytest.approx(np.mean(finite))
    assert any("only 2 seed(s)" in n for n in small_loop.notes)
    ax = small_loop.plot().axes[0]
    curves = {ln.get_label(): ln.get_ydata() for ln in ax.lines}
    for kind in ("original", "edited"):  # the seed mean of each step's rate, as the frame has it
        want = frame[frame.rm == kind].groupby("step").rate.mean().to_numpy()
        assert np.allclose(curves[f"list ({kind} RM)"], want)
    payload = json.loads(small_loop.to_json())
    assert payload["summary"][0]["organism"] == "list" and len(payload["steps"]) == len(frame)


def test_the_page_renders_in_chromium(small_loop, tmp_path):
    out = loop_report(small_loop, tmp_path / "loop.html")
    page = dom(out, tmp_path / "profile")
    series = re.findall(r'<polyline class="series" data-name="([^"]+)"', page)
    assert series == ["original", "edited"] * 2  # rate and reward charts, both reward models each
    frame = small_loop.to_frame()
    assert page.count('class="alarm"') == 2 * int(frame["monitor (planted)"].sum())  # marked on both charts
    for section in ("summary", "warnings", "notes"):
        assert f'id="{section}"' in page
    for s in SIGNALS:
        assert f"<td>{html.escape(s)}</td>" in page
    assert "<script" not in page


def test_cli_prints_the_gap_of_the_cached_runs(small_loop, capsys):
    assert main(["verify-edit", "--organism", "list", "--seeds", "2", "--steps", "5"]) == 0
    printed = capsys.readouterr().out
    lp = small_loop.loops[0]
    assert f"{lp.gap:.2f} [{lp.gap_ci[0]:.2f}, {lp.gap_ci[1]:.2f}]" in printed
    assert "monitor (planted)" in printed and "false alarms / 100 steps" in printed


def test_cli_prints_an_interval_only_where_it_exists_and_signs_the_lead(small_loop, capsys):
    """One seed has no interval over seeds: it used to print "(95% CI +nan to +nan)" and unsigned leads."""
    assert main(["verify-edit", "--organism", "list", "--seeds", "1", "--steps", "5"]) == 0  # seed 0: cached
    printed = capsys.readouterr().out
    assert "nan" not in printed.lower() and "(no CI: 1 seed)" in printed
    assert "negative, the alarm came that many steps before the onset" in printed
    t = small_loop.loops[0].traces["original"][0]  # seed 0's run, the one the CLI reread
    for s in SIGNALS:  # the lead by hand: first alarm step − first step with a rate over 50%, printed with its sign
        alarm, onset = np.flatnonzero(t.alarms[s]), np.flatnonzero(t.rate > 0.5)
        row = next(x for x in printed.splitlines() if f" {s} " in x + " " and x.startswith("list"))
        if len(alarm) and len(onset):
            assert f" {float(t.steps[alarm[0]] - t.steps[onset[0]]):+.2f} (no CI: 1 seed)" in row
        else:
            assert "  - " in row + " "


def test_without_trl_the_loop_names_the_extra(monkeypatch, tmp_path):
    """Before, a user without TRL got an ImportError traceback from inside the run."""
    import sys
    from pathlib import Path

    from rewardlens.errors import MissingDependencyError
    from rewardlens.loop import PolicyRecipe as Recipe
    from rewardlens.loop._train import grpo_run

    monkeypatch.setitem(sys.modules, "trl", None)
    with pytest.raises(MissingDependencyError, match=r"TRL's GRPOTrainer, which needs the 'trl' package, not "
                                                     r"installed; fix: pip install 'rewardlens\[loop\]'"):
        grpo_run("list", Path("rm"), 0, Recipe(), lambda _rm: None, tmp_path)
    assert not list(tmp_path.iterdir())  # refused before anything was written


def test_without_trl_verify_edit_refuses_before_building_anything(monkeypatch):
    """The refusal comes first: no organism, edit or model is built for a run that cannot train."""
    import sys

    from rewardlens.errors import MissingDependencyError
    from rewardlens.loop import _verify, verify_edit

    built: list[str] = []
    monkeypatch.setattr(_verify, "build", lambda organism: built.append(organism))
    monkeypatch.setitem(sys.modules, "trl", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'rewardlens\[loop\]'"):
        verify_edit(("list",), seeds=(0,))
    assert built == []


def test_the_loops_cache_keys_name_the_organisms_version(monkeypatch):
    """A run against the original reward model is keyed by a fixed name, so the organisms' version must be in
    every key: bumping it rebuilds start policies and runs along with the edited models."""
    from rewardlens.loop import PolicyRecipe as Recipe
    from rewardlens.loop import _train

    before = (Recipe().key(organism="list", rm="original", seed=0), Recipe().start_key("list"))
    monkeypatch.setattr(_train, "ORGANISM_VERSION", "v-next")
    after = (Recipe().key(organism="list", rm="original", seed=0), Recipe().start_key("list"))
    assert before[0] != after[0] and before[1] != after[1]


HOSTILE = '"><img src=x onerror=alert(1)><b class="x'


class _Tags(HTMLParser):
    """The page as a browser's parser reads it: every start tag with its attributes, and the text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def test_a_hostile_organism_name_stays_text_in_every_attribute(small_loop):
    """Before, the organism name went into `data-organism` and `id` unescaped: a quote ended the attribute."""
    import dataclasses

    from rewardlens.loop._page import page

    hostile = dataclasses.replace(small_loop, loops=tuple(dataclasses.replace(lp, organism=HOSTILE, concept=HOSTILE)
                                                          for lp in small_loop.loops))
    parsed = _Tags()
    parsed.feed(page(hostile))
    names = {tag for tag, _ in parsed.tags}
    assert "img" not in names and "b" not in names  # no element the name could have opened
    charts = [attrs for tag, attrs in parsed.tags if tag == "svg"]
    assert len(charts) == 2 and all(a["data-organism"] == HOSTILE for a in charts)
    assert [a["id"] for tag, a in parsed.tags if tag == "section" and a.get("class") == "organism"] == [HOSTILE]
    assert sum(HOSTILE in t for t in parsed.text) >= 3  # the heading and both charts' titles show it as text


@pytest.mark.parametrize("flag, path, words", [
    ("--out", "/proc/x.html", "cannot write to --out page: /proc/x.html"),
    ("--save", "/proc/x.json", "cannot write to --save file: /proc/x.json"),
    ("--save", ".", "--save file is a folder, not a file: ."),
])
def test_verify_edit_checks_its_outputs_before_training(monkeypatch, capsys, flag, path, words):
    """Before, the training ran for minutes and the write failed after it, with a raw OSError."""
    import rewardlens.loop as loop

    def trained(*_args, **_kwargs):
        raise AssertionError("verify_edit ran before its outputs were checked")

    monkeypatch.setattr(loop, "verify_edit", trained)
    assert main(["verify-edit", "--organism", "list", flag, path]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"rewardlens: error: {words}" + (" (/proc takes no new files: No such file or directory)"
                                                     if path.startswith("/proc") else "")]
