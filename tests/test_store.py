"""The persistent tuning-decision store: round trips, location, corruption, concurrency, locking."""
import json
import multiprocessing
import os
import sys
import threading
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
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def test_put_get_round_trip_and_second_process_sees_it(tmp_path):
    path = tmp_path / "cpu.json"
    store = DecisionStore(path)
    assert store.path == path and len(store) == 0 and store.get("missing") is None
    assert not path.exists()  # nothing is written before a put
    store.put("spmm|sig=abc|F=64", {"BLOCK_F": 64, "num_warps": 4}, ms=0.125, source="tuned", candidates=7)
    assert store.get("spmm|sig=abc|F=64") == {"BLOCK_F": 64, "num_warps": 4}
    rec = store.get_record("spmm|sig=abc|F=64")
    assert rec["config"] == {"BLOCK_F": 64, "num_warps": 4} and rec["ms"] == 0.125
    assert rec["source"] == "tuned" and rec["candidates"] == 7 and "T" in rec["time"]
    assert len(store) == 1

    data = _load(path)  # the documented format, human-readable
    assert data["version"] == 1 and data["device"] == "cpu"
    assert data["decisions"]["spmm|sig=abc|F=64"] == rec
    text = path.read_text()
    assert text == json.dumps(data, indent=1, sort_keys=True) + "\n"

    other = DecisionStore(path)  # a second process starting later
    assert other.get("spmm|sig=abc|F=64") == {"BLOCK_F": 64, "num_warps": 4}
    assert other.get_record("spmm|sig=abc|F=64") == rec


def test_returned_values_are_copies(tmp_path):
    store = DecisionStore(tmp_path / "cpu.json")
    store.put("k", {"A": 1})
    store.get("k")["A"] = 99
    store.get_record("k")["config"]["A"] = 99
    assert store.get("k") == {"A": 1}


def test_writers_merge_instead_of_overwriting(tmp_path):
    path = tmp_path / "cpu.json"
    a, b = DecisionStore(path), DecisionStore(path)
    assert a.get("x") is None  # a has loaded (an empty file) before b writes
    b.put("from-b", {"A": 1})
    a.put("from-a", {"A": 2})
    b.put("from-a", {"A": 3})  # the newer record wins for its key
    assert set(_load(path)["decisions"]) == {"from-a", "from-b"}
    assert _load(path)["decisions"]["from-a"]["config"] == {"A": 3}
    assert a.get("from-b") == {"A": 1}  # a learned b's decision while merging
    assert DecisionStore(path).get("from-a") == {"A": 3}


def test_put_normalises_and_validates(tmp_path):
    import numpy as np
    import torch

    store = DecisionStore(tmp_path / "cpu.json")
    store.put("k", {"A": np.int64(3), "B": torch.tensor(5), "FLAT": True}, ms=float("inf"), source="heuristic")
    rec = store.get_record("k")
    assert rec["config"] == {"A": 3, "B": 5, "FLAT": True} and type(rec["config"]["A"]) is int
    assert rec["ms"] is None and rec["source"] == "heuristic"
    assert DecisionStore(tmp_path / "cpu.json").get_record("k") == rec
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
    assert store.path == tmp_path / "tune" / "nvidia-h100-80gb-hbm3.json"
    assert store_for_device("cpu").path == tmp_path / "tune" / "cpu.json"
    store.put("k", {"BLOCK_F": 32})
    assert _load(store.path)["device"] == "NVIDIA H100 80GB HBM3"
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


@pytest.mark.parametrize("content", [
    b"\x00\xff\xfe not json {",
    b"[1, 2, 3]",
    json.dumps({"version": 2, "device": "cpu", "decisions": {"k": {"config": {"A": 1}}}}).encode(),
    json.dumps({"version": 1, "device": "cpu", "decisions": ["k"]}).encode(),
], ids=["garbage", "list", "wrong-version", "wrong-structure"])
def test_corrupt_file_is_ignored_then_replaced(tmp_path, content):
    path = tmp_path / "cpu.json"
    path.write_bytes(content)
    store = DecisionStore(path)
    with pytest.warns(RuntimeWarning, match="cpu.json"):
        assert store.get("k") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning per store: neither this get nor the put warns
        assert store.get("other") is None
        store.put("new", {"A": 2})
    data = _load(path)
    assert data["version"] == 1 and list(data["decisions"]) == ["new"]
    assert DecisionStore(path).get("new") == {"A": 2}


def test_malformed_records_are_dropped(tmp_path):
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps({"version": 1, "decisions": {"good": {"config": {"A": 1}}, "bad": {"A": 1}}}))
    store = DecisionStore(path)
    with pytest.warns(RuntimeWarning, match="malformed"):
        assert store.get("good") == {"A": 1}
    assert store.get("bad") is None


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

    path = str(tmp_path / "shared.json")
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
    data = _load(path)  # valid JSON, not torn
    assert data["version"] == 1
    assert set(data["decisions"]) == {f"w{w}-k{i}" for w in range(4) for i in range(25)}
    assert DecisionStore(path).get("w3-k24") == {"worker": 3, "i": 24}
    leftovers = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock"))
    assert leftovers == ["shared.json"]  # no temp files left behind


def test_concurrent_threads_lose_nothing(tmp_path):
    store = DecisionStore(tmp_path / "cpu.json")
    threads = [threading.Thread(target=lambda t=t: [store.put(f"t{t}-{i}", {"i": i}) for i in range(10)])
               for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(store) == 60 and len(_load(tmp_path / "cpu.json")["decisions"]) == 60


def test_lock_timeout_keeps_decision_in_memory(tmp_path):
    path = tmp_path / "cpu.json"
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
    assert set(_load(path)["decisions"]) == {"k", "k2", "k3"}


def _assert_warns_once_then_keeps_memory(store):
    """The first failed write warns once; later ones are silent; decisions stay in memory."""
    with pytest.warns(RuntimeWarning, match="cpu.json"):
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
        store = DecisionStore(ro / "cpu.json")
        _assert_warns_once_then_keeps_memory(store)
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o700)


def test_unwritable_file_keeps_memory_only(tmp_path, monkeypatch):
    """The read-only path without relying on permissions (also runs as root)."""
    def deny(self, decisions):
        raise PermissionError(13, "Permission denied", str(self.path))

    monkeypatch.setattr(DecisionStore, "_replace_file", deny)
    store = DecisionStore(tmp_path / "cpu.json")
    _assert_warns_once_then_keeps_memory(store)
    assert not (tmp_path / "cpu.json").exists()


def test_clear_forgets_memory_and_file(tmp_path):
    path = tmp_path / "cpu.json"
    store = DecisionStore(path)
    store.put("k", {"A": 1})
    store.clear()
    assert len(store) == 0 and store.get("k") is None and not path.exists()
    assert DecisionStore(path).get("k") is None
    store.put("k2", {"A": 2})
    assert list(_load(path)["decisions"]) == ["k2"]
