"""The probes' scoring is stored chunk by chunk: an audit SIGKILLed mid-probe resumes without reading a stored
sequence again (neither for the probes nor for the concepts, whose depths the chunks keep), and ends bit for bit
equal to a run never interrupted; SIGTERM stops the command line as Ctrl-C does, with the resume line."""

import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

import rewardlens as rl
import rewardlens.hacking._scored as scored_module
import rewardlens.model._read_cache as cache_module
from rewardlens.audit import Plan, Store, audit
from rewardlens.data import save_pairs
from rewardlens.zoo import AUDIT_PAIRS
from tests.audit.test_audit import _all_records, _assert_same_records

PLAN = Plan(divergence=False, tokens=False)
CHUNKS = "SELECT count(*) FROM units JOIN runs USING (run_id) WHERE instrument LIKE 'probes/scored/%'"

CHILD = textwrap.dedent("""
    import sys, time, torch
    torch.set_num_threads(1)
    import rewardlens as rl
    from rewardlens.audit import Plan, Store, audit
    from rewardlens.hacking.internal import Chunks
    save = Chunks.rewards
    def slow(self, *args):  # a chunk's write, then a pause: the parent's kill lands between chunks or inside one
        self.save = (lambda put: lambda unit, record: (put(unit, record), time.sleep(0.3)))(self.save)
        return save(self, *args)
    Chunks.rewards = slow
    audit(rl.load(sys.argv[1]), rl.load_pairs(sys.argv[2]), store=Store(sys.argv[3]),
          plan=Plan(divergence=False, tokens=False))
""")


def _wait_for_chunks(child: subprocess.Popen, path, at_least: int) -> None:
    """Poll the store until it holds `at_least` probe chunks (the child must still be running)."""
    Store(path).close()  # the schema, so the poll can query it from the start
    poll = sqlite3.connect(path, timeout=30)
    deadline = time.monotonic() + 300
    try:
        while True:
            if poll.execute(CHUNKS).fetchone()[0] >= at_least:
                return
            assert child.poll() is None, child.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the child stored no probe chunk"
            time.sleep(0.02)
    finally:
        poll.close()


def _count_reads(monkeypatch) -> dict[str, int]:
    """Sequences the probes read with the model (`probe`'s chunk reads), and sequences any instrument reads
    through the shared cache (the probes' and the concepts'), from here on."""
    n = {"probe": 0, "cache": 0}
    chunk_read, shared = scored_module._read, cache_module.read_sharing

    def probe_read(model, seqs, *args):
        n["probe"] += len(seqs)
        return chunk_read(model, seqs, *args)

    def cache_read(model, seqs, **kwargs):
        n["cache"] += len(seqs)
        return shared(model, seqs, **kwargs)

    monkeypatch.setattr(scored_module, "_read", probe_read)
    monkeypatch.setattr(cache_module, "read_sharing", cache_read)
    return n


def test_an_audit_sigkilled_mid_probe_resumes_without_reading_a_stored_sequence(organisms, tmp_path, monkeypatch):
    folder = str(organisms[("sycophancy", 1.0)])
    pairs = AUDIT_PAIRS[:4]
    pairs_file = str(save_pairs(pairs, tmp_path / "pairs.jsonl"))
    path = tmp_path / "killed" / "results.sqlite"
    child = subprocess.Popen([sys.executable, "-c", CHILD, folder, pairs_file, str(path)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_for_chunks(child, path, 3)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL

    model = rl.load(folder)
    store = Store(path)
    key = next(k for k, _ in store.runs() if k.instrument.startswith("probes/scored/"))
    stored = sum(len(r["reward"]) for _, r in store.records(key))
    assert not any(k.instrument == "probes" for k in store.keys()), "the kill must land before the probes finish"

    n = _count_reads(monkeypatch)
    reference = Store(tmp_path / "uninterrupted" / "results.sqlite")
    audit(model, pairs, store=reference, plan=PLAN)
    total = dict(n)
    assert total["probe"] > stored >= 3, "the kill must land mid-probe for this test to mean anything"

    n.update(probe=0, cache=0)
    resumed = audit(model, pairs, store=store, plan=PLAN)
    # Only the sequences the killed run had not stored are read: by the probes, and by the concepts, whose
    # depths the stored chunks hand back to the shared cache.
    assert n["probe"] == total["probe"] - stored
    assert n["cache"] == total["cache"] - stored
    _assert_same_records(_all_records(store), _all_records(reference))  # every record, bit for bit
    assert resumed.probes is not None and resumed.concepts is not None

    n.update(probe=0, cache=0)
    audit(model, pairs, store=store, plan=PLAN)
    assert n == {"probe": 0, "cache": 0}, "a finished audit reads nothing again"


def test_concepts_after_stored_probes_read_nothing_and_match_a_run_never_interrupted(organisms, tmp_path,
                                                                                     monkeypatch):
    """A run stopped between the probes and the concepts: the concepts take the depths the probes' chunks
    keep (the same bits the uninterrupted run's shared cache held), so they read no sequence."""
    model = rl.load(str(organisms[("sycophancy", 1.0)]))
    pairs = AUDIT_PAIRS[:4]
    quick = Plan(divergence=False, tokens=False, probe_items=12)
    store, reference = Store(tmp_path / "a.sqlite"), Store(tmp_path / "b.sqlite")
    audit(model, pairs, store=reference, plan=quick)
    audit(model, pairs, store=store, plan=quick)
    # Stop as if killed before the concepts: drop the concepts' row, then run again.
    key = next(k for k in store.keys() if k.instrument.startswith("concepts"))
    store._db.execute("DELETE FROM units WHERE run_id = (SELECT run_id FROM runs WHERE instrument = ?)",
                      (key.instrument,))
    assert "all" not in store.done(key)
    n = _count_reads(monkeypatch)
    again = audit(model, pairs, store=store, plan=quick)
    assert n == {"probe": 0, "cache": 0} and again.concepts is not None
    _assert_same_records(_all_records(store), _all_records(reference))


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143)])
def test_sigterm_prints_the_resume_line_and_keeps_what_was_stored(organisms, tmp_path, sig, code):
    """`timeout` and schedulers stop a job with SIGTERM: the audit stops as on Ctrl-C, says what the store
    keeps and the command that resumes, and exits 143 (128 + SIGTERM)."""
    folder = str(organisms[("sycophancy", 1.0)])
    pairs_file = str(save_pairs(AUDIT_PAIRS[:4], tmp_path / "pairs.jsonl"))
    out = tmp_path / "out"
    args = [sys.executable, "-m", "rewardlens", "audit", folder, "--pairs", pairs_file, "--out", str(out),
            "--no-divergence", "--no-tokens"]
    child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for_chunks(child, out / "results.sqlite", 1)
    finally:
        child.send_signal(sig)
        _, err = child.communicate(timeout=120)
    text = err.decode()
    assert child.returncode == code, text[-2000:]
    said = text.split("rewardlens: interrupted")  # after the progress bars' carriage returns
    assert len(said) == 2, text[-2000:]
    line = said[1].splitlines()[0]
    assert "4 of 4 pairs" in line and "chunk" in line and "resume with:" in line and "Traceback" not in text
    store = Store(out / "results.sqlite")
    assert len(store.done(next(k for k in store.keys() if k.instrument.startswith("probes/scored/")))) >= 1
