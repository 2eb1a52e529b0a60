"""A results store that knows its own damage: every record and every run's metadata carries a checksum over its
JSON text and its arrays. A damaged unit is never read as numbers: `done` leaves it out, a rerun computes it again
and replaces it (and says so), `records` refuses it by name, `merge` refuses a shard's; a file SQLite itself cannot
read is named as damaged. Never a raw sqlite3, zipfile or json traceback."""

import sqlite3
import warnings

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.audit import Plan, RunKey, Store, audit
from rewardlens.errors import RewardLensWarning, StoreError
from tests.audit.test_audit import _many

KEY = RunKey("model-a", "data-1", "lens", "1")


def _store(path, n=3):
    store = Store(path)
    store.write([(KEY, str(i), i, {"v": np.arange(4.0) + i, "name": f"pair {i}"}) for i in range(n)],
                {KEY: {"names": ["a"]}})
    return store


def _set(path, column, unit, value):
    """Overwrite one unit's column behind the store's back, as a bad disk or a torn copy would."""
    db = sqlite3.connect(path)
    db.execute(f"UPDATE units SET {column} = ? WHERE unit = ?", (value, unit))
    db.commit()
    db.close()


def _get(path, column, unit):
    db = sqlite3.connect(path)
    db.text_factory = bytes
    (value,), = db.execute(f"SELECT {column} FROM units WHERE unit = ?", (unit,))
    db.close()
    return value


def _flip(value: bytes, at: int) -> bytes:
    return value[:at] + bytes([value[at] ^ 0x5A]) + value[at + 1:]


def test_a_changed_number_in_a_records_json_is_damage_not_another_number(tmp_path):
    path = tmp_path / "s.sqlite"
    _store(path).close()
    text = _get(path, "record", "1").decode()
    _set(path, "record", "1", text.replace('"pair 1"', '"pair 7"'))  # still valid JSON, another value
    store = Store(path)
    assert store.done(KEY) == {"0", "2"}
    assert "checksum" in store.status(KEY).damaged["1"]
    with pytest.raises(StoreError, match=r"unit '1' of lens in .*s\.sqlite is damaged \(its checksum does not match "
                                         r"its bytes\); run the audit again with this store"):
        store.records(KEY)
    assert [u for u, _ in store.records(KEY, ["0", "2"])] == ["0", "2"]  # the sound ones still read
    store.write([(KEY, "1", 1, {"v": np.arange(4.0) + 1, "name": "pair 1"})])  # a damaged unit may be replaced
    assert [r["name"] for _, r in store.records(KEY)] == ["pair 0", "pair 1", "pair 2"]
    with pytest.raises(StoreError, match="already stored"):  # a sound one still may not
        store.write([(KEY, "1", 1, {"v": np.arange(4.0), "name": "pair 1"})])


@pytest.mark.parametrize("how", ["crc", "truncated", "not utf-8", "envelope"])
def test_a_damaged_blob_or_text_is_named_by_unit(tmp_path, how):
    path = tmp_path / "s.sqlite"
    _store(path).close()
    blob, text = _get(path, "arrays", "2"), _get(path, "record", "2")
    if how == "crc":  # a byte of the array's data: the zip's CRC fails where the bytes are read
        _set(path, "arrays", "2", _flip(blob, len(blob) // 3))
    elif how == "truncated":
        _set(path, "arrays", "2", blob[: len(blob) // 2])
    elif how == "not utf-8":  # sqlite3 would raise "Could not decode to UTF-8" reading it
        db = sqlite3.connect(path)
        db.execute("UPDATE units SET record = CAST(? AS TEXT) WHERE unit = '2'", (_flip(text, len(text) - 5),))
        db.commit()
        db.close()
    else:  # a flipped byte in the envelope's own head
        _set(path, "record", "2", text.decode().replace("__sha256__", "__sha257__"))
    store = Store(path)
    assert store.done(KEY) == {"0", "1"} and set(store.status(KEY).damaged) == {"2"}
    with pytest.raises(StoreError, match=r"unit '2' of lens in .* is damaged \(.+\); run the audit again"):
        store.records(KEY)


def test_a_store_written_before_checksums_still_reads_and_its_broken_rows_are_damaged(tmp_path):
    path = tmp_path / "old.sqlite"
    Store(path).close()
    db = sqlite3.connect(path)  # rows as the store wrote them before checksums: plain JSON, no envelope
    db.execute("INSERT INTO runs (model, data, instrument, version, meta) VALUES (?, ?, ?, ?, ?)",
               (*vars(KEY).values(), '{"names": ["a"]}'))
    db.execute("INSERT INTO units VALUES (1, '0', 0, '{\"v\": 1, \"t\": {\"__tuple__\": [1, 2]}}', NULL)")
    db.execute("INSERT INTO units VALUES (1, '1', 1, '{\"v\": 1, \"t\"', NULL)")  # torn mid-write by a bad copy
    db.commit()
    db.close()
    store = Store(path)
    assert store.meta(KEY) == {"names": ["a"]} and store.done(KEY) == {"0"}
    assert store.records(KEY, ["0"]) == [("0", {"v": 1, "t": (1, 2)})]
    assert "does not decode" in store.status(KEY).damaged["1"]
    with pytest.raises(StoreError, match="unit '1' of lens .* is damaged"):
        store.records(KEY)


def test_damaged_metadata_damages_its_run_until_a_write_rewrites_it(tmp_path):
    path = tmp_path / "s.sqlite"
    _store(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE runs SET meta = replace(meta, '\"a\"', '\"b\"')")
    db.commit()
    db.close()
    store = Store(path)
    with pytest.raises(StoreError, match=r"the metadata of lens in .* is damaged \(its checksum does not match"):
        store.meta(KEY)
    assert store.done(KEY) == set() and set(store.status(KEY).damaged) == {"0", "1", "2"}
    for i in range(3):  # one write per chunk, as a rerun does: each may replace what `status` found damaged
        store.write([(KEY, str(i), i, {"v": np.arange(4.0) + i, "name": f"pair {i}"})], {KEY: {"names": ["a"]}})
    assert store.meta(KEY) == {"names": ["a"]} and store.done(KEY) == {"0", "1", "2"}


def test_merge_refuses_a_damaged_shard_unit_and_replaces_a_damaged_own_one(tmp_path):
    main, shard = tmp_path / "main.sqlite", tmp_path / "shard.sqlite"
    _store(main, 2).close()
    _store(shard, 3).close()
    _set(main, "arrays", "0", _flip(_get(main, "arrays", "0"), 200))
    store = Store(main)
    assert store.merge(shard) == 2  # unit 0 replaces the damaged one, unit 2 is new
    assert [float(r["v"][0]) for _, r in store.records(KEY)] == [0.0, 1.0, 2.0]

    bad = tmp_path / "bad.sqlite"
    _store(bad, 4).close()
    _set(bad, "arrays", "3", _flip(_get(bad, "arrays", "3"), 200))
    with pytest.raises(StoreError, match=r"unit '3' of lens in .*bad\.sqlite is damaged .*; nothing was merged"):
        store.merge(bad)
    assert store.done(KEY) == {"0", "1", "2"}  # no garbage copied, nothing half merged
    _store(tmp_path / "only.sqlite", 2).close()
    _set(tmp_path / "only.sqlite", "arrays", "1", _flip(_get(tmp_path / "only.sqlite", "arrays", "1"), 200))
    with pytest.warns(RewardLensWarning, match=r"1 damaged unit\(s\) were not merged; .*main\.sqlite holds them sound"):
        assert store.merge(tmp_path / "only.sqlite") == 0  # the main store holds unit 1 sound: nothing to copy


def test_a_file_sqlite_cannot_read_is_named_as_damaged(tmp_path):
    path = tmp_path / "s.sqlite"
    _store(path, 40).close()
    db = sqlite3.connect(path)
    (root,), = db.execute("SELECT rootpage FROM sqlite_master WHERE name = 'units'")
    (size,), = db.execute("PRAGMA page_size")
    db.close()
    data = bytearray(path.read_bytes())
    data[(root - 1) * size] = 0x07  # the units table's root page: no b-tree page type
    path.write_bytes(bytes(data))
    store = Store(path)  # the schema (page 1) reads
    with pytest.raises(StoreError, match=r"s\.sqlite is damaged: SQLite cannot read its pages \(SQLite: database disk "
                                         r"image is malformed\); it was left as it is — point --store at a new file"):
        store.done(KEY)


PLAN = Plan(chunk_size=1, probes=False, concepts=False, divergence=False)


def _same(a, b) -> bool:
    """Every number and name the audit read back, bit for bit."""
    arrays = [(a.lens, b.lens, ("linear", "normed", "reward")),
              (a.sublayers, b.sublayers, ("values", "constant", "reward")),
              (a.heads, b.heads, ("values", "constant", "reward")),
              (a.faithfulness, b.faithfulness, ("attribution", "direct", "total", "seed_effect", "seed_attribution"))]
    equal = all(np.array_equal(getattr(x, f), getattr(y, f), equal_nan=True) for x, y, names in arrays for f in names)
    names = a.heads.names == b.heads.names and a.faithfulness.names == b.faithfulness.names
    tokens = a.token_pairs == b.token_pairs and all(
        np.array_equal(x, y) for x, y in zip(a.tokens.values, b.tokens.values))
    return equal and names and tokens and a.pair_ids == b.pair_ids


def test_a_corrupted_audit_store_reruns_to_the_same_numbers_or_one_clear_error(tiny_root, pairs, tmp_path):
    model = rl.load(str(tiny_root["llama"]))
    data = _many(pairs, 4)
    base = tmp_path / "base" / "results.sqlite"
    first = audit(model, data, store=base, plan=PLAN)
    rng = np.random.default_rng(0)

    # Bytes flipped inside stored rows (the JSON text, the arrays): always found, computed again, said.
    path = tmp_path / "rows" / "results.sqlite"
    path.parent.mkdir()
    path.write_bytes(base.read_bytes())
    db = sqlite3.connect(path)
    db.text_factory = bytes
    rows = db.execute("SELECT rowid, record, arrays FROM units").fetchall()
    for k in rng.choice(len(rows), 6, replace=False):
        rowid, text, blob = rows[k]
        column, value = ("record", text) if k % 2 or blob is None else ("arrays", blob)
        flipped = _flip(value, int(rng.integers(0, len(value))))
        db.execute(f"UPDATE units SET {column} = CAST(? AS {'TEXT' if column == 'record' else 'BLOB'}) "
                   "WHERE rowid = ?", (flipped, rowid))
    db.commit()
    db.close()
    with pytest.warns(RewardLensWarning, match=r"audit: \d+ damaged unit\(s\) in .*rows/results\.sqlite were "
                                               r"recomputed: \S+ pair p\d \(unit [0-9a-f]{24}\)"):
        again = audit(model, data, store=path, plan=PLAN)
    assert _same(again, first)
    assert _same(audit(model, data, store=path, plan=PLAN), first)  # repaired for good

    # Bytes flipped anywhere in the file, SQLite's own pages included.
    outcomes = set()
    for trial in range(8):
        path = tmp_path / f"file{trial}" / "results.sqlite"
        path.parent.mkdir()
        data_ = bytearray(base.read_bytes())
        for at in rng.integers(0, len(data_), 3):
            data_[at] ^= int(rng.integers(1, 256))
        path.write_bytes(bytes(data_))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RewardLensWarning)
                again = audit(model, data, store=path, plan=PLAN)
        except StoreError as exc:
            message = str(exc)
            assert str(path) in message and "\n" not in message, message
            assert "damaged" in message or "not a rewardlens results store" in message, message
            outcomes.add("refused")
        else:
            assert _same(again, first), trial
            outcomes.add("same")
    assert "same" in outcomes
