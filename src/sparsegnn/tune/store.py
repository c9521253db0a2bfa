"""Tuning decisions that outlive a call: one process-wide map per device, persisted as JSON.

Where the state lives, and why:

* **In memory**, one :class:`DecisionStore` per device name per process (``store_for_device``),
  shared by every ``Graph``.  The tuner keys a decision by a *structural signature* of the
  problem (degree profile, feature width, dtype, ... -- the key is opaque here), not by the
  identity of a ``Graph`` object.  So two ``Graph`` objects with the same signature share one
  decision, and a graph whose signature was tuned before never re-tunes.
* **On disk**, one JSON file per device, ``tune_cache_dir() / "<device-slug>.json"`` (for
  example ``~/.cache/sparsegnn/tune/nvidia-h100-80gb-hbm3.json``), so that decisions are
  shared across processes and runs as well: the next process, and every worker of a
  multi-process job, starts from what earlier ones measured.  Timings only hold for the device
  they were taken on, hence one file per device.  The file is plain, sorted, indented JSON (never
  pickle), so it can be read, diffed, edited or deleted by hand::

      {"version": 1, "device": "NVIDIA H100 80GB HBM3",
       "decisions": {"<key>": {"config": {"BLOCK_F": 64, ...}, "ms": 0.071,
                               "source": "tuned", "time": "2025-01-01T12:00:00+00:00"}}}

Loading is lazy (on the first ``get``/``put``/``len``) and happens once per store; a ``put``
writes through at once.  Writers in several processes never lose each other's decisions and
never leave a torn file: under an exclusive ``filelock.FileLock`` on ``<file>.lock`` a writer
re-reads the file, merges its record in (it wins for its own key, every other key on disk is
kept), writes a temporary file in the same directory and ``os.replace``-s it over the old one,
so readers (which take no lock) always see a complete file.

Persistence is best effort and never raises into the caller's op: a corrupt file, a file of
another version, a read-only directory or a lock that cannot be had in time each give one
``RuntimeWarning`` per store, and the decision is then kept in memory only.  Set
``SPARSEGNN_TUNE_CACHE`` to a directory to move the files, or to ``0``/``off``/``none``/empty
to keep decisions in memory only.
"""
from __future__ import annotations

import copy
import json
import math
import numbers
import os
import re
import tempfile
import threading
import warnings
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, Optional, Set

import filelock

__all__ = ["DecisionStore", "store_for_device", "tune_cache_dir", "reset_stores"]

#: Version of the file format; files of any other version are ignored (and replaced on a put).
FORMAT_VERSION = 1
#: Values of ``$SPARSEGNN_TUNE_CACHE`` that disable persistence (compared lower-cased, stripped).
_DISABLING = frozenset({"", "0", "off", "none"})
#: Record fields the store fills in itself; ``put(**meta)`` may not override them.
_RESERVED = frozenset({"config", "ms", "source", "time"})


# ---------------------------------------------------------------- locations
def tune_cache_dir() -> Optional[Path]:
    """The directory that holds the per-device decision files, or ``None`` if persistence is off.

    ``$SPARSEGNN_TUNE_CACHE`` if set (a directory; ``""``, ``"0"``, ``"off"`` and ``"none"``,
    in any case, disable persistence), else ``<cache root>/tune``, where the cache root is
    ``$SPARSEGNN_CACHE``, else ``platformdirs.user_cache_dir("sparsegnn")`` when platformdirs is
    installed, else ``~/.cache/sparsegnn``.

    Returns:
        The directory (not necessarily existing yet), or ``None`` when decisions are to be kept
        in memory only (also when no home directory can be determined).
    """
    env = os.environ.get("SPARSEGNN_TUNE_CACHE")
    if env is not None:
        if env.strip().lower() in _DISABLING:
            return None
        return Path(env).expanduser()
    from .._paths import cache_root   # here: the file alone imports only the stdlib and filelock

    try:
        return cache_root() / "tune"
    except (RuntimeError, KeyError, OSError):  # Path.home() without a resolvable home directory
        return None


def _slug(device_name: str) -> str:
    """``"NVIDIA H100 80GB HBM3"`` -> ``"nvidia-h100-80gb-hbm3"`` (runs of other characters -> one '-')."""
    return re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") or "device"


# ---------------------------------------------------------------- JSON helpers
def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _plain(value: Any) -> Any:
    """``json.dumps`` ``default=`` hook: numpy / torch scalars and other numbers -> Python numbers."""
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    item = getattr(value, "item", None)  # one-element tensors and numpy scalars
    if callable(item):
        try:
            plain = item()
        except (TypeError, ValueError, RuntimeError):
            plain = None
        if isinstance(plain, (bool, int, float, str)):
            return plain
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def _valid_record(record: Any) -> bool:
    return (isinstance(record, dict) and isinstance(record.get("config"), dict)
            and all(isinstance(k, str) for k in record["config"]))


# ---------------------------------------------------------------- the store
class DecisionStore:
    """A thread-safe map ``key -> record`` of tuning decisions, optionally persisted to one JSON file.

    A record is ``{"config": {...}, "ms": float | None, "source": str, "time": iso str, **meta}``.
    Keys are opaque strings built by the caller.  All disk I/O is best effort: failures warn
    (once per kind per store) and leave the decision in memory; nothing here raises into the
    caller's op except misuse (a non-string key, a config that is not JSON-serialisable).

    Args:
        path: The JSON file, or ``None`` to keep decisions in memory only.
        lock_timeout: Seconds to wait for the inter-process file lock before keeping a
            decision in memory only.
        device: The device name recorded in the file (default: the file's stem).
    """

    def __init__(self, path: Optional[Path], *, lock_timeout: float = 10.0, device: Optional[str] = None):
        self._path = Path(path) if path is not None else None
        self._lock_timeout = float(lock_timeout)
        self._device = device if device is not None else (self._path.stem if self._path is not None else None)
        self._mem: Dict[str, dict] = {}
        self._loaded = False
        self._lock = threading.Lock()      # guards _mem, _loaded, _unsaved, _warned, _readonly
        self._io_lock = threading.Lock()   # serialises this process's writers to the file
        self._unsaved: Set[str] = set()    # keys put while the file could not be written
        self._warned: Set[str] = set()
        self._readonly = False             # the directory proved unwritable: stop trying

    # ------------------------------------------------------------ public API
    @property
    def path(self) -> Optional[Path]:
        """The JSON file, or ``None`` when persistence is disabled."""
        return self._path

    def get(self, key: str) -> Optional[dict]:
        """The stored config for ``key`` (a copy), or ``None`` if no decision was stored."""
        record = self._lookup(key)
        return dict(record["config"]) if record is not None else None

    def get_record(self, key: str) -> Optional[dict]:
        """The full stored record for ``key`` (a deep copy), or ``None``.

        Returns:
            ``{"config": {...}, "ms": float | None, "source": str, "time": iso str, ...meta}``.
        """
        record = self._lookup(key)
        return copy.deepcopy(record) if record is not None else None

    def put(self, key: str, config: dict, *, ms: Optional[float] = None, source: str = "tuned", **meta: Any) -> None:
        """Store the decision ``config`` for ``key`` in memory and write it through to the file.

        Args:
            key: Opaque string key.
            config: The chosen config, e.g. ``{"BLOCK_F": 64, "num_warps": 4}``.
            ms: Its measured time in milliseconds (non-finite values are stored as ``None``).
            source: Where the decision came from, e.g. ``"tuned"`` or ``"heuristic"``.
            **meta: Further JSON-serialisable fields to keep with the record (not ``time``).

        Raises:
            TypeError: If ``key`` is not a string, ``meta`` uses a reserved field, or the record
                is not JSON-serialisable (caller bugs; disk problems never raise).
        """
        if not isinstance(key, str):
            raise TypeError(f"DecisionStore.put(): key must be a str, got {type(key).__name__}")
        if not isinstance(config, dict):
            raise TypeError(f"DecisionStore.put(): config must be a dict, got {type(config).__name__}")
        clash = _RESERVED.intersection(meta)
        if clash:
            raise TypeError(f"DecisionStore.put(): meta may not set reserved field(s) {sorted(clash)}")
        if ms is not None:
            ms = float(ms)
            if not math.isfinite(ms):
                ms = None
        if not all(isinstance(k, str) for k in config):  # json.dumps would stringify int keys
            raise TypeError(f"DecisionStore.put(): config keys must be str, got {list(config)}")
        record = {**meta, "config": config, "ms": ms, "source": str(source), "time": _now()}
        try:  # normalise through a JSON round trip, so memory holds exactly what the file will
            record = json.loads(json.dumps(record, default=_plain, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"DecisionStore.put(): record for {key!r} is not JSON-serialisable: {exc}") from None
        with self._lock:
            self._load_locked()
            self._mem[key] = record
            self._unsaved.add(key)
            skip = self._path is None or self._readonly
        if not skip:
            self._write_through()

    def clear(self) -> None:
        """Forget every decision, in memory and in the file (the file is removed)."""
        with self._lock:
            self._mem.clear()
            self._unsaved.clear()
            self._loaded = True  # nothing to load any more
            path, skip = self._path, self._path is None or self._readonly
        if skip or not path.parent.is_dir():
            return
        with self._io_lock:
            try:
                with filelock.FileLock(str(self._lock_path()), timeout=self._lock_timeout):
                    try:
                        os.remove(path)
                    except FileNotFoundError:
                        pass
            except filelock.Timeout:
                self._warn("timeout", f"could not lock {self._lock_path()} within {self._lock_timeout:g} s; "
                                      f"the decision file {path} was not cleared")
            except OSError as exc:
                self._warn("oserror", f"could not clear the tuning decision file {path}: {exc}")

    def __len__(self) -> int:
        with self._lock:
            self._load_locked()
            return len(self._mem)

    def __repr__(self) -> str:
        return f"DecisionStore(path={str(self._path) if self._path else None!r}, loaded={self._loaded})"

    # ------------------------------------------------------------ internals
    def _lock_path(self) -> Path:
        return self._path.with_name(self._path.name + ".lock")

    def _lookup(self, key: str) -> Optional[dict]:
        with self._lock:
            self._load_locked()
            return self._mem.get(key)

    def _warn(self, kind: str, message: str) -> None:
        """Warn once per ``kind`` per store."""
        with self._lock:
            if kind in self._warned:
                return
            self._warned.add(kind)
        warnings.warn(f"sparsegnn tuning decisions: {message}", RuntimeWarning, stacklevel=4)

    def _load_locked(self) -> None:
        """Read the file into memory once (caller holds ``self._lock``); memory entries win."""
        if self._loaded:
            return
        self._loaded = True
        if self._path is None:
            return
        disk, problem = self._read_file()
        if problem is not None:
            self._warned.add("corrupt")  # warn outside our own lock below
            warnings.warn(f"sparsegnn tuning decisions: ignoring {self._path}: {problem}; "
                          "it will be replaced on the next put", RuntimeWarning, stacklevel=4)
        for key, record in disk.items():
            self._mem.setdefault(key, record)

    def _read_file(self) -> "tuple[Dict[str, dict], Optional[str]]":
        """``(decisions, problem)`` from the file: ``({}, None)`` if it is missing, ``({}, why)``
        if it is unreadable, of another version or malformed; malformed records are dropped."""
        try:
            with open(self._path, "r", encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return {}, None
        except (OSError, UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
            return {}, f"unreadable ({type(exc).__name__}: {exc})"
        if not isinstance(data, dict) or not isinstance(data.get("decisions"), dict):
            return {}, "not a decision file (expected an object with a 'decisions' object)"
        if data.get("version") != FORMAT_VERSION:
            return {}, f"format version {data.get('version')!r}, expected {FORMAT_VERSION}"
        decisions = {k: v for k, v in data["decisions"].items() if isinstance(k, str) and _valid_record(v)}
        if len(decisions) != len(data["decisions"]):
            return decisions, f"{len(data['decisions']) - len(decisions)} malformed record(s) dropped"
        return decisions, None

    def _write_through(self) -> None:
        """Merge this process's unsaved records into the file under the inter-process lock."""
        path = self._path
        with self._io_lock:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                if not os.access(path.parent, os.W_OK | os.X_OK):
                    raise PermissionError(f"directory {path.parent} is not writable")
                with filelock.FileLock(str(self._lock_path()), timeout=self._lock_timeout):
                    disk, problem = self._read_file()
                    if problem is not None:
                        self._warn("corrupt", f"ignoring {path}: {problem}; replacing it")
                    with self._lock:
                        pending = {k: self._mem[k] for k in self._unsaved if k in self._mem}
                        for key, record in disk.items():  # learn other processes' decisions
                            self._mem.setdefault(key, record)
                    disk.update(pending)
                    self._replace_file(disk)
                    with self._lock:
                        for key, record in pending.items():
                            if self._mem.get(key) is record:  # not re-put meanwhile
                                self._unsaved.discard(key)
            except filelock.Timeout:
                self._warn("timeout", f"could not lock {self._lock_path()} within {self._lock_timeout:g} s; "
                                      "keeping new decisions in memory only for now")
            except PermissionError as exc:
                with self._lock:
                    self._readonly = True
                self._warn("readonly", f"cannot write {path} ({exc}); keeping decisions in memory only")
            except OSError as exc:
                self._warn("oserror", f"could not write {path} ({type(exc).__name__}: {exc}); "
                                      "keeping new decisions in memory only for now")

    def _replace_file(self, decisions: Dict[str, dict]) -> None:
        """Atomically replace the file with ``decisions`` (temp file in the same dir + ``os.replace``)."""
        path = self._path
        payload = {"version": FORMAT_VERSION, "device": self._device, "decisions": decisions}
        text = json.dumps(payload, indent=1, sort_keys=True) + "\n"
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            try:  # mkstemp makes 0600; keep the old file's mode, else a plain 0644
                mode = os.stat(path).st_mode & 0o777
            except OSError:
                mode = 0o644
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise


# ---------------------------------------------------------------- process-wide stores
_STORES: Dict[str, DecisionStore] = {}
_STORES_LOCK = threading.Lock()
#: Bumped by ``reset_stores`` (see ``stores_generation``).
_GENERATION = 0


def store_for_device(device_name: str) -> DecisionStore:
    """The process-wide decision store of ``device_name`` (memoised per name).

    Its file is ``tune_cache_dir() / (slug + ".json")``, with the slug the name lower-cased and
    each run of non-alphanumerics replaced by ``-`` (``"NVIDIA H100 80GB HBM3"`` ->
    ``nvidia-h100-80gb-hbm3.json``); with persistence disabled the store is memory only.  The
    location is resolved on the first call for a name; ``reset_stores()`` forgets it.

    Args:
        device_name: e.g. ``torch.cuda.get_device_name(device)``, or ``"cpu"``.
    """
    with _STORES_LOCK:
        store = _STORES.get(device_name)
        if store is None:
            directory = tune_cache_dir()
            path = directory / f"{_slug(device_name)}.json" if directory is not None else None
            store = _STORES[device_name] = DecisionStore(path, device=device_name)
        return store


def reset_stores() -> None:
    """Forget every memoised store, so the next ``store_for_device`` re-reads the environment (tests)."""
    global _GENERATION
    with _STORES_LOCK:
        _STORES.clear()
        _GENERATION += 1


def stores_generation() -> int:
    """A number that changes whenever ``reset_stores`` runs: a copy of a decision taken under one
    generation (a per-graph memo of the hot path) is stale under another.  Costs an attribute read."""
    return _GENERATION
