"""Command line: `rewardlens COMMAND [MODEL] [--pairs FILE] [--json]`; `rewardlens -h` lists commands.

Arguments and paths are checked with the standard library alone; torch, transformers and the
instruments are imported only once they are all good (inside each command's run function).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence

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
    graph,
    loop,
    monitor,
    organisms,
    parity,
    probes,
    sae,
    serve,
    tokens,
    transcoders,
)
from ._common import FLAGS, Command, Interrupted, check_common, command_line, print_json

_EPILOG = ("exit status: 0 done, 2 bad input (one line: 'rewardlens: error: ...'), 1 a bug in rewardlens (its "
           "traceback, then a line asking to report it), 130 interrupted. REWARDLENS_DEBUG=1 shows the "
           "traceback of every error, bad input too (the exit status is unchanged).")
"""What `rewardlens -h` says under the commands."""

# Each module owns its commands; the order here is the order of `rewardlens -h`.
_MODULES = (base, tokens, audit, bench, causal, circuit, probes, compare, concepts, conflict, edit, sae, transcoders,
            graph, organisms,
            monitor, loop, serve, parity)


def _commands() -> dict[str, Command]:
    return {c.name: c for module in _MODULES for c in module.COMMANDS}


def build_parser() -> argparse.ArgumentParser:
    """The `rewardlens` parser: one subcommand per `Command`, each with `--json`."""
    parser = argparse.ArgumentParser(prog="rewardlens", description=__doc__, epilog=_EPILOG)
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
    naming it), 1 for a bug (its traceback), 130 on Ctrl-C, 143 on SIGTERM (handled as Ctrl-C: what was kept,
    and how to resume), else the command's own."""
    args = build_parser().parse_args(argv)
    args.command_line = command_line(argv)  # what to run again (a resumable audit says it)
    command = _commands()[args.command]
    with _terminated_as_interrupt() as received:
        return _run(args, command, received)


@contextlib.contextmanager
def _terminated_as_interrupt() -> Iterator[list[int]]:
    """SIGTERM raised as KeyboardInterrupt while the command runs, so `timeout`, a scheduler's kill or a closed
    session stop it as Ctrl-C does (a store's transaction rolled back, the resume line printed); the signals
    received are listed in what it yields. Off the main thread (where no handler can be set) nothing changes."""
    received: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        if received:  # a second SIGTERM while the first unwinds: the resume line is still to be printed
            return
        received.append(signum)
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    before = signal.signal(signal.SIGTERM, stop)
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, before)


def _run(args: argparse.Namespace, command: Command, received: list[int]) -> int:
    """`main` once the command is parsed; `received`: the signals `_terminated_as_interrupt` turned into
    KeyboardInterrupt (the exit code is 128 + the signal's number, 130 for Ctrl-C)."""
    try:
        check_common(args)
        command.check(args)
        result = command.run(args)
        if args.json:
            print_json(result)  # strict JSON: NaN and inf as null
        else:
            command.show(result)
    except KeyboardInterrupt as exc:
        print(str(exc) if isinstance(exc, Interrupted) else "rewardlens: interrupted", file=sys.stderr)
        return 128 + (received[0] if received else signal.SIGINT)
    except Exception as exc:  # sorted into bad input and bugs, each reported its own way
        return failed(exc)
    return command.exit_code(result)


_PATH_ERRORS = (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, NotADirectoryError)


def bad_input(exc: BaseException) -> bool:
    """Whether `exc` is bad input rather than a bug: an error rewardlens raises on purpose (`RewardLensError`,
    `UsageError` for a bad argument), or an `OSError` about a path or the system (a missing or unreadable file,
    a full disk: it names a file or carries an errno). Anything else, a bare `ValueError` included, is a bug."""
    if isinstance(exc, RewardLensError):
        return True
    return isinstance(exc, OSError) and (isinstance(exc, _PATH_ERRORS) or exc.filename is not None
                                         or exc.errno is not None)


def failed(exc: BaseException) -> int:
    """Report `exc` and return the exit code: bad input is one line naming it (the flag of the option it carries,
    `RewardLensError.option`), exit 2; a bug is its traceback and a line asking for a report, exit 1.
    `REWARDLENS_DEBUG=1` shows the traceback of bad input too (same exit code)."""
    if not bad_input(exc):
        traceback.print_exception(type(exc), exc, exc.__traceback__)
        print("rewardlens: error: this is a bug in rewardlens; please report it with the traceback above",
              file=sys.stderr)
        return 1
    if os.environ.get("REWARDLENS_DEBUG", "") not in ("", "0"):
        traceback.print_exception(type(exc), exc, exc.__traceback__)
    message, flag = str(exc), FLAGS.get(getattr(exc, "option", None) or "")
    if flag is not None and flag not in message:
        message += f" (on the command line: {flag})"
    print(f"rewardlens: error: {one_line(message)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
