"""Argument and path errors are refused before torch or transformers is imported; Ctrl-C during an
audit says what the store keeps and how to resume.

Each failing command runs in a fresh interpreter that reports, at exit, whether torch or
transformers was ever imported. Speed itself is not asserted here (benchmarks/ measures it).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rewardlens as rl
from rewardlens.cli import _common as cli_common
from rewardlens.cli import audit as cli_audit
from rewardlens.cli import concepts as cli_concepts
from rewardlens.cli import edit as cli_edit
from rewardlens.cli import organisms as cli_organisms
from rewardlens.cli import probes as cli_probes
from rewardlens.cli._common import DTYPES, ArgumentError, check_model
from rewardlens.data import save_pairs
from tests.helpers import tiny

HEAVY = ("torch", "transformers")
# Runs the command line, then says on stderr (at exit, also after argparse's SystemExit) which
# heavy modules were imported.
WRAPPER = f"""
import atexit, sys
atexit.register(lambda: sys.stderr.write("HEAVY:" + ",".join(m for m in {HEAVY!r} if m in sys.modules) + "\\n"))
from rewardlens.cli import main
sys.exit(main())
"""


def run_light(*argv: str, cwd: Path) -> tuple[int, str]:
    """Exit code and stderr (minus the wrapper's line) of `rewardlens ARGV`; fails if torch or
    transformers was imported."""
    proc = subprocess.run([sys.executable, "-c", WRAPPER, *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=120)
    lines = proc.stderr.splitlines()
    heavy = [line for line in lines if line.startswith("HEAVY:")]
    assert heavy == ["HEAVY:"], f"rewardlens {' '.join(argv)} imported {heavy}; stderr:\n{proc.stderr}"
    return proc.returncode, "\n".join(line for line in lines if not line.startswith("HEAVY:"))


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer) -> Path:
    return tiny.build("llama", tokenizer, tmp_path_factory.mktemp("fast"))


@pytest.fixture(scope="module")
def pairs_path(tmp_path_factory, pairs) -> Path:
    return save_pairs(pairs, tmp_path_factory.mktemp("fast-pairs") / "pairs.jsonl")


def test_python_m_rewardlens_names_a_missing_model_folder_without_importing_torch(tmp_path):
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "rewardlens", "score", "missing-folder",
                           "--pairs", "missing.jsonl"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert imported and not {m for m in imported if m.split(".")[0] in HEAVY}
    err = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 2
    assert err == ["rewardlens: error: no such model folder: missing-folder"]


@pytest.mark.parametrize("argv, message", [
    (["audit", "missing-folder"], "no such model folder: missing-folder"),
    (["lens", "./no/such", "--pairs", "p.jsonl"], "no such model folder: ./no/such"),
    (["compare", "missing-a", "missing-b", "--pairs", "p.jsonl"], "no such model folder: missing-a"),
    (["probe", "/no/such/model"], "no such model folder: /no/such/model"),
])
def test_a_missing_model_folder_is_named_at_once(tmp_path, argv, message):
    code, err = run_light(*argv, cwd=tmp_path)
    assert code == 2 and one_error_line(err) == f"rewardlens: error: {message}"


def test_a_file_or_a_folder_without_config_is_not_a_model_folder(tmp_path):
    (tmp_path / "weights.bin").write_text("")
    (tmp_path / "empty").mkdir()
    code, err = run_light("score", "weights.bin", "--pairs", "p.jsonl", cwd=tmp_path)
    assert code == 2 and "not a model folder (it is a file): weights.bin" in one_error_line(err)
    code, err = run_light("score", "empty", "--pairs", "p.jsonl", cwd=tmp_path)
    assert code == 2 and "not a model folder (no config.json in it): empty" in one_error_line(err)


def test_a_hub_id_is_left_to_the_loader():
    check_model("some-org/some-model")  # no local folder: may be a hub repository, not refused here
    for bad in ("missing-folder", "./org/name", "/abs/org/name", "a/b/c"):
        with pytest.raises(ArgumentError, match="no such model folder"):
            check_model(bad)


def test_a_missing_pairs_file_with_a_real_model_is_named_before_the_model_loads(tmp_path, model_dir, pairs_path):
    code, err = run_light("score", str(model_dir), "--pairs", "missing.jsonl", cwd=tmp_path)
    assert code == 2 and one_error_line(err) == "rewardlens: error: no such --pairs file: missing.jsonl"
    code, err = run_light("probe", str(model_dir), "--reference", "gone.jsonl", cwd=tmp_path)
    assert code == 2 and "no such --reference file: gone.jsonl" in one_error_line(err)
    code, err = run_light("conflict", str(model_dir), "--pairs", str(pairs_path), "--term", "a=x.jsonl",
                          "--term", "b=y.jsonl", cwd=tmp_path)
    assert code == 2 and "no such --term file: x.jsonl" in one_error_line(err)
    code, err = run_light("concepts", str(model_dir), "--concept", "lists=with.txt,without.txt", cwd=tmp_path)
    assert code == 2 and "no such concept file: with.txt" in one_error_line(err)
    code, err = run_light("sae", "attribute", str(model_dir), "--pairs", str(pairs_path), "--sae", "nosae",
                          cwd=tmp_path)
    assert code == 2 and "no such SAE folder: nosae" in one_error_line(err)


def test_a_malformed_pairs_file_is_named_before_torch(tmp_path, model_dir):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "hi", "chosen": "a"}\n')
    code, err = run_light("score", str(model_dir), "--pairs", str(bad), cwd=tmp_path)
    assert code == 2 and "bad.jsonl" in one_error_line(err) and "rejected" in err


@pytest.mark.parametrize("argv, message", [
    (["--batch-size", "0"], "must be > 0"),
    (["--dtype", "float8"], "invalid choice: 'float8'"),
    (["--fraction", "2"], "must be in (0, 1]"),
    (["--truncation", "right"], "invalid choice: 'right'"),
])
def test_a_bad_flag_value_is_refused_by_the_parser(tmp_path, model_dir, pairs_path, argv, message):
    code, err = run_light("lens", str(model_dir), "--pairs", str(pairs_path), *argv, cwd=tmp_path)
    assert code == 2 and message in err and "Traceback" not in err


@pytest.mark.parametrize("argv, message", [
    (["audit", "--sae-layer", "3"], "--sae-layer needs --sae PATH"),
    (["patch", "{model}", "--pairs", "{pairs}", "--atp", "--estimand", "direct"], "--atp estimates total effects"),
    (["score", "{model}"], "--pairs"),
])
def test_a_bad_combination_of_flags_is_refused_before_torch(tmp_path, model_dir, pairs_path, argv, message):
    argv = [a.format(model=model_dir, pairs=pairs_path) for a in argv]
    code, err = run_light(*argv, cwd=tmp_path)
    assert code == 2 and message in err and "Traceback" not in err


def test_an_output_folder_that_cannot_be_written_is_named(tmp_path, model_dir):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, err = run_light("audit", "--out", "a-file/report", cwd=tmp_path)
    assert code == 2 and one_error_line(err) == (
        f"rewardlens: error: cannot create --out folder a-file/report: {blocker} is a file")
    code, err = run_light("audit", "--out", "a-file", cwd=tmp_path)
    assert code == 2 and "--out folder is a file, not a folder: a-file" in one_error_line(err)
    (tmp_path / "w.txt").write_text("x\n")
    code, err = run_light("edit", str(model_dir), "--concept", "w.txt,w.txt", "--out", "a-file/edited", cwd=tmp_path)
    assert code == 2 and "cannot create --out folder a-file/edited" in one_error_line(err)
    code, err = run_light("calibrate", "--out", str(tmp_path), cwd=tmp_path)
    assert code == 2 and "--out file is a folder, not a file" in one_error_line(err)


def test_import_rewardlens_is_light_and_every_public_name_resolves(tmp_path):
    code = ("import sys, types, rewardlens as rl; assert 'torch' not in sys.modules, 'torch at import'\n"
            "import rewardlens.audit, rewardlens.compare, rewardlens.calibrate\n"
            "from rewardlens import audit\n"
            "for name in ('audit', 'compare', 'calibrate'):\n"
            "    assert callable(getattr(rl, name)) and not isinstance(getattr(rl, name), types.ModuleType), name\n"
            "assert audit is sys.modules['rewardlens.audit'].audit\n"
            "print(rl.__version__)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for name in rl.__all__:
        value = getattr(rl, name)
        face = importlib.import_module(f"rewardlens.{rl._FACE[name]}")
        assert value is getattr(face, name), name
    assert set(rl._FACE) == set(rl.__all__) and set(rl.__all__) <= set(dir(rl))
    with pytest.raises(AttributeError):
        rl.no_such_name  # noqa: B018


def test_the_parsers_copies_of_option_values_match_their_owners():
    """The parser checks choices without importing their owners; here the owners are asked."""
    from rewardlens.hacking import ALPHAS, AXES, ITEMS, METHODS, STAGES
    from rewardlens.model._load import _DTYPES
    from rewardlens.zoo.organisms import ORGANISMS

    assert set(DTYPES) == {*_DTYPES, "auto"}
    assert cli_probes.AXES == tuple(AXES)
    assert cli_edit.METHODS == tuple(METHODS)
    assert cli_concepts.ALPHAS == tuple(ALPHAS)
    assert set(cli_organisms.ORGANISMS) == set(ORGANISMS)
    assert cli_common.BUILT_IN_ITEMS == len(ITEMS)
    assert cli_common.PROBE_STAGES == STAGES
    from rewardlens.cli import loop as cli_loop
    from rewardlens.loop._organisms import PLANTED

    assert set(cli_loop.LOOP_ORGANISMS) == set(PLANTED)


def _units(store: Path) -> set[str]:
    """Pair units in the store, read-only (the audit is writing it). Never waits on the writer's lock
    (timeout=0: a busy store reads as not yet there): a reader that waited up to seconds for the lock
    saw the first chunk only once the audit had finished, and its Ctrl-C then landed in the exiting
    interpreter, which ignores it (exit 0)."""
    try:
        db = sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=0)
        try:
            return {r[0] for r in db.execute("SELECT DISTINCT unit FROM units WHERE unit != 'all'")}
        finally:
            db.close()
    except sqlite3.Error:  # not created yet, or mid-creation
        return set()


def test_ctrl_c_during_an_audit_says_what_is_kept_and_the_printed_command_resumes(tmp_path):
    from rewardlens.zoo import AUDIT_PAIRS, demo_model_dir

    demo_model_dir()  # train the demo once here, so the audit below starts computing at once
    # Six rounds of the built-in pairs, each round's prompts worded apart (no pair repeats another): far
    # more chunks after the first than the poll below takes to see it.
    openers = ("", "Quick question. ", "Tell me honestly. ", "One more thing. ", "Be direct. ", "Briefly: ")
    pairs = [dataclasses.replace(p, prompt=opener + str(p.prompt), id=f"{i}-{k}")
             for k, opener in enumerate(openers) for i, p in enumerate(AUDIT_PAIRS)]
    path = save_pairs(pairs, tmp_path / "pairs.jsonl")
    out, store = tmp_path / "out", tmp_path / "out" / "results.sqlite"
    argv = [sys.executable, "-m", "rewardlens", "audit", "--pairs", str(path), "--out", str(out), "--chunk-size", "2",
            "--no-probes", "--no-concepts", "--quiet"]
    # SIGINT at its default in the child whatever this process inherited: a Python started with SIGINT
    # ignored keeps ignoring it, and would finish the audit (exit 0) instead of stopping.
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 600
        while not _units(store) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, "the audit ended before a chunk could be interrupted:\n" + proc.stderr.read()
        assert _units(store), "no chunk was stored within 600 s"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    line = one_error_line(err)
    found = re.fullmatch(rf"rewardlens: interrupted; {re.escape(str(store))} keeps (\d+) of {len(pairs)} pairs"
                         r"(?: and \d+ whole-model results?)? \(a rerun reuses them, found by content\); "
                         r"resume with: (.+)", line)
    assert found, line
    kept, command = int(found.group(1)), found.group(2)
    assert kept >= 1 and kept == len(_units(store))  # at least the first span (one pair alone)
    assert shlex.split(command) == argv

    again = subprocess.run(shlex.split(command), cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr
    assert (f"resumed: {kept} of {len(pairs)} pairs already in the store (reused from an earlier run), not computed "
            "again") in again.stdout
    assert len(_units(store)) == len(pairs)
    numbers = json.loads((out / "numbers.json").read_text())
    assert numbers["n_pairs"] == len(pairs)


def test_strict_refuses_degenerate_pairs_before_torch(tmp_path, model_dir, pairs):
    path = save_pairs([pairs[0], pairs[0]], tmp_path / "twice.jsonl")
    for argv in (["score", str(model_dir), "--pairs", str(path)], ["probe", str(model_dir), "--reference", str(path)],
                 ["audit", "--pairs", str(path)]):
        code, err = run_light(*argv, "--strict", cwd=tmp_path)
        assert code == 2 and "twice.jsonl" in one_error_line(err) and "line 2" in err, err


# ---- issue 30: every flag checked before the model loads ------------------------------------------


@pytest.fixture
def no_loading(monkeypatch):
    """The loaders, replaced by one that fails the test: a refusal must come before any model loads."""
    import rewardlens.model

    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded")

    for name in ("load", "load_prm", "load_judge", "load_dpo"):
        monkeypatch.setattr(rewardlens.model, name, loaded)


def refused(capsys, *argv: str) -> str:
    """The one error line `rewardlens ARGV` exits 2 with, in-process."""
    from rewardlens.cli import main

    assert main(list(argv)) == 2
    return one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("pad, message", [
    ("999999", "--pad-token-id 999999 is not a token id of {model}: its vocabulary has 600 ids (0 to 599, config.json "
               "vocab_size); pass an id in that range, or drop --pad-token-id to read by the model's own"),
    ("-5", "--pad-token-id -5 is not a token id (ids count from 0); pass the id of the pad token, or drop "
           "--pad-token-id to read by the model's own"),
])
def test_a_pad_token_id_outside_the_vocabulary_is_refused_before_torch(tmp_path, model_dir, pairs_path, pad, message):
    """Before, torch.embedding raised an IndexError on the first forward."""
    code, err = run_light("score", str(model_dir), "--pairs", str(pairs_path), "--pad-token-id", pad, cwd=tmp_path)
    assert code == 2 and one_error_line(err) == "rewardlens: error: " + message.format(model=model_dir)


@pytest.mark.parametrize("device, message", [
    ("", "--device '' is not a device name; pass cpu, cuda, cuda:N, mps or another device torch knows (TYPE or "
         "TYPE:INDEX)"),
    ("cuda:x", "--device 'cuda:x' is not a device name; pass cpu, cuda, cuda:N, mps or another device torch knows "
               "(TYPE or TYPE:INDEX)"),
    ("tpu", "--device 'tpu' is not a device torch knows (Expected one of "),
])
def test_a_device_torch_cannot_parse_is_refused_before_the_model_loads(capsys, no_loading, model_dir, pairs_path,
                                                                      device, message):
    """Before, `.to(device)` raised a RuntimeError after the weights had loaded."""
    line = refused(capsys, "score", str(model_dir), "--pairs", str(pairs_path), f"--device={device}")
    assert line.startswith("rewardlens: error: " + message)
    assert line.endswith("pass cpu, cuda, cuda:N, mps or another type torch lists") or device != "tpu"


@pytest.mark.parametrize("argv, shown", [
    (["audit", "{model}", "--pairs", "{pairs}", "--out="], "--out"),
    (["audit", "{model}", "--pairs", "{pairs}", "--store="], "--store"),
    (["audit", "{model}", "--pairs="], "--pairs"),
    (["probe", "{model}", "--pairs="], "--pairs"),
    (["score", "", "--pairs", "{pairs}"], "MODEL"),
    (["patch", "{model}", "--pairs", "{pairs}", "--dpo-reference="], "--dpo-reference"),
    (["sae", "attribute", "{model}", "--pairs", "{pairs}", "--sae="], "--sae"),
])
def test_an_empty_path_is_refused_by_name(capsys, no_loading, tmp_path, monkeypatch, model_dir, pairs_path, argv,
                                          shown):
    """Before, `--out ""` wrote the whole audit into the current folder, and `--pairs ""` audited the built-in
    pairs instead."""
    monkeypatch.chdir(tmp_path)
    line = refused(capsys, *(a.format(model=model_dir, pairs=pairs_path) for a in argv))
    assert line == (f"rewardlens: error: {shown} '' is empty, and an empty path means the current folder; name the "
                    "file or folder (use . to mean the current folder)")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_a_store_in_a_folder_that_takes_no_files_names_the_store(capsys, no_loading, model_dir, pairs_path):
    """Before, the error named the run lock's file (/proc/.rewardlens.lock), not the store asked for."""
    line = refused(capsys, "audit", str(model_dir), "--pairs", str(pairs_path), "--store", "/proc/x.sqlite")
    assert line.startswith("rewardlens: error: cannot write to --store file: /proc/x.sqlite (/proc ")


KIND_FIX = {"--prm-separator": "a PRM's folder (…ForTokenClassification or …ForCausalLM)",
            "--judge-tokens": "a judge's folder (…ForCausalLM)",
            "--dpo-reference": "the policy's folder (…ForCausalLM)"}


@pytest.mark.parametrize("flag, value, reads", [
    ("--prm-separator", ".", "reads a process RM's steps from a token-classification head (or, with --prm-tokens, "
                             "an LM head)"),
    ("--judge-tokens", "Yes,No", "reads an LLM judge's answer-token log-odds from its LM head"),
    ("--dpo-reference", "{model}", "reads a DPO policy's implicit reward from its LM head"),
])
def test_a_kind_flag_on_a_sequence_classifier_names_the_flag(tmp_path, model_dir, pairs_path, flag, value, reads):
    """Before, the load blamed the folder's weights ('not in the folder ... initialised them at random')."""
    code, err = run_light("score", str(model_dir), "--pairs", str(pairs_path), flag, value.format(model=model_dir),
                          cwd=tmp_path)
    assert code == 2 and one_error_line(err) == (
        f"rewardlens: error: {flag} {reads}, but {model_dir} holds a sequence-classification reward model "
        f"(LlamaForSequenceClassification in its config.json), which has no such head; drop {flag} to score it as "
        f"one, or point at {KIND_FIX[flag]}")


@pytest.mark.parametrize("argv, message", [
    (["patch", "{model}", "--pairs", "{pairs}", "--mode", "noising", "--ablation", "mean"],
     "--ablation mean picks what --mode ablation writes, but --mode is noising, which patches in the other side's "
     "activations; pass --mode ablation too, or drop --ablation"),
    (["score", "{model}", "--pairs", "{pairs}", "--offload-folder", "off"],
     "--offload-folder is where --device-map puts weights it offloads to disk, and --device-map was not given; "
     "pass --device-map auto too, or drop --offload-folder"),
    (["audit", "{model}", "--pairs", "{pairs}", "--probe-items", "5", "--no-probes", "--no-concepts"],
     "--probe-items 5 picks the items of the probes and concepts, and --no-probes --no-concepts skips both; "
     "drop --probe-items"),
    (["audit", "{model}", "--pairs", "{pairs}", "--probe-items", "1"],
     "--probe-items 1 is under 2, the inputs a concept needs a side; pass 2 to 72, 'all', or drop --probe-items "
     "for the staged budget"),
])
def test_an_option_that_does_not_apply_is_refused_by_name(capsys, no_loading, tmp_path, monkeypatch, model_dir,
                                                          pairs_path, argv, message):
    """Before, each ran with the option silently unused (or, for --probe-items 1, failed once the model loaded)."""
    monkeypatch.chdir(tmp_path)
    line = refused(capsys, *(a.format(model=model_dir, pairs=pairs_path) for a in argv))
    assert line == f"rewardlens: error: {message}"


def test_probe_items_over_the_built_in_items_are_clamped_with_a_word(capsys, model_dir):
    """Before, `--probe-items 100000` failed only after the model had loaded."""
    from rewardlens.cli import build_parser

    args = build_parser().parse_args(["audit", str(model_dir), "--probe-items", "100000"])
    cli_audit._check(args)
    assert args.probe_items == 72  # all of them: the same run as --probe-items all
    assert capsys.readouterr().err == "rewardlens: --probe-items 100000 > the 72 built-in items: using all 72\n"
