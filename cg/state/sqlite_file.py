"""One SQLite file under WAL: its connections, its schema, and what can go wrong with the file
itself (`SqliteStore` is the store on top of it; nothing here runs for PostgreSQL).

Safe under concurrent processes (WAL, `busy_timeout`, every write one `BEGIN IMMEDIATE`
transaction) and a killed process (a transaction is all or nothing). The file is private to its
owner (it holds transcripts) and claimed by one proxy at a time (`claim_file`). The WAL is held
to its share of `max_mb` (`WAL_SHARE`): checkpointed at half of it and truncated back after.

The control answers (the session list, the ledger's totals) read on a connection of their own
(`_view`), from the addon's worker thread, so they never hold the lock every turn takes.

What a reuse turn reads every time (its checkpoint, whether its stash is there) is remembered
while no other connection has committed (`PRAGMA data_version`, asked at most once every
`reads_fresh_s`) and this store has not written a checkpoint or a stash since.

Errors: every failure is a `StoreError` saying what failed and on which file; the last one is
kept in `error` (`error_at`, monotonic) until an operation succeeds. `health()` notices a file
deleted or replaced under the open connection and writes the open database back to its path
(nothing stashed is lost with it), and tries a store that failed again after `retry` seconds.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from cg.state.interface import HEALTH_RETRY, retried
from cg.state.records import MEMORY, StoreClaimed, StoreError
from cg.state.schema import SQLITE_MIGRATIONS, SQLITE_VERSION
from cg.state.tenant import new_key

TENANT_KEY = "tenant_key"  # its row in `meta`
WAL_SHARE = 0.125  # of `max_mb`: what the WAL is truncated to after a checkpoint
SHM_BYTES = 32 * 1024  # the WAL's index file
READS_MAX = 4096  # checkpoints and stash presences remembered between writes (then all go)
# How long a `PRAGMA data_version` answer stands: a reuse turn reads its checkpoint and its
# stash's presence (twice) within a millisecond, and each would ask it again. Another process's
# commit is then seen at most this late, as if it came that much later.
READS_FRESH_S = 0.002
log = logging.getLogger("context_guru")


def claim_file(path: str) -> int | None:
    """Hold `path` + `.lock` exclusively while this process lives (the kernel lets go when it
    ends, `kill -9` included): two proxies on one SQLite file would each summarize the same
    conversations and splice different summaries into one session. Returns the descriptor
    that holds it (None where `fcntl` does not exist). Raises StoreClaimed naming the holder."""
    try:
        import fcntl
    except ImportError:  # (not POSIX: no claim)
        return None
    lock = path + ".lock"
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise StoreError(f"cannot claim the store {path}: {lock}: {e.strerror or e}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise StoreClaimed(
            f"the store {path} is in use by another context-guru process (pid {holder}): one "
            "SQLite file serves one proxy, or both would summarize the same sessions; give "
            "this one its own cg_db, or share a PostgreSQL store (store.url) between them"
        ) from None
    except OSError as e:
        os.close(fd)
        raise StoreError(f"cannot claim the store {path}: {e.strerror or e}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode("ascii"), 0)
    return fd


class SqliteFile:
    """The file, its two connections and the reads remembered on them; thread-safe."""

    def __init__(self, path: str, *, max_bytes: int, busy_timeout_ms: int, claim: bool) -> None:
        self.persistent = path != MEMORY
        self.path = str(Path(path).expanduser()) if self.persistent else MEMORY
        self.max_bytes = max_bytes
        self._reads: dict[tuple[str | None, ...], Any] = {}
        self._reads_version: int | None = None
        self.reads_fresh_s = READS_FRESH_S
        self._reads_asked = float("-inf")  # `_reads_clock()` when data_version was last read
        self._reads_clock: Callable[[], float] = time.monotonic
        self._lock = threading.Lock()
        self.error: str | None = None  # the last operation's error, until one succeeds
        self.error_at = 0.0  # time.monotonic() of that error
        self._conn: sqlite3.Connection | None = None
        self.tenant_key = b""  # the fingerprint key (`cg.state.tenant`), read by `_open`
        # The control answers' own connection (`_view`): a file's is opened with the store.
        self._view_conn: sqlite3.Connection | None = None
        self._view_lock = threading.Lock()
        self._claim: int | None = None
        if claim and self.persistent:
            Path(self.path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._claim = claim_file(self.path)
        try:
            self._conn = self._open(busy_timeout_ms)
        except BaseException:
            self._unclaim()
            raise
        self._busy_ms = busy_timeout_ms
        self._inode = self._stat()
        self.journal_mode: str = self._conn.execute("PRAGMA journal_mode").fetchone()[0]
        if self.persistent:
            # Opened with the store, not by the first control answer: no request opens a file.
            try:
                self._view_conn = self._open_view()
            except sqlite3.Error as e:
                self.close()
                raise StoreError(f"cannot open the store {self.path}: {e}") from None

    def _flushed(self) -> None:
        """Before a read on the view: what the store holds back is committed (`SqliteStore`)."""

    def health(self, retry: float = HEALTH_RETRY) -> str | None:
        """Why the store is unusable now, or None: a file deleted or replaced under the open
        connection is written back from it; a store whose last operation failed (locked,
        read-only, full) is left alone for `retry` seconds, then tried with one small write."""
        if not self.persistent:
            return None
        now = time.monotonic()
        problem = self.file_problem()
        if problem is not None:
            if self.error is not None and now - self.error_at < retry:
                return f"{problem}; {self.error}"
            try:
                self.restore_file()
            except StoreError as e:
                return f"{problem}; {e}"
            log.warning("context-guru: %s; written back from the open store", problem)
        return retried(self, retry)

    def close(self) -> None:
        if self._conn is not None:
            self._flushed()
        with self._lock:
            if self._conn is not None:
                with suppress(sqlite3.Error):
                    self._conn.execute("PRAGMA optimize")
                self._conn.close()
                self._conn = None
        self._close_view()  # after: a read under way finishes first, none starts after
        self._unclaim()

    # -- opening ----------------------------------------------------------------------------

    def _open(self, busy_timeout_ms: int) -> sqlite3.Connection:
        where = self.path
        if self.persistent:
            p = Path(self.path)
            try:
                p.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                if not p.exists():
                    # The store holds transcripts: readable by its owner only.
                    os.close(os.open(p, os.O_RDWR | os.O_CREAT, 0o600))
            except OSError as e:
                raise StoreError(
                    f"cannot create the store {where}: {e.strerror or e}; set cg_db to a "
                    "writable path"
                ) from None
        try:
            conn = sqlite3.connect(
                self.path, timeout=busy_timeout_ms / 1000, isolation_level=None,
                check_same_thread=False,
            )  # fmt: skip
        except sqlite3.Error as e:
            raise StoreError(f"cannot open the store {where}: {e}") from None
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            if self.persistent:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise StoreError(f"cannot open the store {where}: WAL mode refused ({mode})")
                conn.execute("PRAGMA synchronous = NORMAL")
                self._wal_pragmas(conn)
            conn.execute("PRAGMA foreign_keys = OFF")
            self._migrate(conn)
            self.tenant_key = self._load_tenant_key(conn)
        except sqlite3.Error as e:
            conn.close()
            raise StoreError(f"cannot open the store {where}: {e}") from None
        except StoreError:
            conn.close()
            raise
        return conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        """Bring the file to SQLITE_VERSION, one version per transaction (so two processes
        opening an old file at once migrate it once: the second sees the new version)."""
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SQLITE_VERSION:
            raise StoreError(
                f"the store {self.path} has schema version {version}, newer than this "
                f"context-guru understands ({SQLITE_VERSION}); use a newer context-guru or "
                "another cg_db"
            )
        while version < SQLITE_VERSION:
            conn.execute("BEGIN IMMEDIATE")
            try:
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                if version < SQLITE_VERSION:
                    version += 1
                    for stmt in SQLITE_MIGRATIONS[version].split(";"):
                        if stmt.strip():
                            conn.execute(stmt)
                    conn.execute(f"PRAGMA user_version = {version}")
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def _load_tenant_key(self, conn: sqlite3.Connection) -> bytes:
        """The file's fingerprint key, made the first time (`INSERT OR IGNORE`: two processes
        opening a new file at once keep the first one's). Read without a write when it is
        there: a read-only file with one opens."""
        row = conn.execute("SELECT v FROM meta WHERE k = ?", (TENANT_KEY,)).fetchone()
        if row is None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(
                    "INSERT OR IGNORE INTO meta (k, v) VALUES (?, ?)", (TENANT_KEY, new_key())
                )
                row = conn.execute("SELECT v FROM meta WHERE k = ?", (TENANT_KEY,)).fetchone()
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        return bytes(row[0])

    # -- plumbing ---------------------------------------------------------------------------

    @contextmanager
    def _op(self, what: str) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._conn is None:
                raise StoreError(f"{what}: the store {self.path} is closed")
            try:
                yield self._conn
            except sqlite3.Error as e:
                self.error = f"{what} on {self.path}: {e}"
                self.error_at = time.monotonic()
                raise StoreError(self.error) from None

    @contextmanager
    def _view(self, what: str) -> Iterator[sqlite3.Connection]:
        """The connection the control answers read on (the session list, the ledger's
        totals): its own, used from the addon's worker thread, so a page read never holds the
        lock every turn's store call takes; WAL lets it read while the other one writes. It
        only reads (`query_only`), and never creates the file (`mode=rw`). What this process
        holds back (`batch_delay`) is committed first. An in-memory store, or a file no longer
        the one opened, is read on the main connection."""
        self._flushed()
        if not self.persistent or self.file_problem() is not None:
            with self._op(what) as conn:
                yield conn
            return
        with self._view_lock:
            if self._conn is None:
                raise StoreError(f"{what}: the store {self.path} is closed")
            try:
                if self._view_conn is None:
                    self._view_conn = self._open_view()
                yield self._view_conn
            except sqlite3.Error as e:
                self.error = f"{what} on {self.path}: {e}"
                self.error_at = time.monotonic()
                raise StoreError(self.error) from None

    def _open_view(self) -> sqlite3.Connection:
        uri = "file:" + urllib.parse.quote(self.path) + "?mode=rw"
        conn = sqlite3.connect(
            uri, uri=True, timeout=self._busy_ms / 1000, isolation_level=None,
            check_same_thread=False,
        )  # fmt: skip
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_ms)}")
            conn.execute("PRAGMA query_only = ON")
        except sqlite3.Error:
            conn.close()
            raise
        return conn

    def _close_view(self) -> None:
        """Close the control answers' connection (reopened on their next read: after a
        restore, the file written back)."""
        with self._view_lock:
            if self._view_conn is not None:
                with suppress(sqlite3.Error):
                    self._view_conn.close()
                self._view_conn = None

    # -- the file under the connection --------------------------------------------------------

    def _stat(self) -> tuple[int, int] | None:
        if not self.persistent:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_dev, st.st_ino)

    def file_problem(self) -> str | None:
        """Why the open file is no longer the one at `path` (deleted, replaced), or None."""
        if not self.persistent or self._conn is None:
            return None
        now = self._stat()
        if now is None:
            return f"the store {self.path} was deleted while open"
        if now != self._inode:
            return f"the store {self.path} was replaced by another file while open"
        return None

    def restore_file(self) -> None:
        """Write the open database back to `path` (it was deleted or replaced: the open
        connection still holds everything) and carry on there. Raises StoreError."""
        where = self.path
        with self._lock:
            if self._conn is None:
                raise StoreError(f"restore: the store {where} is closed")
            tmp = f"{where}.restore-{os.getpid()}"
            try:
                Path(where).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                for suffix in ("", "-wal", "-shm"):
                    with suppress(FileNotFoundError):
                        os.unlink(tmp + suffix)
                os.close(os.open(tmp, os.O_RDWR | os.O_CREAT, 0o600))
                dst = sqlite3.connect(tmp, isolation_level=None)
                try:
                    self._conn.backup(dst)
                    dst.execute("PRAGMA journal_mode = WAL")
                finally:
                    dst.close()
                if self._stat() is not None and self._stat() != self._inode:
                    # Another file took the path: leave it, keep ours beside it.
                    raise StoreError(
                        f"the store {where} was replaced by another file; the open store was "
                        f"saved as {tmp}"
                    )
                os.replace(tmp, where)
                conn = sqlite3.connect(
                    where, timeout=self._busy_ms / 1000, isolation_level=None,
                    check_same_thread=False,
                )  # fmt: skip
                conn.execute(f"PRAGMA busy_timeout = {int(self._busy_ms)}")
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = NORMAL")
                self._wal_pragmas(conn)
            except (OSError, sqlite3.Error) as e:
                self.error = f"cannot restore the store {where}: {e}"
                self.error_at = time.monotonic()
                raise StoreError(self.error) from None
            old, self._conn = self._conn, conn
            # Another connection: its data_version starts afresh, asked before the next read.
            self._forget_reads()
            self._reads_version, self._reads_asked = None, float("-inf")
            old.close()
            self._inode = self._stat()
            self.error = None
        self._close_view()  # it held the file that was replaced or deleted

    @contextmanager
    def _tx(self, what: str) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken up front so concurrent writers queue, never deadlock."""
        with self._op(what) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            self.error = None  # a write went through: whatever failed before is over

    def probe(self) -> None:
        """One small write (the schema version, rewritten as it is), to learn whether writes
        go through again after `error`. Raises StoreError."""
        with self._tx("probe") as conn:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            conn.execute(f"PRAGMA user_version = {version}")

    def _wal_limit(self) -> int:
        """What the WAL is truncated to after a checkpoint (it otherwise keeps its high-water
        mark)."""
        return max(64 * 1024, int(self.max_bytes * WAL_SHARE))

    def _wal_pragmas(self, conn: sqlite3.Connection) -> None:
        """The WAL within its share: checkpointed once it holds half of it (SQLite's default is
        1000 pages, 4 MB, whatever the cap; the other half is for the transaction that crosses
        the mark) and truncated back to the share afterwards."""
        limit = self._wal_limit()
        page = int(conn.execute("PRAGMA page_size").fetchone()[0]) or 4096
        conn.execute(f"PRAGMA journal_size_limit = {limit}")
        conn.execute(f"PRAGMA wal_autocheckpoint = {min(1000, max(16, limit // 2 // page))}")

    def _checkpoint(self) -> None:
        """Copy the WAL into the database and cut it back to nothing (best effort: a reader in
        another process can hold it; the next checkpoint then does it)."""
        if self.persistent:
            with suppress(StoreError), self._op("checkpoint") as conn:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def _db_bytes(self) -> int:
        """The database file on disk, now (one `stat` call; 0 when not a file). Its WAL is held
        by its own pragmas; counted here, its refilling after each truncation set off
        evictions that found nothing to do."""
        if not self.persistent:
            return 0
        try:
            return os.path.getsize(self.path)
        except OSError:
            return 0

    def _current_reads(self, conn: sqlite3.Connection) -> dict[tuple[str | None, ...], Any]:
        """The remembered reads, emptied first if another connection committed since (or
        there are too many). One `PRAGMA data_version` against a query and a row decoded, and
        that asked at most once every `reads_fresh_s` (the reads of one turn ask it once)."""
        t = self._reads_clock()
        if t - self._reads_asked >= self.reads_fresh_s:
            version = conn.execute("PRAGMA data_version").fetchone()[0]
            self._reads_asked = t
            if version != self._reads_version:
                self._reads.clear()
                self._reads_version = version
        if len(self._reads) >= READS_MAX:
            self._reads.clear()
        return self._reads

    def _forget_reads(self) -> None:
        """This store wrote a checkpoint or a stash (its own commits leave `data_version` as
        it was): what it remembered reading may be stale."""
        self._reads.clear()

    def _unclaim(self) -> None:
        """Let go of the file (`claim_file`): another proxy may open it now."""
        fd, self._claim = getattr(self, "_claim", None), None
        if fd is not None:
            with suppress(OSError):
                os.close(fd)
