"""The store's semantics on both engines (`target`: a real SQLite file, and a fresh database on
the suite's PostgreSQL server): byte-exact stashes, per-session scoping, checkpoints that survive
a restart, TTL and size-bounded LRU eviction, concurrent writers, a newer schema refused, health.

A test that takes `db` or `tmp_path` instead is of SQLite's own machinery and says so: the write
lock and `data_version`, eviction inline with the writes and a WAL share at a time, the file on
disk (its mode, size, deletion, replacement), a killed writer. PostgreSQL's own (claims, the
cache kept by LISTEN/NOTIFY, the writer thread) is test_pgstore.py."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from cg.billing.ledger import _load
from cg.settings import StoreConfig
from cg.state import Store, memory
from cg.state.policy import (
    CACHE_STATE_CLEARED,
    CACHE_STATE_LIFE,
    FACTS_TRIM,
    TOUCH_INTERVAL,
    facts_cap,
)
from cg.state.records import (
    KEY_PATTERN,
    KEY_RE,
    Checkpoint,
    EvictResult,
    FactRow,
    LedgerTurns,
    StoreError,
    span_bytes,
    stash_key,
    valid_key,
)
from cg.state.schema import PG_VERSION, SQLITE_VERSION
from cg.state.sqlite import SqliteStore
from cg.state.sqlite_file import SHM_BYTES
from cg.wire.usage import Usage

HOUR = 3600.0


class Clock:
    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "sub" / "cg.sqlite3"


# The semantics tests run on both engines: an SQLite file, and a fresh database on the suite's
# PostgreSQL server (tests/conftest.py; skipped without one unless CG_REQUIRE_POSTGRES=1).
Target = Path | str


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    if request.param == "sqlite":
        return tmp_path / "sub" / "cg.sqlite3"
    url: str = request.getfixturevalue("pg_url")
    return url


def make(target: Target, **kw: Any) -> Store:
    """The store on `target`: the SQLite file, or the PostgreSQL store on that URL."""
    if isinstance(target, str):
        from cg.state.pgstore import PgStore

        return PgStore(target, **kw)
    return SqliteStore(target, **kw)


SOURCES = [
    '{"role": "user", "content": "caf\\u00e9 \\ud83d\\ude00 \\"quoted\\" \\n"}',
    '{"role":"assistant","content":[{"type":"text","text":"café 😀 ⟪cg⟫ \u2028 tab\\t"}]}',
    '{\n  "role": "user",\n  "content": "  spaced  "\n}',
]


def checkpoint(session: str = "s1", key: str | None = None, n: int = 4) -> Checkpoint:
    msg = json.dumps({"role": "user", "content": f"=== History Summary ===\nsummary {n}"})
    return Checkpoint(
        session=session,
        summary=f"summary {n}",
        head_count=1,
        covered_count=n,
        covered_hash=f"hash{n}",
        key=key,
        message=msg,
    )


# -- keys ------------------------------------------------------------------------------------


def test_stash_key_is_a_24_hex_content_hash():
    k = stash_key(SOURCES)
    assert KEY_RE.match(k) and valid_key(k) and len(k) == 24
    assert stash_key(list(SOURCES)) == k
    assert stash_key(SOURCES[:2]) != k
    # Unambiguous: moving text across the boundary between two sources changes the key.
    assert stash_key(["ab", "c"]) != stash_key(["a", "bc"])
    assert KEY_PATTERN == "[0-9a-f]{24}"


@pytest.mark.parametrize("bad", ["", "abc", "G" * 24, "a" * 25, "a" * 23, "a" * 24 + "\n", None])
def test_key_allow_list_refuses_malformed_ids(bad: object):
    assert not valid_key(bad)


# -- stashes ---------------------------------------------------------------------------------


def test_stash_round_trips_byte_exact(target: Target, clock: Clock):
    with make(target, now=clock) as st:
        key = stash_key(SOURCES)
        st.put_stash(key, "s1", SOURCES, "anthropic")
        got = st.get_stash(key, "s1")
    assert got is not None
    assert got.sources() == SOURCES
    assert got.span == span_bytes(SOURCES) == ("[" + ",".join(SOURCES) + "]").encode()
    assert got.messages() == [json.loads(s) for s in SOURCES]
    assert (got.key, got.session, got.dialect, got.count) == (key, "s1", "anthropic", 3)
    assert got.size == len(got.span)
    # \u escapes stay escapes, raw non-ASCII stays raw.
    assert b"\\u00e9" in got.span and "😀".encode() in got.span


def test_an_empty_span_round_trips(target: Target):
    with make(target) as st:
        st.put_stash(stash_key([]), "s", [], "openai")
        got = st.get_stash(stash_key([]))
    assert got is not None and got.sources() == [] and got.count == 0


def test_stash_is_scoped_to_its_owner_session(target: Target):
    with make(target) as st:
        key = stash_key(SOURCES)
        st.put_stash(key, "owner", SOURCES, "anthropic")
        assert st.get_stash(key, "owner") is not None
        assert st.get_stash(key, "intruder") is None
        assert not st.has_stash(key, "intruder")
        assert st.has_stash(key, "owner") and st.has_stash(key)
        # Unscoped (control endpoint, CLI) resolves it.
        got = st.get_stash(key)
        assert got is not None and got.session == "owner"


def test_same_span_in_two_sessions_resolves_for_both(target: Target):
    # A resumed conversation under a new session id stashes identical content.
    with make(target) as st:
        key = stash_key(SOURCES)
        st.put_stash(key, "old", SOURCES, "anthropic")
        st.put_stash(key, "new", SOURCES, "anthropic")
        a, b = st.get_stash(key, "old"), st.get_stash(key, "new")
        assert a is not None and b is not None and a.span == b.span
        assert st.stats().stashes == 2


def test_put_stash_is_idempotent_and_refreshes_last_used(target: Target, clock: Clock):
    with make(target, now=clock) as st:
        key = stash_key(SOURCES)
        st.put_stash(key, "s", SOURCES, "anthropic")
        clock.t += 10
        st.put_stash(key, "s", SOURCES, "anthropic")
        assert st.stats().stashes == 1
        got = st.get_stash(key, "s")
        assert got is not None and got.created == clock.t - 10 and got.sources() == SOURCES


def test_get_stash_marks_it_used_has_stash_does_not(target: Target, clock: Clock):
    with make(target, now=clock) as st:
        key = stash_key(SOURCES)
        st.put_stash(key, "s", SOURCES, "anthropic")
        clock.t += 100
        assert st.has_stash(key)
        clock.t += 100
        got = st.get_stash(key, "s")
        assert got is not None and got.last_used == clock.t
        assert st.sessions()[0].session == "s"


def test_unknown_or_malformed_keys_resolve_to_none(target: Target):
    with make(target) as st:
        assert st.get_stash("0" * 24) is None
        assert st.get_stash("'; DROP TABLE stashes; --") is None
        assert not st.has_stash("nope")
        with pytest.raises(ValueError):
            st.put_stash("not-a-key", "s", SOURCES, "anthropic")


def test_delete_stash(target: Target):
    with make(target) as st:
        key = stash_key(SOURCES)
        st.put_stash(key, "a", SOURCES, "anthropic")
        st.put_stash(key, "b", SOURCES, "anthropic")
        assert st.delete_stash(key, "a") == 1
        assert not st.has_stash(key, "a") and st.has_stash(key, "b")
        assert st.delete_stash(key) == 1
        assert not st.has_stash(key)


# -- checkpoints -----------------------------------------------------------------------------


def test_checkpoint_put_get_replace_delete(target: Target, clock: Clock):
    with make(target, now=clock) as st:
        assert st.get_checkpoint("s1") is None
        cp = checkpoint(n=4)
        stored = st.put_checkpoint(cp)
        assert (stored.created, stored.updated) == (clock.t, clock.t)
        got = st.get_checkpoint("s1")
        assert got == stored
        assert got is not None and got.message == cp.message and got.key is None

        clock.t += 60
        rolled = st.put_checkpoint(checkpoint(n=9))
        got = st.get_checkpoint("s1")
        assert got == rolled
        assert got is not None and got.covered_count == 9 and got.summary == "summary 9"
        assert got.created == clock.t - 60 and got.updated == clock.t

        assert st.get_checkpoint("s2") is None
        assert st.delete_checkpoint("s1")
        assert not st.delete_checkpoint("s1")
        assert st.get_checkpoint("s1") is None


def test_checkpoint_message_and_meta_round_trip_exactly(target: Target):
    text = (
        '{"role": "user", "content": "=== History Summary ===\\n<summary>caf\\u00e9 😀</summary>"}'
    )
    cp = Checkpoint("s", "café 😀", 2, 7, "ab" * 16, stash_key(SOURCES), text, meta={"n": [1, "é"]})
    with make(target) as st:
        st.put_checkpoint(cp)
        got = st.get_checkpoint("s")
    assert got is not None
    assert got.message == text and got.message.encode() == text.encode()
    assert got.meta == {"n": [1, "é"]}
    assert (got.summary, got.head_count, got.covered_count, got.covered_hash, got.key) == (
        cp.summary,
        2,
        7,
        cp.covered_hash,
        cp.key,
    )


def test_a_restart_keeps_checkpoints_stashes_and_session_clocks(target: Target, clock: Clock):
    key = stash_key(SOURCES)
    st = make(target, now=clock)
    st.put_stash(key, "s1", SOURCES, "anthropic")
    stored = st.put_checkpoint(checkpoint(key=key))
    st.touch_session("s1", cache_ttl=300.0)
    st.close()
    with pytest.raises(StoreError, match="closed"):
        st.get_checkpoint("s1")

    with make(target, now=clock) as again:
        assert again.get_checkpoint("s1") == stored
        got = again.get_stash(key, "s1")
        assert got is not None and got.sources() == SOURCES
        assert again.last_request("s1") == clock.t
        rec = again.get_session("s1")
        assert rec is not None and rec.cache_ttl == 300.0


def test_reading_a_checkpoint_keeps_its_stash_from_lru_eviction(target: Target, clock: Clock):
    old, live = stash_key(["1"]), stash_key(["2"])
    with make(target, now=clock) as st:
        st.put_stash(live, "s", ["2" * 100], "anthropic")
        clock.t += 1
        st.put_stash(old, "t", ["1" * 100], "anthropic")
        st.put_checkpoint(checkpoint("s", key=live))
        clock.t += TOUCH_INTERVAL + 1  # `last_used` is refreshed at most once per interval
        assert st.get_checkpoint("s") is not None  # marks `live` used
        st.max_bytes = 300  # stashes get half: 150 bytes, evicted down to 135
        result = st.evict()
        assert result.lru_stashes == 1
        assert st.has_stash(live) and not st.has_stash(old)


def test_a_reuse_turn_within_the_minute_reads_its_checkpoint_without_the_write_lock(
    tmp_path: Path, clock: Clock
):
    """Another process holding SQLite's write lock does not stall a reuse turn whose stash was
    marked used less than TOUCH_INTERVAL ago: the read takes no write transaction."""
    path = tmp_path / "cg.sqlite3"
    live = stash_key(["2"])
    with SqliteStore(path, now=clock, busy_timeout_ms=50) as st:
        st.put_stash(live, "s", ["2" * 100], "anthropic")
        st.put_checkpoint(checkpoint("s", key=live))
        clock.t += TOUCH_INTERVAL + 1
        assert st.get_checkpoint("s") is not None  # due: marks the stash used
        other = sqlite3.connect(path)
        try:
            other.execute("BEGIN IMMEDIATE")  # another process's write lock
            with pytest.raises(StoreError):  # guard: a write now waits and fails
                st.touch_session("s")
            clock.t += 1
            assert st.get_checkpoint("s") is not None  # a read: not stalled by the lock
            clock.t += TOUCH_INTERVAL
            with pytest.raises(StoreError):  # due again: the mark needs the lock
                st.get_checkpoint("s")
        finally:
            other.rollback()
            other.close()
        assert st.get_checkpoint("s") is not None  # the lock gone: marked


def test_a_fresh_stash_is_asked_about_once_a_minute_not_every_turn(tmp_path: Path, clock: Clock):
    """A checkpoint whose stash was written less than TOUCH_INTERVAL ago is not due for a mark:
    the first reuse turn asks, the rest of that minute take no write transaction; a minute
    later the stash is marked used."""
    path = tmp_path / "cg.sqlite3"
    live = stash_key(["2"])
    with SqliteStore(path, now=clock) as st:
        st.put_stash(live, "s", ["2" * 100], "anthropic")
        st.put_checkpoint(checkpoint("s", key=live))
        queries: list[str] = []
        assert st._conn is not None
        st._conn.set_trace_callback(queries.append)
        for _ in range(5):
            clock.t += 1
            assert st.get_checkpoint("s") is not None
        assert sum(q.startswith("BEGIN") for q in queries) == 1
        clock.t += TOUCH_INTERVAL + 1
        assert st.get_checkpoint("s") is not None
        assert sum(q.startswith("BEGIN") for q in queries) == 2
        st._conn.set_trace_callback(None)
    conn = sqlite3.connect(path)
    (used,) = conn.execute("SELECT last_used FROM stashes").fetchone()
    conn.close()
    assert used == clock.t  # marked by the second ask


# -- sessions --------------------------------------------------------------------------------


def test_touch_session_returns_the_previous_record(target: Target, clock: Clock):
    with make(target, now=clock) as st:
        assert st.touch_session("s") is None  # first seen
        assert st.last_request("s") == clock.t
        first = clock.t
        clock.t += 30
        prev = st.touch_session("s", cache_ttl=3600.0)
        assert prev is not None and prev.last_request == first and prev.cache_ttl is None
        prev = st.touch_session("s", now=clock.t + 5)
        assert prev is not None and prev.cache_ttl == 3600.0
        assert st.last_request("s") == clock.t + 5
        assert st.last_request("unknown") is None


def test_sessions_lists_every_known_session_most_recent_first(target: Target, clock: Clock):
    with make(target, now=clock) as st:
        st.touch_session("a")
        clock.t += 1
        st.put_checkpoint(checkpoint("b", n=5))
        clock.t += 1
        st.put_stash(stash_key(SOURCES), "c", SOURCES, "openai")
        infos = st.sessions()
    assert [i.session for i in infos] == ["c", "b", "a"]
    c, b, a = infos
    assert c.stashes == 1 and c.stash_bytes == len(span_bytes(SOURCES))
    assert b.covered_count == 5 and b.checkpoint_updated is not None and b.stashes == 0
    assert a.last_request is not None and a.checkpoint_updated is None


# -- eviction --------------------------------------------------------------------------------


def test_ttl_eviction_on_last_used(target: Target, clock: Clock):
    with make(target, now=clock, ttl_hours=1, evict_interval=0) as st:
        stale, fresh = stash_key(["1"]), stash_key(["2"])
        st.put_stash(stale, "s", ["1"], "anthropic")
        st.put_stash(fresh, "s", ["2"], "anthropic")
        st.put_checkpoint(checkpoint("old"))
        st.touch_session("old")
        clock.t += 0.5 * HOUR
        assert st.get_stash(fresh, "s") is not None  # used: its hour starts again
        clock.t += 0.6 * HOUR
        result = st.evict()
        assert result.expired_stashes == 1
        assert result.checkpoints == 1 and result.sessions == 1
        assert not st.has_stash(stale) and st.has_stash(fresh)
        assert st.get_checkpoint("old") is None and st.last_request("old") is None
        assert st.stats().evicted == 1


def test_a_checkpoint_lives_while_its_session_is_active(target: Target, clock: Clock):
    with make(target, now=clock, ttl_hours=1) as st:
        st.put_checkpoint(checkpoint("live"))
        clock.t += 2 * HOUR
        st.touch_session("live")
        st.evict()
        assert st.get_checkpoint("live") is not None


def test_eviction_runs_on_open(target: Target, clock: Clock):
    with make(target, now=clock, ttl_hours=1) as st:
        st.put_stash(stash_key(SOURCES), "s", SOURCES, "anthropic")
    clock.t += 2 * HOUR
    with make(target, now=clock, ttl_hours=1) as st:
        assert st.stats().stashes == 0


def test_eviction_runs_opportunistically_on_put_at_most_once_per_interval(db: Path, clock: Clock):
    # SQLite evicts on the writing call; the PostgreSQL store's writer evicts when idle.
    with SqliteStore(db, now=clock, ttl_hours=1, evict_interval=600) as st:
        a = stash_key(["a"])
        st.put_stash(a, "s", ["a"], "anthropic")
        clock.t += 2 * HOUR  # `a` is now stale
        st.put_stash(stash_key(["b"]), "s", ["b"], "anthropic")  # evicts
        assert not st.has_stash(a)
        c = stash_key(["c"])
        st.put_stash(c, "s", ["c"], "anthropic")
        clock.t += 2 * HOUR  # `c` is stale and the interval has passed again
        st.put_stash(stash_key(["d"]), "s", ["d"], "anthropic")
        assert not st.has_stash(c)


def test_no_eviction_between_intervals(target: Target, clock: Clock):
    with make(target, now=clock, ttl_hours=1, evict_interval=10 * HOUR) as st:
        a = stash_key(["a"])
        st.put_stash(a, "s", ["a"], "anthropic")
        clock.t += 2 * HOUR
        st.put_stash(stash_key(["b"]), "s", ["b"], "anthropic")
        assert st.has_stash(a)  # stale, but the last eviction was under 10 h ago
        assert st.evict().expired_stashes == 1


def test_size_bound_evicts_least_recently_used_first(target: Target, clock: Clock):
    """Stashes get half of `max_mb` (here 1 MiB of 2) and are evicted down to 90% of it."""
    mb = 1024 * 1024
    blob = "x" * (mb // 5)  # four of these fit in 1 MiB, five do not (with their brackets)
    keys = [stash_key([f"{i}"]) for i in range(6)]
    with make(target, now=clock, max_mb=2, evict_interval=HOUR) as st:
        for i, k in enumerate(keys[:4]):
            st.put_stash(k, "s", [json.dumps(blob + str(i))], "anthropic")
            clock.t += 1
        clock.t += 1
        assert st.get_stash(keys[0], "s") is not None  # the oldest, but recently used
        st.put_stash(keys[4], "s", [json.dumps(blob)], "anthropic")
        st.put_stash(keys[5], "s", [json.dumps(blob)], "anthropic")
        st.evict()
        assert st.evicted == 2
        assert st.has_stash(keys[0])  # kept: used recently
        assert not st.has_stash(keys[1]) and not st.has_stash(keys[2])
        assert all(st.has_stash(k) for k in keys[3:])
        assert st.stats().stash_bytes <= mb


def test_a_write_past_the_stash_budget_evicts_at_once(db: Path, clock: Clock):
    """The interval (an hour here) does not let stashes run past their budget meanwhile."""
    mb = 1024 * 1024
    with SqliteStore(db, now=clock, max_mb=2, evict_interval=HOUR) as st:
        for i in range(12):
            st.put_stash(stash_key([f"{i}"]), "s", [json.dumps("x" * (mb // 5))], "anthropic")
            clock.t += 1
            assert st.stats().stash_bytes <= mb  # never over half of max_mb, even for a moment
        assert st.evicted >= 7  # vacuity: it was the size that evicted, not the clock


class _RowCounter:
    """A connection that counts the stash rows its SELECTs hand back, sums aside (every other
    call goes to the connection itself)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self.rows = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def execute(self, sql: str, *args: Any) -> Any:
        cur = self._conn.execute(sql, *args)
        rows = re.search(r"SELECT .* FROM stashes", sql, re.S) and "SUM(" not in sql
        return _Counted(cur, self) if rows else cur


class _Counted:
    def __init__(self, cur: sqlite3.Cursor, owner: _RowCounter) -> None:
        self._cur, self._owner = cur, owner

    def __iter__(self) -> Iterator[Any]:
        for row in self._cur:
            self._owner.rows += 1
            yield row

    def fetchone(self) -> Any:
        row = self._cur.fetchone()
        self._owner.rows += row is not None
        return row

    def fetchall(self) -> list[Any]:
        rows = self._cur.fetchall()
        self._owner.rows += len(rows)
        return rows

    def close(self) -> None:
        self._cur.close()


def test_eviction_reads_the_rows_of_the_stashes_that_go_and_no_others(db: Path, clock: Clock):
    """The budget is summed from the LRU index; stash rows are read only for the stashes that
    go (stale, or least recently used over the budget). Reading all of them took ~17 ms with
    6,000 stashes, on the event loop, once a minute with nothing to evict."""
    kb = 1024
    with SqliteStore(db, now=clock, max_mb=2, evict_interval=HOUR) as st:
        for i in range(4):  # the oldest: 800 KB of the ~1 MB the stashes may hold
            st.put_stash(stash_key([f"big{i}"]), "s", [json.dumps("x" * (200 * kb))], "anthropic")
            clock.t += 1
        for i in range(200):
            st.put_stash(stash_key([f"{i}"]), "s", [json.dumps(f"{i}")], "anthropic")
            clock.t += 1
        counter = _RowCounter(st._conn)  # type: ignore[arg-type]
        st._conn = counter  # type: ignore[assignment]
        assert st.evict() == EvictResult(0, 0, 0, 0)
        assert counter.rows == 0  # summed, not read: none of the 204 rows
        clock.t += 1
        for i in range(200):  # past the budget: the oldest big one goes, read with one more
            st.put_stash(stash_key([f"more{i}"]), "s", [json.dumps("y" * 4 * kb)], "anthropic")
            clock.t += 1
            if st.evicted:
                break
        assert st.evicted == 1 and not st.has_stash(stash_key(["big0"]))  # vacuity: it evicted
        assert counter.rows <= 2  # the victim, and the row after it that ended the walk
        clock.t += 30 * 24 * HOUR  # everything stale: every row is read, once
        counter.rows = 0
        left = st.stats().stashes
        assert st.evict().expired_stashes == left
        assert counter.rows == left


def test_stashes_make_room_for_what_the_rest_of_the_file_holds(db: Path, clock: Clock):
    """Checkpoints (and the ledger) grow with the sessions seen and live by the TTL, not the
    size: the stashes shrink so the file still holds to `max_mb`."""
    kb = 1024
    max_mb = 2
    with SqliteStore(db, now=clock, max_mb=max_mb, evict_interval=HOUR) as st:
        for i in range(300):
            st.put_stash(stash_key([f"{i}"]), "s", [json.dumps("z" * (20 * kb))], "anthropic")
            big = "c" * 3000
            if i % 2 == 0:  # 150 sessions' checkpoints: ~0.9 MB of the 2
                st.put_checkpoint(
                    Checkpoint(
                        session=f"s{i}", summary=big, head_count=1, covered_count=4,
                        covered_hash=f"h{i}", key=stash_key([f"{i}"]),
                        message=json.dumps({"role": "user", "content": big}),
                    )
                )  # fmt: skip
            clock.t += 1
            assert st.stats().file_bytes <= max_mb * kb * kb, (i, st.stats().file_bytes)
        assert st.stats().stash_bytes < max_mb * kb * kb // 2 * 0.8  # less than their half
        assert st.evicted > 200  # vacuity


def test_when_the_rest_needs_room_the_stashes_keep_to_less_until_measured_again(
    db: Path, clock: Clock
):
    """Checkpoints fill half the cap: the stashes' budget falls below their half and holds
    between evictions, so they never refill into pages the rest needs (the file grows only
    when every page is live: in a day-long soak, stashes refilling their whole half after each
    eviction ratcheted the file up to 31 MB of a 32 MB cap)."""
    kb, mb = 1024, 1024 * 1024
    max_mb = 4
    with SqliteStore(db, now=clock, max_mb=max_mb, evict_interval=10 * HOUR) as st:
        share = st._stash_budget
        for i in range(600):  # ~2.5 MB of checkpoints: over half the cap
            big = "c" * 2000
            st.put_checkpoint(
                Checkpoint(
                    session=f"s{i}", summary=big, head_count=1, covered_count=4,
                    covered_hash=f"h{i}", key=None,
                    message=json.dumps({"role": "user", "content": big}),
                )
            )  # fmt: skip
        st.evict()
        budget = st._stash_budget
        assert 0 < budget < share * 0.6, (budget, share)  # vacuity: the rest took room
        page = 4096
        allowed = max_mb * mb - st._wal_limit() - SHM_BYTES
        for i in range(200):
            st.put_stash(stash_key([f"{i}"]), "s", [json.dumps("z" * (20 * kb))], "anthropic")
            assert st.stats().stash_bytes <= st._stash_budget + 21 * kb
            conn = st._conn
            assert conn is not None
            pages, free = (
                conn.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_count", "freelist_count")
            )
            assert (pages - free) * page <= allowed, i  # what is live fits the file's share
            clock.t += 1
        assert st.evicted > 100  # vacuity: it was the lowered budget that evicted
    assert os.path.getsize(db) <= allowed


def test_a_large_eviction_goes_a_wal_share_at_a_time(db: Path, clock: Clock):
    """With `secure_delete` on (as Debian builds SQLite) a deleted stash is overwritten through
    the WAL: ~6 MB evicted at once stays within about one WAL share, checkpointed between."""
    mb = 1024 * 1024
    seen: list[int] = []

    class Watched(SqliteStore):
        def _checkpoint(self) -> None:
            seen.append(os.path.getsize(self.path + "-wal"))
            super()._checkpoint()

    with Watched(db, now=clock, max_mb=16, evict_interval=HOUR) as st:
        for i in range(70):
            st.put_stash(stash_key([f"{i}"]), "s", [json.dumps("w" * (100 * 1024))], "anthropic")
            clock.t += 1
        assert not seen  # under the budget (8 MB): nothing evicted yet
        st.max_bytes = 2 * mb  # a smaller cap: ~6 MB of stashes must go, 256 KiB at a time
        st.evict()
        assert len(seen) > 4  # vacuity: it went in chunks
        # seen[0]: the WAL the writes above left, within the 16 MB cap's share; then one
        # chunk's each, within half the 2 MB cap's share
        assert seen[0] <= 2 * mb and max(seen[1:]) <= st._wal_limit() // 2 + 64 * 1024, seen
        assert st.stats().stash_bytes <= mb


def fact_row(n: int) -> FactRow:
    """A facts row as `cg.state.facts` writes one: raw digest, canonical digest, tokens,
    tool output tokens, flags."""
    raw = hashlib.blake2b(str(n).encode(), digest_size=16).digest()
    return (raw, raw[::-1], n % 5000, (n % 300,), 0)


def test_the_facts_cache_holds_its_cap_as_it_fills_oldest_first_a_few_rows_at_a_time(
    db: Path, clock: Clock
):
    """The cap is kept by `put_facts` itself (not by a minute's bulk delete in `evict`, whose
    random keys put megabytes into the WAL at once), least recently first seen first."""
    counts: list[int] = []
    with SqliteStore(db, now=clock, max_mb=1, evict_interval=10 * HOUR) as st:
        cap = facts_cap(st.max_bytes)  # 2,621 rows
        for i in range(80):  # 8,000 rows through the cap, 100 a turn, no eviction
            st.put_facts([fact_row(i * 100 + j) for j in range(100)])
            rows = st._conn.execute("SELECT COUNT(*) FROM facts").fetchone()[0]  # type: ignore[union-attr]
            assert rows < cap + FACTS_TRIM + 100, (i, rows)
            counts.append(rows)
            clock.t += 1
        kept = st.get_facts([fact_row(n)[0] for n in range(8000)])
        assert cap <= len(kept) < cap + FACTS_TRIM
        assert all(fact_row(n)[0] in kept for n in range(7900, 8000))  # the newest are kept
        assert not any(fact_row(n)[0] in kept for n in range(8000 - cap - 200))  # oldest gone
        assert st._last_evict < clock.t - 20  # vacuity: no eviction ran meanwhile
    assert max(counts) >= cap  # vacuity: it filled to the cap


def test_the_file_holds_to_max_mb(db: Path, clock: Clock):
    """Ten times `max_mb` stashed, facts written too: the database, its WAL and its shared
    memory file together stay within `max_mb`."""
    kb = 1024
    max_mb = 4
    inside: list[int] = []  # the files between an eviction's transactions

    class Watched(SqliteStore):
        def _checkpoint(self) -> None:
            inside.append(self.stats().file_bytes)
            super()._checkpoint()

    with Watched(db, now=clock, max_mb=max_mb, evict_interval=HOUR) as st:
        for i in range(800):
            st.put_stash(stash_key([f"{i}"]), "s", [json.dumps("y" * (50 * kb))], "anthropic")
            if i % 40 == 0:
                st.put_facts([fact_row(i * 1000 + j) for j in range(300)])
            clock.t += 1
            assert st.stats().file_bytes <= max_mb * kb * kb, (i, st.stats().file_bytes)
        assert st.evicted > 700  # vacuity: ~40 MB went through a 4 MB file
        assert len(inside) > 100 and max(inside) <= max_mb * kb * kb, max(inside)


# -- the file (SQLite only) ---------------------------------------------------------------


def test_wal_mode_is_on_and_the_file_is_private(db: Path):
    with SqliteStore(db) as st:
        assert st.journal_mode == "wal" and st.persistent
        st.put_stash(stash_key(SOURCES), "s", SOURCES, "anthropic")
        assert st.stats().file_bytes > 0
        assert st.stats().journal_mode == "wal"
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SQLITE_VERSION
    finally:
        conn.close()
    assert stat.S_IMODE(os.stat(db).st_mode) == 0o600


def test_tilde_path_and_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = StoreConfig(path="~/.context-guru/cg.sqlite3", ttl_hours=2, max_mb=3)
    with SqliteStore.from_config(cfg) as st:
        assert st.path == str(tmp_path / ".context-guru" / "cg.sqlite3")
        assert st.ttl == 2 * HOUR and st.max_bytes == 3 * 1024 * 1024
    assert (tmp_path / ".context-guru" / "cg.sqlite3").is_file()
    other = tmp_path / "other.db"
    with SqliteStore.from_config(cfg, path=str(other)) as st:
        assert st.path == str(other)


def test_memory_store_does_not_persist():
    with memory() as st:
        assert not st.persistent
        st.put_stash(stash_key(SOURCES), "s", SOURCES, "anthropic")
        assert st.has_stash(stash_key(SOURCES))
        assert st.stats().file_bytes == 0


def test_an_unwritable_location_raises_store_error(tmp_path: Path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreError, match=r"cannot create the store .*a-file"):
        SqliteStore(blocker / "cg.sqlite3")


def test_a_file_that_is_not_a_database_raises_store_error(tmp_path: Path):
    bad = tmp_path / "cg.sqlite3"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="cannot open the store"):
        SqliteStore(bad)
    assert bad.read_bytes() == b"this is not sqlite" * 100


def test_a_newer_schema_is_refused(target: Target):
    make(target).close()
    if isinstance(target, str):
        import psycopg

        newer = PG_VERSION + 1
        with psycopg.connect(target, autocommit=True) as pg:
            pg.execute("UPDATE cg_meta SET v = %s WHERE k = 'schema'", (newer,))
    else:
        newer = SQLITE_VERSION + 1
        conn = sqlite3.connect(target)
        conn.execute(f"PRAGMA user_version = {newer}")
        conn.commit()
        conn.close()
    with pytest.raises(StoreError, match=f"schema version {newer}, newer"):
        make(target)


def test_two_stores_on_one_file_written_from_two_threads(target: Target):
    """Two stores (two connections; on PostgreSQL two instances) on one file or database, and
    one store shared by two threads."""
    a, b = make(target), make(target)
    n = 150

    def work(st: Store, who: str) -> None:
        for i in range(n):
            src = [f'{{"i": {i}, "who": "{who}"}}']
            k = stash_key(src)
            st.put_stash(k, who, src, "anthropic")
            st.touch_session(who)
            st.put_checkpoint(checkpoint(who, key=k, n=i))
            got = st.get_stash(k, who)
            assert got is not None and got.sources() == src

    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(work, a, "A"), pool.submit(work, b, "B"), pool.submit(work, a, "C")]
        for f in futures:
            f.result()  # re-raises a worker's exception here
    for st in (a, b):
        st.stats()  # (PostgreSQL: this instance's writes committed before the other reads)
    for st in (a, b):
        assert st.stats().stashes == 3 * n
        for who in "ABC":
            cp = st.get_checkpoint(who)
            assert cp is not None and cp.covered_count == n - 1
    a.close()
    b.close()
    if isinstance(target, Path):
        conn = sqlite3.connect(target)
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        conn.close()


KILLED_WRITER = textwrap.dedent(
    """
    import sys
    from cg.state.sqlite import SqliteStore
    from cg.state.records import stash_key
    st = SqliteStore(sys.argv[1])
    i = 0
    while True:
        src = ['{"i": %d, "pad": "%s"}' % (i, "p" * 2000)]
        st.put_stash(stash_key(src), "victim", src, "anthropic")
        i += 1
        if i == 50:
            print("ready", flush=True)
    """
)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_a_writer_killed_mid_write_leaves_a_readable_store(db: Path):
    SqliteStore(db).close()
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(db)],
        stdout=subprocess.PIPE,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"ready\n"  # 50 commits done, more in flight
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    with SqliteStore(db) as st:
        n = st.stats().stashes
        assert n >= 50
        for info in st.sessions():
            assert info.session == "victim"
        src = ['{"i": 0, "pad": "%s"}' % ("p" * 2000)]
        got = st.get_stash(stash_key(src), "victim")
        assert got is not None and got.sources() == src
        st.put_stash(stash_key(["after"]), "s", ["after"], "anthropic")
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()


# -- the file under the connection (SQLite only); errors while running; health ---------------


def test_a_deleted_file_is_noticed_and_written_back_with_everything(db: Path):
    st = SqliteStore(db)
    src = ['{"role":"user","content":"kept"}']
    st.put_stash(stash_key(src), "s", src, "anthropic")
    assert st.file_problem() is None
    for suffix in ("", "-wal", "-shm"):
        if Path(f"{db}{suffix}").exists():
            os.unlink(f"{db}{suffix}")
    assert "deleted" in (st.file_problem() or "")
    st.restore_file()
    assert st.file_problem() is None and db.exists()
    st.put_stash(stash_key(["after"]), "s", ["after"], "anthropic")  # writes go on, to the file
    st.close()
    with SqliteStore(db) as again:  # what a restart finds
        got = again.get_stash(stash_key(src), "s")
        assert got is not None and got.sources() == src
        assert again.has_stash(stash_key(["after"]), "s")


def test_health_writes_a_deleted_file_back_and_answers_none(db: Path):
    """SQLite only (a file under the connection): what the proxy's `_store_down` asks."""
    st = SqliteStore(db)
    src = ['{"role":"user","content":"kept"}']
    st.put_stash(stash_key(src), "s", src, "anthropic")
    for suffix in ("", "-wal", "-shm"):
        if Path(f"{db}{suffix}").exists():
            os.unlink(f"{db}{suffix}")
    assert st.file_problem() is not None  # vacuity guard: health has something to repair
    assert st.health() is None
    assert st.file_problem() is None and db.exists()
    st.close()
    with SqliteStore(db) as again:
        assert again.has_stash(stash_key(src), "s")


def test_health_of_a_replaced_file_names_the_problem(db: Path):
    st = SqliteStore(db)
    os.unlink(db)
    SqliteStore(db).close()  # another store took the path
    problem = st.health() or ""
    assert "replaced by another file while open" in problem and "saved as" in problem
    st.close()


def test_health_leaves_a_failed_store_alone_for_retry_seconds_then_tries_it(target: Target):
    """Both engines: an error within `retry` seconds is reported as it stands, with the retry
    named; after that, one probe, and a store that answers it is healthy again."""
    with make(target) as st:
        assert st.health() is None
        st.error, st.error_at = "disk on fire", time.monotonic()
        assert st.health(2.0) == "the store failed (disk on fire); retried after 2s"
        assert st.error == "disk on fire"  # not tried within the window
        assert st.health(0.0) is None  # tried: the probe went through
        assert st.error is None


def test_a_replaced_file_is_not_overwritten(db: Path):
    st = SqliteStore(db)
    os.unlink(db)
    SqliteStore(db).close()  # another store took the path
    assert "replaced" in (st.file_problem() or "")
    with pytest.raises(StoreError, match="replaced"):
        st.restore_file()
    st.close()


def test_the_error_stays_until_a_write_goes_through(db: Path):
    st = SqliteStore(db, busy_timeout_ms=50)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another connection holds the write lock
    with pytest.raises(StoreError, match="locked"):
        st.touch_session("s")
    assert st.error is not None and "locked" in st.error
    with pytest.raises(StoreError):
        st.probe()
    assert st.get_session("s") is None  # reads go on, and do not clear the error
    assert st.error is not None
    holder.execute("ROLLBACK")
    holder.close()
    st.probe()
    error: str | None = st.error  # (mypy narrowed the attribute above; probe cleared it)
    assert error is None
    st.close()


def test_a_stash_reads_back_from_a_store_that_cannot_be_written(db: Path):
    st = SqliteStore(db, busy_timeout_ms=50)
    src = ["{}"]
    st.put_stash(stash_key(src), "s", src, "anthropic")
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        got = st.get_stash(stash_key(src), "s")  # marking it used fails: it is read all the same
        assert got is not None and got.sources() == src
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        st.close()


def test_a_prompt_cache_state_is_cleared_once_every_entry_in_it_has_expired(
    target: Target,
) -> None:
    """Two hours after a session's last answer its stored prompt-cache state can only load as
    a cold cache (the longest TTL is one hour), so eviction clears it, a bounded run at a time,
    and keeps the session's counts and usage."""

    class Clock:
        t = 1_000_000.0

        def __call__(self) -> float:
            return self.t

    clock = Clock()
    state = '{"v":1,"entries":[["00",1000100.0,3600.0]]}'
    n = CACHE_STATE_CLEARED + 10
    with make(target, now=clock, evict_interval=1e9) as st:
        for i in range(n):
            st.record_usage(f"old{i}", [("agent", "m", "", Usage(5, requests=1))],
                            LedgerTurns(turns=1), state)  # fmt: skip
        clock.t += CACHE_STATE_LIFE - 60
        st.record_usage("new", [("agent", "m", "", Usage(5, requests=1))], LedgerTurns(turns=1),
                        state)  # fmt: skip
        clock.t += 120  # the old ones are past the life, the new one is not
        st.evict()
        kept = [i for i in range(n) if st.cache_state(f"old{i}") is not None]
        assert len(kept) == 10  # a bounded run: the next eviction takes the rest
        assert st.cache_state("new") == state
        st.evict()
        assert all(st.cache_state(f"old{i}") is None for i in range(n))
        assert st.cache_state("new") == state
        assert st.ledger_turns("old0")["old0"].turns == 1 and st.usage_rows("old0") != []
        assert _load(st.cache_state("old0")).entries == {}  # what it loads as: cold, as before
        assert not [e for e in _load(state).entries.values() if e[0] > clock.t]  # all expired


# -- the reads a reuse turn repeats, remembered (SQLite only: `data_version`) -----------------

READ_KEYS = [stash_key([f'{{"k":{i}}}']) for i in range(3)]
READ_SESSIONS = ["s1", "s2"]


def _file_says(path: Path) -> tuple[set[tuple[str, str]], dict[str, str]]:
    """Stashes and checkpoints as a connection of its own reads them now."""
    conn = sqlite3.connect(path)
    try:
        stashes = {(k, s) for k, s in conn.execute("SELECT key, session FROM stashes")}
        cps = dict(conn.execute("SELECT session, summary FROM checkpoints").fetchall())
    finally:
        conn.close()
    return stashes, cps


def _reads_of(store: Store) -> tuple[set[tuple[str, str]], dict[str, str]]:
    stashes = {(k, s) for k in READ_KEYS for s in READ_SESSIONS if store.has_stash(k, s)}
    for k in READ_KEYS:  # without a session: any owner's
        assert store.has_stash(k) == any((k, s) in stashes for s in READ_SESSIONS)
    cps = {}
    for s in READ_SESSIONS:
        cp = store.get_checkpoint(s)
        if cp is not None:
            cps[s] = cp.summary
    return stashes, cps


@settings(max_examples=40, deadline=None)
@given(
    ops=hs.lists(
        hs.tuples(
            hs.sampled_from(["put_stash", "delete_stash", "put_cp", "delete_cp", "evict"]),
            hs.sampled_from(["ours", "other"]),
            hs.integers(0, len(READ_KEYS) - 1),
            hs.integers(0, len(READ_SESSIONS) - 1),
            hs.integers(0, 9),
        ),
        max_size=14,
    )
)
def test_remembered_reads_answer_as_the_file_does(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, str, int, int, int]]
) -> None:
    """`get_checkpoint` and `has_stash` remember what they read until the store writes a
    checkpoint or a stash, or another connection commits: whatever either of two stores on
    one file does, in any order, the first one's answers are what the file holds."""
    path = tmp_path_factory.mktemp("reads") / "cg.sqlite3"
    ours, other = SqliteStore(path), SqliteStore(path)
    ours.reads_fresh_s = 0.0  # data_version asked at every read (its window: the test below)
    remembered = 0
    try:
        for op, who, k, si, n in ops:
            store = ours if who == "ours" else other
            key, session = READ_KEYS[k], READ_SESSIONS[si]
            if op == "put_stash":
                store.put_stash(key, session, [f'{{"k":{k}}}'], "anthropic")
            elif op == "delete_stash":
                store.delete_stash(key, session)
            elif op == "put_cp":
                store.put_checkpoint(checkpoint(session, key, n + 1))
            elif op == "delete_cp":
                store.delete_checkpoint(session)
            else:
                store.evict()
            assert _reads_of(ours) == _file_says(path)
            remembered += len(ours._reads)
            assert _reads_of(ours) == _file_says(path)  # asked again: from memory, the same
    finally:
        ours.close()
        other.close()
    if ops:
        assert remembered  # vacuity guard: the reads were remembered between the writes


def test_one_turns_reads_ask_data_version_once_and_a_commit_is_seen_after_the_window(
    tmp_path: Path,
) -> None:
    """`PRAGMA data_version` stands for `reads_fresh_s`: a turn's checkpoint and stash reads
    ask it once, not each; another process's delete is seen once the window has passed (its
    clock is the test's), and not a read later."""
    path = tmp_path / "cg.sqlite3"
    store = SqliteStore(path)
    clock = [100.0]
    store._reads_clock = lambda: clock[0]
    key = READ_KEYS[0]
    store.put_stash(key, "s1", ['{"k":0}'], "anthropic")
    store.put_checkpoint(checkpoint("s1", key))
    assert store.has_stash(key, "s1") and store.get_checkpoint("s1") is not None
    assert store.has_stash(key)
    queries: list[str] = []
    assert store._conn is not None
    store._conn.set_trace_callback(queries.append)
    clock[0] += 1.0  # a new turn
    assert store.get_checkpoint("s1") is not None and store.has_stash(key, "s1")
    assert store.has_stash(key, "s1") and store.has_stash(key)
    assert queries == ["PRAGMA data_version"], queries
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("DELETE FROM stashes")
    conn.close()
    clock[0] += store.reads_fresh_s / 2
    assert store.has_stash(key, "s1")  # within the window: as it was
    clock[0] += store.reads_fresh_s
    assert not store.has_stash(key, "s1")
    store._conn.set_trace_callback(None)
    store.close()


def test_a_stash_another_process_deletes_stops_resolving_at_once(tmp_path: Path) -> None:
    """Vacuity guard for the memo: the second read is answered from memory (no query), and a
    delete committed by another connection is seen by the next read all the same."""
    path = tmp_path / "cg.sqlite3"
    store = SqliteStore(path)
    store.reads_fresh_s = 0.0
    key = READ_KEYS[0]
    store.put_stash(key, "s1", ['{"k":0}'], "anthropic")
    store.put_checkpoint(checkpoint("s1", key))
    assert store.has_stash(key, "s1") and store.get_checkpoint("s1") is not None
    queries: list[str] = []
    assert store._conn is not None
    store._conn.set_trace_callback(queries.append)
    assert store.has_stash(key, "s1") and store.get_checkpoint("s1") is not None
    assert all(q.startswith("PRAGMA data_version") for q in queries), queries
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("DELETE FROM stashes")
        conn.execute("DELETE FROM checkpoints")
    conn.close()
    assert not store.has_stash(key, "s1") and store.get_checkpoint("s1") is None
    store._conn.set_trace_callback(None)
    store.close()
