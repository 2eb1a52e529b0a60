"""Per-pair units keyed by pair content: an audit of a superset, a subset or a reordering of pairs already stored
computes only the pairs it has not seen, reads the others back exactly, and says how many it reused; a pair given
twice is one unit; ranks split the distinct pairs so none is computed twice."""

import dataclasses

import numpy as np

import rewardlens as rl
from rewardlens.audit import Decided, Plan, ResumeStatus, Store, audit, resume_status
from rewardlens.audit.internal import checksum, collect, run_pairs
from tests.audit.test_audit import _many

PLAN = Plan(chunk_size=4, probes=False, concepts=False, divergence=False, tokens=False)


def test_a_superset_computes_only_its_new_pairs_and_a_subset_or_reordering_none(tiny_root, pairs):
    model = rl.load(str(tiny_root["llama"]))
    data = _many(pairs, 16)
    store = Store(":memory:")
    assert run_pairs(model, data[:8], store, PLAN) == 8
    first = collect(model, data[:8], store, PLAN)
    assert run_pairs(model, data, store, PLAN) == 8  # `--limit 16` after 8 pairs of the same file finished
    both = collect(model, data, store, PLAN)
    np.testing.assert_array_equal(both.lens.linear[:16], first.lens.linear)  # rows 2i, 2i+1: the first 8 pairs
    np.testing.assert_array_equal(both.heads.values[:16], first.heads.values)
    np.testing.assert_array_equal(both.faithfulness.total[:8], first.faithfulness.total)
    assert both.pair_ids == [p.id for p in data] and both.data_checksum == checksum(data)

    # The faithfulness key holds the run's decision over all its pairs: a subset deciding alike reuses it.
    shuffled = [data[i] for i in np.random.default_rng(0).permutation(16)]
    assert Decided.of(model, shuffled) == Decided.of(model, data) == Decided.of(model, data[5:11])
    assert run_pairs(model, shuffled, store, PLAN) == 0
    again = collect(model, shuffled, store, PLAN)
    order = [data.index(p) for p in shuffled]
    np.testing.assert_array_equal(again.faithfulness.total, both.faithfulness.total[order])
    assert again.pair_ids == [p.id for p in shuffled]
    assert run_pairs(model, data[5:11], store, PLAN) == 0
    np.testing.assert_array_equal(collect(model, data[5:11], store, PLAN).heads.values, both.heads.values[10:22])


def test_a_pair_given_twice_is_one_unit_and_ranks_never_share_one(tiny_root, pairs):
    model = rl.load(str(tiny_root["llama"]))
    a, b, c = _many(pairs, 3)
    given = [a, b, dataclasses.replace(a, id="a-again", subset="other"), c, b]  # id and subset change no number
    plan = dataclasses.replace(PLAN, chunk_size=1)
    single = Store(":memory:")
    assert run_pairs(model, given, single, plan) == 3
    res = collect(model, given, single, plan)
    assert res.pair_ids == ["p0", "p1", "a-again", "p2", "p1"] and res.subsets == [None, None, "other", None, None]
    np.testing.assert_array_equal(res.lens.linear[4:6], res.lens.linear[0:2])  # pair 2 read back from pair 0's unit
    np.testing.assert_allclose(res.lens.reward, model.score(given).reshape(-1), atol=1e-5)

    shards = [Store(":memory:"), Store(":memory:")]
    computed = [run_pairs(model, given, shard, plan, rank=r, world_size=2) for r, shard in enumerate(shards)]
    assert computed == [2, 1]  # distinct pairs a, b, c: chunks 0 and 2 on rank 0, chunk 1 on rank 1
    merged = Store(":memory:")
    assert sum(merged.merge(shard) for shard in shards) == 3 * 4  # four instruments, no unit in both shards
    np.testing.assert_array_equal(collect(model, given, merged, plan).faithfulness.total, res.faithfulness.total)


def test_the_resume_message_says_how_many_pairs_are_reused(tiny_root, pairs, tmp_path):
    model = rl.load(str(tiny_root["llama"]))
    data = _many(pairs, 16)
    path = tmp_path / "results.sqlite"
    audit(model, data[:8], store=path, plan=PLAN)
    status = resume_status(path, model, data, PLAN)
    assert (status.kept, status.n_pairs, status.whole) == (8, 16, 0)
    assert status.message("rewardlens audit M --limit 16") == (
        f"rewardlens: interrupted; {path} keeps 8 of 16 pairs (a rerun reuses them, found by content); "
        "resume with: rewardlens audit M --limit 16")
    assert ResumeStatus.reused(8, 16) == "8 of 16 pairs already in the store (reused from an earlier run)"
    assert resume_status(path, model, data[2:6], PLAN).kept == 4


def test_faithfulness_provenance_survives_the_store_chunk_by_chunk(tiny_root, pairs):
    """Each chunk's record of how faithfulness patched is kept with its pairs, so the audit read back (all of it,
    a subset, a resumed run) says which engine computed each field, as faithfulness on those pairs says it; a
    store written under an older schema version is computed again beside it, never read as the new one."""
    from rewardlens.audit._plan import run_keys
    from rewardlens.audit.internal import VERSION
    from rewardlens.causal import faithfulness

    model = rl.load(str(tiny_root["llama"]))
    data = _many(pairs, 8)
    decided = Decided.of(model, data)
    store = Store(":memory:")
    old = dataclasses.replace(run_keys(model, data, PLAN)["faithfulness"], version="older")
    store.write([(old, "u", 0, {"total": np.zeros(1)})], {old: {}})  # an older rewardlens's row
    assert run_pairs(model, data[:4], store, PLAN) == 4  # one chunk, then "killed"
    assert run_pairs(model, data, store, PLAN) == 4  # resumed: the second chunk only
    got = collect(model, data, store, PLAN).faithfulness.provenance
    want = faithfulness(model, data[4:], level="head", mode=decided.mode, seed_positions=decided.seed_positions,
                        n_boot=10).provenance
    assert got is not None and set(got) == set(want) == {"total", "seed_effect", "direct", "attribution_patching"}
    for name in want:
        assert (got[name].engine, got[name].declined) == (want[name].engine, want[name].declined), name
    assert got["total"].engine == "cached_read_sweep" and got["total"].proof
    assert collect(model, data[2:6], store, PLAN).faithfulness.provenance == got  # both chunks ran alike
    assert old in store.keys() and old.version != VERSION and store.records(old)[0][0] == "u"
