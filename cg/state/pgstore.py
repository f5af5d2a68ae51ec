"""The PostgreSQL store: one memory shared by several proxies (`store.url: postgresql://…`).

Why it exists: behind a load balancer a session's turns land on any instance, so every instance
must see the same checkpoints, stashes, session clocks and ledger, and must re-emit the
byte-identical summary (anything else misses the provider's prompt cache). `PgStore` has the
SQLite `Store`'s interface and semantics (it subclasses it, so every caller typed `Store` takes
it); what differs is how it keeps the network off the hot path. The design, with its failure
modes, is docs/postgres.md; in short:

- **Reads the hot path makes are served from a local cache** (checkpoints, session clocks, which
  stashes exist), filled on a miss (read-through) and kept true by LISTEN/NOTIFY: every write
  notifies channel `cg_store` in its transaction, so the notice arrives after the commit, and
  each instance drops (a checkpoint: `c KEY`) or updates (a session clock carries its values:
  `s T TTL ID`) its entry. A reuse turn therefore costs no database round trip. The cache is
  trusted only while the listening connection is up: when it drops, the cache is cleared and
  every read goes to the database (and fails open when that is down) until LISTEN is back.
  A generation counter keeps a read that raced a notice from caching the older value.
- **Writes leave the hot path**: `touch_session`, `put_checkpoint`, `put_stash`,
  `delete_checkpoint`, `record_usage` and the stash touches go to a FIFO queue that one writer
  thread (its own connection) commits in order; the local cache is updated at once. A write that
  fails for a connection reason is retried after a reconnect (a restarted database gets the
  ledger rows it missed), a bad one is dropped and recorded. Reads that go to the database for
  a whole-table answer (`sessions`, `usage_rows`, `stats`, …) first wait for the queue to drain,
  so a process reads its own writes. The control answers' reads (a page of the session list,
  the ledger's totals: `session_page`, `usage_totals`) run in the addon's worker thread on a
  connection of their own (`_view`), never on the one the hot path's read-throughs take.
- **One summary per conversation across instances**: `claim()` takes a row in `cg_claims` with a
  lease on the database's clock, under a per-conversation advisory lock, only if nobody else
  holds a live lease and the conversation's checkpoint is still the one the commission was
  decided on (else someone already wrote a newer one: reuse it). The lease is renewed by the
  writer while the job runs; a holder killed mid-commission stops renewing, and once the lease
  runs out the next instance to commission takes it over. The holder releases the claim after
  its checkpoint is written (in that order: a claim in between finds the new checkpoint).

The password in the URL is never shown: `path` (what logs, `/_cg/health`, stats and errors
print) is the URL with the password replaced, and every error message is scrubbed of it.

psycopg (3) is imported only when a PostgreSQL URL is configured: `pip install
'context-guru[postgres]'`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit, urlunsplit

from cg.state.pending import CacheState, cache_state_json
from cg.state.store import (
    _CP_COLS,
    _STASH_COLS,
    _USAGE_COLS,
    CACHE_STATE_CLEARED,
    CACHE_STATE_LIFE,
    FACTS_BATCH,
    LEDGER_TTL_DAYS,
    NO_TURNS,
    PAGE_START,
    TOUCH_INTERVAL,
    Candidate,
    Checkpoint,
    EvictResult,
    FactRow,
    LedgerTurns,
    PageKey,
    SessionDetail,
    SessionInfo,
    SessionRecord,
    Stash,
    Store,
    StoreError,
    StoreStats,
    UsageRow,
    _check_kinds,
    _checkpoint,
    _excess,
    _fact_params,
    _fact_row,
    _facts_cap,
    _ledger_turns,
    _meta_json,
    _quotas,
    _stamped,
    _stash,
    _stash_filter,
    _stash_limits,
    _take,
    _usage_row,
    checked_span,
    owner,
    valid_key,
)
from cg.state.tenant import ANONYMOUS, UNBOUND, new_key, readable
from cg.wire.usage import Usage

PG_SCHEMA_VERSION = 3
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
_EVICT_LOCK = 0x63675F657663  # ... of an eviction ("cg_evc")
_OWNER = "split_part(session, '#', 1)"

_SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS cg_stashes (
    key TEXT NOT NULL,
    session TEXT NOT NULL,
    created DOUBLE PRECISION NOT NULL,
    last_used DOUBLE PRECISION NOT NULL,
    size BIGINT NOT NULL,
    dialect TEXT NOT NULL,
    count INTEGER NOT NULL,
    span BYTEA NOT NULL,
    PRIMARY KEY (key, session)
);
CREATE INDEX IF NOT EXISTS cg_stashes_lru ON cg_stashes (last_used, size);
CREATE INDEX IF NOT EXISTS cg_stashes_session ON cg_stashes (session);
CREATE TABLE IF NOT EXISTS cg_checkpoints (
    session TEXT PRIMARY KEY,
    summary TEXT NOT NULL,
    head_count INTEGER NOT NULL,
    covered_count INTEGER NOT NULL,
    covered_hash TEXT NOT NULL,
    key TEXT,
    message TEXT NOT NULL,
    created DOUBLE PRECISION NOT NULL,
    updated DOUBLE PRECISION NOT NULL,
    meta TEXT,
    version BIGINT NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS cg_sessions (
    session TEXT PRIMARY KEY,
    last_request DOUBLE PRECISION NOT NULL,
    cache_ttl DOUBLE PRECISION
);
CREATE TABLE IF NOT EXISTS cg_usage (
    session TEXT NOT NULL,
    kind TEXT NOT NULL,
    model TEXT NOT NULL,
    tier TEXT NOT NULL,
    input_tokens BIGINT NOT NULL,
    cache_write_tokens BIGINT NOT NULL,
    cache_write_1h_tokens BIGINT NOT NULL,
    cache_read_tokens BIGINT NOT NULL,
    output_tokens BIGINT NOT NULL,
    requests BIGINT NOT NULL,
    updated DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (session, kind, model, tier)
);
CREATE TABLE IF NOT EXISTS cg_ledger (
    session TEXT PRIMARY KEY,
    turns BIGINT NOT NULL,
    rewritten BIGINT NOT NULL,
    tokens_not_sent BIGINT NOT NULL,
    estimate_skipped BIGINT NOT NULL,
    cache_state TEXT,
    last_seen DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS cg_ledger_seen ON cg_ledger (last_seen);
CREATE TABLE IF NOT EXISTS cg_claims (
    conversation TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    claimed DOUBLE PRECISION NOT NULL,
    lease_until DOUBLE PRECISION NOT NULL
)
"""
# v2: what `cg.state.facts` knows of a message (its token counts), by the digest of its raw
# bytes, so the first turn after a restart (or on an instance new to the session) reads them
# instead of tokenising ~1 MB; a cache: expired by the TTL, capped at a quarter of `max_mb`.
_SCHEMA_V2 = """
CREATE TABLE IF NOT EXISTS cg_facts (
    raw BYTEA PRIMARY KEY,
    digest BYTEA NOT NULL,
    tokens BIGINT NOT NULL,
    outputs TEXT NOT NULL,
    flags INTEGER NOT NULL,
    seen DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS cg_facts_seen ON cg_facts (seen)
"""
# v3, the session list's indexes (as SQLite's v4): a page of the ledger in (last_seen, session)
# order, which also serves the ledger's expiry (`cg_ledger_seen` did), and a session's
# checkpoints by their owner. On exactly the owner expression: a range on the key (`'A#'` to
# `'A$'`) is not index-served under a collation other than C.
_SCHEMA_V3_INDEXES = f"""
DROP INDEX IF EXISTS cg_ledger_seen;
CREATE INDEX IF NOT EXISTS cg_ledger_page ON cg_ledger (last_seen, session);
CREATE INDEX IF NOT EXISTS cg_checkpoints_owner ON cg_checkpoints (({_OWNER}), updated)
"""
# v3, tenancy (`cg.state.tenant`): the tenant that wrote each stash and checkpoint, `*`
# (unbound) on the rows from before; the stashes keyed by it too (two tenants stashing one span
# in one session get a row each); the quota eviction's index (per session and tenant, by last
# use), the one that tells a stash a checkpoint names, and the fingerprint key every instance
# shares. The defaults fill the old rows and go: every write names its tenant.
_SCHEMA_V3 = (
    """
ALTER TABLE cg_stashes ADD COLUMN tenant TEXT NOT NULL DEFAULT '*';
ALTER TABLE cg_stashes ALTER COLUMN tenant DROP DEFAULT;
ALTER TABLE cg_stashes DROP CONSTRAINT cg_stashes_pkey;
ALTER TABLE cg_stashes ADD PRIMARY KEY (key, session, tenant);
DROP INDEX IF EXISTS cg_stashes_session;
CREATE INDEX cg_stashes_session ON cg_stashes (session, tenant, last_used, size);
ALTER TABLE cg_checkpoints ADD COLUMN tenant TEXT NOT NULL DEFAULT '*';
ALTER TABLE cg_checkpoints ALTER COLUMN tenant DROP DEFAULT;
CREATE INDEX cg_checkpoints_key ON cg_checkpoints (key);
CREATE TABLE cg_keys (k TEXT PRIMARY KEY, v BYTEA NOT NULL);
"""
    + _SCHEMA_V3_INDEXES
)
# schema version reached -> the DDL that takes the database from the one before to it
MIGRATIONS = {1: _SCHEMA_V1, 2: _SCHEMA_V2, 3: _SCHEMA_V3}
TENANT_KEY = "tenant"  # its row in `cg_keys`
_LEDGER_SELECT = (
    "SELECT session, turns, rewritten, tokens_not_sent, estimate_skipped, last_seen FROM cg_ledger"
)
# The session list's reads (`session_page`), each served by an index (tests/state/
# test_session_page.py holds every query behind a page to its plan).
_PAGE_SQL = (
    f"{_LEDGER_SELECT} WHERE (last_seen, session) < (%s, %s) "
    "ORDER BY last_seen DESC, session DESC LIMIT %s"
)
# Per listed session, in one round trip: its checkpoints' count and its newest checkpoint.
_NEWEST_CP_SQL = f"""
SELECT o.s, n.n, c.* FROM unnest(%s::text[]) AS o(s)
CROSS JOIN LATERAL (SELECT count(*) FROM cg_checkpoints WHERE {_OWNER} = o.s) AS n(n)
JOIN LATERAL (
    SELECT {_CP_COLS} FROM cg_checkpoints WHERE {_OWNER} = o.s ORDER BY updated DESC LIMIT 1
) AS c ON true
"""
_USAGE_SELECT = f"SELECT session, kind, model, tier, {_USAGE_COLS} FROM cg_usage"
_SUMS = ", ".join(f"COALESCE(SUM({c.strip()}), 0)" for c in _USAGE_COLS.split(","))
_USAGE_TOTALS_SQL = f"SELECT kind, model, tier, {_SUMS} FROM cg_usage GROUP BY kind, model, tier"
_LEDGER_TOTALS_SQL = (
    "SELECT COALESCE(SUM(turns), 0), COALESCE(SUM(rewritten), 0), "
    "COALESCE(SUM(tokens_not_sent), 0), COALESCE(SUM(estimate_skipped), 0), "
    "COALESCE(MAX(last_seen), 0) FROM cg_ledger"
)
_T = TypeVar("_T")
_DB_NOW = "extract(epoch from clock_timestamp())::double precision"


def redact_url(url: str) -> str:
    """The URL with its password (if any) replaced by `***`: what may be shown anywhere."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "postgresql://(unparseable URL)"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))


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
class _Op:
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
    parts: list[_Op] | None = None  # a batch: these operations, committed together


def _batchable(op: _Op) -> bool:
    """A plain write: retried after a reconnect, nobody waiting for its result."""
    return op.retry and op.future is None and op.counted and op.parts is None


class PgStore(Store):
    """A PostgreSQL database shared by every instance; see the module docstring."""

    def __init__(
        self,
        url: str,
        *,
        ttl_hours: float = 72.0,
        max_mb: float = 512.0,
        now: Callable[[], float] = time.time,
        evict_interval: float = 60.0,
        evict: bool = True,
        lease_seconds: float = LEASE_SECONDS,
        connect_timeout: int = CONNECT_TIMEOUT,
    ) -> None:
        if ttl_hours <= 0 or max_mb <= 0:
            raise ValueError("ttl_hours and max_mb must be positive")
        self._pg = _driver()
        self._url = url  # holds the password: never shown (`path` is what may be)
        raw_pw = urlsplit(url).password or ""
        self._secrets = sorted({p for p in (raw_pw, unquote(raw_pw)) if p}, key=len, reverse=True)
        self.persistent = True
        self.path = redact_url(url)
        self.journal_mode = "postgresql"
        self.ttl = ttl_hours * 3600.0
        self.max_bytes = int(max_mb * 1024 * 1024)
        self.now = now
        self.evict_interval = evict_interval if evict else float("inf")
        self.evicted = 0
        self._last_evict = float("-inf")
        self._lock = threading.Lock()
        self.error: str | None = None
        self.error_at = 0.0
        # The writer lost the server and waits for it (a write refused by the database is an
        # `error`, not this): read-your-writes is skipped only then.
        self.down = False
        self.instance = uuid.uuid4().hex
        self.lease = lease_seconds
        self.connect_timeout = connect_timeout
        self.cache = _Cache()
        self.dropped = 0  # queued writes dropped (queue full, or refused by the database)
        self._held: set[str] = set()  # conversations this instance holds a claim on
        self._touched: dict[tuple[str, str, str], float] = {}
        self._closed = threading.Event()
        self._live = threading.Event()  # LISTEN went up at least once
        self._stale = threading.Event()  # the server went away since the reader connected
        self._queue: queue.Queue[_Op | None] = queue.Queue()
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
        if evict:
            try:
                self.evict()
            except StoreError:
                self.close()
                raise

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
        """Create or bring the schema to PG_SCHEMA_VERSION, one version per transaction, under
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
                    if version > PG_SCHEMA_VERSION:
                        raise StoreError(
                            f"the store {self.path} has schema version {version}, newer than "
                            f"this context-guru understands ({PG_SCHEMA_VERSION}); use a newer "
                            "context-guru or another database"
                        )
                    if version == PG_SCHEMA_VERSION:
                        return
                    version += 1
                    for stmt in MIGRATIONS[version].split(";"):
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

    def _submit(self, op: _Op) -> None:
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
        pending: _Op | None = None  # failed on a lost connection: retried first
        ahead: _Op | None = None  # taken from the queue while gathering; next in line
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
                renew = _Op(self._renew, "renew claims", retry=False, counted=False)
                conn, _ = self._attempt(conn, renew)
            if op is None:
                if self.now() - self._last_evict < self.evict_interval or self._closed.is_set():
                    continue
                op = _Op(self._evict_tx, "evict", retry=False, counted=False)
                self._last_evict = self.now()  # tried: not again before the interval
            conn, again = self._attempt(conn, op)
            pending = op if again else None
            if again:
                self._closed.wait(RECONNECT_PAUSE)
        if conn is not None:
            with suppress(Exception):
                conn.close()

    def _gather(self, first: _Op) -> tuple[_Op, _Op | None]:
        """`first` and the plain writes queued within LINGER after it, as one operation; and
        the operation that ended the gathering (someone waits for it), if any."""
        self._kick.wait(LINGER)
        self._kick.clear()
        ops = [first]
        ahead: _Op | None = None
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

        return _Op(run, f"{len(ops)} writes", mode="pipeline", parts=ops), ahead

    def _attempt(self, conn: Any, op: _Op) -> tuple[Any, bool]:
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

    def _try(self, conn: Any, op: _Op) -> tuple[Any, bool, bool]:
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
        self._submit(_Op(run, what, fut, retry=False))
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
        self._submit(_Op(lambda conn: None, "settle", fut, retry=False))
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

    def describe(self) -> dict[str, Any]:
        """What `/_cg/health` adds for this engine (never the password)."""
        c = self.cache
        return {
            "engine": "postgresql",
            "url": self.path,
            "listening": c.live,
            "cache": {"hits": c.hits, "misses": c.misses, "notices": c.notices, "ping": c.ping},
            "queued": self._queue.qsize(),
            "dropped": self.dropped,
        }

    def probe(self) -> None:
        """A round trip on the reading connection (reconnecting it), the writer drained, and
        LISTEN up: only then is the store usable again. Raises StoreError."""
        with self._read("probe") as conn:
            conn.execute("SELECT 1")
        self.flush(2.0)
        if not self.cache.live:
            raise StoreError(self.error or f"probe on {self.path}: not listening yet")
        self.error = None

    def file_problem(self) -> str | None:
        return None

    def restore_file(self) -> None:
        return None

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

    # -- claims -------------------------------------------------------------------------------

    async def claim(self, conversation: str, based_on: str | None) -> bool:
        """Take the right to summarize `conversation`: True when this instance holds it now.

        False when another instance holds a live lease, or when the conversation's checkpoint
        is no longer `based_on` (the covered hash the commission was decided on; None: none):
        someone wrote a newer one, which this instance will reuse. Raises StoreError."""

        def run(conn: Any) -> bool:
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (conversation,))
            row = conn.execute(
                "SELECT covered_hash FROM cg_checkpoints WHERE session = %s", (conversation,)
            ).fetchone()
            if (row[0] if row else None) != based_on:
                return False
            got = conn.execute(
                "INSERT INTO cg_claims (conversation, holder, claimed, lease_until) "
                f"VALUES (%s, %s, {_DB_NOW}, {_DB_NOW} + %s) "
                "ON CONFLICT (conversation) DO UPDATE SET holder = excluded.holder, "
                "claimed = excluded.claimed, lease_until = excluded.lease_until "
                f"WHERE cg_claims.lease_until < {_DB_NOW} OR cg_claims.holder = excluded.holder "
                "RETURNING holder",
                (conversation, self.instance, self.lease),
            ).fetchone()
            return got is not None

        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._submit(_Op(run, "claim", fut, retry=False))
        won = bool(await asyncio.wait_for(asyncio.wrap_future(fut), 10.0))
        if won:
            self._held.add(conversation)
        return won

    def release(self, conversation: str) -> None:
        """Give up this instance's claim on `conversation` (its job ended without a checkpoint)."""
        if conversation not in self._held:
            return
        self._held.discard(conversation)
        me = self.instance
        self._submit(
            _Op(
                lambda conn: conn.execute(
                    "DELETE FROM cg_claims WHERE conversation = %s AND holder = %s",
                    (conversation, me),
                ),
                "release",
                mode="single",
            )
        )

    def _renew(self, conn: Any) -> None:
        held = list(self._held)
        if held:
            conn.execute(
                f"UPDATE cg_claims SET lease_until = {_DB_NOW} + %s "
                "WHERE holder = %s AND conversation = ANY(%s)",
                (self.lease, self.instance, held),
            )

    def claims(self) -> list[tuple[str, str, float]]:
        """(conversation, holder, seconds left on the lease) of every claim: for tests/ops."""
        with self._read("claims") as conn:
            rows = conn.execute(
                f"SELECT conversation, holder, lease_until - {_DB_NOW} FROM cg_claims "
                "ORDER BY conversation"
            ).fetchall()
        return [(r[0], r[1], float(r[2])) for r in rows]

    # -- stashes ------------------------------------------------------------------------------

    def put_stash(
        self,
        key: str,
        session: str,
        span_sources: Sequence[str],
        dialect: str,
        tenant: str = ANONYMOUS,
    ) -> None:
        span = checked_span(key, span_sources, self.max_stash_bytes)
        t = self.now()
        n = len(span_sources)
        self._submit(
            _Op(
                lambda conn: conn.execute(
                    f"INSERT INTO cg_stashes ({_STASH_COLS}) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) "
                    "ON CONFLICT (key, session, tenant) DO UPDATE SET "
                    "last_used = excluded.last_used",
                    (key, session, t, t, len(span), dialect, n, span, tenant),
                ),
                "put_stash",
                mode="single",
            )
        )
        with self.cache.lock:
            self.cache.stashes.put((key, session, tenant), True)

    def get_stash(
        self, key: str, session: str | None = None, tenant: str | None = None
    ) -> Stash | None:
        if not valid_key(key):
            return None
        t = self.now()
        self._drain()
        where, args = _stash_filter(key, session, tenant, "%s")
        order = "tenant = '*', last_used DESC" if tenant is not None else "last_used DESC"
        with self._read("get_stash") as conn:
            row = conn.execute(
                f"SELECT {_STASH_COLS} FROM cg_stashes WHERE {where} ORDER BY {order} LIMIT 1",
                args,
            ).fetchone()
        if row is None:
            return None
        k, s, tn = row[0], row[1], row[8]
        with suppress(StoreError):
            self._submit(
                _Op(
                    lambda conn: conn.execute(
                        "UPDATE cg_stashes SET last_used = %s WHERE key = %s AND session = %s "
                        "AND tenant = %s",
                        (t, k, s, tn),
                    ),
                    "get_stash: mark used",
                    mode="single",
                )
            )
        return _stash(row, t)

    def has_stash(self, key: str, session: str | None = None, tenant: str | None = None) -> bool:
        if not valid_key(key):
            return False
        c = self.cache
        with c.lock:
            if c.live:
                if session is not None and tenant is not None:
                    unbound = (key, session, UNBOUND)
                    known = (key, session, tenant) in c.stashes or unbound in c.stashes
                else:  # not the hot path's question: the operator's, or a test's
                    known = any(
                        k[0] == key
                        and session in (None, k[1])
                        and (tenant is None or readable(k[2], tenant))
                        for k in c.stashes
                    )
                if known:
                    c.hits += 1
                    return True
            c.misses += 1
            gen = c.gen
        self._catch_up()
        where, args = _stash_filter(key, session, tenant, "%s")
        with self._read("has_stash") as conn:
            row = conn.execute(
                f"SELECT session, tenant FROM cg_stashes WHERE {where} LIMIT 1", args
            ).fetchone()
        if row is not None:
            with c.lock:
                if c.live and c.gen == gen:
                    c.stashes.put((key, row[0], row[1]), True)
        return row is not None

    def delete_stash(self, key: str, session: str | None = None) -> int:
        def run(conn: Any) -> int:
            if session is None:
                cur = conn.execute("DELETE FROM cg_stashes WHERE key = %s", (key,))
            else:
                cur = conn.execute(
                    "DELETE FROM cg_stashes WHERE key = %s AND session = %s", (key, session)
                )
            conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"x {key} {session or ''}"))
            return int(cur.rowcount)

        with self.cache.lock:
            for k in [k for k in self.cache.stashes if k[0] == key and session in (None, k[1])]:
                self.cache.stashes.pop(k, None)
        return int(self._call(run, "delete_stash"))

    # -- checkpoints --------------------------------------------------------------------------

    def put_checkpoint(self, cp: Checkpoint) -> Checkpoint:
        t = self.now()
        meta = _meta_json(cp)
        c = self.cache
        with c.lock:
            known = c.live and cp.session in c.cps
            prev = c.cps.get(cp.session)
        if not known:
            prev = self.get_checkpoint(cp.session)
        created = prev.created if prev is not None else t
        conv = cp.session

        def run(conn: Any) -> None:
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (conv,))
            conn.execute(
                f"INSERT INTO cg_checkpoints ({_CP_COLS}) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (session) DO UPDATE SET summary = excluded.summary, "
                "head_count = excluded.head_count, covered_count = excluded.covered_count, "
                "covered_hash = excluded.covered_hash, key = excluded.key, "
                "message = excluded.message, updated = excluded.updated, meta = excluded.meta, "
                "tenant = excluded.tenant, version = cg_checkpoints.version + 1",
                (
                    conv, cp.summary, cp.head_count, cp.covered_count, cp.covered_hash,
                    cp.key, cp.message, created, t, meta, cp.tenant,
                ),
            )  # fmt: skip
            conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"c {conv}"))

        self._submit(_Op(run, "put_checkpoint", mode="pipeline"))
        out = _stamped(cp, created, t)
        with c.lock:
            c.gen += 1
            c.convs.pop(conv.split("@", 1)[0], None)
            if c.live:
                c.cps.put(conv, out)
        return out

    def _touch_stash(self, cp: Checkpoint, t: float) -> None:
        """Mark a live checkpoint's stash used, at most once a TOUCH_INTERVAL, off the hot path."""
        if cp.key is None:
            return
        k = (cp.key, owner(cp.session), cp.tenant)
        if t - self._touched.get(k, float("-inf")) < TOUCH_INTERVAL:
            return
        self._touched[k] = t
        if len(self._touched) > CACHE_MAX:
            self._touched.clear()
        self._submit(
            _Op(
                lambda conn: conn.execute(
                    "UPDATE cg_stashes SET last_used = %s WHERE key = %s AND session = %s "
                    "AND tenant = %s AND last_used < %s",
                    (t, k[0], k[1], k[2], t - TOUCH_INTERVAL),
                ),
                "get_checkpoint: mark used",
                mode="single",
            )
        )

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

    def _load_checkpoint(self, session: str) -> Checkpoint | None:
        with self._read("get_checkpoint") as conn:
            row = conn.execute(
                f"SELECT {_CP_COLS} FROM cg_checkpoints WHERE session = %s", (session,)
            ).fetchone()
        return _checkpoint(row) if row is not None else None

    def get_checkpoint(self, session: str, tenant: str | None = None) -> Checkpoint | None:
        t = self.now()
        cp = self._read_through(self.cache.cps, session, self._load_checkpoint)
        if cp is None or (tenant is not None and not readable(cp.tenant, tenant)):
            return None
        self._touch_stash(cp, t)
        return cp

    def _load_conversation(self, base: str) -> list[Checkpoint]:
        with self._read("conversation_checkpoints") as conn:
            rows = conn.execute(
                f"SELECT {_CP_COLS} FROM cg_checkpoints WHERE {_OWNER} = %s",
                (owner(base),),
            ).fetchall()
        mine = [_checkpoint(r) for r in rows]
        return [cp for cp in mine if cp.session.split("@", 1)[0] == base]

    def conversation_checkpoints(self, base: str) -> list[Checkpoint]:
        """As SQLite's: every tenant's checkpoint of one conversation, found by the owner index
        and kept in the local cache (a notice of any of its checkpoints drops the entry)."""
        return list(self._read_through(self.cache.convs, base, self._load_conversation))

    def checkpoints_of(self, session: str) -> list[Checkpoint]:
        self._drain()
        with self._read("checkpoints_of") as conn:
            rows = conn.execute(
                f"SELECT {_CP_COLS} FROM cg_checkpoints WHERE {_OWNER} = %s ORDER BY updated",
                (session,),
            ).fetchall()
        return [_checkpoint(r) for r in rows]

    def delete_checkpoint(self, session: str) -> bool:
        c = self.cache
        with c.lock:
            known = c.live and session in c.cps
            had = known and c.cps[session] is not None
        if not known:
            had = self.get_checkpoint(session) is not None
        if not had:
            return False

        def run(conn: Any) -> None:
            conn.execute("DELETE FROM cg_checkpoints WHERE session = %s", (session,))
            conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"c {session}"))

        self._submit(_Op(run, "delete_checkpoint", mode="pipeline"))
        with c.lock:
            c.gen += 1
            c.convs.pop(session.split("@", 1)[0], None)
            if c.live:
                c.cps.put(session, None)
        return True

    # -- sessions -----------------------------------------------------------------------------

    # -- per-message facts (a cache of token counts; see `cg.state.facts`) --------------------

    def get_facts(self, raws: Sequence[bytes]) -> dict[bytes, FactRow]:
        """Read only for what no memo knows (a restart, a session new to this instance): one
        round trip per FACTS_BATCH messages instead of tokenising them."""
        out: dict[bytes, FactRow] = {}
        if not raws:
            return out
        with self._read("get_facts") as conn:
            for i in range(0, len(raws), FACTS_BATCH):
                part = list(raws[i : i + FACTS_BATCH])
                for raw, digest, tokens, outputs, flags in conn.execute(
                    "SELECT raw, digest, tokens, outputs, flags FROM cg_facts WHERE raw = ANY(%s)",
                    (part,),
                ).fetchall():
                    out[bytes(raw)] = _fact_row(raw, digest, tokens, outputs, flags)
        return out

    def put_facts(self, rows: Sequence[FactRow]) -> None:
        """Queued to the writer (off the hot path); a message already known keeps its row."""
        if not rows:
            return
        t = self.now()
        params = _fact_params(rows, t)

        def run(conn: Any) -> None:
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO cg_facts (raw, digest, tokens, outputs, flags, seen) "
                    "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (raw) DO NOTHING",
                    params,
                )

        self._submit(_Op(run, "put_facts", mode="pipeline"))

    def touch_session(
        self, session: str, now: float | None = None, cache_ttl: float | None = None
    ) -> SessionRecord | None:
        t = self.now() if now is None else now
        prev = self.get_session(session)

        ttl = "-" if cache_ttl is None else repr(float(cache_ttl))
        notice = f"s {t!r} {ttl} {session}"

        def run(conn: Any) -> None:
            # One statement, autocommitted: the notice goes out with its commit.
            conn.execute(
                "WITH up AS (INSERT INTO cg_sessions (session, last_request, cache_ttl) "
                "VALUES (%s, %s, %s) ON CONFLICT (session) DO UPDATE SET "
                "last_request = excluded.last_request, cache_ttl = excluded.cache_ttl "
                "RETURNING 1) SELECT pg_notify(%s, %s) FROM up",
                (session, t, cache_ttl, CHANNEL, notice),
            )

        self._submit(_Op(run, "touch_session", mode="single"))
        c = self.cache
        with c.lock:
            c.gen += 1
            if c.live:
                c.sessions.put(session, SessionRecord(session, t, cache_ttl))
        return prev

    def _load_session(self, session: str) -> SessionRecord | None:
        with self._read("get_session") as conn:
            row = conn.execute(
                "SELECT last_request, cache_ttl FROM cg_sessions WHERE session = %s", (session,)
            ).fetchone()
        return SessionRecord(session, row[0], row[1]) if row else None

    def get_session(self, session: str) -> SessionRecord | None:
        return self._read_through(self.cache.sessions, session, self._load_session)

    def sessions(self) -> list[SessionInfo]:
        self._drain()
        with self._read("sessions") as conn:
            rows = conn.execute(
                f"""
                WITH cp AS (
                    SELECT {_OWNER} AS owner, updated, covered_count,
                           ROW_NUMBER() OVER (PARTITION BY {_OWNER}
                                              ORDER BY updated DESC) AS k
                    FROM cg_checkpoints
                ), ids AS (
                    SELECT session FROM cg_sessions
                    UNION SELECT owner FROM cp
                    UNION SELECT session FROM cg_stashes
                    UNION SELECT session FROM cg_ledger
                ), st AS (
                    SELECT session, COUNT(*) AS n, SUM(size) AS bytes, MAX(last_used) AS used
                    FROM cg_stashes GROUP BY session
                )
                SELECT ids.session, s.last_request, s.cache_ttl, c.updated, c.covered_count,
                       COALESCE(st.n, 0), COALESCE(st.bytes, 0),
                       GREATEST(COALESCE(s.last_request, 0), COALESCE(c.updated, 0),
                                COALESCE(st.used, 0), COALESCE(l.last_seen, 0)) AS seen
                FROM ids
                LEFT JOIN cg_sessions s ON s.session = ids.session
                LEFT JOIN cp c ON c.owner = ids.session AND c.k = 1
                LEFT JOIN st ON st.session = ids.session
                LEFT JOIN cg_ledger l ON l.session = ids.session
                ORDER BY seen DESC, ids.session
                """
            ).fetchall()
        return [
            SessionInfo(r[0], r[1], r[2], r[3], r[4], int(r[5]), int(r[6]), last_seen=r[7] or None)
            for r in rows
        ]

    # -- the session list, a page at a time (the control answers; `_view`) ----------------------

    def session_page(self, limit: int, after: PageKey | None = None) -> list[SessionDetail]:
        with self._view("session_page") as conn:
            rows = conn.execute(_PAGE_SQL, (*(after or PAGE_START), limit)).fetchall()
            return self._details(conn, [(r[0], _ledger_turns(r[1:])) for r in rows])

    def session_details(self, sessions: Sequence[str]) -> list[SessionDetail]:
        ids = list(sessions)
        if not ids:
            return []
        with self._view("session_details") as conn:
            rows = conn.execute(f"{_LEDGER_SELECT} WHERE session = ANY(%s)", (ids,)).fetchall()
            turns = {r[0]: _ledger_turns(r[1:]) for r in rows}
            return self._details(conn, [(s, turns.get(s, NO_TURNS)) for s in ids])

    def _details(self, conn: Any, listed: list[tuple[str, LedgerTurns]]) -> list[SessionDetail]:
        """Each listed session's newest checkpoint, count and usage rows: two round trips,
        by index (`cg_checkpoints_owner`, the primary key of `cg_usage`)."""
        ids = [s for s, _ in listed]
        if not ids:
            return []
        usage: dict[str, list[UsageRow]] = {}
        for r in conn.execute(f"{_USAGE_SELECT} WHERE session = ANY(%s)", (ids,)).fetchall():
            usage.setdefault(r[0], []).append(_usage_row(r))
        newest = {r[0]: (_checkpoint(r[2:]), int(r[1])) for r in conn.execute(
            _NEWEST_CP_SQL, (ids,)
        ).fetchall()}  # fmt: skip
        out: list[SessionDetail] = []
        for session, turns in listed:
            cp, n = newest.get(session, (None, 0))
            out.append(SessionDetail(session, turns, cp, n, tuple(usage.get(session, ()))))
        return out

    def usage_totals(self) -> list[UsageRow]:
        with self._view("usage_totals") as conn:
            rows = conn.execute(_USAGE_TOTALS_SQL).fetchall()
        return [_usage_row(("", *r)) for r in rows]

    def ledger_totals(self) -> LedgerTurns:
        with self._view("ledger_totals") as conn:
            row = conn.execute(_LEDGER_TOTALS_SQL).fetchone()
        return _ledger_turns(row)

    # -- the usage ledger ---------------------------------------------------------------------

    def record_usage(
        self,
        session: str,
        rows: Sequence[tuple[str, str, str, Usage]],
        turns: LedgerTurns | None = None,
        cache_state: CacheState | None = None,
    ) -> None:
        _check_kinds(rows)
        t = self.now()
        rows = list(rows)
        d = turns or NO_TURNS
        state = cache_state_json(cache_state)  # as of this answer

        def run(conn: Any) -> None:
            for kind, model, tier, u in rows:
                conn.execute(
                    f"INSERT INTO cg_usage (session, kind, model, tier, {_USAGE_COLS}, updated) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
                    "ON CONFLICT (session, kind, model, tier) DO UPDATE SET "
                    "input_tokens = cg_usage.input_tokens + excluded.input_tokens, "
                    "cache_write_tokens = cg_usage.cache_write_tokens + "
                    "excluded.cache_write_tokens, "
                    "cache_write_1h_tokens = cg_usage.cache_write_1h_tokens + "
                    "excluded.cache_write_1h_tokens, "
                    "cache_read_tokens = cg_usage.cache_read_tokens + excluded.cache_read_tokens, "
                    "output_tokens = cg_usage.output_tokens + excluded.output_tokens, "
                    "requests = cg_usage.requests + excluded.requests, updated = excluded.updated",
                    (
                        session, kind, model, tier, u.input_tokens, u.cache_write_tokens,
                        u.cache_write_1h_tokens, u.cache_read_tokens, u.output_tokens,
                        u.requests, t,
                    ),
                )  # fmt: skip
            conn.execute(
                "INSERT INTO cg_ledger (session, turns, rewritten, tokens_not_sent, "
                "estimate_skipped, cache_state, last_seen) VALUES (%s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (session) DO UPDATE SET turns = cg_ledger.turns + excluded.turns, "
                "rewritten = cg_ledger.rewritten + excluded.rewritten, "
                "tokens_not_sent = cg_ledger.tokens_not_sent + excluded.tokens_not_sent, "
                "estimate_skipped = cg_ledger.estimate_skipped + excluded.estimate_skipped, "
                "cache_state = COALESCE(excluded.cache_state, cg_ledger.cache_state), "
                "last_seen = excluded.last_seen",
                (
                    session, d.turns, d.rewritten, d.tokens_not_sent, d.estimate_skipped,
                    state, t,
                ),
            )  # fmt: skip

        self._submit(_Op(run, "record_usage", mode="pipeline"))

    def held(self) -> bool:
        """Nothing is held back here: every booking is queued for the writer thread at once
        (`batch_delay` is SQLite's, whose commit is on the hot path)."""
        return False

    def flush_held(self) -> None:
        """Bookings are the writer's already (`flush` waits for them to commit)."""

    def usage_rows(self, session: str | None = None) -> list[UsageRow]:
        self._drain()
        sql = f"SELECT session, kind, model, tier, {_USAGE_COLS} FROM cg_usage"
        args: tuple[str, ...] = ()
        if session is not None:
            sql += " WHERE session = %s"
            args = (session,)
        with self._read("usage_rows") as conn:
            rows = conn.execute(sql + " ORDER BY session, kind, model, tier", args).fetchall()
        return [_usage_row(r) for r in rows]

    def ledger_turns(self, session: str | None = None) -> dict[str, LedgerTurns]:
        self._drain()
        sql = (
            "SELECT session, turns, rewritten, tokens_not_sent, estimate_skipped, last_seen "
            "FROM cg_ledger"
        )
        args: tuple[str, ...] = ()
        if session is not None:
            sql += " WHERE session = %s"
            args = (session,)
        with self._read("ledger_turns") as conn:
            rows = conn.execute(sql, args).fetchall()
        return {r[0]: _ledger_turns(r[1:]) for r in rows}

    def cache_state(self, session: str) -> str | None:
        self._drain()
        with self._read("cache_state") as conn:
            row = conn.execute(
                "SELECT cache_state FROM cg_ledger WHERE session = %s", (session,)
            ).fetchone()
        return row[0] if row else None

    # -- bounds -------------------------------------------------------------------------------

    def stats(self) -> StoreStats:
        self._drain()
        with self._read("stats") as conn:
            n, total = conn.execute(
                "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM cg_stashes"
            ).fetchone()
            cps = conn.execute("SELECT COUNT(*) FROM cg_checkpoints").fetchone()[0]
            sess = conn.execute("SELECT COUNT(*) FROM cg_sessions").fetchone()[0]
            size = conn.execute(
                "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE c.relkind = 'r' AND c.relname LIKE 'cg\\_%%' "
                "AND n.nspname = current_schema()"
            ).fetchone()[0]
        return StoreStats(
            self.path, True, self.journal_mode, int(n), int(total), int(cps), int(sess),
            int(size), self.ttl / 3600.0, self.max_bytes / (1024 * 1024), self.evicted,
        )  # fmt: skip

    def evict(self) -> EvictResult:
        result: EvictResult = self._call(self._evict_tx, "evict", 10.0)
        return result

    def _evict_tx(self, conn: Any) -> EvictResult:
        t = self.now()
        cutoff = t - self.ttl
        # A big eviction may take longer than the 2 s a hot-path read is allowed.
        conn.execute("SET LOCAL statement_timeout = 60000")
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_EVICT_LOCK,))
        expired = conn.execute("DELETE FROM cg_stashes WHERE last_used < %s", (cutoff,)).rowcount
        cps = conn.execute(
            f"DELETE FROM cg_checkpoints WHERE updated < %s AND {_OWNER} NOT IN "
            "(SELECT session FROM cg_sessions WHERE last_request >= %s)",
            (cutoff, cutoff),
        ).rowcount
        sess = conn.execute("DELETE FROM cg_sessions WHERE last_request < %s", (cutoff,)).rowcount
        ledger_cutoff = t - max(self.ttl, LEDGER_TTL_DAYS * 86400.0)
        conn.execute(
            "DELETE FROM cg_usage WHERE session NOT IN "
            "(SELECT session FROM cg_ledger WHERE last_seen >= %s)",
            (ledger_cutoff,),
        )
        conn.execute("DELETE FROM cg_ledger WHERE last_seen < %s", (ledger_cutoff,))
        # An expired prompt-cache state, as the SQLite store clears it (`CACHE_STATE_LIFE`).
        conn.execute(
            "UPDATE cg_ledger SET cache_state = NULL WHERE session IN (SELECT session FROM "
            "cg_ledger WHERE last_seen < %s AND cache_state IS NOT NULL LIMIT %s)",
            (t - CACHE_STATE_LIFE, CACHE_STATE_CLEARED),
        )
        conn.execute(f"DELETE FROM cg_claims WHERE lease_until < {_DB_NOW} - 3600")
        conn.execute("DELETE FROM cg_facts WHERE seen < %s", (cutoff,))
        # Facts are a cache: the newest `_facts_cap` rows are kept, as the SQLite store does.
        conn.execute(
            "DELETE FROM cg_facts WHERE raw IN (SELECT raw FROM cg_facts ORDER BY seen DESC "
            "OFFSET %s)",
            (_facts_cap(self.max_bytes),),
        )
        total = int(conn.execute("SELECT COALESCE(SUM(size), 0) FROM cg_stashes").fetchone()[0])
        lru = 0
        budget, target = _stash_limits(self.max_bytes)  # as the SQLite store shares `max_mb`
        if total > budget:
            # By quota, as the SQLite store evicts (`cg.state.store._quotas`).
            usage = {
                (tn, s): int(n)
                for s, tn, n in conn.execute(
                    "SELECT session, tenant, SUM(size) FROM cg_stashes GROUP BY session, tenant"
                ).fetchall()
            }
            candidates: list[Candidate] = []
            for (tenant, session), cap in _quotas(usage, target).items():
                rows = conn.execute(
                    "SELECT key, size, EXISTS (SELECT 1 FROM cg_checkpoints c "
                    "WHERE c.key = s.key), last_used FROM cg_stashes s "
                    "WHERE session = %s AND tenant = %s ORDER BY last_used, created",
                    (session, tenant),
                ).fetchall()
                excess = _excess(rows, usage[(tenant, session)] - cap)
                candidates += [(nm, u, k, session, tenant, n) for nm, u, k, n in excess]
            victims, _ = _take(candidates, total, target)
            with conn.cursor() as cur:
                cur.executemany(
                    "DELETE FROM cg_stashes WHERE key = %s AND session = %s AND tenant = %s",
                    [(k, s, tn) for k, s, tn, _ in victims],
                )
            lru = len(victims)
        result = EvictResult(expired, lru, cps, sess)
        if result.total:
            conn.execute("SELECT pg_notify(%s, 'e')", (CHANNEL,))
            self._notice("e")  # this instance too, before the caller reads again
        self._last_evict = t
        self.evicted += result.expired_stashes + result.lru_stashes
        return result

    def _maybe_evict(self) -> None:
        return None  # the writer evicts when idle, every evict_interval

    def __enter__(self) -> PgStore:
        return self
