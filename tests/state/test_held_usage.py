"""`SqliteStore.record_usage` and `SqliteStore.touch_session` with `batch_delay`: bookings and session clocks
held in memory (`cg.state.pending`) and committed together. What is held must read back, before
and after it is committed, exactly as if each write had been committed alone; nothing held is
lost by a read, an eviction, a close, or a commit that failed."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cg.state.pending import HeldWrites
from cg.state.records import LedgerTurns, StoreError
from cg.state.sqlite import SqliteStore
from cg.wire.usage import Usage

Row = tuple[str, str, str, Usage]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def held_store(path: Path, delay: float = 10.0) -> tuple[SqliteStore, Clock]:
    store = SqliteStore(path, batch_delay=delay)
    clock = Clock()
    store._clock = clock
    return store, clock


@contextmanager
def twins(d: Path) -> Iterator[tuple[SqliteStore, SqliteStore, Clock]]:
    """A store committing every write, and one holding them an hour (on its own clock)."""
    one = SqliteStore(d / "one.sqlite3")
    held, clock = held_store(d / "held.sqlite3", delay=3600.0)
    try:
        yield one, held, clock
    finally:
        one.close()
        held.close()


def committed(path: Path) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    """The usage and ledger tables as another process would read them now."""
    conn = sqlite3.connect(path)
    try:
        usage = conn.execute(
            "SELECT session, kind, model, tier, input_tokens, output_tokens, requests FROM usage "
            "ORDER BY session, kind, model, tier"
        ).fetchall()
        ledger = conn.execute(
            "SELECT session, turns, rewritten, tokens_not_sent, estimate_skipped, cache_state "
            "FROM ledger ORDER BY session"
        ).fetchall()
    finally:
        conn.close()
    return usage, ledger


AGENT: list[Row] = [("agent", "m", "", Usage(10, 0, 0, 5, 2, 1))]


def test_a_booking_is_held_until_the_window_passes_then_committed_with_the_next(
    tmp_path: Path,
) -> None:
    path = tmp_path / "cg.sqlite3"
    store, clock = held_store(path, delay=0.25)
    store.record_usage("s", AGENT, LedgerTurns(turns=1), '{"v":1}')
    store.record_usage("s", AGENT, LedgerTurns(turns=1))
    assert committed(path) == ([], [])  # held: another process sees nothing yet
    assert store.held()
    clock.t = 0.25
    store.record_usage("t", AGENT, LedgerTurns(turns=1))  # past the window: all three go
    assert not store.held()
    usage, ledger = committed(path)
    assert usage == [("s", "agent", "m", "", 20, 4, 2), ("t", "agent", "m", "", 10, 2, 1)]
    assert ledger == [("s", 2, 0, 0, 0, '{"v":1}'), ("t", 1, 0, 0, 0, None)]
    store.close()


def test_without_a_delay_every_booking_commits_at_once(tmp_path: Path) -> None:
    path = tmp_path / "cg.sqlite3"
    store = SqliteStore(path)
    store.record_usage("s", AGENT, LedgerTurns(turns=1))
    assert committed(path)[1] == [("s", 1, 0, 0, 0, None)]
    assert not store.held()
    store.close()


def test_every_read_of_the_ledger_sees_what_is_held(tmp_path: Path) -> None:
    path = tmp_path / "cg.sqlite3"
    store, _ = held_store(path)
    store.record_usage("s", AGENT, LedgerTurns(turns=1), '{"v":1,"entries":[]}')
    # The cache state is answered from memory, without a commit.
    assert store.cache_state("s") == '{"v":1,"entries":[]}'
    assert store.held()
    assert [r.usage for r in store.usage_rows("s")] == [AGENT[0][3]]
    assert not store.held()  # the read committed them
    store.record_usage("s", AGENT, LedgerTurns(turns=1))
    assert store.ledger_turns()["s"].turns == 2
    store.record_usage("u", AGENT, LedgerTurns(turns=1))
    assert "u" in {info.session for info in store.sessions()}
    store.close()


def test_a_cache_state_held_as_a_callable_is_written_once_when_committed(tmp_path: Path) -> None:
    """The ledger hands over what writes its state: only the newest of a batch is written,
    once, when committed (or read), never each answer's."""
    path = tmp_path / "cg.sqlite3"
    store, clock = held_store(path, delay=0.25)
    made: list[str] = []

    def state(n: int) -> Callable[[], str]:
        def write() -> str:
            made.append(f"v{n}")
            return f'{{"v":{n}}}'

        return write

    for n in range(3):
        store.record_usage("s", AGENT, LedgerTurns(turns=1), state(n))
    assert made == []  # held: nothing written yet
    assert store.cache_state("s") == '{"v":2}' and made == ["v2"]  # a read writes the newest
    store.record_usage("s", AGENT, LedgerTurns(turns=1), state(3))
    clock.t = 0.25
    store.record_usage("t", AGENT, LedgerTurns(turns=1))  # past the window: committed
    assert made == ["v2", "v3"]
    assert committed(path)[1] == [("s", 4, 0, 0, 0, '{"v":3}'), ("t", 1, 0, 0, 0, None)]
    store.close()
    unbatched = SqliteStore(tmp_path / "once.sqlite3")  # no window: written with its booking
    unbatched.record_usage("s", AGENT, LedgerTurns(turns=1), state(9))
    assert made[-1] == "v9" and unbatched.cache_state("s") == '{"v":9}'
    unbatched.close()


def test_close_commits_what_is_held(tmp_path: Path) -> None:
    path = tmp_path / "cg.sqlite3"
    store, _ = held_store(path)
    store.record_usage("s", AGENT, LedgerTurns(turns=1, rewritten=1, tokens_not_sent=7))
    assert committed(path) == ([], [])
    store.close()
    assert committed(path)[1] == [("s", 1, 1, 7, 0, None)]


def test_a_commit_that_fails_keeps_the_bookings_for_the_next(tmp_path: Path) -> None:
    path = tmp_path / "cg.sqlite3"
    store = SqliteStore(path, batch_delay=10.0, busy_timeout_ms=50)
    store._clock = Clock()
    store.record_usage("s", AGENT, LedgerTurns(turns=1))
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another writer holds the file
    try:
        with pytest.raises(StoreError):
            store.flush_held()
        store.record_usage("s", AGENT, LedgerTurns(turns=1))  # booked while it was refused
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert store.held()
    store.flush_held()
    assert committed(path) == ([("s", "agent", "m", "", 20, 4, 2)], [("s", 2, 0, 0, 0, None)])
    store.close()


def test_an_unknown_kind_is_refused_before_anything_is_held(tmp_path: Path) -> None:
    store, _ = held_store(tmp_path / "cg.sqlite3")
    with pytest.raises(ValueError):
        store.record_usage("s", [("bogus", "m", "", Usage())])
    assert not store.held()
    store.close()


# -- the batch against one commit per booking ------------------------------------------------

counts = st.integers(0, 10**6)
usages = st.builds(Usage, counts, counts, counts, counts, counts, st.integers(0, 3))
rows = st.lists(
    st.tuples(
        st.sampled_from(["agent", "estimate", "summarizer"]),
        st.sampled_from(["m1", "m2"]),
        st.sampled_from(["", "long"]),
        usages,
    ),
    max_size=3,
)
bookings = st.lists(
    st.tuples(
        st.sampled_from(["s1", "s2", "s3"]),
        rows,
        st.builds(LedgerTurns, st.integers(0, 2), st.integers(0, 1), counts, st.integers(0, 1)),
        st.one_of(st.none(), st.sampled_from(['{"a":1}', '{"b":2}'])),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(bookings=bookings, split=st.integers(0, 12))
def test_held_bookings_read_back_as_if_each_had_been_committed_alone(
    tmp_path_factory: pytest.TempPathFactory,
    bookings: list[tuple[str, list[Row], LedgerTurns, str | None]],
    split: int,
) -> None:
    d = tmp_path_factory.mktemp("held")
    with twins(d) as (one, held, clock):
        for i, (session, rs, turns, state) in enumerate(bookings):
            one.record_usage(session, rs, turns, state)
            if i == split:
                clock.t += 3600.0  # one commit in the middle, the rest held until the read
            held.record_usage(session, rs, turns, state)
        assert held.usage_rows() == one.usage_rows()
        assert _counters(held) == _counters(one)
        for session in ("s1", "s2", "s3"):
            assert held.cache_state(session) == one.cache_state(session)
        assert committed(d / "held.sqlite3") == committed(d / "one.sqlite3")


def _counters(store: SqliteStore) -> dict[str, tuple[int, int, int, int]]:
    return {
        s: (t.turns, t.rewritten, t.tokens_not_sent, t.estimate_skipped)
        for s, t in store.ledger_turns().items()
    }


def test_a_batch_put_back_in_front_keeps_the_newer_state() -> None:
    older, newer = HeldWrites(), HeldWrites()
    older.add("s", AGENT, (1, 0, 0, 0), "old", 1.0)
    newer.add("s", AGENT, (1, 1, 3, 0), "new", 2.0)
    newer.add("s", AGENT, (1, 0, 0, 0), None, 3.0)
    older.absorb(newer)
    assert len(older) == 2
    assert older.ledger["s"] == [3, 1, 3, 0, "new", 3.0]
    assert older.usage[("s", "agent", "m", "")] == (Usage(30, 0, 0, 15, 6, 3), 3.0)


# -- session clocks ---------------------------------------------------------------------------


def clocks(path: Path) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(
            "SELECT session, last_request, cache_ttl FROM sessions ORDER BY session"
        ).fetchall()
    finally:
        conn.close()


def test_a_session_clock_is_held_read_back_and_committed_with_the_bookings(
    tmp_path: Path,
) -> None:
    path = tmp_path / "cg.sqlite3"
    store, clock = held_store(path, delay=0.25)
    assert store.touch_session("s", 100.0, 300.0) is None  # seen for the first time
    prev = store.touch_session("s", 160.0, 3600.0)
    assert prev is not None and (prev.last_request, prev.cache_ttl) == (100.0, 300.0)
    got = store.get_session("s")
    assert got is not None and (got.last_request, got.cache_ttl) == (160.0, 3600.0)
    assert store.last_request("s") == 160.0
    assert clocks(path) == []  # held
    clock.t = 1.0
    store.record_usage("s", AGENT, LedgerTurns(turns=1))  # past the window: all of it goes
    assert clocks(path) == [("s", 160.0, 3600.0)]
    assert committed(path)[1] == [("s", 1, 0, 0, 0, None)]
    # Read from the file once committed, as before.
    prev = store.touch_session("s", 200.0)
    assert prev is not None and prev.last_request == 160.0
    store.close()
    assert clocks(path) == [("s", 200.0, None)]


def test_an_eviction_sees_a_held_clock_and_keeps_its_session(tmp_path: Path) -> None:
    from cg.state.records import Checkpoint

    path = tmp_path / "cg.sqlite3"
    now = [1_000_000.0]
    store = SqliteStore(path, ttl_hours=1.0, now=lambda: now[0], batch_delay=10.0)
    store._clock = Clock()
    store.put_checkpoint(
        Checkpoint("s", "summary", 1, 3, "h" * 64, None, '{"role":"user","content":"x"}')
    )
    now[0] += 2 * 3600.0  # the checkpoint is two hours old, past the TTL
    store.touch_session("s", now[0])  # but its session has just been seen (held)
    assert clocks(path) == []
    result = store.evict()
    assert result.checkpoints == 0 and store.get_checkpoint("s") is not None
    assert [c[0] for c in clocks(path)] == ["s"]
    store.close()


def test_without_a_delay_a_clock_is_written_at_once(tmp_path: Path) -> None:
    path = tmp_path / "cg.sqlite3"
    store = SqliteStore(path)
    store.touch_session("s", 5.0, 300.0)
    assert clocks(path) == [("s", 5.0, 300.0)] and not store.held()
    store.close()


@settings(max_examples=40, deadline=None)
@given(
    writes=st.lists(
        st.tuples(
            st.sampled_from(["s1", "s2"]),
            st.floats(0, 1e6, allow_nan=False),
            st.one_of(st.none(), st.sampled_from([300.0, 3600.0])),
            st.booleans(),
        ),
        min_size=1,
        max_size=10,
    ),
    split=st.integers(0, 10),
)
def test_held_clocks_answer_as_committed_ones(
    tmp_path_factory: pytest.TempPathFactory,
    writes: list[tuple[str, float, float | None, bool]],
    split: int,
) -> None:
    d = tmp_path_factory.mktemp("clocks")
    with twins(d) as (one, held, clock):
        for i, (session, t, ttl, book) in enumerate(writes):
            if i == split:
                clock.t += 3600.0
            assert held.touch_session(session, t, ttl) == one.touch_session(session, t, ttl)
            if book:
                one.record_usage(session, AGENT, LedgerTurns(turns=1))
                held.record_usage(session, AGENT, LedgerTurns(turns=1))
            for s in ("s1", "s2"):
                assert held.get_session(s) == one.get_session(s)
        assert [(i.session, i.last_request) for i in held.sessions()] == [
            (i.session, i.last_request) for i in one.sessions()
        ]
        assert clocks(d / "held.sqlite3") == clocks(d / "one.sqlite3")
