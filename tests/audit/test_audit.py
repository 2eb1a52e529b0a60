"""The audit runner: results equal the instruments', a SIGKILLed run resumes exactly, 2 torchrun ranks
give exactly the single-process store."""

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.audit import Plan, Store, audit
from rewardlens.audit._plan import chunks
from rewardlens.audit.internal import collect, run_pairs
from rewardlens.data import save_pairs
from rewardlens.errors import StoreError
from rewardlens.hacking import STAGES

PAIRS_ONLY = Plan(chunk_size=1, probes=False, concepts=False)
REPO = Path(__file__).resolve().parents[2]


def _many(pairs, n):
    """n distinct pairs (a numbered prompt each), so the data has n units of real content."""
    return [rl.Pair(f"({i}) {p.prompt}" if isinstance(p.prompt, str) else p.prompt, p.chosen, p.rejected + f" {i}",
                    id=f"p{i}") for i, p in ((i, pairs[i % len(pairs)]) for i in range(n))]


def _all_records(store: Store) -> dict:
    return {key.instrument: store.records(key) for key, _ in store.runs()}


def _assert_same_records(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert [u for u, _ in a[name]] == [u for u, _ in b[name]], name
        for (_, ra), (_, rb) in zip(a[name], b[name]):
            assert ra.keys() == rb.keys()
            for f in ra:
                assert _same(ra[f], rb[f]), (name, f)


def _same(a, b) -> bool:
    """Bit-for-bit equal (NaN equal to NaN), through the lists and dicts a record holds (ragged
    per-token arrays, names and labels)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) and a.dtype.kind in "biufc":
        return np.array_equal(a, b, equal_nan=True)
    return bool(np.all(a == b)) if isinstance(a, np.ndarray) else a == b or (a != a and b != b)


def test_audit_equals_the_instruments_run_directly(tiny_root, pairs):
    model = rl.load(str(tiny_root["llama"]))
    data = _many(pairs, 7)
    res = audit(model, data, plan=Plan(chunk_size=3, probes=False, concepts=False))
    ln, heads = rl.lens(model, data), rl.attribute(model, data, level="head")
    fa = rl.faithfulness(model, data, level="head")
    np.testing.assert_allclose(res.lens.linear, ln.linear, atol=1e-5)
    np.testing.assert_allclose(res.lens.reward, model.score(data), atol=1e-5)
    np.testing.assert_allclose(res.heads.values, heads.values, atol=1e-5)
    assert res.heads.names == heads.names and res.faithfulness.names == fa.names
    np.testing.assert_allclose(res.faithfulness.total, fa.total, atol=1e-5)
    np.testing.assert_allclose(res.faithfulness.direct, fa.direct, atol=1e-5)
    assert res.faithfulness.seed_positions == fa.seed_positions
    assert res.pair_ids == [p.id for p in data] and res.faithfulness.pair_ids == res.pair_ids
    assert res.lens.rows[-1] == "6/rejected" and res.probes is None and res.concepts is None


def test_whole_model_instruments_are_stored_once_and_read_back(organisms):
    model = rl.load(str(organisms[("sycophancy", 1.0)]))
    from rewardlens.zoo import AUDIT_PAIRS

    store = Store(":memory:")
    res = audit(model, AUDIT_PAIRS[:4], store=store, plan=Plan(chunk_size=4, concepts=False))
    # the audit's default is the staged item budget: the yardstick is `probe` with the same stages
    direct = rl.probe(model, reference=AUDIT_PAIRS[:4], batch_size=16, stages=STAGES)
    assert res.probes.stage == direct.stage and res.probes.item_ids == direct.item_ids
    assert res.probes.axes == direct.axes
    np.testing.assert_array_equal(res.probes.mean, direct.mean)
    np.testing.assert_array_equal(res.probes.flagged, direct.flagged)
    # The audit's scale is from the margins its per-pair part stored (traced in other batches than the
    # direct call scores them in): equal to float precision.
    assert res.probes.scale == pytest.approx(direct.scale, rel=1e-6)
    again = collect(model, AUDIT_PAIRS[:4], store, Plan(chunk_size=4, concepts=False))
    np.testing.assert_array_equal(again.probes.delta, res.probes.delta)


def test_collect_names_missing_pairs(tiny_root, pairs):
    model = rl.load(str(tiny_root["gpt2"]))
    store = Store(":memory:")
    run_pairs(model, pairs, store, PAIRS_ONLY, rank=0, world_size=2)  # only this rank's chunks
    with pytest.raises(StoreError, match="holds 2 of 3 pairs"):
        collect(model, pairs, store, PAIRS_ONLY)


def test_chunks_cover_every_pair_once():
    spans = chunks(10, 4)
    assert [list(s) for s in spans] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


CHILD = textwrap.dedent("""
    import sys, torch
    torch.set_num_threads(1)
    import rewardlens as rl
    from rewardlens.audit import Plan, Store
    from rewardlens.audit.internal import run_pairs
    model = rl.load(sys.argv[1])
    run_pairs(model, rl.load_pairs(sys.argv[2]), Store(sys.argv[3]), Plan(chunk_size=1, probes=False, concepts=False))
""")


def test_a_sigkilled_run_resumes_without_recomputing_losing_or_duplicating(tiny_root, pairs, tmp_path):
    folder, n = str(tiny_root["llama"]), 150
    data = _many(pairs, n)
    pairs_file = str(save_pairs(data, tmp_path / "pairs.jsonl"))
    path = tmp_path / "results.sqlite"
    Store(path).close()  # create the schema, so the poll below can query it from the start
    child = subprocess.Popen([sys.executable, "-c", CHILD, folder, pairs_file, str(path)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    poll = sqlite3.connect(path, timeout=30)
    deadline = time.monotonic() + 300
    while poll.execute("SELECT count(DISTINCT unit) FROM units").fetchone()[0] < 5:
        assert child.poll() is None, child.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "the child stored nothing"
        time.sleep(0.01)
    child.send_signal(signal.SIGKILL)
    child.wait()
    poll.close()
    assert child.returncode == -signal.SIGKILL

    model = rl.load(folder)
    store = Store(path)
    done = [store.done(key) for key, _ in store.runs()]
    assert len(done) == 5 and all(d == done[0] for d in done)  # a chunk is in every instrument or in none
    # (the four per-pair instruments and the divergence scores of faithfulness's sweep, stored with them)
    finished = len(done[0])
    assert 5 <= finished < n, "the kill must land mid-run for this test to mean anything"

    assert run_pairs(model, data, store, PAIRS_ONLY) == n - finished  # only the missing pairs are computed
    for key, _ in store.runs():  # no row lost, none twice
        rows = store._db.execute("SELECT count(*), count(DISTINCT unit) FROM units JOIN runs USING (run_id) "
                                 "WHERE instrument = ?", (key.instrument,)).fetchone()
        assert rows == (n, n)
    reference = Store(tmp_path / "uninterrupted.sqlite")
    run_pairs(model, data, reference, PAIRS_ONLY)
    _assert_same_records(_all_records(store), _all_records(reference))  # bit for bit
    assert run_pairs(model, data, store, PAIRS_ONLY) == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_torchrun_ranks_give_exactly_the_single_process_results(tiny_root, pairs, tmp_path):
    data = _many(pairs, 7)
    pairs_file = str(save_pairs(data, tmp_path / "pairs.jsonl"))
    args = [str(tiny_root["qwen2"]), "--pairs", pairs_file, "--chunk-size", "2", "--no-probes", "--no-concepts",
            "--quiet", "--json"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
                "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), "-m", "rewardlens"]
    proc = subprocess.run([*torchrun, "audit", *args, "--out", str(tmp_path / "two")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shards = [Store(tmp_path / "two" / f"results.rank{r}.sqlite") for r in (0, 1)]
    per_rank = [len(next(iter(_all_records(s).values()))) for s in shards]
    assert per_rank == [3, 4]  # spans {0}, {3,4} on rank 0; {1,2}, {5,6} on rank 1 (the first pair alone)
    single = subprocess.run([sys.executable, "-m", "rewardlens", "audit", *args, "--out", str(tmp_path / "one")],
                            env=env, capture_output=True, text=True, timeout=600)
    assert single.returncode == 0, single.stderr[-3000:]
    _assert_same_records(_all_records(Store(tmp_path / "two" / "results.sqlite")),
                         _all_records(Store(tmp_path / "one" / "results.sqlite")))
    assert (tmp_path / "two" / "report.html").is_file()


def test_a_quick_plan_probes_a_spread_of_the_builtin_items(organisms):
    from rewardlens.hacking import ITEMS
    from rewardlens.zoo import AUDIT_PAIRS

    model = rl.load(str(organisms[("sycophancy", 1.0)]))
    plan = Plan(chunk_size=4, probe_items=6)
    items = plan.items()
    assert len(items) == 6 and len({i.domain for i in items}) == 6 and all(i in ITEMS for i in items)
    store = Store(":memory:")
    res = audit(model, AUDIT_PAIRS[:2], store=store, plan=plan)
    assert len(res.probes.item_ids) == 6 and set(res.probes.item_ids) == {i.id for i in items}
    assert res.concepts.names == res.probes.axes and int(res.concepts.n_positive.max()) <= 6
    assert {k.instrument for k, _ in store.runs()} >= {"probes/items-6", "concepts/items-6"}
    with pytest.raises(ValueError, match="probe_items"):
        Plan(probe_items=1)


def test_sae_features_are_stored_and_read_back_under_the_saes_own_key(tiny_root, pairs):
    model = rl.load(str(tiny_root["llama"]))
    sae = rl.sae.TopKSAE(model.d_model, rl.sae.SAEConfig(expansion_factor=2, k=4), seed=0)
    plan = Plan(chunk_size=2, probes=False, concepts=False, sae_layer=0)
    store = Store(":memory:")
    res = audit(model, pairs, store=store, plan=plan, sae=sae)
    direct = rl.attribute_features(model, sae, pairs, layer=0)
    np.testing.assert_array_equal(res.features.values, direct.values)
    np.testing.assert_array_equal(res.features.features, direct.features)
    other = rl.sae.TopKSAE(model.d_model, rl.sae.SAEConfig(expansion_factor=2, k=4), seed=1)
    assert collect(model, pairs, store, plan, sae=other).features is None  # another SAE is another run
    with pytest.raises(ValueError, match="sae_layer"):
        audit(model, pairs, plan=Plan(probes=False, concepts=False), sae=sae)


def test_a_run_tokenizes_each_pair_once_and_decides_once(tiny_root, pairs, monkeypatch):
    """The per-pair part carries what it computed: the decision over all pairs tokenizes them, every chunk
    traces from those token ids, and every estimand of a chunk starts from its one trace (it tokenized
    each sequence 8 times before)."""
    import rewardlens.model._core as core
    from rewardlens.audit import Decided

    model = rl.load(str(tiny_root["llama"]))
    data = _many(pairs, 5)
    calls, passes = [], []
    real, encode = core.tokenize, core.RewardModel._read_positions
    monkeypatch.setattr(core, "tokenize", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(core.RewardModel, "_read_positions", lambda self, x: passes.append(1) or encode(self, x))
    decided = Decided.of(model, data)
    assert len(calls) == 2 * len(data) and decided.seed_positions in ("all", "read") and decided.mode == "noising"
    assert len(passes) == 1
    run_pairs(model, data, Store(":memory:"), Plan(chunk_size=2, probes=False, concepts=False), decided=decided)
    assert len(calls) == 2 * len(data) and len(passes) == 1  # no chunk encoded its pairs again
    run_pairs(model, data, Store(":memory:"), Plan(chunk_size=2, probes=False, concepts=False))
    assert len(passes) == 2  # deciding for itself: one encoding pass, once
    assert len(calls) == 2 * len(data)  # of inputs the model has tokenized already (TokenMemo)


def test_clean_runs_of_other_pairs_are_refused(tiny_root, pairs):
    from rewardlens.causal import trace_pairs

    model = rl.load(str(tiny_root["llama"]))
    traced = trace_pairs(model, pairs[:2])
    with pytest.raises(ValueError, match=r"clean= holds the runs of 4 sequences but 3 pairs"):
        rl.patch(model, pairs[:3], clean=traced.clean)
    with pytest.raises(ValueError, match=r"seqs= holds 4 sequences for 3 pairs"):
        trace_pairs(model, pairs[:3], seqs=traced.clean.seqs)


def test_the_audit_and_the_monitor_probe_the_same_spread_of_items():
    """One item-subsetting rule (`hacking.spread_items`): a quick audit and the monitor pick the same items."""
    from rewardlens.hacking import ITEMS, spread_items
    from rewardlens.monitor import Monitor

    for n in (2, 6, 12, len(ITEMS)):
        items = spread_items(n)
        assert Plan(probe_items=n).items() == items and items == list(ITEMS[:: len(ITEMS) // n][:n])
        assert len(set(items)) == n and len({i.domain for i in items}) == min(n, len({i.domain for i in ITEMS}))
    mon = Monitor([rl.Pair("p", "a", "b")], probes=["length"], probe_items=6)
    assert list(mon.probe_items) == spread_items(6)
    with pytest.raises(ValueError, match=f"between 2 .* and {len(ITEMS)}"):
        Plan(probe_items=len(ITEMS) + 1)
