"""The SQLite results store: exact round trips, atomic writes, refusals, shard merges."""

import sqlite3

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.audit import Store
from rewardlens.audit.internal import RunKey, checksum, fingerprint
from rewardlens.errors import StoreError

KEY = RunKey("model-a", "data-1", "lens", "1")


def test_records_round_trip_exactly(tmp_path):
    rec = {"x": np.arange(6, dtype=np.float32).reshape(2, 3) / 7, "ids": ("a", "b"), "names": ["p", "q"],
           "nan": float("nan"), "n": 3, "nested": {"y": np.array([1.5, np.nan])}, "none": None}
    with_store = Store(tmp_path / "s.sqlite")
    with_store.write([(KEY, "0", 0, rec)], {KEY: {"names": ["p"]}})
    with_store.close()
    (unit, back), = Store(tmp_path / "s.sqlite").records(KEY)  # a fresh connection reads it from disk
    assert unit == "0" and back["x"].dtype == np.float32 and np.array_equal(back["x"], rec["x"])
    assert back["ids"] == ("a", "b") and back["names"] == ["p", "q"] and back["n"] == 3 and back["none"] is None
    assert np.isnan(back["nan"]) and np.array_equal(back["nested"]["y"], rec["nested"]["y"], equal_nan=True)
    assert Store(tmp_path / "s.sqlite").meta(KEY) == {"names": ["p"]}


def test_records_come_back_in_position_order_and_done_lists_units(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    store.write([(KEY, str(i), i, {"v": i}) for i in (3, 1, 2)])
    store.write([(KEY, "0", 0, {"v": 0})])
    assert [r["v"] for _, r in store.records(KEY)] == [0, 1, 2, 3]
    assert store.done(KEY) == {"0", "1", "2", "3"}
    assert store.done(RunKey("model-a", "data-1", "lens", "2")) == set()  # another version is another run


def test_a_failed_write_leaves_nothing_and_duplicates_are_refused(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    store.write([(KEY, "0", 0, {"v": 0})])
    other = RunKey("model-a", "data-1", "heads", "1")
    with pytest.raises(StoreError, match="already stored"):
        store.write([(other, "0", 0, {"v": 1}), (KEY, "0", 0, {"v": 2})])
    assert store.done(other) == set()  # the transaction rolled back its first row too
    assert [r for _, r in store.records(KEY)] == [{"v": 0}]


def test_merge_adds_new_units_and_refuses_disagreeing_ones(tmp_path):
    a, b = Store(tmp_path / "a.sqlite"), Store(tmp_path / "b.sqlite")
    a.write([(KEY, "0", 0, {"v": np.array([1.0])})], {KEY: {"m": 1}})
    b.write([(KEY, "0", 0, {"v": np.array([1.0])}), (KEY, "1", 1, {"v": np.array([2.0])})], {KEY: {"m": 1}})
    assert a.merge(tmp_path / "b.sqlite") == 1
    assert a.merge(b) == 0  # merging again is a no-op
    assert [float(r["v"][0]) for _, r in a.records(KEY)] == [1.0, 2.0]
    c = Store(tmp_path / "c.sqlite")
    c.write([(KEY, "1", 1, {"v": np.array([2.5])})])
    with pytest.raises(StoreError, match="differs"):
        a.merge(c)


def test_a_file_that_is_not_a_store_is_named(tmp_path):
    bad = tmp_path / "notes.sqlite"
    bad.write_text("not a database at all, just text " * 100)
    with pytest.raises(StoreError, match="notes.sqlite is not a rewardlens results store") as info:
        Store(bad)
    assert "left untouched" in str(info.value) and "delete" not in str(info.value).lower()
    assert issubclass(StoreError, rl.RewardLensError)
    assert not isinstance(StoreError("x"), sqlite3.Error)


def test_another_programs_database_is_refused_untouched(tmp_path):
    path = tmp_path / "app.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    db.execute("INSERT INTO notes (body) VALUES ('keep me')")
    db.commit()
    db.close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match="another program's tables: notes") as info:
        Store(path)
    assert "left untouched" in str(info.value) and "delete" not in str(info.value).lower()
    assert path.read_bytes() == before  # no tables added, journal mode not switched to WAL
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE runs (a, b)")  # a table of our name with other columns is someone else's too
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="another program's tables: runs"):
        Store(path)


def test_reopening_a_store_keeps_its_rows_and_takes_no_write_lock(tmp_path):
    path = tmp_path / "s.sqlite"
    Store(path).write([(KEY, "0", 0, {"v": 0})])
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # another process mid-write: opening and reading still go through
    store = Store(path, timeout=0.2)
    assert store.done(KEY) == {"0"}
    writer.execute("ROLLBACK")


def test_fingerprint_follows_config_head_and_dtype(tiny_root):
    import torch

    a = rl.load(str(tiny_root["llama"]))
    assert fingerprint(a) == fingerprint(rl.load(str(tiny_root["llama"])))
    assert fingerprint(a) != fingerprint(rl.load(str(tiny_root["llama"]), dtype="bfloat16"))
    assert fingerprint(a) != fingerprint(rl.load(str(tiny_root["qwen2"])))
    hf = a.model.__class__.from_pretrained(str(tiny_root["llama"]))
    with torch.no_grad():
        hf.score.weight[0, 0] += 1e-3  # a new head on the same backbone is a new model
    assert fingerprint(a) != fingerprint(rl.wrap(hf, a.tokenizer))


def test_checksum_follows_every_field_and_the_order(pairs):
    assert checksum(pairs) == checksum(list(pairs))
    assert checksum(pairs) != checksum(pairs[::-1])
    changed = [rl.Pair(pairs[0].prompt, pairs[0].chosen + " ", pairs[0].rejected), *pairs[1:]]
    assert checksum(pairs) != checksum(changed)


def test_pairs_without_a_group_hash_as_before_the_field_existed():
    # Stores written before `Pair.group` must resume: their data checksum may not move.
    import dataclasses

    from rewardlens.zoo import DEMO_PAIRS

    # (`extra`, the record's other fields, is never hashed: tests/audit/test_audit_parity.py)
    before = [{k: v for k, v in dataclasses.asdict(p).items() if k not in ("group", "extra")} for p in DEMO_PAIRS]
    assert checksum(DEMO_PAIRS) == checksum(before)  # the dicts hash as the old `asdict` of each pair did
    grouped = [dataclasses.replace(p, group="g") for p in DEMO_PAIRS]
    assert checksum(grouped) != checksum(DEMO_PAIRS)


def test_fingerprint_follows_every_choice_that_defines_a_reward(tiny_root):
    """A rerun into the same store must not reuse a different reward's rows: the separator, the combine
    rule, a judge's question and tokens, DPO's beta and its reference each make another reward."""
    from rewardlens.zoo import build_tokenizer
    from tests.model.test_rm_kinds import SEP, build

    tok = build_tokenizer()
    lm, other = build(tok, "llama", "lm"), build(tok, "llama", "lm", seed=1)
    plain = rl.load(str(tiny_root["llama"]))
    before = fingerprint(plain)
    models = {
        "prm": rl.model.wrap_prm(lm, tok, separator=SEP, tokens=(23, 29), combine="min"),
        "prm-sum": rl.model.wrap_prm(lm, tok, separator=SEP, tokens=(23, 29), combine="sum"),
        "prm-dot": rl.model.wrap_prm(lm, tok, separator=".", tokens=(23, 29), combine="min"),
        "prm-last-token": rl.model.wrap_prm(lm, tok, separator=SEP, tokens=(23, 29), combine="min", final="last-token"),
        "judge": rl.model.wrap_judge(lm, tok, tokens=(23, 29)),
        "judge-asked": rl.model.wrap_judge(lm, tok, tokens=(23, 29), question="Rate: {response}"),
        "dpo": rl.model.wrap_dpo(lm, other, tok, beta=0.5),
        "dpo-beta": rl.model.wrap_dpo(lm, other, tok, beta=2.0),
        "dpo-self": rl.model.wrap_dpo(lm, lm, tok, beta=0.5),
        "dpo-separate": rl.model.wrap_dpo(lm, other, tok, beta=0.5, reference_term="separate"),
    }
    prints = {name: fingerprint(model) for name, model in models.items()}
    assert len(set(prints.values())) == len(prints), prints
    assert prints["prm"] == fingerprint(rl.model.wrap_prm(lm, tok, separator=SEP, tokens=(23, 29), combine="min"))
    assert fingerprint(plain) == before  # a sequence classifier's fingerprint did not move


def test_what_defines_a_kind_hashes_to_the_bytes_it_always_did(tiny_root):
    """`_kind`'s bytes are pinned, as the formula gave them before the kind was declared (`RewardKind`):
    a change would make every store written before it unresumable."""
    import json

    from rewardlens.audit._keys import _kind
    from rewardlens.zoo import build_tokenizer
    from tests.model.test_rm_kinds import SEP, build

    tok = build_tokenizer()
    lm, other, tc = build(tok, "llama", "lm"), build(tok, "llama", "lm", seed=1), build(tok, "llama", "tc")
    assert _kind(rl.load(str(tiny_root["llama"]))) == []  # a sequence classifier adds nothing
    pinned = {
        "prm": (rl.model.wrap_prm(lm, tok, separator=SEP, tokens=(23, 29)),
                b'["separator", "\\n", "min", null, [23, 29], 1.0, false, false]'),
        "prm-tc": (rl.model.wrap_prm(tc, tok, separator=SEP, combine="sum"),
                   b'["separator", "\\n", "sum", null, null, 1.0, false, false]'),
        "judge": (rl.model.wrap_judge(lm, tok, tokens=(23, 29), question="Rate: {response}"),
                  b'["last", null, "sum", "Rate: {response}", [23, 29], 1.0, false, false]'),
        "dpo": (rl.model.wrap_dpo(lm, other, tok, beta=0.5), b'["response", null, "sum", null, null, 0.5, true, true]'),
        "dpo-separate": (rl.model.wrap_dpo(lm, other, tok, beta=0.5, reference_term="separate"),
                         b'["response", null, "sum", null, null, 0.5, true, false]'),
    }
    for name, (model, kind) in pinned.items():
        reference = [] if model.reference is None else [fingerprint(model.reference).encode()]
        assert _kind(model) == [kind, *reference], name
        assert json.loads(kind)[3] == model.judge, name
    reference = pinned["dpo"][0].reference
    assert reference is not None
    assert _kind(reference) == [b'["response", null, "sum", null, null, 0.5, true, false]']


def test_schema_version_follows_the_stored_fields():
    """A field added to a stored result, or moved between the chunked and the shared parts, gives a new
    schema version, so a store written before the change is computed again, never read as the new one."""
    import dataclasses

    from rewardlens.audit._plan import REVISION
    from rewardlens.audit.internal import STORED_RESULTS, VERSION, schema_version
    from rewardlens.exact import Lens
    from rewardlens.exact.internal import STEP_FIELDS
    from rewardlens.types import Stored

    assert schema_version(REVISION, STORED_RESULTS, STEP_FIELDS) == VERSION  # deterministic, and what runs use
    wider = dataclasses.make_dataclass("Lens", [("extra", int, dataclasses.field(default=0))], bases=(Lens,),
                                       frozen=True)
    wider.__qualname__ = Lens.__qualname__  # the same name, one field more
    assert schema_version(REVISION, [wider if c is Lens else c for c in STORED_RESULTS], STEP_FIELDS) != VERSION
    moved = type("Lens", (Lens,), {"STORED": Stored(per_row=Lens.STORED.per_row[:-1], derived=Lens.STORED.derived)})
    moved.__qualname__ = Lens.__qualname__
    assert schema_version(REVISION, [moved if c is Lens else c for c in STORED_RESULTS], STEP_FIELDS) != VERSION
    assert schema_version(REVISION + 1, STORED_RESULTS, STEP_FIELDS) != VERSION
    assert schema_version(REVISION, STORED_RESULTS, STEP_FIELDS[:-1]) != VERSION


def test_every_declared_stored_field_is_a_field_of_its_result():
    import dataclasses

    from rewardlens.audit.internal import STORED_RESULTS

    declared = [c for c in STORED_RESULTS if hasattr(c, "STORED")]
    assert {c.__name__ for c in declared} == {"Lens", "Attribution", "Faithfulness"}
    for cls in declared:
        names, s = {f.name for f in dataclasses.fields(cls)}, cls.STORED
        assert set(s.per_row + s.per_pair + s.derived) <= names, cls
        assert not (s.per_row and s.per_pair) and not set(s.per_row + s.per_pair) & set(s.derived), cls
