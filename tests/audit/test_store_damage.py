"""A results store that knows its own damage: every record and every run's metadata carries a checksum over its
JSON text and its arrays. A damaged unit is never read as numbers: `done` leaves it out, a rerun computes it again
and replaces it (and says so), `records` refuses it by name, `merge` refuses a shard's; a file SQLite itself cannot
read is named as damaged. Never a raw sqlite3, zipfile or json traceback."""

import hashlib
import json
import sqlite3
import warnings

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.audit import Plan, Store, audit
from rewardlens.audit.internal import RunKey
from rewardlens.cli import main
from rewardlens.data import save_pairs
from rewardlens.errors import RewardLensWarning, StoreError
from tests.audit.test_audit import _many
from tests.helpers.locks import held_by_another_process

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
                                         r"its bytes, or the run and unit it is filed under\); run the audit again"):
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
        _set(path, "record", "2", text.decode()[:3] + "X" + text.decode()[4:])
    store = Store(path)
    assert store.done(KEY) == {"0", "1"} and set(store.status(KEY).damaged) == {"2"}
    with pytest.raises(StoreError, match=r"unit '2' of lens in .* is damaged \(.+\); run the audit again"):
        store.records(KEY)


def test_a_store_written_before_checksums_still_opens_and_its_broken_rows_are_damaged(tmp_path):
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
    assert store.runs() == [(KEY, {"names": ["a"]})]
    # its key cannot be verified: not done, not read as numbers (a rerun computes it again), yet not damaged
    assert store.done(KEY) == set() and store.status(KEY).unbound == {"0"}
    with pytest.raises(StoreError, match="unit '0' of lens .* was written before records were bound to their key"):
        store.records(KEY, ["0"])
    assert "does not decode" in store.status(KEY).damaged["1"]
    with pytest.raises(StoreError, match="unit '1' of lens .* is damaged"):
        store.records(KEY, ["1"])


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


# Rows a tool swapped, re-keyed or moved: each record's checksum binds it to the run key and the unit it was
# written under, so a row filed anywhere else reads as damaged, never as the numbers of the unit it now sits in.

OTHER = RunKey("model-a", "data-1", "heads", "1")


def _sql(path, *statements):
    db = sqlite3.connect(path)
    for statement in statements:
        db.execute(statement)
    db.commit()
    db.close()


def _two_runs(path):
    store = _store(path)
    store.write([(OTHER, str(i), i, {"v": np.arange(4.0) * 10 + i, "name": f"head {i}"}) for i in range(3)],
                {OTHER: {"names": ["b"]}})
    store.close()


def _swap(db, run, a, b):
    """Exchange the record bytes of units `a` and `b` of the run `run` (each keeps its place and key)."""
    got = {u: db.execute("SELECT record, arrays FROM units WHERE run_id = ? AND unit = ?", (run, u)).fetchone()
           for u in (a, b)}
    for u, v in ((a, b), (b, a)):
        db.execute("UPDATE units SET record = ?, arrays = ? WHERE run_id = ? AND unit = ?", (*got[v], run, u))


def _run_id(db, instrument):
    (run,), = db.execute("SELECT run_id FROM runs WHERE instrument = ?", (instrument,))
    return run


def _move_runs(db, a, b):
    """Every row of the runs `a` and `b` filed under the other (by their run ids)."""
    ra, rb = _run_id(db, a), _run_id(db, b)
    db.execute("UPDATE units SET run_id = -run_id WHERE run_id IN (?, ?)", (ra, rb))
    db.execute("UPDATE units SET run_id = CASE run_id WHEN ? THEN ? ELSE ? END WHERE run_id < 0", (-ra, rb, ra))


def _swap_keys(db, a, b):
    """The two runs' keys exchanged (their rows and metadata stay)."""
    ra, rb = _run_id(db, a), _run_id(db, b)
    db.execute("UPDATE runs SET instrument = '-' WHERE run_id = ?", (ra,))
    db.execute("UPDATE runs SET instrument = ? WHERE run_id = ?", (a, rb))
    db.execute("UPDATE runs SET instrument = ? WHERE run_id = ?", (b, ra))


def _swap_meta(db, a, b):
    ra, rb = _run_id(db, a), _run_id(db, b)
    (ma,), (mb,) = (db.execute("SELECT meta FROM runs WHERE run_id = ?", (r,)).fetchone() for r in (ra, rb))
    db.execute("UPDATE runs SET meta = ? WHERE run_id = ?", (mb, ra))
    db.execute("UPDATE runs SET meta = ? WHERE run_id = ?", (ma, rb))


def _rekey(db, run, a, b):
    """Unit `a`'s row filed under unit `b` (whose own row is gone)."""
    db.execute("DELETE FROM units WHERE run_id = ? AND unit = ?", (run, b))
    db.execute("UPDATE units SET unit = ? WHERE run_id = ? AND unit = ?", (b, run, a))


def _tamper(path, move):
    db = sqlite3.connect(path)
    move(db)
    db.commit()
    db.close()


MOVES = {  # what a tool (a hand-written UPDATE, a bad merge script, a dedup pass) may do to the rows
    "swap two units' bytes": lambda db: _swap(db, 1, "0", "1"),
    "re-key a unit": lambda db: _rekey(db, 1, "0", "1"),
    "move rows under another instrument's run": lambda db: _move_runs(db, "lens", "heads"),
    "swap the runs' keys": lambda db: _swap_keys(db, "lens", "heads"),
    "swap the runs' metadata": lambda db: _swap_meta(db, "lens", "heads"),
}
DAMAGED = {"swap two units' bytes": {"0", "1"}, "re-key a unit": {"1"}}


@pytest.mark.parametrize("how", list(MOVES))
def test_a_row_filed_under_another_unit_or_run_is_damage_not_that_units_numbers(tmp_path, how):
    path = tmp_path / "s.sqlite"
    _two_runs(path)
    _tamper(path, MOVES[how])
    store = Store(path)
    damaged = DAMAGED.get(how, {"0", "1", "2"})
    assert set(store.status(KEY).damaged) == damaged
    assert store.done(KEY) == {"0", "1", "2"} - damaged - ({"0"} if how == "re-key a unit" else set())
    unit = min(damaged)
    with pytest.raises(StoreError, match=rf"unit '{unit}' of lens in .*s\.sqlite is damaged \(.+\); run the audit "
                                         "again with this store") as info:
        store.records(KEY)
    assert "\n" not in str(info.value)
    # a rerun's writes replace exactly what was damaged, and the store then reads every unit's own numbers
    for key, scale, name in ((KEY, 1, "pair"), (OTHER, 10, "head")):
        left = sorted(set(store.status(key).damaged) | ({"0"} if how == "re-key a unit" and key == KEY else set()))
        for u in left:
            store.write([(key, u, int(u), {"v": np.arange(4.0) * scale + int(u), "name": f"{name} {u}"})],
                        {key: {"names": ["a" if key == KEY else "b"]}})
    assert [r["name"] for _, r in store.records(KEY)] == ["pair 0", "pair 1", "pair 2"]
    assert [float(r["v"][1]) for _, r in store.records(OTHER)] == [10.0, 11.0, 12.0]
    assert store.meta(KEY) == {"names": ["a"]} and store.meta(OTHER) == {"names": ["b"]}


@pytest.mark.parametrize("table", ["runs", "units"])
def test_a_missing_table_is_named_as_damage_with_a_fix_that_keeps_the_file(tmp_path, table):
    path = tmp_path / "s.sqlite"
    _two_runs(path)
    _sql(path, f"DROP TABLE {table}")
    before = path.read_bytes()
    with pytest.raises(StoreError, match=rf"^{path} is damaged: its table '{table}' is missing") as info:
        Store(path)
    message = str(info.value).lower()
    assert "\n" not in message and "left as it is" in message and "new file" in message
    assert "delete" not in message and "remove" not in message and "already stored" not in message
    assert path.read_bytes() == before  # nothing created in its place


def _old_seal(inner: str, blob: bytes | None) -> str:
    """A record's envelope as rewardlens wrote it before records were bound to their key: SHA-256 over the
    JSON text and the blob (each part preceded by its length, 8 bytes little-endian), first 24 hex digits."""
    h = hashlib.sha256()
    for part in (inner.encode(), b"-" if blob is None else b"+" + blob):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return f'{{"__sha256__": "{h.hexdigest()[:24]}", "__record__": {inner}}}'


def _unbind_db(db, envelope):
    """Every row and run's metadata as an older rewardlens wrote them: the old envelope (`envelope`), or none."""
    mark = '"__record__": '
    rows = [("units", "rowid", *r) for r in db.execute("SELECT rowid, record, arrays FROM units")]
    rows += [("runs", "run_id", *r, None) for r in db.execute("SELECT run_id, meta FROM runs")]
    for table, id_, rowid, text, blob in rows:
        inner = text[text.index(mark) + len(mark):-1]
        column = "record" if table == "units" else "meta"
        db.execute(f"UPDATE {table} SET {column} = ? WHERE {id_} = ?",
                   (_old_seal(inner, blob) if envelope else inner, rowid))


def _unbind(path, envelope):
    _tamper(path, lambda db: _unbind_db(db, envelope))


@pytest.mark.parametrize("envelope", [True, False], ids=["checksum without the key", "no checksum"])
def test_records_written_before_they_were_bound_open_but_are_recomputed_not_trusted(tmp_path, envelope):
    """An older record's key cannot be verified: it opens and its metadata reads, but it is never read as numbers
    (a swap among old rows would go unseen); a rerun computes it again and rewrites it bound."""
    path = tmp_path / "old.sqlite"
    _two_runs(path)
    _unbind(path, envelope)
    _tamper(path, MOVES["swap two units' bytes"])  # undetectable among unbound rows: hence not trusted
    store = Store(path)
    assert store.runs() == [(KEY, {"names": ["a"]}), (OTHER, {"names": ["b"]})]  # listed as stored
    with pytest.raises(StoreError, match=r"the metadata of lens in .*old\.sqlite was written before records were "
                                         r"bound to their key; run the audit again with this store"):
        store.meta(KEY)
    assert store.done(KEY) == set() and store.status(KEY).unbound == {"0", "1", "2"}
    assert store.status(KEY).damaged == {}
    with pytest.raises(StoreError, match=r"unit '0' of lens in .*old\.sqlite was written before records were "
                                         r"bound to their key .*; run the audit again with this store"):
        store.records(KEY)
    fresh = Store(tmp_path / "fresh.sqlite")
    with pytest.warns(RewardLensWarning, match=r"old\.sqlite: 6 unit\(s\) written before records were bound to "
                                               r"their key were not merged \(their key cannot be verified"):
        assert fresh.merge(path) == 0
    assert fresh.keys() == []  # not even the runs: their metadata is unbound too
    store.write([(KEY, str(i), i, {"v": np.arange(4.0) + i, "name": f"pair {i}"}) for i in range(3)],
                {KEY: {"names": ["a"]}})
    assert [r["name"] for _, r in store.records(KEY)] == ["pair 0", "pair 1", "pair 2"]
    assert store.status(OTHER).unbound == {"0", "1", "2"}  # untouched by the other run's rewrite


def test_merge_never_copies_a_row_into_a_unit_it_was_not_written_for(tmp_path):
    main, shard = tmp_path / "main.sqlite", tmp_path / "shard.sqlite"
    _store(main, 1).close()
    _two_runs(shard)
    _tamper(shard, MOVES["swap two units' bytes"])
    store = Store(main)
    with pytest.raises(StoreError, match=r"unit '1' of lens in .*shard\.sqlite is damaged .*; nothing was merged"):
        store.merge(shard)
    assert store.done(KEY) == {"0"} and store.done(OTHER) == set()


@pytest.fixture(scope="module")
def audited(tiny_root, pairs, tmp_path_factory):
    """The tiny model's audit of 4 pairs, and the store it wrote: every damaged copy below starts from it."""
    model, data = rl.load(str(tiny_root["llama"])), _many(pairs, 4)
    base = tmp_path_factory.mktemp("audited") / "results.sqlite"
    return model, data, base, audit(model, data, store=base, plan=PLAN)


def _units(db, instrument):
    return [u for u, in db.execute("SELECT unit FROM units WHERE run_id = ? ORDER BY position",
                                   (_run_id(db, instrument),))]


def _lens_swap(db):
    _swap(db, _run_id(db, "lens"), *_units(db, "lens")[1:3])


AUDIT_MOVES = {
    "swap two pairs' lens rows": _lens_swap,
    "re-key a pair's head row": lambda db: _rekey(db, _run_id(db, "attribution/head"),
                                                  *_units(db, "attribution/head")[2:4]),
    "move the lens under the sublayers' run": lambda db: _move_runs(db, "lens", "attribution/sublayer"),
    "move rows between attribution levels": lambda db: _move_runs(db, "attribution/sublayer", "attribution/head"),
    "swap the whole-model rows": lambda db: _move_runs(db, "tokens", "parity"),
    "swap the runs' keys": lambda db: _swap_keys(db, "attribution/sublayer", "attribution/head"),
    "swap the runs' metadata": lambda db: _swap_meta(db, "lens", "attribution/head"),
}


def _older(envelope):
    def move(db):
        _unbind_db(db, envelope)
        _lens_swap(db)  # among unbound rows no checksum can see it
    return move


AUDIT_MOVES["older records (checksum without the key), two swapped"] = _older(True)
AUDIT_MOVES["older records (no checksum), two swapped"] = _older(False)
AUDIT_MOVES["delete the runs' rows"] = lambda db: db.execute("DELETE FROM runs")  # units left without a run


@pytest.mark.parametrize("how", list(AUDIT_MOVES))
def test_an_audit_store_whose_rows_were_moved_reruns_to_the_same_numbers(audited, tmp_path, how):
    """Rows swapped, re-keyed or moved between runs by a tool: the audit reads none of them as another unit's
    numbers (before, two swapped lens rows published each other's margins with no warning, and rows moved
    under another instrument's run ended in a TypeError); it computes them again, and the store is sound after."""
    model, data, base, first = audited
    path = tmp_path / "results.sqlite"
    path.write_bytes(base.read_bytes())
    _tamper(path, AUDIT_MOVES[how])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RewardLensWarning)
        again = audit(model, data, store=path, plan=PLAN)
    assert _same(again, first)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RewardLensWarning)  # rewritten bound: nothing damaged or older is left
        assert _same(audit(model, data, store=path, plan=PLAN), first)


def _cli_audit(model, pairs_file, out, *more):
    return main(["audit", model, "--pairs", str(pairs_file), "--out", str(out), "--chunk-size", "1", "--no-probes",
                 "--no-concepts", "--no-divergence", "--quiet", *more])


def test_the_cli_publishes_the_same_numbers_or_stops_with_one_line(tiny_root, pairs, tmp_path, capsys):
    """The command line over a store a tool rewrote: the same numbers.json with exit 0 (two pairs' lens rows
    swapped, which published each other's margins and moved the mean margin before), or one line and exit 2
    naming the damage and a fix that keeps the file (the `runs` table dropped, once "already stored")."""
    model, data = str(tiny_root["llama"]), tmp_path / "pairs.jsonl"
    save_pairs(_many(pairs, 4), data)
    out = tmp_path / "out"
    assert _cli_audit(model, data, out) == 0
    numbers = json.loads((out / "numbers.json").read_text())
    _tamper(out / "results.sqlite", _lens_swap)
    with pytest.warns(RewardLensWarning, match=r"2 damaged unit\(s\) in .* were recomputed: lens pair p1"):
        assert _cli_audit(model, data, out) == 0
    again = json.loads((out / "numbers.json").read_text())
    assert {k: v for k, v in again.items() if k != "provenance"} == {
        k: v for k, v in numbers.items() if k != "provenance"}
    capsys.readouterr()
    _tamper(out / "results.sqlite", lambda db: db.execute("DROP TABLE runs"))
    assert _cli_audit(model, data, out) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"rewardlens: error: {out / 'results.sqlite'} is damaged: its table 'runs' is missing")
    assert "--store at a new file" in err and "delete" not in err.lower()


def test_a_shared_store_held_by_another_run_is_named_by_its_own_option(tiny_root, pairs, tmp_path, capsys):
    """A store given by --store in a folder another run holds: the refusal names that folder, the store and
    --store, the option to change, not --out (which this run has to itself)."""
    model, data = str(tiny_root["llama"]), tmp_path / "pairs.jsonl"
    save_pairs(pairs[:1], data)
    shared, out = tmp_path / "shared", tmp_path / "mine"
    with held_by_another_process(shared) as (first, _):
        assert _cli_audit(model, data, out, "--store", str(shared / "results.sqlite")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"pid {first.pid}" in err, err
    assert f"another run is writing into {shared.resolve()}" in err and "--out" not in err
    assert f"give this run a --store outside that folder (its store: {shared / 'results.sqlite'})" in err
    assert not (shared / "results.sqlite").exists() and not (out / "report.html").exists()
