"""argparse's prefix matching is off everywhere: a typo such as `--pair` is an error, never `--pairs`."""

from __future__ import annotations

import argparse

import pytest

from rewardlens.cli import build_parser


def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers(child, (*path, name))


def test_every_parser_has_prefix_matching_off():
    seen = {" ".join(path) for path, parser in _parsers(build_parser()) if not parser.allow_abbrev}
    everything = {" ".join(path) for path, _ in _parsers(build_parser())}
    assert "sae train" in everything and "audit" in everything  # the walk reaches nested commands
    assert seen == everything


@pytest.mark.parametrize("argv, typo", [
    (["score", "model", "--pairs", "p.jsonl", "--pair", "q.jsonl"], "--pair"),
    (["sae", "train", "model", "--pairs", "p.jsonl", "--layer", "1", "--out", "o", "--lay", "2"], "--lay"),
])
def test_a_prefix_of_an_option_is_refused(capsys, argv, typo):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    assert f"unrecognized arguments: {typo}" in capsys.readouterr().err
