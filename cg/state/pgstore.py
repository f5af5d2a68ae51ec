"""The PostgreSQL store: one memory shared by several proxies (`store.url: postgresql://…`).

Why it exists: behind a load balancer a session's turns land on any instance, so every instance
must see the same checkpoints, stashes, session clocks and ledger, and must re-emit the
byte-identical summary (anything else misses the provider's prompt cache). `PgStore` has the
SQLite store's interface (`cg.state.interface.Store`) and semantics; what differs is how it keeps
the network off the hot path (its plumbing, `cg.state.pgconn.PgBase`). The design, with its failure
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
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Any

from cg.state.interface import Store
from cg.state.pending import CacheState, cache_state_json
from cg.state.pgconn import CACHE_MAX, CHANNEL, CONNECT_TIMEOUT, LEASE_SECONDS, Op, PgBase
from cg.state.policy import (
    TOUCH_INTERVAL,
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
from cg.state.records import redact_url as redact_url
from cg.state.sql import (
    CP_COLS,
    FACTS_BATCH,
    PG,
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
    usage_params,
    usage_row,
)
from cg.state.tenant import ANONYMOUS, UNBOUND, readable
from cg.wire.usage import Usage

Q = PG
_EVICT_LOCK = 0x63675F657663  # pg_advisory_xact_lock key of an eviction ("cg_evc")
_OWNER = Q.dialect.owner
_DB_NOW = "extract(epoch from clock_timestamp())::double precision"
# Per listed session, in one round trip: its checkpoints' count and its newest checkpoint.
_CP_UPSERT = (
    f"INSERT INTO cg_checkpoints ({CP_COLS}) VALUES ({', '.join(['%s'] * 11)}) "
    "ON CONFLICT (session) DO UPDATE SET summary = excluded.summary, "
    "head_count = excluded.head_count, covered_count = excluded.covered_count, "
    "covered_hash = excluded.covered_hash, key = excluded.key, "
    "message = excluded.message, updated = excluded.updated, meta = excluded.meta, "
    "tenant = excluded.tenant, version = cg_checkpoints.version + 1"
)
_CLOCK_NOTIFY = f"WITH up AS ({Q.clock_upsert} RETURNING 1) SELECT pg_notify(%s, %s) FROM up"
_CONVERSATION_SQL = f"SELECT {CP_COLS} FROM cg_checkpoints WHERE {_OWNER} = %s"
_STALE_DELETE = "DELETE FROM cg_stashes WHERE last_used < %s"
# One quota group's stashes (the stale ones are gone by then), least recently used first.
_GROUP_ROWS = (
    "SELECT key, size, EXISTS (SELECT 1 FROM cg_checkpoints c WHERE c.key = s.key), "
    "last_used FROM cg_stashes s WHERE session = %s AND tenant = %s ORDER BY last_used, created"
)
_NEWEST_CP_SQL = f"""
SELECT o.s, n.n, c.* FROM unnest(%s::text[]) AS o(s)
CROSS JOIN LATERAL (SELECT count(*) FROM cg_checkpoints WHERE {_OWNER} = o.s) AS n(n)
JOIN LATERAL (
    SELECT {CP_COLS} FROM cg_checkpoints WHERE {_OWNER} = o.s ORDER BY updated DESC LIMIT 1
) AS c ON true
"""


class PgStore(PgBase, Store):
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
        self.ttl = ttl_hours * 3600.0
        self.max_bytes = int(max_mb * 1024 * 1024)
        self.now = now
        self.evict_interval = evict_interval if evict else float("inf")
        self.evicted = 0
        self._last_evict = float("-inf")
        self.batch_delay = 0.0  # SQLite's; every write here is queued for the writer at once
        self.instance = uuid.uuid4().hex
        self.lease = lease_seconds
        self._touched: dict[tuple[str, str, str], float] = {}
        super().__init__(url, connect_timeout)
        if evict:
            try:
                self.evict()
            except StoreError:
                self.close()
                raise

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

    def __enter__(self) -> PgStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def max_stash_bytes(self) -> int:
        """The largest span one stash may hold (`policy.max_stash_bytes`)."""
        return max_stash_bytes(self.max_bytes)

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
        self._submit(Op(run, "claim", fut, retry=False))
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
            Op(
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
            Op(
                lambda conn: conn.execute(
                    Q.stash_put, (key, session, t, t, len(span), dialect, n, span, tenant)
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
        where, args = stash_filter(key, session, tenant, "%s")
        with self._read("get_stash") as conn:
            row = conn.execute(
                f"SELECT {STASH_COLS} FROM cg_stashes WHERE {where} "
                f"ORDER BY {stash_order(tenant)} LIMIT 1",
                args,
            ).fetchone()
        if row is None:
            return None
        k, s, tn = row[0], row[1], row[8]
        with suppress(StoreError):
            self._submit(
                Op(
                    lambda conn: conn.execute(Q.stash_used, (t, k, s, tn)),
                    "get_stash: mark used",
                    mode="single",
                )
            )
        return stash_of(row, t)

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
        where, args = stash_filter(key, session, tenant, "%s")
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
                cur = conn.execute(Q.stash_delete, (key,))
            else:
                cur = conn.execute(Q.stash_delete_of, (key, session))
            conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"x {key} {session or ''}"))
            return int(cur.rowcount)

        with self.cache.lock:
            for k in [k for k in self.cache.stashes if k[0] == key and session in (None, k[1])]:
                self.cache.stashes.pop(k, None)
        return int(self._call(run, "delete_stash"))

    # -- checkpoints --------------------------------------------------------------------------

    def put_checkpoint(self, cp: Checkpoint) -> Checkpoint:
        t = self.now()
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
            conn.execute(_CP_UPSERT, checkpoint_params(cp, created, t))
            conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"c {conv}"))

        self._submit(Op(run, "put_checkpoint", mode="pipeline"))
        out = stamped(cp, created, t)
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
            Op(
                lambda conn: conn.execute(Q.stash_touch, (t, k[0], k[1], k[2], t - TOUCH_INTERVAL)),
                "get_checkpoint: mark used",
                mode="single",
            )
        )

    def _load_checkpoint(self, session: str) -> Checkpoint | None:
        with self._read("get_checkpoint") as conn:
            row = conn.execute(Q.checkpoint, (session,)).fetchone()
        return checkpoint_of(row) if row is not None else None

    def get_checkpoint(self, session: str, tenant: str | None = None) -> Checkpoint | None:
        t = self.now()
        cp = self._read_through(self.cache.cps, session, self._load_checkpoint)
        if cp is None or (tenant is not None and not readable(cp.tenant, tenant)):
            return None
        self._touch_stash(cp, t)
        return cp

    def _load_conversation(self, base: str) -> list[Checkpoint]:
        with self._read("conversation_checkpoints") as conn:
            rows = conn.execute(_CONVERSATION_SQL, (owner(base),)).fetchall()
        mine = [checkpoint_of(r) for r in rows]
        return [cp for cp in mine if cp.session.split("@", 1)[0] == base]

    def conversation_checkpoints(self, base: str) -> list[Checkpoint]:
        """As SQLite's: every tenant's checkpoint of one conversation, found by the owner index
        and kept in the local cache (a notice of any of its checkpoints drops the entry)."""
        return list(self._read_through(self.cache.convs, base, self._load_conversation))

    def checkpoints_of(self, session: str) -> list[Checkpoint]:
        self._drain()
        with self._read("checkpoints_of") as conn:
            rows = conn.execute(Q.checkpoints_of, (session,)).fetchall()
        return [checkpoint_of(r) for r in rows]

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
            conn.execute(Q.checkpoint_delete, (session,))
            conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"c {session}"))

        self._submit(Op(run, "delete_checkpoint", mode="pipeline"))
        with c.lock:
            c.gen += 1
            c.convs.pop(session.split("@", 1)[0], None)
            if c.live:
                c.cps.put(session, None)
        return True

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
                    out[bytes(raw)] = fact_row(raw, digest, tokens, outputs, flags)
        return out

    def put_facts(self, rows: Sequence[FactRow]) -> None:
        """Queued to the writer (off the hot path); a message already known keeps its row."""
        if not rows:
            return
        t = self.now()
        params = fact_params(rows, t)

        def run(conn: Any) -> None:
            with conn.cursor() as cur:
                cur.executemany(Q.facts_put, params)

        self._submit(Op(run, "put_facts", mode="pipeline"))

    def touch_session(
        self, session: str, now: float | None = None, cache_ttl: float | None = None
    ) -> SessionRecord | None:
        t = self.now() if now is None else now
        prev = self.get_session(session)

        ttl = "-" if cache_ttl is None else repr(float(cache_ttl))
        notice = f"s {t!r} {ttl} {session}"

        def run(conn: Any) -> None:
            # One statement, autocommitted: the notice goes out with its commit.
            conn.execute(_CLOCK_NOTIFY, (session, t, cache_ttl, CHANNEL, notice))

        self._submit(Op(run, "touch_session", mode="single"))
        c = self.cache
        with c.lock:
            c.gen += 1
            if c.live:
                c.sessions.put(session, SessionRecord(session, t, cache_ttl))
        return prev

    def _load_session(self, session: str) -> SessionRecord | None:
        with self._read("get_session") as conn:
            row = conn.execute(Q.clock, (session,)).fetchone()
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
            rows = conn.execute(Q.page, (*(after or PAGE_START), limit)).fetchall()
            return self._details(conn, [(r[0], turns_of(r[1:])) for r in rows])

    def session_details(self, sessions: Sequence[str]) -> list[SessionDetail]:
        ids = list(sessions)
        if not ids:
            return []
        with self._view("session_details") as conn:
            rows = conn.execute(f"{Q.ledger_rows} WHERE session = ANY(%s)", (ids,)).fetchall()
            turns = {r[0]: turns_of(r[1:]) for r in rows}
            return self._details(conn, [(s, turns.get(s, NO_TURNS)) for s in ids])

    def _details(self, conn: Any, listed: list[tuple[str, LedgerTurns]]) -> list[SessionDetail]:
        """Each listed session's newest checkpoint, count and usage rows: two round trips,
        by index (`cg_checkpoints_owner`, the primary key of `cg_usage`)."""
        ids = [s for s, _ in listed]
        if not ids:
            return []
        usage: dict[str, list[UsageRow]] = {}
        for r in conn.execute(f"{Q.usage_rows} WHERE session = ANY(%s)", (ids,)).fetchall():
            usage.setdefault(r[0], []).append(usage_row(r))
        newest = {r[0]: (checkpoint_of(r[2:]), int(r[1])) for r in conn.execute(
            _NEWEST_CP_SQL, (ids,)
        ).fetchall()}  # fmt: skip
        out: list[SessionDetail] = []
        for session, turns in listed:
            cp, n = newest.get(session, (None, 0))
            out.append(SessionDetail(session, turns, cp, n, tuple(usage.get(session, ()))))
        return out

    def usage_totals(self) -> list[UsageRow]:
        with self._view("usage_totals") as conn:
            rows = conn.execute(Q.usage_totals).fetchall()
        return [usage_row(("", *r)) for r in rows]

    def ledger_totals(self) -> LedgerTurns:
        with self._view("ledger_totals") as conn:
            row = conn.execute(Q.ledger_totals).fetchone()
        return turns_of(row)

    # -- the usage ledger ---------------------------------------------------------------------

    def record_usage(
        self,
        session: str,
        rows: Sequence[tuple[str, str, str, Usage]],
        turns: LedgerTurns | None = None,
        cache_state: CacheState | None = None,
    ) -> None:
        check_kinds(rows)
        t = self.now()
        params = usage_params(session, rows, t)
        d = turns or NO_TURNS
        counts = (session, d.turns, d.rewritten, d.tokens_not_sent, d.estimate_skipped)
        state = cache_state_json(cache_state)  # as of this answer

        def run(conn: Any) -> None:
            for row in params:
                conn.execute(Q.usage_upsert, row)
            conn.execute(Q.ledger_upsert, (*counts, state, t))

        self._submit(Op(run, "record_usage", mode="pipeline"))

    def held(self) -> bool:
        """Nothing is held back here: every booking is queued for the writer thread at once
        (`batch_delay` is SQLite's, whose commit is on the hot path)."""
        return False

    def flush_held(self) -> None:
        """Bookings are the writer's already (`flush` waits for them to commit)."""

    def usage_rows(self, session: str | None = None) -> list[UsageRow]:
        self._drain()
        sql, args = (Q.usage_rows, ()) if session is None else (Q.usage_rows_of, (session,))
        with self._read("usage_rows") as conn:
            rows = conn.execute(sql + Q.usage_order, args).fetchall()
        return [usage_row(r) for r in rows]

    def ledger_turns(self, session: str | None = None) -> dict[str, LedgerTurns]:
        self._drain()
        sql, args = (Q.ledger_rows, ()) if session is None else (Q.ledger_rows_of, (session,))
        with self._read("ledger_turns") as conn:
            rows = conn.execute(sql, args).fetchall()
        return {r[0]: turns_of(r[1:]) for r in rows}

    def record_plan(self, session: str, plan: str, limits: str | None) -> None:
        """Queued to the writer, as every booking is."""
        t = self.now()

        def run(conn: Any) -> None:
            conn.execute(Q.plan_upsert, (session, t, plan, limits))

        self._submit(Op(run, "record_plan", mode="pipeline"))

    def plans(self, session: str | None = None) -> dict[str, tuple[str, str | None]]:
        self._drain()
        sql, args = (Q.plans, ()) if session is None else (Q.plans_of, (session,))
        with self._read("plans") as conn:
            rows = conn.execute(sql, args).fetchall()
        return {r[0]: (r[1], r[2]) for r in rows}

    def cache_state(self, session: str) -> str | None:
        self._drain()
        with self._read("cache_state") as conn:
            row = conn.execute(Q.cache_state, (session,)).fetchone()
        return row[0] if row else None

    # -- bounds -------------------------------------------------------------------------------

    def stats(self) -> StoreStats:
        self._drain()
        with self._read("stats") as conn:
            n, total = conn.execute(Q.stash_count).fetchone()
            cps = conn.execute(Q.checkpoint_count).fetchone()[0]
            sess = conn.execute(Q.session_count).fetchone()[0]
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
        expired = conn.execute(_STALE_DELETE, (cutoff,)).rowcount
        gone = expire(conn, Q, t, self.ttl, facts_cap(self.max_bytes))
        cps, sess = gone.checkpoints, gone.sessions
        conn.execute(f"DELETE FROM cg_claims WHERE lease_until < {_DB_NOW} - 3600")
        total = int(conn.execute(Q.stash_count).fetchone()[1])
        lru = 0
        budget, target = stash_limits(self.max_bytes)
        if total > budget:
            usage = {(tn, s): int(n) for s, tn, n in conn.execute(Q.group_bytes, (cutoff,))}

            def rows_of(session: str, tenant: str) -> list[tuple[Any, ...]]:
                rows: list[tuple[Any, ...]] = conn.execute(
                    _GROUP_ROWS, (session, tenant)
                ).fetchall()
                return rows

            victims, _ = quota_victims(usage, total, target, rows_of)
            with conn.cursor() as cur:
                cur.executemany(Q.stash_delete_row, [(k, s, tn) for k, s, tn, _ in victims])
            lru = len(victims)
        result = EvictResult(expired, lru, cps, sess)
        if result.total:
            conn.execute("SELECT pg_notify(%s, 'e')", (CHANNEL,))
            self._notice("e")  # this instance too, before the caller reads again
        self._last_evict = t
        self.evicted += result.expired_stashes + result.lru_stashes
        return result

    def last_request(self, session: str) -> float | None:
        rec = self.get_session(session)
        return rec.last_request if rec else None
