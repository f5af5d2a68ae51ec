"""Every statement both engines run, written once, and the rows they read and write.

A `Dialect` is what differs between SQLite and PostgreSQL in these statements: the placeholder
(`?`, `%s`), the table prefix (none, `cg_`), the checkpoint owner's expression (the key's part
before `#`) and the form of an offset without a limit. `Statements(dialect)` renders them once,
at import (`SQLITE`, `PG`): an engine reads its own attributes, never formats SQL per turn.
What only one engine has (SQLite's pragmas and `rowid` joins, PostgreSQL's `pg_notify`,
advisory locks, `unnest`/`ANY` and `RETURNING`) is written in that engine's module.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from cg.state.policy import CACHE_STATE_CLEARED, CACHE_STATE_LIFE, ledger_cutoff
from cg.state.records import (
    USAGE_KINDS,
    Checkpoint,
    FactRow,
    LedgerTurns,
    Stash,
    UsageRow,
)
from cg.state.schema import PG_OWNER, SQLITE_OWNER
from cg.state.tenant import UNBOUND
from cg.wire.usage import Usage

TABLES = ("stashes", "checkpoints", "sessions", "usage", "ledger", "facts")
STASH_COLS = "key, session, created, last_used, size, dialect, count, span, tenant"
CP_COLS = (
    "session, summary, head_count, covered_count, covered_hash, key, message, created, "
    "updated, meta, tenant"
)
USAGE_COLS = (
    "input_tokens, cache_write_tokens, cache_write_1h_tokens, cache_read_tokens, "
    "output_tokens, requests"
)
LEDGER_COLS = "session, turns, rewritten, tokens_not_sent, estimate_skipped, last_seen"
FACTS_BATCH = 500  # raw digests per read (well under SQLite's bound on parameters)


@dataclass(frozen=True, slots=True)
class Dialect:
    name: str
    mark: str  # the placeholder
    prefix: str  # of every table name
    owner: str  # a checkpoint key's owner (`owner()`), as SQL over its `session` column
    offset: str  # rows from the `?`th on, without a limit

    def render(self, sql: str) -> str:
        """`sql` written with `{table}` names, `{owner}` and `?` placeholders, in this dialect."""
        names = {t: self.prefix + t for t in TABLES}
        out = sql.format(owner=self.owner, offset=self.offset, **names)
        return out.replace("?", self.mark) if self.mark != "?" else out


SQLITE_DIALECT = Dialect("sqlite", "?", "", SQLITE_OWNER, "LIMIT -1 OFFSET ?")
PG_DIALECT = Dialect("postgresql", "%s", "cg_", PG_OWNER, "OFFSET ?")

_SUMS = ", ".join(f"COALESCE(SUM({c.strip()}), 0)" for c in USAGE_COLS.split(","))
_ADDED = ", ".join(
    f"{c} = {{usage}}.{c} + excluded.{c}" for c in (x.strip() for x in USAGE_COLS.split(","))
)


class Statements:
    """The shared statements in one dialect (attributes named after what they do)."""

    def __init__(self, d: Dialect) -> None:
        r = d.render
        self.dialect = d
        self.usage_upsert = r(
            f"INSERT INTO {{usage}} (session, kind, model, tier, {USAGE_COLS}, updated) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            f"ON CONFLICT (session, kind, model, tier) DO UPDATE SET {_ADDED}, "
            "updated = excluded.updated"
        )
        self.ledger_upsert = r(
            "INSERT INTO {ledger} (session, turns, rewritten, tokens_not_sent, "
            "estimate_skipped, cache_state, last_seen) VALUES (?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (session) DO UPDATE SET turns = {ledger}.turns + excluded.turns, "
            "rewritten = {ledger}.rewritten + excluded.rewritten, "
            "tokens_not_sent = {ledger}.tokens_not_sent + excluded.tokens_not_sent, "
            "estimate_skipped = {ledger}.estimate_skipped + excluded.estimate_skipped, "
            "cache_state = COALESCE(excluded.cache_state, {ledger}.cache_state), "
            "last_seen = excluded.last_seen"
        )
        self.clock_upsert = r(
            "INSERT INTO {sessions} (session, last_request, cache_ttl) VALUES (?, ?, ?) "
            "ON CONFLICT (session) DO UPDATE SET last_request = excluded.last_request, "
            "cache_ttl = excluded.cache_ttl"
        )
        self.clock = r("SELECT last_request, cache_ttl FROM {sessions} WHERE session = ?")
        # stashes
        self.stash_put = r(
            f"INSERT INTO {{stashes}} ({STASH_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (key, session, tenant) DO UPDATE SET last_used = excluded.last_used"
        )
        self.stash_used = r(
            "UPDATE {stashes} SET last_used = ? WHERE key = ? AND session = ? AND tenant = ?"
        )
        # A live checkpoint's stash, marked used unless it was within TOUCH_INTERVAL.
        self.stash_touch = r(
            "UPDATE {stashes} SET last_used = ? WHERE key = ? AND session = ? "
            "AND tenant = ? AND last_used < ?"
        )
        self.stash_delete = r("DELETE FROM {stashes} WHERE key = ?")
        self.stash_delete_of = r("DELETE FROM {stashes} WHERE key = ? AND session = ?")
        self.stash_delete_row = r(
            "DELETE FROM {stashes} WHERE key = ? AND session = ? AND tenant = ?"
        )
        # checkpoints
        self.checkpoint = r(f"SELECT {CP_COLS} FROM {{checkpoints}} WHERE session = ?")
        self.checkpoints_of = r(
            f"SELECT {CP_COLS} FROM {{checkpoints}} WHERE {{owner}} = ? ORDER BY updated"
        )
        self.checkpoint_delete = r("DELETE FROM {checkpoints} WHERE session = ?")
        # facts
        self.facts_put = r(
            "INSERT INTO {facts} (raw, digest, tokens, outputs, flags, seen) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (raw) DO NOTHING"
        )
        # the ledger
        self.usage_rows = r(f"SELECT session, kind, model, tier, {USAGE_COLS} FROM {{usage}}")
        self.usage_rows_of = self.usage_rows + r(" WHERE session = ?")
        self.usage_order = " ORDER BY session, kind, model, tier"
        self.ledger_rows = r(f"SELECT {LEDGER_COLS} FROM {{ledger}}")
        self.ledger_rows_of = self.ledger_rows + r(" WHERE session = ?")
        self.cache_state = r("SELECT cache_state FROM {ledger} WHERE session = ?")
        # A subscription session's plan and rate-limit readings (`cg.billing.plan`): its ledger
        # row made if the turn's counters are still held, the counters left to their upsert.
        self.plan_upsert = r(
            "INSERT INTO {ledger} (session, turns, rewritten, tokens_not_sent, "
            "estimate_skipped, cache_state, last_seen, plan, plan_limits) "
            "VALUES (?, 0, 0, 0, 0, NULL, ?, ?, ?) ON CONFLICT (session) DO UPDATE SET "
            "plan = excluded.plan, "
            "plan_limits = COALESCE(excluded.plan_limits, {ledger}.plan_limits)"
        )
        self.plans = r("SELECT session, plan, plan_limits FROM {ledger} WHERE plan IS NOT NULL")
        self.plans_of = self.plans + r(" AND session = ?")
        # The session list's reads (`session_page`), each served by an index (tests/state/
        # test_session_page.py holds every query behind a page to its plan).
        self.page = self.ledger_rows + r(
            " WHERE (last_seen, session) < (?, ?) ORDER BY last_seen DESC, session DESC LIMIT ?"
        )
        self.usage_totals = r(
            f"SELECT kind, model, tier, {_SUMS} FROM {{usage}} GROUP BY kind, model, tier"
        )
        self.ledger_totals = r(
            "SELECT COALESCE(SUM(turns), 0), COALESCE(SUM(rewritten), 0), "
            "COALESCE(SUM(tokens_not_sent), 0), COALESCE(SUM(estimate_skipped), 0), "
            "COALESCE(MAX(last_seen), 0) FROM {ledger}"
        )
        # bounds
        self.stash_count = r("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM {stashes}")
        self.checkpoint_count = r("SELECT COUNT(*) FROM {checkpoints}")
        self.session_count = r("SELECT COUNT(*) FROM {sessions}")
        # eviction: what outlived the TTL (a checkpoint lives while its session does)
        self.evict_checkpoints = r(
            "DELETE FROM {checkpoints} WHERE updated < ? AND {owner} NOT IN "
            "(SELECT session FROM {sessions} WHERE last_request >= ?)"
        )
        self.evict_sessions = r("DELETE FROM {sessions} WHERE last_request < ?")
        self.evict_facts = r("DELETE FROM {facts} WHERE seen < ?")
        # Facts are a cache: the newest `facts_cap` rows are kept.
        self.evict_facts_over = r(
            "DELETE FROM {facts} WHERE raw IN (SELECT raw FROM {facts} ORDER BY seen DESC {offset})"
        )
        self.evict_usage = r(
            "DELETE FROM {usage} WHERE session NOT IN "
            "(SELECT session FROM {ledger} WHERE last_seen >= ?)"
        )
        self.evict_ledger = r("DELETE FROM {ledger} WHERE last_seen < ?")
        # A session's prompt-cache state is dead once its last turn is older than the longest
        # cache TTL (`CACHE_STATE_LIFE`); cleared a bounded run at a time.
        self.evict_cache_state = r(
            "UPDATE {ledger} SET cache_state = NULL WHERE session IN (SELECT session FROM "
            "{ledger} WHERE last_seen < ? AND cache_state IS NOT NULL LIMIT ?)"
        )
        self.group_bytes = r(
            "SELECT session, tenant, SUM(size) FROM {stashes} WHERE last_used >= ? "
            "GROUP BY session, tenant"
        )


SQLITE = Statements(SQLITE_DIALECT)
PG = Statements(PG_DIALECT)


def stash_filter(
    key: str, session: str | None, tenant: str | None, mark: str
) -> tuple[str, tuple[str, ...]]:
    """The WHERE clause (and its arguments) of the stashes `key` resolves to: every row of it,
    its session's (`session`), and of those the ones `tenant` may read (its own, and unbound
    ones: `cg.state.tenant.readable`). `mark` is the engine's placeholder."""
    sql = f"key = {mark}"
    args: tuple[str, ...] = (key,)
    if session is not None:
        sql += f" AND session = {mark}"
        args += (session,)
    if tenant is not None:
        sql += f" AND tenant IN ({mark}, '{UNBOUND}')"
        args += (tenant,)
    return sql, args


def stash_order(tenant: str | None) -> str:
    """Which of the rows `stash_filter` finds `get_stash` returns: the tenant's own before an
    unbound one, the most recently used first."""
    return "tenant = '*', last_used DESC" if tenant is not None else "last_used DESC"


# -- rows ------------------------------------------------------------------------------------


def fact_params(rows: Sequence[FactRow], seen: float) -> list[tuple[Any, ...]]:
    """`put_facts` rows as stored (tool output tokens joined by `,`), first seen at `seen`."""
    return [(r, d, n, ",".join(map(str, o)), f, seen) for r, d, n, o, f in rows]


def fact_row(raw: Any, digest: Any, tokens: Any, outputs: str, flags: Any) -> FactRow:
    """A stored facts row as `get_facts` returns it (either engine's column types)."""
    key = bytes(raw)
    outs = tuple(int(x) for x in outputs.split(",") if x)
    return (key, bytes(digest), int(tokens), outs, int(flags))


def stash_of(row: Sequence[Any], last_used: float | None = None) -> Stash:
    """A `STASH_COLS` row (marked used at `last_used`, when given)."""
    key, session, created, used, size, dialect, count, span, tenant = row
    used = used if last_used is None else last_used
    return Stash(key, session, created, used, size, dialect, count, bytes(span), tenant)


def checkpoint_of(row: Sequence[Any]) -> Checkpoint:
    """A `CP_COLS` row."""
    session, summary, head, covered, chash, key, message, created, updated, meta, tenant = row
    return Checkpoint(
        session, summary, head, covered, chash, key, message, created, updated,
        json.loads(meta) if meta else {}, tenant,
    )  # fmt: skip


def checkpoint_params(cp: Checkpoint, created: float, updated: float) -> tuple[Any, ...]:
    """A checkpoint as its `CP_COLS` are written (`meta` as JSON, None when empty)."""
    meta = json.dumps(cp.meta, ensure_ascii=False, sort_keys=True) if cp.meta else None
    return (
        cp.session, cp.summary, cp.head_count, cp.covered_count, cp.covered_hash, cp.key,
        cp.message, created, updated, meta, cp.tenant,
    )  # fmt: skip


def stamped(cp: Checkpoint, created: float, updated: float) -> Checkpoint:
    """`cp` as `put_checkpoint` returns it: its times stamped, its `meta` a copy."""
    return replace(cp, created=created, updated=updated, meta=dict(cp.meta))


def check_kinds(rows: Sequence[tuple[str, str, str, Usage]]) -> None:
    """`record_usage` refuses a row of a kind the ledger does not know (before writing any)."""
    for row in rows:  # (not `kind, *_`: that builds a list per row)
        if row[0] not in USAGE_KINDS:
            raise ValueError(f"record_usage: unknown kind {row[0]!r}")


def usage_row(r: Sequence[Any]) -> UsageRow:
    """A `session, kind, model, tier, {USAGE_COLS}` row (either engine's integer types)."""
    return UsageRow(r[0], r[1], r[2], r[3], Usage(*(int(x) for x in r[4:])))


def turns_of(r: Sequence[Any]) -> LedgerTurns:
    """A `turns, rewritten, tokens_not_sent, estimate_skipped, last_seen` row."""
    return LedgerTurns(int(r[0]), int(r[1]), int(r[2]), int(r[3]), float(r[4]))


def usage_params(
    session: str, rows: Sequence[tuple[str, str, str, Usage]], t: float
) -> list[tuple[Any, ...]]:
    """`(kind, model, tier, usage)` rows as `usage_upsert` takes them, booked at `t`."""
    out: list[tuple[Any, ...]] = []
    for kind, model, tier, u in rows:
        out.append((
            session, kind, model, tier, u.input_tokens, u.cache_write_tokens,
            u.cache_write_1h_tokens, u.cache_read_tokens, u.output_tokens, u.requests, t,
        ))  # fmt: skip
    return out


# -- what both engines' evictions do alike ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class Expired:
    checkpoints: int  # deleted: older than the TTL, and their session too
    sessions: int  # session clocks older than the TTL
    facts_aged: int  # facts rows first seen before the TTL
    facts_over: int  # facts rows past the cache's cap (the oldest)


def expire(conn: Any, q: Statements, t: float, ttl: float, facts_kept: int) -> Expired:
    """Delete, in the caller's transaction, what outlived the TTL at `t` but the stashes: the
    checkpoints of sessions no longer live, the session clocks, the facts (and those past the
    newest `facts_kept`), the ledger once `policy.ledger_cutoff` has passed, and the prompt-cache
    states whose every entry has expired (a bounded run of them). `conn` is either engine's."""
    cutoff = t - ttl
    cps = conn.execute(q.evict_checkpoints, (cutoff, cutoff)).rowcount
    sess = conn.execute(q.evict_sessions, (cutoff,)).rowcount
    aged = conn.execute(q.evict_facts, (cutoff,)).rowcount
    over = conn.execute(q.evict_facts_over, (facts_kept,)).rowcount
    gone = ledger_cutoff(t, ttl)
    conn.execute(q.evict_usage, (gone,))
    conn.execute(q.evict_ledger, (gone,))
    conn.execute(q.evict_cache_state, (t - CACHE_STATE_LIFE, CACHE_STATE_CLEARED))
    return Expired(int(cps), int(sess), int(aged), int(over))
