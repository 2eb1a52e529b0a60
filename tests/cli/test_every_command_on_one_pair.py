"""Every command on ONE pair, in table and --json mode: exit 0, and '-'/None with its reason where a
number is undefined (issue 20: crashes in the printers after the work was done)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rewardlens.cli import _commands, main
from rewardlens.data import Pair, save_pairs

ONE = Pair("What is the capital of France?", "The capital of France is Paris.", "France is in Europe.")
# plain one-sentence answers: formatting, emoji, markdown and repetition apply to no item
PLAIN = Pair("Name a colour.", "Blue", "Red")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("one")
    (root / "pos.txt").write_text("I am certain it is Paris.\nDefinitely blue.\n")
    (root / "neg.txt").write_text("Maybe it is Paris.\nPerhaps blue.\n")
    return {"one": str(save_pairs([ONE], root / "one.jsonl")), "plain": str(save_pairs([PLAIN], root / "plain.jsonl")),
            "other": str(save_pairs([PLAIN], root / "other.jsonl")),
            "concept": f"{root / 'pos.txt'},{root / 'neg.txt'}"}


def _policy_log(out: Path) -> str:
    """A one-record policy monitor log (what monitored_reward(log=...) writes) for monitor-report."""
    import numpy as np

    from rewardlens.monitor import PolicyRecord

    rec = PolicyRecord(0, np.array([0.5]), ("length",), np.array([[0.1]]), np.array([0.2]), np.array([0.2]),
                       ("length",), np.array([[3.0]]))
    path = out / "policy.jsonl"
    path.write_text(rec.to_json() + "\n")
    return str(path)


def _argv(name: str, model: str, other: str, f: dict[str, str], out: Path) -> list[str]:
    one = ["--pairs", f["one"]]
    return {
        "score": ["score", model, *one], "lens": ["lens", model, *one], "attribute": ["attribute", model, *one],
        "parity": ["parity", model, *one],
        "circuit": ["circuit", model, *one, "--top", "3"],
        "bench": ["bench", model, *one, "--against", other, "--n-boot", "40"],
        "tokens": ["tokens", model, *one, "--top", "3"],
        "audit": ["audit", model, *one, "--out", str(out / "audit"), "--probe-items", "2", "--no-concepts", "--quiet"],
        "patch": ["patch", model, *one, "--atp", "--top", "3"],
        "faithfulness": ["faithfulness", model, *one, "--boot", "20"],
        "probe": ["probe", model, *one, "--axis", "length", "--axis", "confidence"],
        "compare": ["compare", model, other, *one, "--n-boot", "20"],
        "concepts": ["concepts", model, "--concept", f"sure={f['concept']}", "--boot", "20", "--alphas=-1,1"],
        "conflict": ["conflict", model, *one, "--term", f"a={f['one']}", "--term", f"b={f['other']}", "--boot", "100"],
        "edit": ["edit", model, "--concept", f["concept"], "--out", str(out / "edited"), *one,
                 "--probe-pairs", f["one"]],
        "sae": ["sae", "train", model, *one, "--layer", "1", "--out", str(out / "sae"), "--latents", "16", "--k", "2"],
        "transcoders": ["transcoders", "train", model, *one, "--layers", "0-1", "--out", str(out / "tc"),
                        "--features", "16", "--k", "2", "--tc-batch-size", "8"],
        "graph": ["graph", model, *one, "--basis", "neurons", "--out", str(out / "graph"), "--max-nodes", "32",
                  "--contexts", "1"],
        "calibrate": ["calibrate", "--organism", "length", "--n-pairs", "10"],
        "monitor-report": ["monitor-report", _policy_log(out), "--out", str(out / "policy.html")],
        # the suite's reduced closed loop (tests/loop/conftest.py): cached on disk, trained once per cache
        "verify-edit": ["verify-edit", "--organism", "list", "--seeds", "2", "--steps", "5"],
    }[name]


# refused up front on one pair, with the reason: exit 2, not a traceback
REFUSED = {"conflict": "at least 3 pairs"}
# crashes in files outside this test's brief, reported for their owners
# runs until stopped, so not "on one pair": tests/serve drives the real command under load and stops it
SERVERS = {"serve"}


def _cases() -> list[object]:
    return [pytest.param(name, as_json, id=f"{name}-{'json' if as_json else 'table'}")
            for name in _commands() if name not in SERVERS for as_json in (False, True)]


@pytest.mark.parametrize(("name", "as_json"), _cases())
def test_every_command_on_one_pair(capsys, tiny_root, files, tmp_path, name, as_json):
    model, other = str(tiny_root["llama"]), str(tiny_root["qwen2"])
    argv = _argv(name, model, other, files, tmp_path)
    code = main([*argv, *(["--json"] if as_json else [])])
    out, err = capsys.readouterr()
    if name in REFUSED:
        assert code == 2 and REFUSED[name] in err and "Traceback" not in err
        return
    assert code == 0, err
    if as_json:
        json.loads(out)  # valid JSON: no NaN, no Infinity
    if name == "sae":  # then attribute through the SAE it trained
        sae_dir = next(p for p in (tmp_path / "sae").iterdir() if p.is_dir())
        code = main(["sae", "attribute", model, "--pairs", files["one"], "--sae", str(sae_dir), "--contexts", "1",
                     *(["--json"] if as_json else [])])
        out, err = capsys.readouterr()
        assert code == 0, err


@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
def test_probe_with_an_axis_that_applies_to_nothing(capsys, tiny_root, files, as_json):
    argv = ["probe", str(tiny_root["llama"]), "--pairs", files["plain"], "--axis", "formatting", "--axis", "emoji",
            "--axis", "length"]
    assert main([*argv, *(["--json"] if as_json else [])]) == 0
    out = capsys.readouterr().out
    if as_json:
        axes = {r["axis"]: r for r in json.loads(out)["axes"]}
        assert axes["formatting"]["n"] == 0 and axes["formatting"]["mean"] is None
    else:
        assert "apply to none of the items (n = 0): formatting" in out
