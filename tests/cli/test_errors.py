"""Issue 43: the command line tells bad input (one line, exit 2) from a bug in rewardlens (its traceback, exit 1).

A bug is planted by replacing the loader a command's run calls (`cli.base.load_model`) with one that fails the
way a bug does: numpy's reshape `ValueError`, a `KeyError`. Bad input is what rewardlens raises on purpose
(`RewardLensError`, `UsageError`) or a path's `OSError`; `REWARDLENS_DEBUG=1` adds the traceback to it.
"""

import argparse

import numpy as np
import pytest

import rewardlens.cli.base as base_cli
from rewardlens.cli import build_parser, main
from rewardlens.cli._common import FLAGS
from rewardlens.data import save_pairs
from rewardlens.errors import CircuitError, DataError, RewardLensError, UsageError

BUG_LINE = "rewardlens: error: this is a bug in rewardlens; please report it with the traceback above"


def _reshape_bug(args):
    return np.arange(3).reshape(2, 2)  # ValueError: cannot reshape array of size 3 into shape (2,2)


def _key_bug(args):
    return {"a": 1}["b"]


@pytest.fixture
def score_argv(tiny_root, pairs, tmp_path):
    return ["score", str(tiny_root["llama"]), "--pairs", str(save_pairs(pairs[:1], tmp_path / "pairs.jsonl"))]


@pytest.mark.parametrize(("bug", "shown"), [(_reshape_bug, "cannot reshape array of size 3"), (_key_bug, "KeyError")])
def test_a_bug_in_a_commands_run_exits_1_with_its_traceback(monkeypatch, capsys, score_argv, bug, shown):
    monkeypatch.delenv("REWARDLENS_DEBUG", raising=False)
    monkeypatch.setattr(base_cli, "load_model", bug)
    assert main(score_argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last)") and shown in err and bug.__name__ in err
    assert err.rstrip("\n").splitlines()[-1] == BUG_LINE


def _raises(exc):
    def load(args):
        raise exc
    return load


@pytest.mark.parametrize("exc", [UsageError("k must be at least 1, got 0", option="k"),
                                 DataError("pairs.jsonl, line 3: no 'chosen' field"),
                                 FileNotFoundError(2, "No such file or directory", "gone.jsonl"),
                                 PermissionError(13, "Permission denied", "/root/x")])
def test_bad_input_is_one_line_and_exit_2(monkeypatch, capsys, score_argv, exc):
    monkeypatch.delenv("REWARDLENS_DEBUG", raising=False)
    monkeypatch.setattr(base_cli, "load_model", _raises(exc))
    assert main(score_argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rewardlens: error: ") and "Traceback" not in err
    assert str(exc) in err


def test_the_flag_comes_from_the_errors_option_not_its_wording(monkeypatch, capsys, score_argv):
    monkeypatch.delenv("REWARDLENS_DEBUG", raising=False)
    planted = UsageError("a message naming no keyword", option="num_latents")
    monkeypatch.setattr(base_cli, "load_model", _raises(planted))
    assert main(score_argv) == 2
    assert capsys.readouterr().err == ("rewardlens: error: a message naming no keyword (on the command line: "
                                       "--latents)\n")


@pytest.mark.parametrize("debug", ["1", "0", None])
def test_debug_shows_the_traceback_of_bad_input_and_keeps_exit_2(monkeypatch, capsys, score_argv, debug):
    """A real bad input (an input longer than --max-length), not a planted one."""
    if debug is None:
        monkeypatch.delenv("REWARDLENS_DEBUG", raising=False)
    else:
        monkeypatch.setenv("REWARDLENS_DEBUG", debug)
    assert main([*score_argv, "--max-length", "4"]) == 2
    err = capsys.readouterr().err
    last = err.rstrip("\n").splitlines()[-1]
    assert last.startswith("rewardlens: error: ") and last.endswith("(on the command line: --max-length)")
    assert ("Traceback (most recent call last)" in err) == (debug == "1")
    assert BUG_LINE not in err


def test_debug_keeps_exit_1_for_a_bug(monkeypatch, capsys, score_argv):
    monkeypatch.setenv("REWARDLENS_DEBUG", "1")
    monkeypatch.setattr(base_cli, "load_model", _reshape_bug)
    assert main(score_argv) == 1
    assert capsys.readouterr().err.count("Traceback (most recent call last)") == 1


def test_the_library_names_the_option_the_command_line_relies_on(tiny_root, pairs):
    """Each `option` the CLI maps is the keyword the caller passed (as `FLAGS` spells it)."""
    import rewardlens as rl
    from rewardlens.errors import TokenizationError

    with pytest.raises(TokenizationError) as info:
        rl.load(str(tiny_root["llama"]), max_length=4).score(pairs[:1])
    assert info.value.option == "max_length"
    with pytest.raises(UsageError) as info:
        rl.load(str(tiny_root["llama"]), dtype="float8")
    assert info.value.option == "dtype"
    with pytest.raises(UsageError) as info:
        rl.load(str(tiny_root["llama"]), device="cpu", device_map="auto")
    assert info.value.option == "device_map"
    from rewardlens.causal import PatchSpec

    with pytest.raises(UsageError) as info:
        PatchSpec(mode="nonsense")
    assert info.value.option == "mode" and isinstance(info.value, ValueError)
    assert all(option in FLAGS for option in ("max_length", "dtype", "device_map", "mode"))


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of `parser` and of the parsers below it (`sae train`, ...)."""
    found = {opt for action in parser._actions for opt in action.option_strings}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found |= _flags(child)
    return found


def test_every_flag_in_the_table_is_one_a_command_has():
    missing = set(FLAGS.values()) - _flags(build_parser())
    assert not missing


def test_the_hierarchy_keeps_value_error_callers_working():
    assert issubclass(UsageError, RewardLensError) and issubclass(UsageError, ValueError)
    assert issubclass(CircuitError, UsageError) and issubclass(DataError, ValueError)
    import pickle

    back = pickle.loads(pickle.dumps(UsageError("x", option="level")))
    assert type(back) is UsageError and back.option == "level" and str(back) == "x"
    assert RewardLensError("y").option is None
