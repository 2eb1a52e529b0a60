"""Command line: `rewardlens COMMAND [MODEL] [--pairs FILE] [--json]`; `rewardlens -h` lists commands.

Arguments and paths are checked with the standard library alone; torch, transformers and the
instruments are imported only once they are all good (inside each command's run function).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..errors import RewardLensError
from . import (
    audit,
    base,
    bench,
    causal,
    circuit,
    compare,
    concepts,
    conflict,
    edit,
    loop,
    monitor,
    organisms,
    parity,
    probes,
    sae,
    tokens,
)
from ._common import Command, Interrupted, as_flags, check_common, command_line, print_json

# Each module owns its commands; the order here is the order of `rewardlens -h`.
_MODULES = (base, tokens, audit, bench, causal, circuit, probes, compare, concepts, conflict, edit, sae, organisms,
            monitor, loop, parity)


def _commands() -> dict[str, Command]:
    return {c.name: c for module in _MODULES for c in module.COMMANDS}


def build_parser() -> argparse.ArgumentParser:
    """The `rewardlens` parser: one subcommand per `Command`, each with `--json`."""
    parser = argparse.ArgumentParser(prog="rewardlens", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for command in _commands().values():
        p = sub.add_parser(command.name, help=command.help)
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
        command.add_arguments(p)
    _no_prefixes(parser)
    return parser


def _no_prefixes(parser: argparse.ArgumentParser) -> None:
    """Turn off argparse's prefix matching on `parser` and every parser below it.

    Why: with it, a typo such as `--pair` is silently taken as `--pairs`, and adding an option
    later can change what an old command line means. Set after construction so that the nested
    parsers the command modules build (`sae train`, ...) are covered without each remembering."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _no_prefixes(child)


def one_line(message: str) -> str:
    """`message` as one line of stderr: a line break it quotes (a path typed with one) is shown escaped."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command (`argv`, default `sys.argv[1:]`) and return its exit code: 2 for bad input (one line
    naming it), 130 on Ctrl-C, else the command's own."""
    args = build_parser().parse_args(argv)
    args.command_line = command_line(argv)  # what to run again (a resumable audit says it)
    command = _commands()[args.command]
    try:
        # Bad input (a model path, a pairs file, an option): one line that names it, no traceback.
        check_common(args)
        command.check(args)
        result = command.run(args)
    except (RewardLensError, OSError, ValueError) as exc:
        print(f"rewardlens: error: {one_line(as_flags(str(exc)))}", file=sys.stderr)  # the fix in flags
        return 2
    except KeyboardInterrupt as exc:
        print(str(exc) if isinstance(exc, Interrupted) else "rewardlens: interrupted", file=sys.stderr)
        return 130
    if args.json:
        print_json(result)  # strict JSON: NaN and inf as null
    else:
        command.show(result)
    return command.exit_code(result)


if __name__ == "__main__":
    sys.exit(main())
