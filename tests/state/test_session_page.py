"""The session list a page at a time (`SqliteStore.session_page`, `session_details`, the ledger's
totals) on both engines: the order, the cursor, the page size, a session with several
conversations, sessions without a checkpoint or without a booking; every query behind a page
served by an index at 10,000 sessions (SQLite's `EXPLAIN QUERY PLAN`, PostgreSQL's `EXPLAIN`
after ANALYZE); and a page read without the lock the hot path takes."""

from __future__ import annotations

import json
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from bench.session_page import COLUMNS, populate, rows, session_id
from cg.state import Store
from cg.state.pgstore import PgStore
from cg.state.records import PAGE_START, Checkpoint, SessionDetail, stash_key
from cg.state.schema import SQLITE_MIGRATIONS, SQLITE_VERSION
from cg.state.sqlite import SqliteStore
from cg.wire.usage import Usage

BIG = 10_000


class Clock:
    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


Target = Path | str


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    if request.param == "sqlite":
        return tmp_path / "cg.sqlite3"
    url: str = request.getfixturevalue("pg_url")
    return url


def make(target: Target, **kw: Any) -> SqliteStore | PgStore:
    if isinstance(target, str):
        return PgStore(target, **kw)
    return SqliteStore(target, **kw)


def cp(key: str, covered: int) -> Checkpoint:
    msg = json.dumps({"role": "user", "content": f"summary of {covered}"})
    return Checkpoint(key, f"summary of {covered}", 1, covered, f"h{covered}", None, msg)


def book(st: Store, session: str, tokens: int = 1) -> None:
    st.record_usage(session, [("agent", "claude-test", "", Usage(tokens, requests=1))])


def ids(page: list[SessionDetail]) -> list[str]:
    return [d.session for d in page]


def all_pages(st: Store, limit: int) -> list[list[SessionDetail]]:
    pages: list[list[SessionDetail]] = []
    after = None
    while True:
        page = st.session_page(limit, after)
        if not page:
            return pages
        pages.append(page)
        after = page[-1].key


# -- what a page holds -----------------------------------------------------------------------------


def test_pages_go_most_recently_booked_first_and_the_cursor_neither_skips_nor_repeats(
    target: Target,
) -> None:
    clock = Clock()
    with make(target, now=clock) as st:
        for i in range(7):
            clock.t += 1
            book(st, f"s{i}")
        clock.t += 1
        book(st, "s2")  # booked again: moves to the top
        pages = all_pages(st, 3)
    assert [ids(p) for p in pages] == [["s2", "s6", "s5"], ["s4", "s3", "s1"], ["s0"]]
    seen = [d.turns.last_seen for p in pages for d in p]
    assert seen == sorted(seen, reverse=True) and len(set(seen)) == 7


def test_sessions_seen_at_the_same_instant_are_split_by_id(target: Target) -> None:
    clock = Clock()
    with make(target, now=clock) as st:
        for s in ("b", "d", "a", "c", "e"):
            book(st, s)  # all at one clock reading
        pages = all_pages(st, 2)
    assert [ids(p) for p in pages] == [["e", "d"], ["c", "b"], ["a"]]


def test_a_page_has_each_sessions_newest_checkpoint_count_and_usage(target: Target) -> None:
    clock = Clock()
    with make(target, now=clock) as st:
        book(st, "a", 3)
        book(st, "ab", 5)
        book(st, "plain", 7)
        book(st, "none", 11)
        st.record_usage("a", [("summarizer", "cheap", "", Usage(2, requests=1))])
        for key, covered in (("a#one", 10), ("a#two", 20), ("a#three", 30)):
            clock.t += 1
            st.put_checkpoint(cp(key, covered))
        clock.t += 1
        st.put_checkpoint(cp("a#one", 40))  # rewritten: now the newest of a's three
        st.put_checkpoint(cp("ab#x", 8))  # "ab" is not "a", though it starts with it
        st.put_checkpoint(cp("plain", 9))  # a key without a conversation part
        st.touch_session("clock-only")  # no booking: not listed
        st.put_stash(stash_key(["x"]), "stash-only", ["x"], "anthropic")
        page = {d.session: d for d in st.session_page(10)}
        again = st.session_details(["none", "a", "clock-only"])
    assert set(page) == {"a", "ab", "plain", "none"}
    a = page["a"]
    assert a.conversations == 3 and a.checkpoint is not None
    assert (a.checkpoint.session, a.checkpoint.covered_count) == ("a#one", 40)
    assert {(r.kind, r.usage.input_tokens) for r in a.usage} == {("agent", 3), ("summarizer", 2)}
    assert page["ab"].conversations == 1 and page["ab"].checkpoint is not None
    assert page["ab"].checkpoint.session == "ab#x"
    assert page["plain"].checkpoint is not None and page["plain"].conversations == 1
    assert page["none"].checkpoint is None and page["none"].conversations == 0
    assert [u.usage.input_tokens for u in page["none"].usage] == [11]
    assert ids(again) == ["none", "a", "clock-only"]
    assert again[1] == a
    assert again[2].turns.last_seen == 0 and again[2].usage == () and again[2].checkpoint is None


def test_a_page_of_an_empty_store_and_past_the_last_session_is_empty(target: Target) -> None:
    with make(target) as st:
        assert st.session_page(50) == [] and st.session_details([]) == []
        book(st, "only")
        (d,) = st.session_page(50)
        assert st.session_page(50, d.key) == []
        assert st.session_page(50, PAGE_START) == [d]


def test_the_totals_are_the_sums_of_every_sessions_rows(target: Target) -> None:
    with make(target) as st:
        for i in range(5):
            book(st, f"s{i}", tokens=i + 1)
        st.record_usage("s0", [("summarizer", "cheap", "", Usage(4, requests=1))])
        totals = {(r.kind, r.model): r.usage for r in st.usage_totals()}
        turns = st.ledger_totals()
        every = st.usage_rows()
    assert totals[("agent", "claude-test")] == Usage(15, requests=5)
    assert totals[("summarizer", "cheap")] == Usage(4, requests=1)
    assert sum((r.usage for r in every), Usage()) == sum(totals.values(), Usage())
    assert turns.last_seen > 0 and turns.turns == 0


# -- served by an index, at 10,000 sessions --------------------------------------------------------


class Recording:
    """A connection that keeps every statement run on it (to EXPLAIN them after)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.statements: list[tuple[str, tuple[Any, ...]]] = []

    def execute(self, sql: str, params: Any = ()) -> Any:
        self.statements.append((sql, tuple(params)))
        return self.conn.execute(sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


def read_a_page(
    st: SqliteStore | PgStore, monkeypatch: pytest.MonkeyPatch
) -> list[tuple[str, tuple[Any, ...]]]:
    """Every statement behind the first page, a later one, a named session's details, and a
    session's checkpoints (`checkpoints_of`, on the connection the hot path uses)."""
    st.session_page(1)  # the connection opened (PostgreSQL opens it on the first read)
    rec = Recording(st._view_conn)
    monkeypatch.setattr(st, "_view_conn", rec)
    hot = Recording(st._conn)
    monkeypatch.setattr(st, "_conn", hot)
    assert len(st.checkpoints_of(session_id(0))) == 3
    assert [cp.session.split("#")[0] for cp in st.checkpoints_of(session_id(2))] == [session_id(2)]
    first = st.session_page(51)
    assert ids(first) == [session_id(i) for i in range(51)]
    later = st.session_page(51, first[-1].key)
    assert ids(later) == [session_id(i) for i in range(51, 102)]
    assert first[0].conversations == 3 and first[2].conversations == 1
    assert first[1].checkpoint is None
    st.session_details([session_id(4000), session_id(4001)])
    monkeypatch.undo()
    tables = " ".join(sql for sql, _ in rec.statements)
    for table in ("ledger", "usage", "checkpoints"):  # vacuity: each kind of read was made
        assert f"FROM {table}" in tables or f"FROM cg_{table}" in tables, tables
    assert len(hot.statements) == 2 and "checkpoints" in hot.statements[0][0], hot.statements
    return rec.statements + hot.statements


def sqlite_plan(conn: sqlite3.Connection, sql: str, params: tuple[Any, ...]) -> list[str]:
    return [str(r[3]) for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]


def full_scans(plan: list[str]) -> list[str]:
    """A plan's steps that read a whole table or index, or sort what they read."""
    return [p for p in plan if p.startswith("SCAN") or "TEMP B-TREE" in p]


def test_every_query_behind_a_page_is_index_served_on_sqlite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "big.sqlite3"
    populate(db, BIG)
    with SqliteStore(db, evict=False) as st:
        statements = read_a_page(st, monkeypatch)
        conn = st._view_conn
        assert conn is not None
        for sql, params in statements:
            plan = sqlite_plan(conn, sql, params)
            assert not full_scans(plan), (sql, plan)
        # Vacuity: the check sees a scan, as the owner filter was before its index.
        was = "SELECT * FROM checkpoints WHERE substr(session, 1, 12) = ?"
        assert full_scans(sqlite_plan(conn, was, ("bench-000000",)))


def test_the_clis_full_read_finds_each_sessions_checkpoint_by_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`SqliteStore.sessions` (`context-guru sessions`) reads every session, but each one's newest
    checkpoint by the owner index, not a scan of every checkpoint per session."""
    db = tmp_path / "big.sqlite3"
    populate(db, BIG)
    with SqliteStore(db, evict=False) as st:
        hot = Recording(st._conn)
        monkeypatch.setattr(st, "_conn", hot)
        infos = st.sessions()
        monkeypatch.undo()
        assert len(infos) == BIG and sum(i.covered_count is not None for i in infos) == BIG // 2
        ((sql, params),) = hot.statements
        assert st._view_conn is not None
        plan = sqlite_plan(st._view_conn, sql, params)
    assert "SEARCH checkpoints USING INDEX checkpoints_owner (<expr>=?)" in plan, plan
    assert "SCAN checkpoints" not in plan, plan


def test_every_query_behind_a_page_is_index_served_on_postgresql(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg

    from cg.state.pgstore import PgStore

    with PgStore(pg_url) as st, psycopg.connect(pg_url, autocommit=True) as conn:
        for table, data in rows(BIG).items():
            cols = COLUMNS[table]
            if table in ("stashes", "checkpoints"):  # (unbound rows, as migrated ones are)
                cols, data = cols + ", tenant", [(*r, "*") for r in data]
            with conn.cursor().copy(f"COPY cg_{table} ({cols}) FROM STDIN") as cp:
                for row in data:
                    cp.write_row(row)
        conn.execute("ANALYZE")
        statements = read_a_page(st, monkeypatch)
        for sql, params in statements:
            plan = [r[0] for r in conn.execute("EXPLAIN " + sql, params).fetchall()]
            assert not [p for p in plan if "Seq Scan" in p or "Sort" in p], (sql, plan)
        # Vacuity: the check sees a sequential scan where no index serves the filter.
        was_sql = "SELECT * FROM cg_checkpoints WHERE substr(session, 1, 12) = 'bench-000000'"
        was = [r[0] for r in conn.execute("EXPLAIN " + was_sql).fetchall()]
        assert any("Seq Scan" in p for p in was), was


# -- off the hot path's lock -----------------------------------------------------------------------


def test_a_page_is_read_while_a_turn_holds_the_store(target: Target) -> None:
    """The control answers read on a connection of their own: a page is read while the
    connection every turn uses is taken."""
    with make(target) as st, ThreadPoolExecutor(1) as pool:
        book(st, "a")
        st.put_checkpoint(cp("a#1", 3))
        assert ids(st.session_page(10)) == ["a"]  # (PostgreSQL: the writes committed)
        with st._lock:
            page = pool.submit(st.session_page, 10).result(timeout=10)
            totals = pool.submit(st.usage_totals).result(timeout=10)
    assert ids(page) == ["a"] and page[0].conversations == 1 and totals


def test_a_sqlite_store_of_schema_v3_gets_the_indexes(tmp_path: Path) -> None:
    db = tmp_path / "v3.sqlite3"
    conn = sqlite3.connect(db, isolation_level=None)
    for version in (1, 2, 3):
        conn.executescript(SQLITE_MIGRATIONS[version])
    conn.execute("PRAGMA user_version = 3")
    conn.execute(
        "INSERT INTO ledger VALUES ('old', 1, 0, 0, 0, NULL, 5.0), ('new', 2, 1, 10, 0, NULL, 6.0)"
    )
    conn.close()
    with SqliteStore(db, evict=False) as st:
        assert ids(st.session_page(10)) == ["new", "old"]
    conn = sqlite3.connect(db)
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    conn.close()
    assert {"ledger_page", "checkpoints_owner"} <= names and "ledger_seen" not in names
    assert version == SQLITE_VERSION == 5


def test_a_postgresql_store_of_schema_v2_gets_the_indexes(pg_url: str) -> None:
    import psycopg

    from cg.state.pgstore import PgStore
    from cg.state.schema import PG_MIGRATIONS

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE cg_meta (k TEXT PRIMARY KEY, v BIGINT NOT NULL)")
        for version in (1, 2):
            for stmt in PG_MIGRATIONS[version].split(";"):
                if stmt.strip():
                    conn.execute(stmt)
        conn.execute("INSERT INTO cg_meta VALUES ('schema', 2)")
        conn.execute("INSERT INTO cg_ledger VALUES ('old', 1, 0, 0, 0, NULL, 5.0)")
    with PgStore(pg_url, evict=False) as st:
        assert ids(st.session_page(10)) == ["old"]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        names = {r[0] for r in conn.execute("SELECT indexname FROM pg_indexes")}
        schema = conn.execute("SELECT v FROM cg_meta WHERE k = 'schema'").fetchone()
    assert {"cg_ledger_page", "cg_checkpoints_owner"} <= names and "cg_ledger_seen" not in names
    assert schema == (4,)
