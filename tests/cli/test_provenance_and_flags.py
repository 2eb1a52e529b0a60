"""Issue 20: CLI errors name the flags, and a report says what it is of; a folder holds one run.

Issue 43: the flag comes from the error's `option` (data), not from rewriting the message's wording."""

import json

import pytest

import rewardlens as rl
from rewardlens.cli import main
from rewardlens.data import save_pairs
from rewardlens.errors import RewardLensError, RewardLensWarning


def test_a_long_input_error_names_the_flags_on_the_command_line(capsys, tiny_root, pairs, tmp_path):
    pairs_file = str(save_pairs(pairs[:1], tmp_path / "pairs.jsonl"))
    assert main(["score", str(tiny_root["llama"]), "--pairs", pairs_file, "--max-length", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.rstrip().endswith("(on the command line: --max-length)")


def test_the_library_keeps_the_python_spelling(tiny_root, pairs):
    model = rl.load(str(tiny_root["llama"]), max_length=4)
    with pytest.raises(RewardLensError, match="max_length=") as info:
        model.score(pairs[:1])
    assert "truncation='left'" in str(info.value) and "--max-length" not in str(info.value)


def test_report_names_model_and_data_and_removes_only_its_own_stale_tables(capsys, tiny_root, pairs, tmp_path):
    pairs_file = save_pairs(pairs[:2], tmp_path / "my-pairs.jsonl")
    out = tmp_path / "out"
    out.mkdir()
    (out / "extra.parquet").write_bytes(b"an earlier run's table")
    (out / "mine.parquet").write_bytes(b"the user's own file")
    (out / "notes.txt").write_text("the user's notes")
    (tmp_path / "outside.txt").write_text("not in the folder")
    (out / "numbers.json").write_text(json.dumps({"tables": {"extra": {"file": "extra.parquet", "rows": 1},
                                                             "evil": {"file": "../outside.txt"}}}))
    model = str(tiny_root["llama"])
    with pytest.warns(RewardLensWarning, match="extra.parquet"):
        code = main(["audit", model, "--pairs", str(pairs_file), "--out", str(out), "--no-probes", "--no-concepts",
                     "--quiet", "--json"])
    assert code == 0
    shown = json.loads(capsys.readouterr().out)["provenance"]
    numbers = json.loads((out / "numbers.json").read_text())
    prov = numbers["provenance"]
    assert prov == shown
    assert prov["model_path"] == str(tiny_root["llama"].resolve()) and prov["data"] == str(pairs_file.resolve())
    assert "audit" in prov["command_line"] and prov["rewardlens_version"] and prov["time_utc"].endswith("+00:00")
    page = (out / "report.html").read_text()
    assert str(tiny_root["llama"].resolve()) in page and "my-pairs.jsonl" in page
    assert not (out / "extra.parquet").exists()
    assert (out / "mine.parquet").read_bytes() == b"the user's own file" and (out / "notes.txt").exists()
    assert (tmp_path / "outside.txt").exists() and (out / "scores.parquet").is_file()


def test_library_audit_provenance(tiny_root, pairs, tmp_path):
    from rewardlens.audit import Plan, audit
    from rewardlens.audit.report import write_report

    model = rl.load(str(tiny_root["llama"]))
    result = audit(model, pairs[:1], plan=Plan(probes=False, concepts=False), data="pairs.jsonl")
    assert result.provenance["data"] == "pairs.jsonl" and result.provenance["command_line"] is None
    write_report(result, tmp_path)
    prov = json.loads((tmp_path / "numbers.json").read_text())["provenance"]
    assert prov["model_path"] == str(tiny_root["llama"].resolve())


@pytest.mark.parametrize(("typed", "meant"), [("ки", "ки"), ("→", "→"), ("\\n", "\n"), ("\\n\\n", "\n\n"),
                                              ("a\\tb", "a\tb"), ("\\\\n", "\\n"), ("\\x", "\\x")])
def test_a_step_separator_keeps_non_ascii_and_expands_escapes(typed, meant):
    """Math-Shepherd's step tag 'ки' must reach the tokenizer as typed, while '\\n' becomes a newline."""
    import argparse

    from rewardlens.cli._common import add_model_options

    parser = argparse.ArgumentParser()
    add_model_options(parser)
    assert parser.parse_args(["model", "--prm-separator", typed]).prm_separator == meant


@pytest.mark.parametrize("flags", [["--prm-combine", "sum"], ["--prm-tokens", "+,-"], ["--dpo-beta", "0.5"],
                                   ["--judge-tokens", "A,B", "--readout", "1"]])
def test_an_option_of_a_kind_not_chosen_is_refused_not_dropped(tiny_root, pairs, tmp_path, capsys, flags):
    """Dropped silently, each of these would score a plain sequence classifier (or a fixed read-out) while
    the user believes another reward is measured."""
    pairs_file = save_pairs(pairs, tmp_path / "pairs.jsonl")
    assert main(["score", str(tiny_root["llama"]), "--pairs", str(pairs_file), *flags]) == 2
    err = capsys.readouterr().err
    assert flags[0] in err or "--readout" in err
