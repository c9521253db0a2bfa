"""The persistent tuning-decision store: round trips, location, bounds, unusable files, the old
JSON format, concurrency, locking."""
import json
import multiprocessing
import os
import sqlite3
import sys
import threading
import time
import warnings

import pytest
from filelock import FileLock

from sparsegnn.tune.store import DecisionStore, reset_stores, store_for_device, tune_cache_dir


@pytest.fixture(autouse=True)
def fresh_stores(monkeypatch, tmp_path):
    """Every test starts without memoised stores and with the cache pointed at its own tmp dir."""
    monkeypatch.setenv("SPARSEGNN_TUNE_CACHE", str(tmp_path / "tune"))
    reset_stores()
    yield
    reset_stores()


def _load(path):
    """The file's decisions, ``{key: record}``, read with the standard library's sqlite3."""
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return {key: json.loads(record) for key, record in conn.execute("SELECT key, record FROM decisions")}


def _names(directory):
    return sorted(p.name for p in directory.iterdir() if not p.name.endswith(".lock"))


def test_put_get_round_trip_and_second_process_sees_it(tmp_path):
    path = tmp_path / "cpu.sqlite"
    store = DecisionStore(path)
    assert store.path == path and len(store) == 0 and store.get("missing") is None
    assert not path.exists()  # nothing is written before a put
    store.put("spmm|sig=abc|F=64", {"BLOCK_F": 64, "num_warps": 4}, ms=0.125, source="tuned", candidates=7)
    assert store.get("spmm|sig=abc|F=64") == {"BLOCK_F": 64, "num_warps": 4}
    rec = store.get_record("spmm|sig=abc|F=64")
    assert rec["config"] == {"BLOCK_F": 64, "num_warps": 4} and rec["ms"] == 0.125
    assert rec["source"] == "tuned" and rec["candidates"] == 7 and "T" in rec["time"]
    assert len(store) == 1

    assert _load(path) == {"spmm|sig=abc|F=64": rec}  # the documented layout: one row per decision, JSON text
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 2

    other = DecisionStore(path)  # a second process starting later
    assert other.get("spmm|sig=abc|F=64") == {"BLOCK_F": 64, "num_warps": 4}
    assert other.get_record("spmm|sig=abc|F=64") == rec


def test_returned_values_are_copies(tmp_path):
    store = DecisionStore(tmp_path / "cpu.sqlite")
    store.put("k", {"A": 1})
    store.get("k")["A"] = 99
    store.get_record("k")["config"]["A"] = 99
    assert store.get("k") == {"A": 1}


def test_writers_merge_instead_of_overwriting(tmp_path):
    path = tmp_path / "cpu.sqlite"
    a, b = DecisionStore(path), DecisionStore(path)
    assert a.get("x") is None  # a has looked at the (missing) file before b writes
    b.put("from-b", {"A": 1})
    a.put("from-a", {"A": 2})
    b.put("from-a", {"A": 3})  # the newer record wins for its key
    assert set(_load(path)) == {"from-a", "from-b"}
    assert _load(path)["from-a"]["config"] == {"A": 3}
    assert a.get("from-b") == {"A": 1}  # a reads b's decision from the file
    assert DecisionStore(path).get("from-a") == {"A": 3}


def test_put_normalises_and_validates(tmp_path):
    import numpy as np
    import torch

    store = DecisionStore(tmp_path / "cpu.sqlite")
    store.put("k", {"A": np.int64(3), "B": torch.tensor(5), "FLAT": True}, ms=float("inf"), source="heuristic")
    rec = store.get_record("k")
    assert rec["config"] == {"A": 3, "B": 5, "FLAT": True} and type(rec["config"]["A"]) is int
    assert rec["ms"] is None and rec["source"] == "heuristic"
    assert DecisionStore(tmp_path / "cpu.sqlite").get_record("k") == rec
    with pytest.raises(TypeError):
        store.put(("tuple", "key"), {"A": 1})
    with pytest.raises(TypeError):
        store.put("k2", {1: 2})
    with pytest.raises(TypeError):
        store.put("k2", {"A": object()})
    with pytest.raises(TypeError):
        store.put("k2", {"A": 1}, time="yesterday")
    assert store.get("k2") is None


def test_store_for_device_memoises_and_slugifies(tmp_path):
    store = store_for_device("NVIDIA H100 80GB HBM3")
    assert store is store_for_device("NVIDIA H100 80GB HBM3")
    assert store.path == tmp_path / "tune" / "nvidia-h100-80gb-hbm3.sqlite"
    assert store_for_device("cpu").path == tmp_path / "tune" / "cpu.sqlite"
    store.put("k", {"BLOCK_F": 32})
    assert _load(store.path)["k"]["config"] == {"BLOCK_F": 32}
    reset_stores()
    again = store_for_device("NVIDIA H100 80GB HBM3")
    assert again is not store and again.get("k") == {"BLOCK_F": 32}


def test_tune_cache_dir_defaults(monkeypatch, tmp_path):
    assert tune_cache_dir() == tmp_path / "tune"
    monkeypatch.delenv("SPARSEGNN_TUNE_CACHE")
    monkeypatch.setenv("SPARSEGNN_CACHE", str(tmp_path / "root"))
    assert tune_cache_dir() == tmp_path / "root" / "tune"
    monkeypatch.delenv("SPARSEGNN_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setitem(sys.modules, "platformdirs", None)  # import fails -> ~/.cache/sparsegnn
    assert tune_cache_dir() == tmp_path / "home" / ".cache" / "sparsegnn" / "tune"


@pytest.mark.parametrize("value", ["", "0", "off", "OFF", "none", "None"])
def test_disabled_persistence_keeps_memory_only(monkeypatch, tmp_path, value):
    monkeypatch.setenv("SPARSEGNN_TUNE_CACHE", value)
    monkeypatch.setenv("SPARSEGNN_CACHE", str(tmp_path / "root"))
    assert tune_cache_dir() is None
    store = store_for_device("cpu")
    assert store.path is None
    store.put("k", {"A": 1}, ms=1.0)
    assert store.get("k") == {"A": 1} and len(store) == 1
    assert store_for_device("cpu").get("k") == {"A": 1}  # shared within the process
    store.clear()
    assert len(store) == 0
    assert list(tmp_path.rglob("*")) == []  # nothing written anywhere


def _sqlite_bytes(tmp_path, rows=300, version=2):
    """A valid decision database of ``rows`` decisions (``version``: its user_version)."""
    path = tmp_path / "made.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE decisions (key TEXT PRIMARY KEY NOT NULL, record TEXT NOT NULL, size INTEGER NOT NULL)")
        conn.executemany("INSERT INTO decisions VALUES (?, ?, 40)",
                         [(f"k{i}", json.dumps({"config": {"A": i}})) for i in range(rows)])
        conn.execute(f"PRAGMA user_version = {version}")
    data = path.read_bytes()
    path.unlink()
    return data


@pytest.mark.parametrize("kind", ["garbage", "truncated", "newer-version", "foreign-database"])
def test_unusable_file_is_moved_aside_not_replaced(tmp_path, kind):
    content = {"garbage": lambda: b"\x00\xff\xfe not a database {",
               "truncated": lambda: _sqlite_bytes(tmp_path)[:6000],
               "newer-version": lambda: _sqlite_bytes(tmp_path, version=3),
               "foreign-database": lambda: _sqlite_bytes(tmp_path).replace(b"decisions", b"dexisions")}[kind]()
    path = tmp_path / "cpu.sqlite"
    path.write_bytes(content)
    store = DecisionStore(path)
    with pytest.warns(RuntimeWarning, match=r"cpu\.sqlite.*moved it to .*cpu\.sqlite\.unreadable-"):
        assert store.get("k299") is None
        store.put("new", {"A": 2})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning per store
        assert store.get("other") is None
        store.put("newer", {"A": 3})
    backups = [p for p in tmp_path.iterdir() if ".unreadable-" in p.name]
    assert len(backups) == 1 and backups[0].read_bytes() == content      # kept byte for byte
    assert set(_load(path)) == {"new", "newer"}
    assert DecisionStore(path).get("new") == {"A": 2}


def test_malformed_records_are_skipped(tmp_path):
    path = tmp_path / "cpu.sqlite"
    DecisionStore(path).put("good", {"A": 1})
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO decisions VALUES ('bad', '{\"A\": 1}', 8), ('worse', 'not json', 8)")
    store = DecisionStore(path)
    assert store.get("good") == {"A": 1}
    with pytest.warns(RuntimeWarning, match="malformed"):
        assert store.get("bad") is None
    assert store.get("worse") is None


def test_store_is_bounded_oldest_dropped(tmp_path):
    path = tmp_path / "cpu.sqlite"
    store = DecisionStore(path, max_entries=10)
    for i in range(25):
        store.put(f"k{i}", {"A": i})
    assert set(_load(path)) == {f"k{i}" for i in range(15, 25)}
    store.put("k15", {"A": -1})             # re-written: now the newest
    store.put("k25", {"A": 25})
    assert set(_load(path)) == {f"k{i}" for i in range(17, 26)} | {"k15"}
    by_bytes = DecisionStore(tmp_path / "bytes.sqlite", max_bytes=1000)
    for i in range(40):
        by_bytes.put(f"k{i}", {"A": i, "PAD": "x" * 50})
    kept = _load(tmp_path / "bytes.sqlite")
    sizes = sum(len(json.dumps(r, sort_keys=True, separators=(",", ":"))) for r in kept.values())
    assert sizes <= 1000 and "k39" in kept and "k0" not in kept and len(kept) >= 5


def test_writes_are_incremental(tmp_path):
    """A put writes its row and leaves the others' pages alone: the time of a put does not grow
    with the file (a whole rewrite of 20 000 records takes far longer than one row)."""
    path = tmp_path / "cpu.sqlite"
    store = DecisionStore(path, max_entries=100_000)
    store._write_rows({f"old{i}": {"config": {"A": i}, "source": "tuned", "pad": "y" * 200} for i in range(20_000)})
    start = time.perf_counter()
    for i in range(20):
        store.put(f"new{i}", {"A": i})
    per_put = (time.perf_counter() - start) / 20
    small = DecisionStore(tmp_path / "small.sqlite")
    start = time.perf_counter()
    for i in range(20):
        small.put(f"new{i}", {"A": i})
    per_small_put = (time.perf_counter() - start) / 20
    assert per_put < 5 * per_small_put + 0.005, (per_put, per_small_put)
    assert len(_load(path)) == 20_020


def test_old_json_file_is_imported_once_and_kept(tmp_path, monkeypatch):
    tune = tmp_path / "tune"
    tune.mkdir()
    old = {"version": 1, "device": "cpu", "decisions": {
        "a": {"config": {"A": 1}, "ms": 1.0, "source": "tuned", "time": "2025-01-01T00:00:00+00:00"},
        "b": {"config": {"A": 2}, "ms": 1.0, "source": "tuned", "time": "2025-01-02T00:00:00+00:00"},
        "junk": {"A": 1}}}
    (tune / "cpu.json").write_text(json.dumps(old))
    with pytest.warns(RuntimeWarning, match=r"imported 2 decision\(s\) of .*cpu\.json"):
        assert store_for_device("cpu").get("b") == {"A": 2}
    assert set(_load(tune / "cpu.sqlite")) == {"a", "b"}
    backups = [p for p in tune.iterdir() if p.name.startswith("cpu.json.v1-")]
    assert len(backups) == 1 and json.loads(backups[0].read_text()) == old and not (tune / "cpu.json").exists()
    reset_stores()
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # nothing left to import
        assert store_for_device("cpu").get("a") == {"A": 1}


def test_old_json_file_too_large_is_moved_aside_unread(tmp_path):
    tune = tmp_path / "tune"
    tune.mkdir()
    (tune / "cpu.json").write_text(json.dumps({"version": 1, "decisions": {
        f"k{i}": {"config": {"A": i}} for i in range(2000)}}))
    store = DecisionStore(tune / "cpu.sqlite", legacy=tune / "cpu.json", max_bytes=10_000)
    with pytest.warns(RuntimeWarning, match="larger than the store's bound"):
        assert store.get("k1") is None
    assert [p.name.startswith("cpu.json.v1-") for p in tune.iterdir() if "json" in p.name] == [True]


# Run in each spawned child.  It loads store.py by file (it needs only the stdlib and filelock)
# rather than through the package, whose import pulls in torch: four interpreters importing
# torch at once take most of 10 s on a 2-core CI machine.
_WORKER = """
import importlib.util
spec = importlib.util.spec_from_file_location("_store_under_test", STORE_FILE)
store = importlib.util.module_from_spec(spec)
spec.loader.exec_module(store)
s = store.DecisionStore(PATH)
BARRIER.wait(timeout=60)  # all four write at once
for i in range(COUNT):
    s.put(f"w{WORKER}-k{i}", {"worker": WORKER, "i": i}, ms=float(i))
"""


def test_concurrent_writers_lose_nothing(tmp_path):
    from sparsegnn.tune import store as store_module

    path = str(tmp_path / "shared.sqlite")
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=exec, args=(_WORKER, {"STORE_FILE": store_module.__file__, "PATH": path,
                                                     "WORKER": w, "COUNT": 25, "BARRIER": barrier}))
             for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert set(_load(path)) == {f"w{w}-k{i}" for w in range(4) for i in range(25)}  # not torn, nothing lost
    assert DecisionStore(path).get("w3-k24") == {"worker": 3, "i": 24}
    assert _names(tmp_path) == ["shared.sqlite"]  # no journal or backup left behind


def test_concurrent_threads_lose_nothing(tmp_path):
    store = DecisionStore(tmp_path / "cpu.sqlite")
    threads = [threading.Thread(target=lambda t=t: [store.put(f"t{t}-{i}", {"i": i}) for i in range(10)])
               for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(store) == 60 and len(_load(tmp_path / "cpu.sqlite")) == 60


def test_lock_timeout_keeps_decision_in_memory(tmp_path):
    path = tmp_path / "cpu.sqlite"
    store = DecisionStore(path, lock_timeout=0.05)
    with FileLock(str(path) + ".lock"):
        with pytest.warns(RuntimeWarning, match="lock"):
            store.put("k", {"A": 1})
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # warned once only
            store.put("k2", {"A": 2})
        assert store.get("k") == {"A": 1} and store.get("k2") == {"A": 2}
        assert not path.exists()
    store.put("k3", {"A": 3})  # lock free again: the earlier decisions are written too
    assert set(_load(path)) == {"k", "k2", "k3"}


def _assert_warns_once_then_keeps_memory(store):
    """The first failed write warns once; later ones are silent; decisions stay in memory."""
    with pytest.warns(RuntimeWarning, match=r"cpu\.sqlite"):
        store.put("k", {"A": 1})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store.put("k2", {"A": 2})
    assert store.get("k") == {"A": 1} and store.get("k2") == {"A": 2}


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX permissions")
def test_read_only_directory_keeps_memory_only(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.geteuid() == 0 and os.access(ro, os.W_OK):
            pytest.skip("root ignores directory permissions (CAP_DAC_OVERRIDE)")
        store = DecisionStore(ro / "cpu.sqlite")
        _assert_warns_once_then_keeps_memory(store)
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o700)


def test_unwritable_file_keeps_memory_only(tmp_path, monkeypatch):
    """The read-only path without relying on permissions (also runs as root): SQLite's own
    refusal to write is taken as read-only, and the file is read but left as it is."""
    path = tmp_path / "cpu.sqlite"
    DecisionStore(path).put("old", {"A": 0})
    before = path.read_bytes()

    def deny(self, rows):
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(DecisionStore, "_write_rows", deny)
    store = DecisionStore(path)
    _assert_warns_once_then_keeps_memory(store)
    assert store.get("old") == {"A": 0} and len(store) == 3 and path.read_bytes() == before


def test_read_only_file_is_read_not_moved(tmp_path, monkeypatch):
    """A file that cannot be written is neither written nor moved aside, even when unusable."""
    path = tmp_path / "cpu.sqlite"
    DecisionStore(path).put("old", {"A": 0})
    monkeypatch.setattr(DecisionStore, "_writable", lambda self: False)
    store = DecisionStore(path)
    assert store.get("old") == {"A": 0}
    _assert_warns_once_then_keeps_memory(store)
    assert _load(path).keys() == {"old"}
    path.write_bytes(b"garbage")
    broken = DecisionStore(path)
    with pytest.warns(RuntimeWarning, match="read-only here"):
        assert broken.get("old") is None
    broken.put("k", {"A": 1})
    assert broken.get("k") == {"A": 1} and path.read_bytes() == b"garbage" and _names(tmp_path) == ["cpu.sqlite"]


def test_clear_forgets_memory_and_file(tmp_path):
    path = tmp_path / "cpu.sqlite"
    store = DecisionStore(path)
    store.put("k", {"A": 1})
    store.clear()
    assert len(store) == 0 and store.get("k") is None and not path.exists()
    assert DecisionStore(path).get("k") is None
    store.put("k2", {"A": 2})
    assert list(_load(path)) == ["k2"]


def test_a_kept_reader_sees_later_writes_and_a_new_file(tmp_path):
    """Lookups keep one read connection: it still sees what another writer commits later, and a
    file moved aside and made anew is read afresh (not the old file's rows)."""
    path = tmp_path / "dev.sqlite"
    writer, reader = DecisionStore(path), DecisionStore(path)
    writer.put("a", {"x": 1})
    assert reader.get("a") == {"x": 1}               # the reader's connection is open now
    assert reader.get("b") is None
    writer.put("b", {"x": 2})
    assert reader.get("b") == {"x": 2}
    os.replace(path, tmp_path / "old.sqlite")         # moved aside; a new file under the name
    DecisionStore(path).put("c", {"x": 3})
    assert reader.get("c") == {"x": 3}
    assert reader.get("zzz") is None
