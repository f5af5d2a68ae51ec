"""The PostgreSQL store's plumbing (`PgBase`, under `PgStore`): its connections, the writer
thread that commits queued writes in order, the listener that keeps the local cache true, and the
errors, scrubbed of the password. Nothing here runs for SQLite; psycopg is imported only when a
`postgresql://` store is opened. The design is docs/postgres.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

from cg.state.interface import HEALTH_RETRY, retried
from cg.state.records import EvictResult, SessionRecord, StoreError, redact_url
from cg.state.schema import PG_MIGRATIONS, PG_VERSION
from cg.state.tenant import new_key

CHANNEL = "cg_store"
LEASE_SECONDS = 30.0  # a claim's lease; renewed every third of it while its job runs
CONNECT_TIMEOUT = 2  # seconds; a database that is down is noticed at once on loopback
STATEMENT_TIMEOUT_MS = 2000
LINGER = 0.05  # seconds the writer gathers plain writes before committing them together
BATCH_MAX = 200  # operations per gathered transaction
QUEUE_MAX = 20_000  # queued writes beyond this are dropped (and counted): memory stays bounded
CACHE_MAX = 20_000  # entries per cache; the least recently used go first
RECONNECT_PAUSE = 0.5
_MIGRATION_LOCK = 0x63675F6D6967  # pg_advisory_xact_lock key of a schema migration ("cg_mig")
TENANT_KEY = "tenant"  # its row in `cg_keys`
_T = TypeVar("_T")


def _driver() -> Any:
    try:
        import psycopg
    except ImportError:
        raise StoreError(
            "a postgresql:// store needs psycopg: pip install 'context-guru[postgres]'"
        ) from None
    return psycopg


class _Lru(OrderedDict[Any, Any]):
    def put(self, k: Any, v: Any) -> None:
        self[k] = v
        self.move_to_end(k)
        while len(self) > CACHE_MAX:
            self.popitem(last=False)


class _Cache:
    """What the hot path reads, local to this process; trusted only while `live`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.live = False  # LISTEN is up: notices keep the entries true
        self.gen = 0  # bumped by every invalidation: a read that raced one is not cached
        self.cps: _Lru = _Lru()  # conversation -> Checkpoint | None
        self.sessions: _Lru = _Lru()  # session -> SessionRecord | None
        self.stashes: _Lru = _Lru()  # (key, session, tenant) -> True (known to exist)
        self.convs: _Lru = _Lru()  # a conversation's key without a tenant -> its checkpoints
        self.hits = 0
        self.misses = 0
        self.notices = 0
        # The token of the last `p TOKEN` notice: notices arrive in commit order, so an
        # instance that shows a ping has applied every change committed before it (an
        # operator's or a test's way to know the instances caught up, /_cg/health).
        self.ping = ""

    def clear(self, live: bool) -> None:
        with self.lock:
            self.live = live
            self.gen += 1
            self.cps.clear()
            self.sessions.clear()
            self.stashes.clear()
            self.convs.clear()


@dataclass
class Op:
    """One queued database operation: `run(conn)` in a transaction; `future` gets its result.
    `retry`: a connection failure keeps it for after the reconnect (writes); else the caller is
    told (a claim must not be taken late)."""

    run: Callable[[Any], Any]
    what: str
    future: concurrent.futures.Future[Any] | None = None
    retry: bool = True
    counted: bool = True  # submitted (in `_outstanding`); the writer's own chores are not
    # How it goes on the wire: "tx" a transaction; "pipeline" a transaction whose statements
    # are sent together (one round trip: writes that read nothing back); "single" one
    # autocommitted statement (the per-turn session clock: one round trip, no BEGIN/COMMIT).
    mode: str = "tx"
    parts: list[Op] | None = None  # a batch: these operations, committed together


def _batchable(op: Op) -> bool:
    """A plain write: retried after a reconnect, nobody waiting for its result."""
    return op.retry and op.future is None and op.counted and op.parts is None


class PgBase:
    """The connections, the writer and the listener of one PostgreSQL store (`PgStore`)."""

    # What the store on top sets before `__init__` (the writer evicts and renews claims).
    ttl: float
    lease: float
    evict_interval: float
    _last_evict: float
    now: Callable[[], float]

    def __init__(self, url: str, connect_timeout: int) -> None:
        self._pg = _driver()
        self._url = url  # holds the password: never shown (`path` is what may be)
        raw_pw = urlsplit(url).password or ""
        self._secrets = sorted({p for p in (raw_pw, unquote(raw_pw)) if p}, key=len, reverse=True)
        self.persistent = True
        self.path = redact_url(url)
        self.journal_mode = "postgresql"
        self._lock = threading.Lock()
        self.error: str | None = None
        self.error_at = 0.0
        # The writer lost the server and waits for it (a write refused by the database is an
        # `error`, not this): read-your-writes is skipped only then.
        self.down = False
        self.connect_timeout = connect_timeout
        self.cache = _Cache()
        self.dropped = 0  # queued writes dropped (queue full, or refused by the database)
        self._held: set[str] = set()  # conversations this instance holds a claim on
        self._closed = threading.Event()
        self._live = threading.Event()  # LISTEN went up at least once
        self._stale = threading.Event()  # the server went away since the reader connected
        self._queue: queue.Queue[Op | None] = queue.Queue()
        self._kick = threading.Event()  # ends the writer's gathering of plain writes
        self._outstanding = 0  # operations submitted and not finished yet
        self._count = threading.Lock()
        self._conn: Any = None
        # The control answers' own connection (`_view`), opened on their first read.
        self._view_conn: Any = None
        self._view_lock = threading.Lock()
        self._conn = self._connect("open")
        try:
            self._migrate_pg(self._conn)
            self.tenant_key = self._load_tenant_key(self._conn)
        except BaseException:
            self._conn.close()
            raise
        self._listener = threading.Thread(target=self._listen, name="cg-pg-listen", daemon=True)
        self._writer = threading.Thread(target=self._write_loop, name="cg-pg-write", daemon=True)
        self._listener.start()
        self._writer.start()
        # Serve from the cache from the first request on (a store that is not listening reads
        # every time); bounded: a LISTEN that fails leaves the store usable, only slower.
        self._live.wait(self.connect_timeout + 3.0)

    def _renew(self, conn: Any) -> None:
        """Renew the leases of the claims held (`PgStore`)."""

    def _evict_tx(self, conn: Any) -> EvictResult:
        """One eviction, in the writer's transaction (`PgStore`)."""
        return EvictResult()

    # -- connections and errors ----------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        """An error message without the password (a driver may quote the connection string)."""
        text = text.replace(self._url, self.path)
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _fail(self, what: str, e: BaseException) -> StoreError:
        msg = " ".join(str(e).split()) or type(e).__name__
        self.error = self._scrub(f"{what} on {self.path}: {msg}")
        self.error_at = time.monotonic()
        return StoreError(self.error)

    def _connect(self, what: str) -> Any:
        try:
            conn = self._pg.connect(
                self._url,
                autocommit=True,
                connect_timeout=self.connect_timeout,
                options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
                application_name="context-guru",
            )
        except self._pg.Error as e:
            raise self._fail(f"cannot open the store ({what})", e) from None
        return conn

    def _migrate_pg(self, conn: Any) -> None:
        """Create or bring the schema to PG_VERSION, one version per transaction, under
        an advisory lock, so instances starting together migrate it once."""
        while True:
            try:
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
                    # Under the lock: two instances creating it at once would collide.
                    conn.execute(
                        "CREATE TABLE IF NOT EXISTS cg_meta (k TEXT PRIMARY KEY, v BIGINT NOT NULL)"
                    )
                    row = conn.execute("SELECT v FROM cg_meta WHERE k = 'schema'").fetchone()
                    version = int(row[0]) if row else 0
                    if version > PG_VERSION:
                        raise StoreError(
                            f"the store {self.path} has schema version {version}, newer than "
                            f"this context-guru understands ({PG_VERSION}); use a newer "
                            "context-guru or another database"
                        )
                    if version == PG_VERSION:
                        return
                    version += 1
                    for stmt in PG_MIGRATIONS[version].split(";"):
                        if stmt.strip():
                            conn.execute(stmt)
                    conn.execute(
                        "INSERT INTO cg_meta (k, v) VALUES ('schema', %s) "
                        "ON CONFLICT (k) DO UPDATE SET v = excluded.v",
                        (version,),
                    )
            except self._pg.Error as e:
                raise self._fail("cannot open the store (migration)", e) from None

    def _load_tenant_key(self, conn: Any) -> bytes:
        """The fingerprint key every instance shares: the first instance to open the database
        makes it; the others, and every later start, read that one."""
        try:
            with conn.transaction():
                conn.execute(
                    "INSERT INTO cg_keys (k, v) VALUES (%s, %s) ON CONFLICT (k) DO NOTHING",
                    (TENANT_KEY, new_key()),
                )
                row = conn.execute("SELECT v FROM cg_keys WHERE k = %s", (TENANT_KEY,)).fetchone()
        except self._pg.Error as e:
            raise self._fail("cannot open the store (tenant key)", e) from None
        return bytes(row[0])

    @contextmanager
    def _read(self, what: str) -> Iterator[Any]:
        """The reading connection (reconnected when it was lost); errors become StoreError."""
        with self._lock:
            if self._closed.is_set():
                raise StoreError(f"{what}: the store {self.path} is closed")
            if self._stale.is_set() and self._conn is not None:
                # The listener lost the server: this idle connection is likely dead too.
                with suppress(Exception):
                    self._conn.close()
                self._conn = None
            if self._conn is None or self._conn.closed:
                self._stale.clear()
                self._conn = self._connect(what)
            try:
                yield self._conn
            except self._pg.Error as e:
                if isinstance(e, self._pg.OperationalError) or self._conn.closed:
                    with suppress(Exception):
                        self._conn.close()
                    self._conn = None
                raise self._fail(what, e) from None

    @contextmanager
    def _view(self, what: str) -> Iterator[Any]:
        """The connection the control answers read on (the session list, the ledger's
        totals), from the addon's worker thread: its own, so a page read never holds the lock
        the hot path's read-throughs take (reconnected when it was lost). This process's
        writes are committed first."""
        self._drain()
        with self._view_lock:
            if self._closed.is_set():
                raise StoreError(f"{what}: the store {self.path} is closed")
            if self._view_conn is None or self._view_conn.closed:
                self._view_conn = self._connect(what)
            try:
                yield self._view_conn
            except self._pg.Error as e:
                if isinstance(e, self._pg.OperationalError) or self._view_conn.closed:
                    with suppress(Exception):
                        self._view_conn.close()
                    self._view_conn = None
                raise self._fail(what, e) from None

    # -- the writer ---------------------------------------------------------------------------

    def _submit(self, op: Op) -> None:
        if self._closed.is_set():
            raise StoreError(f"{op.what}: the store {self.path} is closed")
        if self._queue.qsize() >= QUEUE_MAX:
            self.dropped += 1
            self.error = f"{op.what} on {self.path}: {QUEUE_MAX} writes queued; dropped"
            self.error_at = time.monotonic()
            if op.future is not None:
                op.future.set_exception(StoreError(self.error))
            return
        with self._count:
            self._outstanding += 1
        self._queue.put(op)
        if not _batchable(op):
            self._kick.set()  # someone waits: stop gathering

    def _write_loop(self) -> None:
        """Commit queued operations in order; renew held claims and evict when due.

        Plain writes (no caller waiting) are gathered for up to LINGER seconds and committed
        together, in one pipelined transaction: the writer thread then wakes a few times a
        second under load instead of once per turn, and each wake is one round trip. A thread
        that wakes while a turn runs on the event loop competes with it for the GIL and, on a
        small machine, for the CPU; batching keeps that rare. An operation someone waits for
        (a claim, a flush) ends the wait at once."""
        conn: Any = None
        pending: Op | None = None  # failed on a lost connection: retried first
        ahead: Op | None = None  # taken from the queue while gathering; next in line
        renew_every = max(self.lease / 3.0, 0.05)
        next_renew = time.monotonic() + renew_every
        while True:
            op = pending or ahead
            ahead = None
            if op is None:
                try:
                    op = self._queue.get(timeout=min(renew_every, 1.0))
                except queue.Empty:
                    op = None
                if op is None and self._closed.is_set() and self._queue.empty():
                    break
                if op is not None and _batchable(op):
                    op, ahead = self._gather(op)
            if self._held and time.monotonic() >= next_renew:
                next_renew = time.monotonic() + renew_every
                renew = Op(self._renew, "renew claims", retry=False, counted=False)
                conn, _ = self._attempt(conn, renew)
            if op is None:
                if self.now() - self._last_evict < self.evict_interval or self._closed.is_set():
                    continue
                op = Op(self._evict_tx, "evict", retry=False, counted=False)
                self._last_evict = self.now()  # tried: not again before the interval
            conn, again = self._attempt(conn, op)
            pending = op if again else None
            if again:
                self._closed.wait(RECONNECT_PAUSE)
        if conn is not None:
            with suppress(Exception):
                conn.close()

    def _gather(self, first: Op) -> tuple[Op, Op | None]:
        """`first` and the plain writes queued within LINGER after it, as one operation; and
        the operation that ended the gathering (someone waits for it), if any."""
        self._kick.wait(LINGER)
        self._kick.clear()
        ops = [first]
        ahead: Op | None = None
        while len(ops) < BATCH_MAX:
            try:
                nxt = self._queue.get_nowait()
            except queue.Empty:
                break
            if nxt is None or not _batchable(nxt):
                ahead = nxt
                break
            ops.append(nxt)
        if len(ops) == 1:
            return first, ahead

        def run(conn: Any) -> None:
            for op in ops:
                op.run(conn)

        return Op(run, f"{len(ops)} writes", mode="pipeline", parts=ops), ahead

    def _attempt(self, conn: Any, op: Op) -> tuple[Any, bool]:
        """Run `op` in one transaction: (the connection to go on with, whether to retry it).
        A batch the database refuses is run again one by one, so one bad write drops alone."""
        conn, again, failed = self._try(conn, op)
        if failed and op.parts is not None:
            for part in op.parts:
                conn, again = self._attempt(conn, part)
                if again:  # the connection went: the rest waits for the reconnect
                    rest = op.parts[op.parts.index(part) :]
                    op.parts[:] = rest
                    return conn, True
            return conn, False
        if not again:
            done = len(op.parts) if op.parts is not None else int(op.counted)
            if done:
                with self._count:
                    self._outstanding = max(0, self._outstanding - done)
        return conn, again

    def _try(self, conn: Any, op: Op) -> tuple[Any, bool, bool]:
        """(connection, retry after a reconnect, refused by the database)."""
        try:
            if conn is None or conn.closed:
                conn = self._connect(op.what)
            if op.mode == "single":
                result = op.run(conn)
            elif op.mode == "pipeline":
                with conn.pipeline(), conn.transaction():
                    result = op.run(conn)
            else:
                with conn.transaction():
                    result = op.run(conn)
        except (self._pg.Error, StoreError) as e:
            lost = isinstance(e, (self._pg.OperationalError, StoreError)) or (
                conn is not None and conn.closed
            )
            err = e if isinstance(e, StoreError) else self._fail(op.what, e)
            if lost and conn is not None:
                with suppress(Exception):
                    conn.close()
                conn = None
            self.down = lost
            if lost and op.retry and not self._closed.is_set():
                return conn, True, False
            if op.parts is not None and not lost:
                return conn, False, True  # which one? run them one by one
            if op.future is None:
                self.dropped += len(op.parts) if op.parts is not None else 1
            elif not op.future.done():
                op.future.set_exception(StoreError(str(err)))
            return conn, False, False
        except Exception as e:  # noqa: BLE001 - a bug in one op never stops the writer
            err = self._fail(op.what, e)
            if op.parts is not None:
                return conn, False, True
            if op.future is not None and not op.future.done():
                op.future.set_exception(err)
            return conn, False, False
        if op.future is not None and not op.future.done():
            op.future.set_result(result)
        self.down = False
        if op.retry:
            self.error = None  # a write went through: whatever failed before is over
        return conn, False, False

    def _call(self, run: Callable[[Any], Any], what: str, timeout: float = 5.0) -> Any:
        """Run `run` on the writer, after everything queued before it; wait for its result."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._submit(Op(run, what, fut, retry=False))
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            self.error = f"{what} on {self.path}: no answer within {timeout:g}s"
            self.error_at = time.monotonic()
            raise StoreError(self.error) from None

    def flush(self, timeout: float = 5.0) -> None:
        """Wait until every write queued so far is committed (read-your-writes). Raises
        StoreError when that does not happen in time (the database is down)."""
        if self._writer.is_alive():
            self._call(lambda conn: None, "flush", timeout)

    async def settle(self) -> None:
        """The queued writes committed, without holding the event loop meanwhile."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._submit(Op(lambda conn: None, "settle", fut, retry=False))
        await asyncio.wait_for(asyncio.wrap_future(fut), 10.0)

    # -- the listener -------------------------------------------------------------------------

    def _listen(self) -> None:
        while not self._closed.is_set():
            conn: Any = None
            try:
                conn = self._connect("listen")
                conn.execute(f"LISTEN {CHANNEL}")
                # Whatever was cached before may have missed notices: start afresh.
                self.cache.clear(live=True)
                self._live.set()
                while not self._closed.is_set():
                    for n in conn.notifies(timeout=0.5):
                        self._notice(n.payload)
            except (self._pg.Error, StoreError) as e:
                if not self._closed.is_set():
                    self._fail("listen", e)
            except Exception as e:  # noqa: BLE001 - the listener must survive a bad notice
                self._fail("listen", e)
            finally:
                self.cache.clear(live=False)
                self._stale.set()
                if conn is not None:
                    with suppress(Exception):
                        conn.close()
            self._closed.wait(RECONNECT_PAUSE)

    def _notice(self, payload: str) -> None:
        kind, _, rest = payload.partition(" ")
        c = self.cache
        with c.lock:
            c.notices += 1
            c.gen += 1
            if kind == "c":
                c.cps.pop(rest, None)
                c.convs.pop(rest.split("@", 1)[0], None)
            elif kind == "s":
                t, ttl, session = rest.split(" ", 2)
                cur = c.sessions.get(session)
                if cur is None or cur.last_request <= float(t):
                    c.sessions.put(
                        session,
                        SessionRecord(session, float(t), None if ttl == "-" else float(ttl)),
                    )
            elif kind == "x":  # a stash deleted
                key, _, session = rest.partition(" ")
                for k in [k for k in c.stashes if k[0] == key and (not session or k[1] == session)]:
                    c.stashes.pop(k, None)
            elif kind == "p":
                c.ping = rest[:64]
            elif kind == "e":  # an eviction removed rows: nothing cached can be trusted
                c.cps.clear()
                c.sessions.clear()
                c.stashes.clear()
                c.convs.clear()

    @property
    def listening(self) -> bool:
        return self.cache.live

    def _drain(self, timeout: float = 2.0) -> None:
        """Before a read from the database: this process's writes committed first
        (read-your-writes). Skipped when none are outstanding, and when the writer is waiting
        for the server (`down`: the read fails at once instead of after `timeout` seconds on
        the event loop). A write the database refused is not that: the writes after it still
        commit, and a read skipping them raced the writer (a flaky test under load)."""
        if self._outstanding and not self.down:
            with suppress(StoreError):
                self.flush(timeout)

    def _catch_up(self) -> None:
        """A read the cache could not answer while not listening: drained first (a listening
        cache already holds this process's own writes)."""
        if not self.cache.live:
            self._drain(1.0)

    # -- interface: plumbing ------------------------------------------------------------------

    def probe(self) -> None:
        """A round trip on the reading connection (reconnecting it), the writer drained, and
        LISTEN up: only then is the store usable again. Raises StoreError."""
        with self._read("probe") as conn:
            conn.execute("SELECT 1")
        self.flush(2.0)
        if not self.cache.live:
            raise StoreError(self.error or f"probe on {self.path}: not listening yet")
        self.error = None

    def close(self) -> None:
        if self._closed.is_set():
            return
        if not self.down:  # a store without its server would only make the exit wait
            with suppress(StoreError):
                self.flush(3.0)
        self._closed.set()
        self._queue.put(None)
        self._kick.set()
        self._writer.join(10)
        self._listener.join(5)
        with self._lock:
            if self._conn is not None:
                with suppress(Exception):
                    self._conn.close()
                self._conn = None
        with self._view_lock:
            if self._view_conn is not None:
                with suppress(Exception):
                    self._view_conn.close()
                self._view_conn = None

    def _read_through(self, lru: _Lru, key: str, load: Callable[[str], _T]) -> _T:
        """`lru[key]` while the cache is live and holds it, else `load(key)` from the database,
        cached unless a notice invalidated something meanwhile (the generation moved)."""
        c = self.cache
        with c.lock:
            if c.live and key in lru:
                c.hits += 1
                lru.move_to_end(key)
                hit: _T = lru[key]
                return hit
            c.misses += 1
            gen = c.gen
        self._catch_up()
        value = load(key)
        with c.lock:
            if c.live and c.gen == gen:
                lru.put(key, value)
        return value

    def health(self, retry: float = HEALTH_RETRY) -> str | None:
        """Why the store is unusable now, or None: a store whose last operation failed is left
        alone for `retry` seconds, then tried (`probe`: a round trip, the writer drained, and
        LISTEN up)."""
        return retried(self, retry)
