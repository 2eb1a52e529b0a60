"""The command line, fuzzed: hostile values for the flags of the cheap commands never give a traceback.

Each generated command line runs in-process (`rewardlens.cli.main(argv)`) with the model loaders replaced
by one that stops the run (`Reached`): every check of flags, paths and pairs files runs, and no model loads.
Property: the run either reaches the loader, with no flag the load or its first forward would choke on
or silently ignore, or exits 0/1/2, and a refusal is one line on stderr (`rewardlens: error: ...`, or
argparse's usage and its one error line), never a traceback.
Hypothesis runs derandomized and without an example database, so every run tests the same examples.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewardlens.cli import main
from rewardlens.data import save_pairs
from tests.helpers import tiny

FUZZ = settings(max_examples=int(os.environ.get("REWARDLENS_FUZZ_EXAMPLES", "80")), deadline=None,
                derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])


class Reached(BaseException):
    """Raised in place of loading a model: every check before the load has passed. A `BaseException`, as
    KeyboardInterrupt is, so that the command line's report of a bug (any `Exception`, exit 1) lets it through."""


@pytest.fixture(scope="module")
def world(tmp_path_factory, tokenizer):
    """A folder holding a tiny model, pairs files good and bad, a plain file and an empty folder; the
    current directory is that folder and the loaders are stubbed, for the whole module."""
    import rewardlens.model

    root = tmp_path_factory.mktemp("fuzz-cli")
    tiny.build("llama", tokenizer, root)
    save_pairs(tiny.PAIRS, root / "pairs.jsonl")
    (root / "bad.jsonl").write_text('{"prompt": "p", "chosen": "a"}\n')
    (root / "bad.csv").write_text('prompt,chosen\n"p",[{"content": 1}]\n')
    (root / "plain.txt").write_text("not pairs\n")
    (root / "empty").mkdir()

    def reached(*args, **kwargs):
        raise Reached

    with pytest.MonkeyPatch.context() as mp:
        for name in ("load", "load_prm", "load_judge", "load_dpo"):
            mp.setattr(rewardlens.model, name, reached)
        mp.chdir(root)
        yield root


# ---- values: what a user might type, and worse --------------------------------------------------------
# No NUL bytes or lone surrogates: no operating system passes a NUL in an argument, and a surrogate only
# reaches a real stderr, which escapes it.

JUNK = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=12)


def mostly(*plausible: str) -> st.SearchStrategy[str]:
    """Values a user would type, three times in four; else anything: most lines get past the parser."""
    typed = st.sampled_from(plausible)
    return st.one_of(typed, typed, typed, JUNK)


INTS = mostly("0", "-1", "1", "2", "7", "600", "999999", "1e3", "", " 3", "9" * 30)
FLOATS = mostly("0", "-0.5", "0.5", "1", "2", "nan", "inf", "-inf", "1e-300", "")
PATHS = mostly("pairs.jsonl", "bad.jsonl", "bad.csv", "plain.txt", "empty", "llama", "missing.jsonl", "", ".", "/",
               "/proc/x", "a\nb", "empty/new/deep", "plain.txt/child", "~", "../x")
MODELS = mostly("llama", "missing", "", "plain.txt", "empty", "org/name", "a/b/c", ".", "llama/")
DEVICES = mostly("cpu", "cuda", "cuda:0", "cuda:9", "mps", "meta", "tpu", "", "cuda:x", "CPU", "cuda:-1", "cpu:0",
                 "xla")
FLAG = None  # a flag that takes no value

COMMON = {
    "--batch-size": INTS, "--dtype": st.sampled_from(["auto", "bf16", "float8", ""]), "--device": DEVICES,
    "--device-map": mostly("auto", "", "meta", "cuda:9", "balanced"), "--offload-folder": PATHS,
    "--readout": mostly("0", "-1", "9", "x", "1,-1", "1,a", ","), "--pad-token-id": INTS,
    "--max-length": INTS, "--truncation": st.sampled_from(["error", "left", "right"]),
    "--prm-separator": JUNK, "--prm-combine": st.sampled_from(["min", "sum", "max"]),
    "--prm-tokens": st.sampled_from(["+,-", "+", ",", "a,b,c"]), "--judge-tokens": st.sampled_from(["Yes,No", "Yes"]),
    "--dpo-reference": MODELS, "--dpo-beta": FLOATS, "--limit": INTS, "--strict": FLAG, "--json": FLAG,
    "--trust-remote-code": FLAG, "--pairs": PATHS,
}
OWN = {
    "score": {},
    "lens": {"--fraction": FLOATS},
    "attribute": {"--level": st.sampled_from(["sublayer", "head", "neuron", "x"]), "--top": INTS, "--all-parts": FLAG},
    "tokens": {"--top": INTS, "--baseline": st.sampled_from(["zero", "pad", "x"]), "--no-approx": FLAG,
               "--view": st.sampled_from(["content", "all", "x"])},
    "patch": {"--mode": st.sampled_from(["noising", "denoising", "ablation", "x"]),
              "--ablation": st.sampled_from(["zero", "mean", "x"]),
              "--level": st.sampled_from(["sublayer", "head", "neuron"]),
              "--neurons": st.sampled_from(["mlp_L0_N1", "top:2", "top:0", "x,,y", ""]),
              "--positions": st.sampled_from(["read", "all", "prefix", "-4:", "0:3,-2:", "x", "1:2:3", ":", ""]),
              "--estimand": st.sampled_from(["total", "direct"]), "--divergence": FLAG, "--atp": FLAG, "--top": INTS},
    "faithfulness": {"--mode": st.sampled_from(["noising", "ablation"]), "--boot": INTS, "--paper-statistic": FLAG},
    "probe": {"--reference": PATHS, "--axis": st.sampled_from(["length", "emoji", "x"]), "--min-effect": FLOATS,
              "--seed": INTS},
    "audit": {"--out": PATHS, "--store": PATHS, "--chunk-size": INTS, "--no-probes": FLAG, "--no-concepts": FLAG,
              "--probe-items": INTS, "--sae": PATHS, "--sae-layer": INTS, "--fraction": FLOATS, "--top": INTS,
              "--no-tokens": FLAG},
}


GOOD_MODEL = st.just("llama")
ARGPARSE = re.compile(r"rewardlens( [a-z-]+)*: error: ")
"""argparse's last line: the program and subcommand, then the error."""


@st.composite
def command_line(draw: st.DrawFn, model: st.SearchStrategy[str] = GOOD_MODEL) -> list[str]:
    """A command, its model (the good tiny folder unless `model` says otherwise) and up to five flags."""
    command = draw(st.sampled_from(sorted(OWN)))
    flags = {**COMMON, **OWN[command]}
    argv = [command, draw(model)]
    if draw(st.integers(0, 3)):  # most command lines name a good pairs file, so later checks are reached
        argv += ["--pairs", "pairs.jsonl"]
    for flag in draw(st.lists(st.sampled_from(sorted(flags)), max_size=5)):
        values = flags[flag]
        argv += [flag] if values is None else [f"{flag}={draw(values)}"]  # '=': a value may start with '-'
    return argv


def run(argv: list[str]) -> tuple[int | None, str]:
    """(exit code, stderr) of `rewardlens ARGV` in-process; exit code None when the loader was reached."""
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            code: int | None = main(argv)
        except SystemExit as e:  # argparse: a bad value or choice, or --help
            code = int(e.code or 0)
        except Reached:
            code = None
    return code, err.getvalue()


PATH_FLAGS = ("model", "pairs", "reference", "dpo_reference", "offload_folder", "out", "store", "sae")


def assert_checked_before_load(argv: list[str]) -> None:
    """What reaches the loader holds no flag the load or the first forward would choke on, or ignore."""
    import torch

    from rewardlens.cli import build_parser

    args = build_parser().parse_args(argv)
    assert all(getattr(args, name, None) != "" for name in PATH_FLAGS), argv
    if args.device is not None:
        torch.device(args.device)  # parses
    assert args.pad_token_id is None or 0 <= args.pad_token_id < 600, argv  # the tiny model's vocabulary
    assert args.offload_folder is None or args.device_map is not None, argv
    if args.model == "llama":  # a sequence classifier: no kind flag applies to it
        assert all(getattr(args, k, None) is None for k in ("prm_separator", "judge_tokens", "dpo_reference")), argv
    if args.command == "patch":
        assert args.ablation is None or args.mode == "ablation", argv
        assert (args.level == "neuron") == (args.neurons is not None), argv
    if args.command == "audit" and args.probe_items is not None:
        assert args.probe_items >= 2 and not (args.no_probes and args.no_concepts), argv


def assert_one_line(argv: list[str]) -> None:
    code, err = run(argv)
    assert "Traceback" not in err, (argv, err)
    if code is None:  # every flag passed its checks: the model would load now
        assert_checked_before_load(argv)
        return
    assert code in (0, 1, 2), (argv, code, err)
    lines = re.split(r"\r\n|\r|\n", err.rstrip("\n"))  # what a terminal breaks lines at
    if code == 2:  # our own refusal, one line; or argparse's: its usage, then one line naming the flag
        ours = len(lines) == 1 and lines[0].startswith("rewardlens: error: ")
        parser = len(lines) >= 2 and lines[0].startswith("usage: ") and ARGPARSE.match(lines[-1])
        assert ours or parser, (argv, err)


@FUZZ
@given(argv=command_line())
def test_fuzzed_flags_give_one_line_never_a_traceback(world, argv):
    assert_one_line(argv)


@FUZZ
@given(argv=command_line(MODELS))
def test_fuzzed_model_paths_give_one_line_never_a_traceback(world, argv):
    assert_one_line(argv)


@pytest.mark.parametrize("argv, message", [
    (["score", "llama", "--pairs", "a\nb"], "rewardlens: error: no such --pairs file: a\\nb"),
    (["patch", "llama", "--pairs", "pairs.jsonl", "--device", "gpu 0"],
     "rewardlens: error: --device 'gpu 0' is not a device name; pass cpu, cuda, cuda:N, mps or another device torch "
     "knows (TYPE or TYPE:INDEX)"),
])
def test_what_the_fuzzing_found_is_refused_in_one_line(world, argv, message):
    """A path holding a line break printed as two lines, and a device name with a space reached torch."""
    assert run(argv) == (2, message + "\n")
