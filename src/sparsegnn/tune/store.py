"""Tuning decisions that outlive a call: one process-wide map per device, persisted in SQLite.

Where the state lives, and why:

* **In memory**, one :class:`DecisionStore` per device name per process (``store_for_device``),
  shared by every ``Graph``.  The tuner keys a decision by a *structural signature* of the
  problem (degree profile, feature width, dtype, ... -- the key is opaque here), not by the
  identity of a ``Graph`` object.  So two ``Graph`` objects with the same signature share one
  decision, and a graph whose signature was tuned before never re-tunes.  Memory holds the
  records this process looked up or made, not the whole file.
* **On disk**, one SQLite database per device, ``tune_cache_dir() / "<device-slug>.sqlite"``
  (for example ``~/.cache/sparsegnn/tune/nvidia-h100-80gb-hbm3.sqlite``), so that decisions
  are shared across processes and runs: the next process, and every worker of a multi-process
  job, starts from what earlier ones measured.  Timings only hold for the device they were
  taken on, hence one file per device.  One row per decision, the record as JSON text (never
  pickle), so ``sqlite3 FILE "select key, record from decisions"`` reads it, and deleting the
  file forgets everything::

      decisions(key TEXT PRIMARY KEY, record TEXT, size INTEGER)   -- rowid: write order
      record = {"config": {"BLOCK_F": 64, ...}, "ms": 0.071, "source": "tuned",
                "time": "2025-01-01T12:00:00+00:00", ...}

Why SQLite (the standard library's): a lookup reads one row through the key's index, so a file
of millions of decisions costs a lookup what a file of ten does (a JSON file had to be parsed
whole, into memory, by every process); a ``put`` writes one row, not the whole file; and its
transactions never leave a torn file.

Bounds.  A file keeps at most ``max_entries`` decisions and ``max_bytes`` of record text
(defaults :data:`MAX_ENTRIES`, :data:`MAX_BYTES`); a write beyond either drops the oldest
written rows.  Decisions are cheap to make again; an unbounded file is not cheap to keep.

Writers.  Each write runs under an exclusive ``filelock.FileLock`` on ``<file>.lock`` (processes
and threads never interleave a write, a prune or a recovery), in one SQLite transaction;
readers take no file lock (SQLite's own locks, with a busy timeout, keep a half-made write
from them).

A file it cannot use is never lost.  One that is not a decision database (truncated,
hand-edited, garbage) or was written by a newer version is renamed to
``<file>.unreadable-<UTC time>`` under the lock, with one ``RuntimeWarning``, and a new one is
started.  A read-only file or directory is read (where it can be) but not written: new
decisions stay in memory, with one warning.  A JSON file of the previous format
(``{"version": 1, "decisions": {...}}``, ``<device-slug>.json``) is renamed to
``<name>.v1-<UTC time>`` and its newest ``max_entries`` records imported, once; one larger
than ``max_bytes`` is renamed aside without being read.

Persistence is best effort and never raises into the caller's op: every disk problem gives one
``RuntimeWarning`` per kind per store, and the decision is then kept in memory only.  Set
``SPARSEGNN_TUNE_CACHE`` to a directory to move the files, or to ``0``/``off``/``none``/empty
to keep decisions in memory only.
"""
from __future__ import annotations

import contextlib
import copy
import json
import math
import numbers
import os
import re
import sqlite3
import threading
import warnings
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Set

import filelock

__all__ = ["DecisionStore", "store_for_device", "tune_cache_dir", "reset_stores", "device_slug"]

#: Version of the database layout (SQLite's ``user_version``).  Version 1 was the JSON file;
#: a database of a higher version is moved aside, never overwritten.
FORMAT_VERSION = 2
#: Version of the JSON files written before the database (imported once, see the module doc).
LEGACY_VERSION = 1
#: Default bounds of a store: decisions kept, and bytes of their record text.
MAX_ENTRIES = 50_000
MAX_BYTES = 32 * 2 ** 20
#: SQLite's header: the first 16 bytes of every database file.
_SQLITE_MAGIC = b"SQLite format 3\x00"
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


def device_slug(device_name: str) -> str:
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
_SCHEMA = ("CREATE TABLE IF NOT EXISTS decisions (key TEXT PRIMARY KEY NOT NULL, record TEXT NOT NULL, "
           "size INTEGER NOT NULL)")
#: Rows a single write drops at most when pruning to the bounds: a database far over them (made
#: by hand, or with larger bounds) shrinks over a few writes instead of stalling one op.
_PRUNE_STEP = 10_000


class _Unusable(Exception):
    """The file exists but is not a decision database this version can use."""


def _stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")


def _encode(record: dict) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


class DecisionStore:
    """A thread-safe map ``key -> record`` of tuning decisions, optionally persisted to one SQLite file.

    A record is ``{"config": {...}, "ms": float | None, "source": str, "time": iso str, **meta}``.
    Keys are opaque strings built by the caller.  All disk I/O is best effort: failures warn
    (once per kind per store) and leave the decision in memory; nothing here raises into the
    caller's op except misuse (a non-string key, a config that is not JSON-serialisable).

    Args:
        path: The database file, or ``None`` to keep decisions in memory only.
        lock_timeout: Seconds to wait for the inter-process file lock (and SQLite's own
            locks) before keeping a decision in memory only.
        device: The device name (for messages; default: the file's stem).
        max_entries, max_bytes: Bounds of the file: decisions, and bytes of their record text;
            the oldest written are dropped beyond them.
        legacy: A JSON decision file of the previous format to import once (see the module doc).
    """

    def __init__(self, path: Optional[Path], *, lock_timeout: float = 10.0, device: Optional[str] = None,
                 max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES, legacy: Optional[Path] = None):
        self._path = Path(path) if path is not None else None
        self._legacy = Path(legacy) if legacy is not None else None
        self._lock_timeout = float(lock_timeout)
        self._device = device if device is not None else (self._path.stem if self._path is not None else None)
        self._max_entries = max(1, int(max_entries))
        self._max_bytes = max(1, int(max_bytes))
        self._mem: Dict[str, dict] = {}     # records this process looked up or made
        self._unsaved: Set[str] = set()     # keys put while the file could not be written
        self._lock = threading.Lock()       # guards the fields above and the flags below
        self._io_lock = threading.RLock()   # serialises this process's writers and recoveries
        self._warned: Set[str] = set()
        self._readonly = False              # the file or directory proved unwritable: stop trying
        self._prepared = False              # legacy import / recovery looked at once
        self._reader: Optional[sqlite3.Connection] = None   # kept open for lookups (see _reading)
        self._reader_id: Optional[tuple] = None             # (device, inode) of the file it reads
        self._reader_lock = threading.Lock()                # one lookup at a time on it

    # ------------------------------------------------------------ public API
    @property
    def path(self) -> Optional[Path]:
        """The database file, or ``None`` when persistence is disabled."""
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
        self._prepare()
        with self._lock:
            self._mem[key] = record
            self._unsaved.add(key)
            skip, readonly = self._path is None or self._readonly, self._path is not None and self._readonly
        if readonly:
            self._warn("readonly", f"{self._path} or its directory is read-only here; keeping decisions in memory only")
        if not skip:
            self._write_through()

    def clear(self) -> None:
        """Forget every decision, in memory and in the file (the file is removed)."""
        with self._lock:
            self._mem.clear()
            self._unsaved.clear()
            path, skip = self._path, self._path is None or self._readonly
        if skip or not path.parent.is_dir():
            return
        try:
            with self._locked():
                for victim in (path, path.with_name(path.name + "-journal")):
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(victim)
        except filelock.Timeout:
            self._warn("timeout", f"could not lock {self._lock_path()} within {self._lock_timeout:g} s; "
                                  f"the decision file {path} was not cleared")
        except OSError as exc:
            self._warn("oserror", f"could not clear the tuning decision file {path}: {exc}")

    def __len__(self) -> int:
        """Decisions known: those in the file and those kept in memory only."""
        self._prepare()
        with self._lock:
            memory_only = set(self._unsaved)
            known = len(self._mem)
        if self._path is None:
            return known
        try:
            with self._reading() as conn:
                if conn is None:
                    return len(memory_only)
                count = conn.execute("SELECT COUNT(*) FROM decisions").fetchone()[0]
                missing = sum(conn.execute("SELECT 1 FROM decisions WHERE key = ?", (k,)).fetchone() is None
                              for k in memory_only)
                return count + missing
        except (sqlite3.Error, OSError):
            return known

    def __repr__(self) -> str:
        return f"DecisionStore(path={str(self._path) if self._path else None!r})"

    # ------------------------------------------------------------ internals
    def _lock_path(self) -> Path:
        return self._path.with_name(self._path.name + ".lock")

    def _locked(self):
        """This process's writer lock, then the inter-process file lock (``filelock.Timeout``
        after ``lock_timeout``)."""
        stack = contextlib.ExitStack()
        stack.enter_context(self._io_lock)
        try:
            stack.enter_context(filelock.FileLock(str(self._lock_path()), timeout=self._lock_timeout))
        except BaseException:
            stack.close()
            raise
        return stack

    def _warn(self, kind: str, message: str) -> None:
        """Warn once per ``kind`` per store."""
        with self._lock:
            if kind in self._warned:
                return
            self._warned.add(kind)
        warnings.warn(f"sparsegnn tuning decisions: {message}", RuntimeWarning, stacklevel=4)

    def _writable(self) -> bool:
        """Whether the directory and the file (when it exists) can be written."""
        path = self._path
        directory = path.parent
        if not directory.exists():
            return True     # made on the first write (failing then if its parent is read-only)
        return os.access(directory, os.W_OK | os.X_OK) and (not path.exists() or os.access(path, os.W_OK))

    def _connect(self, write: bool) -> sqlite3.Connection:
        if write:
            conn = sqlite3.connect(str(self._path), timeout=self._lock_timeout, isolation_level=None)
            # No fsync per decision (~4 ms each): a write stays atomic against a crashed process
            # (the journal), and a file an OS crash damages is moved aside on the next read.
            conn.execute("PRAGMA synchronous = OFF")
        else:
            conn = sqlite3.connect(self._path.resolve().as_uri() + "?mode=ro", uri=True, timeout=self._lock_timeout,
                                   isolation_level=None, check_same_thread=False)
        return conn

    @contextlib.contextmanager
    def _reading(self) -> Iterator[Optional[sqlite3.Connection]]:
        """A read-only connection to a usable file, or None when there is no file (or no table yet).
        An unusable file is recovered (moved aside) when it can be, and reads as empty.

        The connection is kept for the next lookup while the file is the same one (same device
        and inode: a file moved aside and made anew is reopened and checked again): opening and
        checking it cost ~0.4 ms, a lookup on it ~20 us.  Each query runs in a transaction of
        its own, so it sees what other processes committed."""
        if self._path is None:
            yield None
            return
        try:
            info = self._path.stat()
        except OSError:
            yield None
            return
        with self._reader_lock:
            if self._reader is not None and self._reader_id != (info.st_dev, info.st_ino):
                self._reader.close()
                self._reader = None
            if self._reader is None:
                try:
                    conn = self._connect(write=False)
                except sqlite3.Error:
                    yield None
                    return
                try:
                    self._check(conn)
                except _Unusable as exc:
                    conn.close()
                    self._recover(str(exc))
                    yield None
                    return
                self._reader, self._reader_id = conn, (info.st_dev, info.st_ino)
            yield self._reader

    @staticmethod
    def _check(conn: sqlite3.Connection) -> bool:
        """Whether ``conn`` holds a decision table (False: an empty new file); ``_Unusable``
        when the file is not a database, is damaged, or is of a newer or foreign layout."""
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.DatabaseError as exc:
            raise _Unusable(f"not a readable SQLite database ({exc})") from None
        if version not in (0, FORMAT_VERSION):
            raise _Unusable(f"format version {version}, this version reads {FORMAT_VERSION}")
        if "decisions" not in tables:
            if tables:
                raise _Unusable(f"an SQLite database without a decisions table (tables {sorted(tables)})")
            return False
        return True

    def _lookup(self, key: str) -> Optional[dict]:
        self._prepare()
        with self._lock:
            record = self._mem.get(key)
        if record is not None or self._path is None:
            return record
        text = None
        try:
            with self._reading() as conn:
                if conn is not None:
                    row = conn.execute("SELECT record FROM decisions WHERE key = ?", (key,)).fetchone()
                    text = row[0] if row is not None else None
        except sqlite3.OperationalError as exc:     # no table yet, or busy beyond the timeout
            if "no such table" not in str(exc):
                self._warn("busy", f"could not read {self._path} ({exc}); deciding again")
            return None
        except sqlite3.DatabaseError as exc:        # damaged pages found by this query
            self._recover(f"not a readable SQLite database ({exc})")
            return None
        if text is None:
            return None
        try:
            record = json.loads(text)
        except ValueError:
            record = None
        if not _valid_record(record):
            self._warn("malformed", f"ignoring a malformed record for {key!r} in {self._path}")
            return None
        with self._lock:
            return self._mem.setdefault(key, record)

    # ------------------------------------------------------------ preparing the file
    def _prepare(self) -> None:
        """Once per store: import a legacy JSON file and recover an unusable one (see the module doc)."""
        with self._lock:
            if self._prepared or self._path is None:
                return
            self._prepared = True
        legacy = [p for p in (self._legacy, self._path) if p is not None and _is_legacy(p)]
        if not self._writable():
            with self._lock:
                self._readonly = True
            for source in legacy:   # read what can be read, in memory only
                self._import_legacy(source, None)
            return
        if not legacy and not (self._path.exists() and not _has_magic(self._path)):
            return
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            with self._locked():
                for source in legacy:
                    if source.exists() and _is_legacy(source):   # not imported meanwhile by another process
                        backup = self._move_aside(source, f"v{LEGACY_VERSION}")
                        self._import_legacy(backup, source)
                if self._path.exists() and not _has_magic(self._path):
                    self._recover_locked("not an SQLite database")
        except filelock.Timeout:
            self._warn("timeout", f"could not lock {self._lock_path()} within {self._lock_timeout:g} s")
        except OSError as exc:
            self._warn("oserror", f"could not prepare {self._path} ({type(exc).__name__}: {exc})")

    def _import_legacy(self, source: Path, original: Optional[Path]) -> None:
        """Records of a version-1 JSON file (moved aside to ``source`` first; ``original`` its old
        name, for messages): the newest ``max_entries`` into the database, or into memory when
        the database cannot be written (``original`` None).  Too large a file is left unread."""
        name = original or source
        try:
            size = source.stat().st_size
        except OSError:
            return
        if size > self._max_bytes:
            where = f"moved to {source}" if original is not None else "left as it is"
            self._warn("legacy", f"{name} ({size} bytes) is larger than the store's bound ({self._max_bytes} bytes); "
                                 f"not imported, {where}")
            return
        try:
            with open(source, "r", encoding="utf-8") as f:
                data = json.load(f)
            decisions = data["decisions"] if data.get("version") == LEGACY_VERSION else None
            if not isinstance(decisions, dict):
                raise ValueError("not a version-1 decision file")
        except (OSError, UnicodeDecodeError, ValueError, AttributeError, KeyError, TypeError) as exc:
            where = f"kept as {source}" if original is not None else "left as it is"
            self._warn("legacy", f"could not import {name} ({type(exc).__name__}: {exc}); {where}")
            return
        records = [(k, v) for k, v in decisions.items() if isinstance(k, str) and _valid_record(v)]
        records.sort(key=lambda kv: str(kv[1].get("time", "")))
        records = records[-self._max_entries:]
        if original is None:
            with self._lock:
                for key, record in records:
                    self._mem.setdefault(key, record)
            return
        with contextlib.closing(self._connect(write=True)) as conn:
            conn.execute("BEGIN IMMEDIATE")
            self._create(conn)
            conn.executemany("INSERT OR IGNORE INTO decisions (key, record, size) VALUES (?, ?, ?)",
                             ((k, t, len(t)) for k, t in ((k, _encode(v)) for k, v in records)))
            self._prune(conn)
            conn.execute("COMMIT")
        warnings.warn(f"sparsegnn tuning decisions: imported {len(records)} decision(s) of {name} into "
                      f"{self._path}; the old file is kept as {source}", RuntimeWarning, stacklevel=5)

    def _recover(self, problem: str) -> None:
        """Move an unusable file aside (under the lock) so a new one can start; read-only: warn only."""
        if self._readonly or not self._writable():
            with self._lock:
                self._readonly = True
            self._warn("unusable", f"cannot use {self._path}: {problem}; it is read-only here, so it is left as "
                                   "it is and decisions are kept in memory only")
            return
        try:
            with self._locked():
                try:   # another process may have recovered it already
                    with contextlib.closing(self._connect(write=False)) as conn:
                        self._check(conn)
                        conn.execute("SELECT COUNT(*) FROM decisions").fetchone()
                    return
                except (_Unusable, sqlite3.Error):
                    pass
                self._recover_locked(problem)
        except filelock.Timeout:
            self._warn("timeout", f"could not lock {self._lock_path()} within {self._lock_timeout:g} s")
        except OSError as exc:
            self._warn("oserror", f"could not move {self._path} aside ({type(exc).__name__}: {exc})")

    def _recover_locked(self, problem: str) -> None:
        if not self._path.exists():
            return
        backup = self._move_aside(self._path, "unreadable")
        journal = self._path.with_name(self._path.name + "-journal")
        if journal.exists():    # SQLite would replay it into the new file
            os.replace(journal, backup.with_name(backup.name + "-journal"))
        warnings.warn(f"sparsegnn tuning decisions: cannot use {self._path}: {problem}; moved it to {backup} "
                      "and starting a new one", RuntimeWarning, stacklevel=5)
        with self._lock:
            self._warned.add("unusable")

    @staticmethod
    def _move_aside(path: Path, tag: str) -> Path:
        """Rename ``path`` to ``<name>.<tag>-<UTC time>`` (a free name) and return it."""
        base = path.with_name(f"{path.name}.{tag}-{_stamp()}")
        backup, n = base, 1
        while backup.exists():
            backup, n = base.with_name(f"{base.name}.{n}"), n + 1
        os.replace(path, backup)
        return backup

    # ------------------------------------------------------------ writing
    @staticmethod
    def _create(conn: sqlite3.Connection) -> None:
        conn.execute(_SCHEMA)
        conn.execute(f"PRAGMA user_version = {FORMAT_VERSION}")

    def _prune(self, conn: sqlite3.Connection) -> None:
        """Drop the oldest written rows beyond ``max_entries`` / ``max_bytes`` (at most
        ``_PRUNE_STEP`` per call)."""
        count, total = conn.execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM decisions").fetchone()
        if count <= self._max_entries and total <= self._max_bytes:
            return
        cutoff = None
        rows = conn.execute("SELECT rowid, size FROM decisions ORDER BY rowid LIMIT ?", (_PRUNE_STEP,))
        for rowid, size in rows:
            if count <= self._max_entries and total <= self._max_bytes:
                break
            cutoff, count, total = rowid, count - 1, total - size
        if cutoff is not None:
            conn.execute("DELETE FROM decisions WHERE rowid <= ?", (cutoff,))

    def _write_rows(self, rows: Dict[str, dict]) -> None:
        """Write ``rows`` in one transaction (the caller holds the locks), then prune."""
        for attempt in (0, 1):
            try:
                with contextlib.closing(self._connect(write=True)) as conn:
                    self._check(conn)
                    conn.execute("BEGIN IMMEDIATE")
                    self._create(conn)
                    conn.executemany("INSERT OR REPLACE INTO decisions (key, record, size) VALUES (?, ?, ?)",
                                     ((k, t, len(t)) for k, t in ((k, _encode(v)) for k, v in rows.items())))
                    self._prune(conn)
                    conn.execute("COMMIT")
                return
            except _Unusable as exc:
                if attempt:
                    raise OSError(str(exc)) from None
                self._recover_locked(str(exc))
            except sqlite3.OperationalError:
                raise
            except sqlite3.DatabaseError as exc:   # damaged pages met while writing
                if attempt:
                    raise OSError(str(exc)) from None
                self._recover_locked(f"not a readable SQLite database ({exc})")

    def _write_through(self) -> None:
        """Write this process's unsaved records to the file under the inter-process lock."""
        path = self._path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not self._writable():
                raise PermissionError(f"{path} or its directory is not writable")
            with self._locked():
                with self._lock:
                    pending = {k: self._mem[k] for k in self._unsaved if k in self._mem}
                if not pending:
                    return
                self._write_rows(pending)
                with self._lock:
                    for key, record in pending.items():
                        if self._mem.get(key) is record:  # not re-put meanwhile
                            self._unsaved.discard(key)
        except filelock.Timeout:
            self._warn("timeout", f"could not lock {self._lock_path()} within {self._lock_timeout:g} s; "
                                  "keeping new decisions in memory only for now")
        except PermissionError as exc:
            self._go_readonly(exc)
        except sqlite3.OperationalError as exc:
            if "readonly" in str(exc) or "read-only" in str(exc):
                self._go_readonly(exc)
            else:   # busy beyond the timeout, disk full, ...
                self._warn("oserror", f"could not write {path} ({exc}); keeping new decisions in memory only for now")
        except (OSError, sqlite3.Error) as exc:
            self._warn("oserror", f"could not write {path} ({type(exc).__name__}: {exc}); "
                                  "keeping new decisions in memory only for now")

    def _go_readonly(self, exc: BaseException) -> None:
        with self._lock:
            self._readonly = True
        self._warn("readonly", f"cannot write {self._path} ({exc}); keeping decisions in memory only")


def _has_magic(path: Path) -> bool:
    """Whether ``path`` is empty or starts with SQLite's header (an empty file is a new database)."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(_SQLITE_MAGIC))
    except OSError:
        return True     # unreadable here: the connection's own error decides later
    return head == b"" or head == _SQLITE_MAGIC


def _is_legacy(path: Path) -> bool:
    """Whether ``path`` is (by its first byte) a JSON decision file of the previous format."""
    try:
        with open(path, "rb") as f:
            return f.read(64).lstrip()[:1] == b"{"
    except OSError:
        return False


# ---------------------------------------------------------------- process-wide stores
_STORES: Dict[str, DecisionStore] = {}
_STORES_LOCK = threading.Lock()
#: Bumped by ``reset_stores`` (see ``stores_generation``).
_GENERATION = 0


def store_for_device(device_name: str) -> DecisionStore:
    """The process-wide decision store of ``device_name`` (memoised per name).

    Its file is ``tune_cache_dir() / (slug + ".sqlite")``, with the slug the name lower-cased and
    each run of non-alphanumerics replaced by ``-`` (``"NVIDIA H100 80GB HBM3"`` ->
    ``nvidia-h100-80gb-hbm3.sqlite``; a ``.json`` file of the previous format beside it is
    imported on first use); with persistence disabled the store is memory only.  The
    location is resolved on the first call for a name; ``reset_stores()`` forgets it.

    Args:
        device_name: e.g. ``torch.cuda.get_device_name(device)``, or ``"cpu"``.
    """
    with _STORES_LOCK:
        store = _STORES.get(device_name)
        if store is None:
            directory = tune_cache_dir()
            slug = device_slug(device_name)
            path = directory / f"{slug}.sqlite" if directory is not None else None
            legacy = directory / f"{slug}.json" if directory is not None else None
            store = _STORES[device_name] = DecisionStore(path, device=device_name, legacy=legacy)
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
