"""The SQLite store: stashes, checkpoints, session clocks, the usage ledger and the facts cache in
one file (`SqliteFile`), bounded by a TTL and `max_mb` (`cg.state.policy`). One file serves one
proxy (`claim`), so `claim()` is always granted: the proxy's own in-flight set keeps one summary
per conversation.

Eviction runs on open and opportunistically after writes, at most once per `evict_interval`
seconds, or at once when a write takes the stashes past their budget or the file has grown by a
fiftieth of the cap. It drops what outlived the TTL (a checkpoint lives while its session does;
reading a checkpoint marks its stash used), then, over the budget, the stashes of the tenants and
sessions over their quota (`policy.quota_victims`). Stashes are deleted after the rest, in runs
of half a WAL share each, every run after a checkpoint that cuts the WAL back to nothing:
SQLite as Debian builds it has `secure_delete` on, so a deleted stash's bytes go through the WAL.
The stashes keep to less than their half when the rest of the file (checkpoints, the ledger,
facts, sessions: bounded by the TTL and the ledger's 30 days, not by size) needs the room.

With `batch_delay` > 0 the ledger's rows and the session clocks are held (`cg.state.pending`)
and committed together: a turn's bookkeeping is one transaction per window instead of two per
turn.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress
from typing import Any, TypeVarTuple

from cg.settings import StoreConfig
from cg.state.interface import DEFAULT_BUSY_TIMEOUT_MS, Store
from cg.state.pending import CacheState, HeldWrites
from cg.state.policy import (
    EVICT_TO,
    FACTS_TRIM,
    TOUCH_INTERVAL,
    StashRow,
    chunks,
    facts_cap,
    max_stash_bytes,
    quota_victims,
    stash_limits,
)
from cg.state.records import (
    NO_TURNS,
    PAGE_START,
    Checkpoint,
    EvictResult,
    FactRow,
    LedgerTurns,
    PageKey,
    SessionDetail,
    SessionInfo,
    SessionRecord,
    Stash,
    StoreError,
    StoreStats,
    UsageRow,
    checked_span,
    owner,
    valid_key,
)
from cg.state.sql import (
    CP_COLS,
    FACTS_BATCH,
    SQLITE,
    STASH_COLS,
    check_kinds,
    checkpoint_of,
    checkpoint_params,
    expire,
    fact_params,
    fact_row,
    stamped,
    stash_filter,
    stash_of,
    stash_order,
    turns_of,
    usage_row,
)
from cg.state.sqlite_file import SHM_BYTES, SqliteFile
from cg.state.tenant import ANONYMOUS, readable
from cg.wire.usage import Usage

Ts = TypeVarTuple("Ts")  # a held write's arguments, typed against its method

TOUCHED_MAX = 20_000  # stashes whose last refresh a process remembers (then it forgets all)
DEFAULT_EVICT_INTERVAL = 60.0
HELD_ROWS_MAX = 50_000  # rows held while the store refuses writes (then they are dropped)
PAGE_BATCH = 500  # ids per `IN (…)` of a page's lookups (far under SQLite's bound on parameters)
ROOM_SHARE = 0.9  # of what the database may take: what is live in it, at most
ROOM_MIN_BYTES = 1024 * 1024  # below it the schema alone is a tenth of the cap: not held on disk
_UNREAD = object()
_DEFAULTS = StoreConfig()
Q = SQLITE
_OWNER = Q.dialect.owner
# Its own rowid changes with a replace: `sessions` joins the newest checkpoint by it.
_CP_REPLACE = f"INSERT OR REPLACE INTO checkpoints ({CP_COLS}) VALUES ({', '.join('?' * 11)})"
# A page's newest checkpoint and count per listed session, by the owner index.
_NEWEST_CP_SQL = (
    f"SELECT {CP_COLS} FROM checkpoints WHERE {_OWNER} = ? ORDER BY updated DESC LIMIT 1"
)
_COUNT_CP_SQL = f"SELECT COUNT(*) FROM checkpoints WHERE {_OWNER} = ?"
# One quota group's live stashes, least recently used first, by `stashes_session`.
_GROUP_ROWS = (
    "SELECT key, size, EXISTS (SELECT 1 FROM checkpoints c WHERE c.key = s.key), "
    "last_used FROM stashes s WHERE session = ? AND tenant = ? AND last_used >= ? "
    "ORDER BY last_used"
)


def _batches(ids: Sequence[str]) -> Iterator[list[str]]:
    for i in range(0, len(ids), PAGE_BATCH):
        yield list(ids[i : i + PAGE_BATCH])


class SqliteStore(SqliteFile, Store):
    """One SQLite file; every method is thread-safe. Use as a context manager or `close()`."""

    def __init__(
        self,
        path: str | os.PathLike[str] = _DEFAULTS.path,
        *,
        ttl_hours: float = _DEFAULTS.ttl_hours,
        max_mb: float = _DEFAULTS.max_mb,
        now: Callable[[], float] = time.time,
        evict_interval: float = DEFAULT_EVICT_INTERVAL,
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        evict: bool = True,
        batch_delay: float = 0.0,
        claim: bool = False,
    ) -> None:
        """`evict=False` opens the file as a reader would: nothing is ever evicted by this
        object (the CLI must not apply its default TTL to a store configured longer).
        `batch_delay`: seconds `record_usage` and `touch_session` may hold their rows to commit
        them together (0: each call commits). `claim`: the proxy's own store, held against a
        second proxy (`claim_file`: StoreClaimed); readers (the CLI) claim nothing."""
        if ttl_hours <= 0 or max_mb <= 0:
            raise ValueError("ttl_hours and max_mb must be positive")
        self.ttl = ttl_hours * 3600.0
        self.now = now
        self.evict_interval = evict_interval if evict else float("inf")
        self.evicted = 0
        self._last_evict = float("-inf")
        self._evicts = evict
        # Stash bytes as the last eviction left them, plus what this process stashed since: past
        # the budget, the next write evicts without waiting for `evict_interval` (other processes
        # on the file count their own, and each evicts on its interval anyway).
        self._stash_bytes = 0
        self._stashed = 0
        self._db_at_evict = 0  # the database file's bytes when the last eviction ended
        self._facts_rows: int | None = None  # rows in `facts`, as this process counts them
        max_bytes = int(max_mb * 1024 * 1024)
        # What the stashes may hold until the next eviction: their share of `max_bytes`, or
        # less when the rest of the file needs the room (`evict`).
        self._stash_budget = stash_limits(max_bytes)[0]
        # (stash key, owner, tenant) -> when this process last refreshed its `last_used`
        self._touched: dict[tuple[str, str, str], float] = {}
        self.batch_delay = batch_delay
        self._batch = HeldWrites()  # bookings and clocks not yet committed (`batch_delay`)
        self._batch_since = 0.0  # `_clock()` when the first of them was booked
        self._clock: Callable[[], float] = time.monotonic  # the window's clock (tests set it)
        super().__init__(
            os.fspath(path), max_bytes=max_bytes, busy_timeout_ms=busy_timeout_ms, claim=claim
        )
        if evict:
            try:
                self.evict()
            except StoreError:
                self.close()
                raise

    @classmethod
    def from_config(
        cls,
        cfg: StoreConfig,
        path: str | None = None,
        now: Callable[[], float] = time.time,
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
    ) -> SqliteStore:
        """The store of a config's `store:` block; `path` (option `cg_db`) overrides its path."""
        return cls(
            path or cfg.path,
            ttl_hours=cfg.ttl_hours,
            max_mb=cfg.max_mb,
            now=now,
            busy_timeout_ms=busy_timeout_ms,
        )

    # -- what several instances share (the PostgreSQL store); one process needs none of it ----

    async def claim(self, conversation: str, based_on: str | None) -> bool:
        """Always True: one SQLite file serves one proxy, whose own in-flight set already
        keeps one summary per conversation."""
        return True

    def release(self, conversation: str) -> None:
        """Nothing to give up (`claim`)."""

    async def settle(self) -> None:
        """Nothing to wait for: SQLite writes synchronously."""

    def describe(self) -> dict[str, Any]:
        """What `/_cg/health` shows of the engine (never a credential)."""
        return {"engine": "sqlite", "path": self.path}

    def _maybe_evict(self) -> None:
        if not self._evicts:
            return
        over = self._stash_bytes + self._stashed > self._stash_budget
        # The rest of the file grew (checkpoints, the ledger, facts): the stashes' room is
        # measured again once the database has grown by a fiftieth of the cap.
        grown = self._db_bytes() > self._db_at_evict + self.max_bytes // 50
        if over or grown or self.now() - self._last_evict >= self.evict_interval:
            self.evict()

    def __enter__(self) -> SqliteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- stashes ----------------------------------------------------------------------------

    @property
    def max_stash_bytes(self) -> int:
        """The largest span one stash may hold (`policy.max_stash_bytes`)."""
        return max_stash_bytes(self.max_bytes)

    def put_stash(
        self,
        key: str,
        session: str,
        span_sources: Sequence[str],
        dialect: str,
        tenant: str = ANONYMOUS,
    ) -> None:
        """Stash a span under `key` for `session` and `tenant`; putting it again only refreshes
        `last_used`. A span over `max_stash_bytes` is refused (ValueError)."""
        span = checked_span(key, span_sources, self.max_stash_bytes)
        t = self.now()
        self._forget_reads()
        with self._tx("put_stash") as conn:
            conn.execute(
                Q.stash_put,
                (key, session, t, t, len(span), dialect, len(span_sources), span, tenant),
            )
        self._stashed += len(span)
        self._maybe_evict()

    def get_stash(
        self, key: str, session: str | None = None, tenant: str | None = None
    ) -> Stash | None:
        """The stash under `key` (owned by `session`, and readable by `tenant`, when given: the
        tenant's own before an unbound one), marked used; None if absent. A store that cannot
        be written (full, read-only, locked) still reads it back: marking it used is best
        effort."""
        if not valid_key(key):
            return None
        t = self.now()
        where, args = stash_filter(key, session, tenant, "?")
        with self._op("get_stash") as conn:
            row = conn.execute(
                f"SELECT {STASH_COLS} FROM stashes WHERE {where} ORDER BY {stash_order(tenant)} "
                "LIMIT 1",
                args,
            ).fetchone()
        if row is None:
            return None
        with suppress(StoreError), self._tx("get_stash: mark used") as conn:
            conn.execute(Q.stash_used, (t, row[0], row[1], row[8]))
        return stash_of(row, t)

    def has_stash(self, key: str, session: str | None = None, tenant: str | None = None) -> bool:
        """Whether `key` resolves (for `session`, and `tenant`, when given); does not mark it
        used."""
        if not valid_key(key):
            return False
        with self._op("has_stash") as conn:
            reads = self._current_reads(conn)
            known = reads.get(("stash", key, session, tenant), _UNREAD)
            if known is _UNREAD:
                where, args = stash_filter(key, session, tenant, "?")
                row = conn.execute(f"SELECT 1 FROM stashes WHERE {where} LIMIT 1", args).fetchone()
                known = reads[("stash", key, session, tenant)] = row is not None
        return bool(known)

    def delete_stash(self, key: str, session: str | None = None) -> int:
        self._forget_reads()
        with self._tx("delete_stash") as conn:
            if session is None:
                cur = conn.execute(Q.stash_delete, (key,))
            else:
                cur = conn.execute(Q.stash_delete_of, (key, session))
        return cur.rowcount

    # -- per-message facts --------------------------------------------------------------------

    def get_facts(self, raws: Sequence[bytes]) -> dict[bytes, FactRow]:
        """The stored facts of the messages whose raw digests are `raws` (those known)."""
        out: dict[bytes, FactRow] = {}
        with self._op("get_facts") as conn:
            for i in range(0, len(raws), FACTS_BATCH):
                part = list(raws[i : i + FACTS_BATCH])
                marks = ",".join("?" * len(part))
                for raw, digest, tokens, outputs, flags in conn.execute(
                    f"SELECT raw, digest, tokens, outputs, flags FROM facts WHERE raw IN ({marks})",
                    part,
                ):
                    out[raw] = fact_row(raw, digest, tokens, outputs, flags)
        return out

    def put_facts(self, rows: Sequence[FactRow]) -> None:
        """Remember messages' facts (a message already known keeps its row)."""
        if not rows:
            return
        t = self.now()
        with self._tx("put_facts") as conn:
            cur = conn.executemany(Q.facts_put, fact_params(rows, t))
            if self._facts_rows is None:
                self._facts_rows = int(conn.execute("SELECT COUNT(*) FROM facts").fetchone()[0])
            else:
                self._facts_rows += max(cur.rowcount, 0)
            # The cache's cap, kept as it fills: the oldest rows go a few at a time. Their keys
            # are random, so each deleted row rewrites a page of its own: the whole overflow
            # deleted at once would put as many pages into the WAL at once.
            over = self._facts_rows - facts_cap(self.max_bytes)
            if over >= FACTS_TRIM:
                gone = conn.execute(
                    "DELETE FROM facts WHERE raw IN (SELECT raw FROM facts ORDER BY seen LIMIT ?)",
                    (over,),
                ).rowcount
                self._facts_rows -= max(gone, 0)
        self._maybe_evict()

    # -- checkpoints ------------------------------------------------------------------------

    def put_checkpoint(self, cp: Checkpoint) -> Checkpoint:
        """Create or replace the session's checkpoint; returns it with its times stamped.

        `created` is kept from the checkpoint being replaced; `updated` is now.
        """
        t = self.now()
        self._forget_reads()
        with self._tx("put_checkpoint") as conn:
            row = conn.execute(
                "SELECT created FROM checkpoints WHERE session = ?", (cp.session,)
            ).fetchone()
            created = row[0] if row else t
            conn.execute(_CP_REPLACE, checkpoint_params(cp, created, t))
        self._maybe_evict()
        return stamped(cp, created, t)

    def get_checkpoint(self, session: str, tenant: str | None = None) -> Checkpoint | None:
        """The conversation's checkpoint (`session`: its key), when `tenant` (if given) may
        read it. Reading it marks its stash used, so a live checkpoint's marker keeps resolving
        while older stashes are evicted first."""
        t = self.now()
        with self._op("get_checkpoint") as conn:
            reads = self._current_reads(conn)
            known = reads.get(("checkpoint", session), _UNREAD)
            if known is _UNREAD:
                row = conn.execute(Q.checkpoint, (session,)).fetchone()
                known = reads[("checkpoint", session)] = None if row is None else checkpoint_of(row)
        if known is None:
            return None
        cp: Checkpoint = known
        if tenant is not None and not readable(cp.tenant, tenant):
            return None
        k = (cp.key or "", owner(session), cp.tenant)
        # At most once a minute (the row holds the blob, and SQLite rewrites it whole), and only
        # then a write transaction: a reuse turn within the minute reads without the write lock.
        # Asked once a minute whether or not it was due, so a stash written less than a minute
        # ago is not asked again on every turn until it is.
        if cp.key is not None and t - self._touched.get(k, float("-inf")) >= TOUCH_INTERVAL:
            with self._tx("get_checkpoint") as conn:
                conn.execute(Q.stash_touch, (t, cp.key, k[1], k[2], t - TOUCH_INTERVAL))
            if len(self._touched) > TOUCHED_MAX:
                self._touched.clear()
            self._touched[k] = t
        return cp

    def conversation_checkpoints(self, base: str) -> list[Checkpoint]:
        """Every tenant's checkpoint of one conversation: `base` is its key without a tenant
        (`session#first`), the others `base@TENANT`. No tenant is checked here: the caller
        reads only one whose request holds every message its summary was made from (the
        summarize component's handover). One index range; remembered as `get_checkpoint` is."""
        with self._op("conversation_checkpoints") as conn:
            reads = self._current_reads(conn)
            known = reads.get(("conversation", base), _UNREAD)
            if known is _UNREAD:
                rows = conn.execute(
                    f"SELECT {CP_COLS} FROM checkpoints WHERE session = ? "
                    "OR (session >= ? AND session < ?)",
                    (base, base + "@", base + "A"),  # ('A' follows '@')
                ).fetchall()
                known = reads[("conversation", base)] = [checkpoint_of(r) for r in rows]
        return list(known)

    def checkpoints_of(self, session: str) -> list[Checkpoint]:
        """Every conversation's checkpoint under `session` (keys `session` or `session#…`)."""
        with self._op("checkpoints_of") as conn:
            rows = conn.execute(Q.checkpoints_of, (session,)).fetchall()
        return [checkpoint_of(r) for r in rows]

    def delete_checkpoint(self, session: str) -> bool:
        self._forget_reads()
        with self._tx("delete_checkpoint") as conn:
            cur = conn.execute(Q.checkpoint_delete, (session,))
        return cur.rowcount > 0

    # -- sessions ---------------------------------------------------------------------------

    def touch_session(
        self, session: str, now: float | None = None, cache_ttl: float | None = None
    ) -> SessionRecord | None:
        """Record a request of `session` at `now`; returns the record it replaces (None when the
        session is seen for the first time), so the caller can judge the cache state. With
        `batch_delay` > 0 the clock is held and committed with the ledger's bookings (every
        read of it here sees the held one)."""
        t = self.now() if now is None else now
        if self.batch_delay <= 0:
            with self._tx("touch_session") as conn:
                row = conn.execute(Q.clock, (session,)).fetchone()
                conn.execute(Q.clock_upsert, (session, t, cache_ttl))
            return SessionRecord(session, row[0], row[1]) if row else None
        prev = self.get_session(session)
        self._hold(HeldWrites.clock, session, t, cache_ttl)
        return prev

    def get_session(self, session: str) -> SessionRecord | None:
        held = self._batch.clocks.get(session)
        if held is not None:
            return SessionRecord(session, held[0], held[1])
        with self._op("get_session") as conn:
            row = conn.execute(Q.clock, (session,)).fetchone()
        return SessionRecord(session, row[0], row[1]) if row else None

    def last_request(self, session: str) -> float | None:
        rec = self.get_session(session)
        return rec.last_request if rec else None

    def sessions(self) -> list[SessionInfo]:
        """Every session the store knows of, most recently seen first: the CLI's full read
        (offline; the whole of four tables, where the control answers read pages by key:
        `session_page`). A session's conversations (checkpoint keys `session#…`) are one
        session; its newest checkpoint is the one reported, found by `checkpoints_owner`
        (`+ids.session`: without affinity, as the index's expression, or no index serves the
        comparison and each session scans every checkpoint)."""
        self._flushed()
        with self._op("sessions") as conn:
            rows = conn.execute(
                f"""
                WITH ids AS (
                    SELECT session FROM sessions
                    UNION SELECT {_OWNER} FROM checkpoints
                    UNION SELECT session FROM stashes
                    UNION SELECT session FROM ledger
                ), st AS (
                    SELECT session, COUNT(*) AS n, SUM(size) AS bytes, MAX(last_used) AS used
                    FROM stashes GROUP BY session
                ), one AS (
                    SELECT ids.session, s.last_request, s.cache_ttl,
                           (SELECT rowid FROM checkpoints WHERE {_OWNER} = +ids.session
                            ORDER BY updated DESC LIMIT 1) AS newest,
                           COALESCE(st.n, 0) AS n, COALESCE(st.bytes, 0) AS bytes, st.used,
                           l.last_seen
                    FROM ids
                    LEFT JOIN sessions s ON s.session = ids.session
                    LEFT JOIN st ON st.session = ids.session
                    LEFT JOIN ledger l ON l.session = ids.session
                )
                SELECT one.session, one.last_request, one.cache_ttl, c.updated, c.covered_count,
                       one.n, one.bytes,
                       MAX(COALESCE(one.last_request, 0), COALESCE(c.updated, 0),
                           COALESCE(one.used, 0), COALESCE(one.last_seen, 0)) AS seen
                FROM one LEFT JOIN checkpoints c ON c.rowid = one.newest
                ORDER BY seen DESC, one.session
                """
            ).fetchall()
        return [
            SessionInfo(r[0], r[1], r[2], r[3], r[4], r[5], r[6], last_seen=r[7] or None)
            for r in rows
        ]

    # -- the session list, a page at a time (the control answers; `_view`) ------------------

    def session_page(self, limit: int, after: PageKey | None = None) -> list[SessionDetail]:
        """Up to `limit` sessions of the ledger, most recently booked first (`last_seen`, then
        the id, both descending), from just after `after` (the `key` of the previous page's
        last one). Keyset, not an offset: a session booked again while someone pages moves to
        the top, and no other one is skipped or shown twice for it."""
        with self._view("session_page") as conn:
            rows = conn.execute(Q.page, (*(after or PAGE_START), limit)).fetchall()
            return self._details(conn, [(r[0], turns_of(r[1:])) for r in rows])

    def session_details(self, sessions: Sequence[str]) -> list[SessionDetail]:
        """The same for the sessions named, in that order (one with no ledger row has zero
        counters)."""
        with self._view("session_details") as conn:
            turns: dict[str, LedgerTurns] = {}
            for part in _batches(sessions):
                marks = ",".join("?" * len(part))
                for r in conn.execute(f"{Q.ledger_rows} WHERE session IN ({marks})", part):
                    turns[r[0]] = turns_of(r[1:])
            return self._details(conn, [(s, turns.get(s, NO_TURNS)) for s in sessions])

    def _details(
        self, conn: sqlite3.Connection, listed: list[tuple[str, LedgerTurns]]
    ) -> list[SessionDetail]:
        """Each listed session's newest checkpoint, count and usage rows, all by index (the
        owner index of `checkpoints`, the primary key of `usage`)."""
        usage: dict[str, list[UsageRow]] = {}
        for part in _batches([s for s, _ in listed]):
            marks = ",".join("?" * len(part))
            for r in conn.execute(f"{Q.usage_rows} WHERE session IN ({marks})", part):
                usage.setdefault(r[0], []).append(usage_row(r))
        out: list[SessionDetail] = []
        for session, turns in listed:
            row = conn.execute(_NEWEST_CP_SQL, (session,)).fetchone()
            n = 0 if row is None else conn.execute(_COUNT_CP_SQL, (session,)).fetchone()[0]
            cp = None if row is None else checkpoint_of(row)
            out.append(SessionDetail(session, turns, cp, int(n), tuple(usage.get(session, ()))))
        return out

    def usage_totals(self) -> list[UsageRow]:
        """The whole ledger's usage summed in the database, one row per (kind, model, tier)
        (session ""): what `/_cg/stats` prices."""
        with self._view("usage_totals") as conn:
            rows = conn.execute(Q.usage_totals).fetchall()
        return [usage_row(("", *r)) for r in rows]

    def ledger_totals(self) -> LedgerTurns:
        """Every session's turn counters summed in the database (`last_seen` the latest)."""
        with self._view("ledger_totals") as conn:
            row = conn.execute(Q.ledger_totals).fetchone()
        return turns_of(row)

    # -- the usage ledger --------------------------------------------------------------------

    def record_usage(
        self,
        session: str,
        rows: Sequence[tuple[str, str, str, Usage]],
        turns: LedgerTurns | None = None,
        cache_state: CacheState | None = None,
    ) -> None:
        """Add `(kind, model, tier, usage)` rows to `session`'s ledger, and `turns` to its
        counters (`cache_state`, when given, replaces the stored one: JSON, or a callable that
        writes it when committed), all in one transaction.

        With `batch_delay` > 0 the rows are held (`cg.state.pending`) and committed with every
        other turn booked within that many seconds, by the first call after it has passed or by
        `flush_held` (the addon's timer, any read of the ledger, `close`). A crash loses at most
        that window of bookings; a failed commit keeps them held for the next (StoreError is
        raised all the same, for the caller to count)."""
        check_kinds(rows)
        d = turns or NO_TURNS
        counts = (d.turns, d.rewritten, d.tokens_not_sent, d.estimate_skipped)
        self._hold(HeldWrites.add, session, rows, counts, cache_state, self.now())

    def _hold(self, write: Callable[[HeldWrites, *Ts], None], *args: *Ts) -> None:
        """Add a write (`write(batch, *args)`, a `HeldWrites` method: no closure made per
        booking) to the held batch; commit the batch once its window has passed (at once
        without a `batch_delay`)."""
        with self._lock:
            if not self._batch:
                self._batch_since = self._clock()
            write(self._batch, *args)
            due = self._clock() - self._batch_since >= self.batch_delay
        if due:
            self._commit_held()
            self._maybe_evict()

    def held(self) -> bool:
        """Whether ledger rows or session clocks wait for `flush_held`."""
        return bool(self._batch)

    def flush_held(self) -> None:
        """Commit the ledger rows and session clocks held (`batch_delay`). Raises StoreError
        (they stay held). No eviction follows: a commission's request hook calls this, and the
        next write due evicts as ever."""
        if self._batch:
            self._commit_held()

    def _commit_held(self) -> None:
        taken: HeldWrites | None = None
        try:
            with self._tx("commit held writes") as conn:
                taken, self._batch = self._batch, HeldWrites()  # under the lock `_tx` holds
                conn.executemany(Q.usage_upsert, taken.usage_params())
                conn.executemany(Q.ledger_upsert, taken.ledger_params())
                conn.executemany(Q.clock_upsert, taken.clock_params())
        except StoreError:
            if taken is not None:
                with self._lock:
                    taken.absorb(self._batch)
                    # A store that keeps failing must not hold an unbounded batch.
                    self._batch = taken if len(taken) <= HELD_ROWS_MAX else HeldWrites()
            raise

    def _flushed(self) -> None:
        """Before a read of the ledger or the sessions table: what this process booked is in it
        (a store that cannot take the write is read as it stands)."""
        if self._batch:
            with suppress(StoreError):
                self._commit_held()

    def usage_rows(self, session: str | None = None) -> list[UsageRow]:
        """The ledger's rows (one session's, when given), in a stable order."""
        sql, args = (Q.usage_rows, ()) if session is None else (Q.usage_rows_of, (session,))
        self._flushed()
        with self._op("usage_rows") as conn:
            rows = conn.execute(sql + Q.usage_order, args).fetchall()
        return [usage_row(r) for r in rows]

    def ledger_turns(self, session: str | None = None) -> dict[str, LedgerTurns]:
        """Each session's turn counters (one session's, when given)."""
        sql, args = (Q.ledger_rows, ()) if session is None else (Q.ledger_rows_of, (session,))
        self._flushed()
        with self._op("ledger_turns") as conn:
            rows = conn.execute(sql, args).fetchall()
        return {r[0]: turns_of(r[1:]) for r in rows}

    def record_plan(self, session: str, plan: str, limits: str | None) -> None:
        """Label `session` with the plan that pays for it, and its latest rate-limit readings
        (`limits`, JSON; None keeps the stored ones). Committed at once: a subscription
        session's turn, not every turn."""
        with self._tx("record_plan") as conn:
            conn.execute(Q.plan_upsert, (session, self.now(), plan, limits))

    def plans(self, session: str | None = None) -> dict[str, tuple[str, str | None]]:
        """session -> (plan, rate-limit readings) of every labelled session (or one)."""
        sql, args = (Q.plans, ()) if session is None else (Q.plans_of, (session,))
        with self._op("plans") as conn:
            rows = conn.execute(sql, args).fetchall()
        return {r[0]: (r[1], r[2]) for r in rows}

    def cache_state(self, session: str) -> str | None:
        """The estimate's prompt-cache entries last stored for `session` (JSON), or None."""
        held = self._batch.cache_state(session)
        if held is not None:
            return held
        with self._op("cache_state") as conn:
            row = conn.execute(Q.cache_state, (session,)).fetchone()
        return row[0] if row else None

    # -- bounds -----------------------------------------------------------------------------

    def stats(self) -> StoreStats:
        self._flushed()
        with self._op("stats") as conn:
            n, total = conn.execute(Q.stash_count).fetchone()
            cps = conn.execute(Q.checkpoint_count).fetchone()[0]
            sess = conn.execute(Q.session_count).fetchone()[0]
        file_bytes = 0
        if self.persistent:
            for suffix in ("", "-wal", "-shm"):
                with suppress(OSError):
                    file_bytes += os.path.getsize(self.path + suffix)
        return StoreStats(
            self.path, self.persistent, self.journal_mode, n, total, cps, sess, file_bytes,
            self.ttl / 3600.0, self.max_bytes / (1024 * 1024), self.evicted,
        )  # fmt: skip

    def _quota_victims(
        self, conn: sqlite3.Connection, cutoff: float, total: int, target: int
    ) -> tuple[list[StashRow], int]:
        """The live stashes that go to bring their `total` bytes within `target`
        (`policy.quota_victims`). The sums per session and tenant come from the
        `stashes_session` index alone; rows are read only for the groups over their quota,
        least recently used first, and no further than their excess (a cursor)."""
        usage = {(tn, s): int(n) for s, tn, n in conn.execute(Q.group_bytes, (cutoff,))}

        def rows_of(session: str, tenant: str) -> sqlite3.Cursor:
            return conn.execute(_GROUP_ROWS, (session, tenant, cutoff))

        return quota_victims(usage, total, target, rows_of)

    def evict(self) -> EvictResult:
        """Drop what outlived the TTL, then, over the size cap, the stashes of the sessions
        over their quota (`policy.quotas`): another session's stashes, within theirs, are not touched.

        Stashes are deleted after the rest, in runs of half a WAL share each, every run after a
        checkpoint that cuts the WAL back to nothing: SQLite as Debian builds it has
        `secure_delete` on, so a deleted stash's bytes are overwritten through the WAL, and one
        transaction for all of it, on top of the WAL the writes before had left, would take the
        files over `max_mb`."""
        self._flushed()  # a session's held clock keeps its checkpoint
        self._forget_reads()
        t = self.now()
        cutoff = t - self.ttl
        with self._tx("evict") as conn:
            cap = facts_cap(self.max_bytes)
            gone = expire(conn, Q, t, self.ttl, cap)
            cps, sess = gone.checkpoints, gone.sessions
            # (`put_facts` trims the facts as it writes; this is for rows other processes
            # wrote, after which exactly the cap is left: this process's count is right again)
            if gone.facts_over > 0:
                self._facts_rows = cap
            elif self._facts_rows is not None:
                self._facts_rows -= max(gone.facts_aged, 0)
            # The sums come from the `stashes_lru` index (last_used, size) alone; rows are read
            # only for the stashes that go (each row is on a page of its own, beside its span,
            # and this runs on the event loop).
            stashed, total = conn.execute(
                "SELECT COALESCE(SUM(size), 0), "
                "COALESCE(SUM(CASE WHEN last_used >= ? THEN size ELSE 0 END), 0) FROM stashes",
                (cutoff,),
            ).fetchone()
            stashed, total = int(stashed), int(total)
            stale: list[StashRow] = [
                (k, s, tn, int(n))
                for k, s, tn, n in conn.execute(
                    "SELECT key, session, tenant, size FROM stashes WHERE last_used < ? "
                    "ORDER BY last_used, created",
                    (cutoff,),
                )
            ]
            budget, target = stash_limits(self.max_bytes)
            if self.persistent and self.max_bytes >= ROOM_MIN_BYTES:
                # The rest of the file (ledger, checkpoints, facts, sessions) grows with the
                # sessions seen; stashes, the part that can go, make room for it. The database
                # may take the cap less the WAL's share and its 32 KiB index; the stashes get
                # what the rest leaves of 90% of that, until the next eviction measures again
                # (`_stash_budget`). The file grows only when its pages are all in use, so
                # bounding what is live bounds the file (evicting only once the file had grown
                # would let the stashes refill their whole share each time, and the file
                # ratchet up by a fiftieth of the cap per eviction).
                page = conn.execute("PRAGMA page_size").fetchone()[0]
                pages = conn.execute("PRAGMA page_count").fetchone()[0]
                free = conn.execute("PRAGMA freelist_count").fetchone()[0]
                allowed = self.max_bytes - self._wal_limit() - SHM_BYTES
                rest = max(0, (pages - free) * page - stashed)
                room = max(0, int(allowed * ROOM_SHARE) - rest)
                budget = min(budget, room)
                target = min(target, int(budget * EVICT_TO))
            victims: list[StashRow] = []
            if total > budget:
                victims, total = self._quota_victims(conn, cutoff, total, target)
        expired, lru = len(stale), len(victims)
        for chunk in chunks(stale + victims, self._wal_limit() // 2):
            self._checkpoint()
            with suppress(StoreError), self._tx("evict: stashes") as conn:
                conn.executemany(Q.stash_delete_row, chunk)
        self._last_evict = t
        self._stash_bytes, self._stashed = int(total), 0
        self._stash_budget = budget
        if lru or expired or cps or sess:
            self._checkpoint()
        self._db_at_evict = self._db_bytes()
        self._forget_reads()  # and after: nothing read between the runs outlives them
        result = EvictResult(expired, lru, cps, sess)
        self.evicted += result.expired_stashes + result.lru_stashes
        return result
