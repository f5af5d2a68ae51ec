"""Tenancy in the store (docs/behaviour.md#bounded-work-and-shared-use): the keyed credential
fingerprint, the read rules on both engines, the migrations of existing stores (their rows unbound
and readable by their session), the quota eviction (one session's or one credential's flood never
evicts another's live stash), and the head-hash session of each tenant."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from mitmproxy.http import Headers

from cg.state import Store, memory
from cg.state.records import Checkpoint, stash_key
from cg.state.schema import SQLITE_V1, SQLITE_V2, SQLITE_V3, SQLITE_VERSION
from cg.state.session import head_hash, session_of
from cg.state.sqlite import SqliteStore
from cg.state.tenant import (
    ANONYMOUS,
    CREDENTIAL_HEADERS,
    FINGERPRINT_HEX,
    UNBOUND,
    describe,
    fingerprint,
)
from cg.wire.body import MessageCache, index_body
from cg.wire.dialects import ANTHROPIC
from tests.state.test_store import Clock, Target, make

KEY = b"k" * 32
K1 = fingerprint(KEY, {"x-api-key": "sk-user-one"})
K2 = fingerprint(KEY, {"x-api-key": "sk-user-two"})
KB = 1024


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    if request.param == "sqlite":
        return tmp_path / "sub" / "cg.sqlite3"
    url: str = request.getfixturevalue("pg_url")
    return url


def checkpoint(conv: str, key: str | None, tenant: str) -> Checkpoint:
    msg = json.dumps({"role": "user", "content": "=== History Summary ===\nsummary"})
    return Checkpoint(conv, "summary", 1, 3, "hash", key, msg, tenant=tenant)


# -- the fingerprint ------------------------------------------------------------------------------


def test_the_fingerprint_is_a_keyed_hash_of_the_first_credential_never_the_credential():
    one = fingerprint(KEY, {"x-api-key": "sk-user-one"})
    assert len(one) == FINGERPRINT_HEX and int(one, 16) >= 0
    assert one == fingerprint(KEY, Headers([(b"X-Api-Key", b"sk-user-one")]))  # either headers
    assert one != fingerprint(b"another key".ljust(32), {"x-api-key": "sk-user-one"})
    assert one != fingerprint(KEY, {"x-api-key": "sk-user-two"})
    # The header's name is part of it: one value under two names is two credentials.
    assert one != fingerprint(KEY, {"authorization": "sk-user-one"})
    assert "sk-user-one" not in one
    # The first present, in the providers' order; an empty value is no credential.
    every = {name: f"v-{name}" for name in CREDENTIAL_HEADERS}
    assert fingerprint(KEY, every) == fingerprint(KEY, {"x-api-key": "v-x-api-key"})
    bearer = {"x-api-key": " ", "authorization": "Bearer sk-b"}
    assert fingerprint(KEY, bearer) == fingerprint(KEY, {"authorization": "Bearer sk-b"})
    for name in CREDENTIAL_HEADERS[1:]:
        assert fingerprint(KEY, {name: "v"}) not in (ANONYMOUS, one)
    assert fingerprint(KEY, {}) == ANONYMOUS
    assert fingerprint(KEY, {"x-context-guru-session": "A"}) == ANONYMOUS


def test_the_record_says_anonymous_bound_or_unbound_never_the_fingerprint():
    assert describe(ANONYMOUS) == "anonymous"
    assert describe(K1) == "bound"
    assert describe(K1, unbound=True) == describe(ANONYMOUS, unbound=True) == "unbound"


def test_the_sqlite_store_keeps_its_key_and_another_file_or_memory_has_its_own(tmp_path: Path):
    with SqliteStore(tmp_path / "a.sqlite3") as a:
        key = a.tenant_key
    assert len(key) == 32
    with SqliteStore(tmp_path / "a.sqlite3") as again, SqliteStore(tmp_path / "b.sqlite3") as other:
        assert again.tenant_key == key
        assert other.tenant_key != key
    with memory() as m1, memory() as m2:
        assert m1.tenant_key and m1.tenant_key != m2.tenant_key


def test_a_read_only_file_with_a_key_opens(tmp_path: Path):
    path = tmp_path / "ro.sqlite3"
    with SqliteStore(path) as st:
        key = st.tenant_key
    path.chmod(0o400)
    try:
        with SqliteStore(path, evict=False) as ro:
            assert ro.tenant_key == key
    finally:
        path.chmod(0o600)


def test_every_postgresql_instance_shares_one_key(pg_url: str):
    from cg.state.pgstore import PgStore

    with PgStore(pg_url) as a, PgStore(pg_url) as b:
        assert len(a.tenant_key) == 32 and a.tenant_key == b.tenant_key
    with PgStore(pg_url) as again:
        assert again.tenant_key == a.tenant_key


# -- the read rules, both engines -------------------------------------------------------------------


def test_a_stash_resolves_for_its_session_and_tenant_only(target: Target):
    key = stash_key(["span"])
    with make(target) as st:
        st.put_stash(key, "A", ['{"m":"span of A"}'], "anthropic", K1)
        assert st.has_stash(key, "A", K1)
        assert not st.has_stash(key, "A", K2)
        assert not st.has_stash(key, "A", ANONYMOUS)
        assert not st.has_stash(key, "B", K1)
        got = st.get_stash(key, "A", K1)
        assert got is not None and got.tenant == K1 and got.text == '[{"m":"span of A"}]'
        assert st.get_stash(key, "A", K2) is None
        assert st.get_stash(key, "A", ANONYMOUS) is None
        # The operator's reads (tenant None): every tenant's, scoped to a session or not.
        assert st.get_stash(key, "A") is not None and st.get_stash(key) is not None
        assert st.has_stash(key, "A") and st.has_stash(key)


def test_two_tenants_stashing_one_span_in_one_session_each_get_a_row(target: Target):
    key = stash_key(["same"])
    with make(target) as st:
        st.put_stash(key, "A", ['"one"'], "anthropic", K1)
        st.put_stash(key, "A", ['"one"'], "anthropic", K2)
        assert st.stats().stashes == 2
        one, two = st.get_stash(key, "A", K1), st.get_stash(key, "A", K2)
        assert one is not None and two is not None and (one.tenant, two.tenant) == (K1, K2)
        assert st.delete_stash(key, "A") == 2  # the operator's delete: every tenant's


def test_a_checkpoint_reads_back_for_its_tenant_only(target: Target):
    with make(target) as st:
        st.put_checkpoint(checkpoint("A#c1", None, K1))
        got = st.get_checkpoint("A#c1", K1)
        assert got is not None and got.tenant == K1
        assert st.get_checkpoint("A#c1", K2) is None
        assert st.get_checkpoint("A#c1", ANONYMOUS) is None
        assert st.get_checkpoint("A#c1") is not None  # the operator's read


def test_unbound_rows_are_readable_by_every_tenant_of_their_session(target: Target):
    key = stash_key(["old"])
    with make(target) as st:
        st.put_stash(key, "A", ['"old"'], "anthropic", UNBOUND)
        st.put_checkpoint(checkpoint("A#c1", key, UNBOUND))
        for tenant in (K1, K2, ANONYMOUS):
            assert st.has_stash(key, "A", tenant)
            stash = st.get_stash(key, "A", tenant)
            assert stash is not None and stash.tenant == UNBOUND
            cp = st.get_checkpoint("A#c1", tenant)
            assert cp is not None and cp.tenant == UNBOUND
        assert not st.has_stash(key, "B", K1)  # still the session's own
        # A tenant's own row is read before the unbound one.
        st.put_stash(key, "A", ['"old"'], "anthropic", K1)
        own = st.get_stash(key, "A", K1)
        assert own is not None and own.tenant == K1


# -- migrations: the rows of an existing store stay readable by their session, unbound -------------


SPAN = '[{"role":"user","content":"stashed before tenancy"}]'
MESSAGE = json.dumps({"role": "user", "content": "=== History Summary ===\nold"})


def _v3_file(path: Path, key: str) -> None:
    """An SQLite store as context-guru wrote it at schema v3, with a stash and a checkpoint."""
    with closing(sqlite3.connect(path)) as conn:
        for ddl in (SQLITE_V1, SQLITE_V2, SQLITE_V3):
            conn.executescript(ddl)
        conn.execute(
            "INSERT INTO stashes VALUES (?, 'A', 1000.0, 1000.0, ?, 'anthropic', 1, ?)",
            (key, len(SPAN), SPAN.encode()),
        )
        conn.execute(
            "INSERT INTO checkpoints VALUES ('A#c1', 'old', 1, 1, 'h', ?, ?, 1000.0, 1000.0, NULL)",
            (key, MESSAGE),
        )
        conn.execute("PRAGMA user_version = 3")
        conn.commit()


def _assert_unbound(st: Store, key: str) -> None:
    for tenant in (K1, K2, ANONYMOUS):
        stash = st.get_stash(key, "A", tenant)
        assert stash is not None and stash.text == SPAN and stash.tenant == UNBOUND
        assert st.has_stash(key, "A", tenant)
        cp = st.get_checkpoint("A#c1", tenant)
        assert cp is not None and cp.key == key and cp.message == MESSAGE
        assert cp.tenant == UNBOUND
    assert not st.has_stash(key, "B", K1)


def test_a_v3_sqlite_store_is_migrated_its_rows_unbound_and_still_its_sessions(tmp_path: Path):
    path = tmp_path / "v3.sqlite3"
    key = stash_key(["old"])
    _v3_file(path, key)
    with SqliteStore(path, now=lambda: 2000.0) as st:
        _assert_unbound(st, key)
        # New rows are bound; the old stash's key stays the old one's alone.
        st.put_stash(key, "A", ['"new"'], "anthropic", K1)
        mine = st.get_stash(key, "A", K1)
        assert mine is not None and mine.tenant == K1
        unbound = st.get_stash(key, "A", K2)
        assert unbound is not None and unbound.tenant == UNBOUND
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SQLITE_VERSION == 5
        info = conn.execute("PRAGMA table_info(stashes)").fetchall()  # (…, name, …, pk)
        assert [r[1] for r in sorted(info, key=lambda r: r[5]) if r[5]] == [
            "key",
            "session",
            "tenant",
        ]


def test_a_killed_v4_migration_leaves_the_v3_file_as_it_was(tmp_path: Path):
    """The rebuild is one transaction: a failure inside it (here: a table in the way) rolls
    every step back, and the file still opens as v3 would."""
    path = tmp_path / "v3.sqlite3"
    key = stash_key(["old"])
    _v3_file(path, key)
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE stashes_v4 (x)")  # the rebuild's name, taken
        conn.commit()
    with pytest.raises(Exception, match="stashes_v4"):
        SqliteStore(path)
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 3
        assert conn.execute("SELECT key, session FROM stashes").fetchall() == [(key, "A")]
        conn.execute("DROP TABLE stashes_v4")
        conn.commit()
    with SqliteStore(path, now=lambda: 2000.0) as st:
        _assert_unbound(st, key)


def _v2_database(url: str, key: str) -> None:
    """A PostgreSQL store as context-guru wrote it at schema v2, with a stash and a checkpoint."""
    import psycopg

    from cg.state.schema import PG_MIGRATIONS

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE cg_meta (k TEXT PRIMARY KEY, v BIGINT NOT NULL)")
        for version in (1, 2):
            for stmt in PG_MIGRATIONS[version].split(";"):
                if stmt.strip():
                    conn.execute(stmt)
        conn.execute("INSERT INTO cg_meta VALUES ('schema', 2)")
        conn.execute(
            "INSERT INTO cg_stashes VALUES (%s, 'A', 1000.0, 1000.0, %s, 'anthropic', 1, %s)",
            (key, len(SPAN), SPAN.encode()),
        )
        conn.execute(
            "INSERT INTO cg_checkpoints (session, summary, head_count, covered_count, "
            "covered_hash, key, message, created, updated) "
            "VALUES ('A#c1', 'old', 1, 1, 'h', %s, %s, 1000.0, 1000.0)",
            (key, MESSAGE),
        )


def test_a_v2_postgresql_store_is_migrated_its_rows_unbound_and_still_its_sessions(pg_url: str):
    import psycopg

    from cg.state.pgstore import PgStore
    from cg.state.schema import PG_VERSION

    key = stash_key(["old"])
    _v2_database(pg_url, key)
    with PgStore(pg_url, now=lambda: 2000.0) as st:
        _assert_unbound(st, key)
        st.put_stash(key, "A", ['"new"'], "anthropic", K1)  # a second row, not a conflict
        st.flush()
        assert st.stats().stashes == 2
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute("SELECT v FROM cg_meta WHERE k = 'schema'").fetchone()
        assert row is not None and row[0] == PG_VERSION == 4
        default = conn.execute(
            "SELECT column_default FROM information_schema.columns "
            "WHERE table_name = 'cg_stashes' AND column_name = 'tenant'"
        ).fetchone()
        assert default == (None,)  # every write names its tenant: no default fills it in


# -- eviction by quota, both engines ------------------------------------------------------------


def _blob(n: int, tag: str) -> list[str]:
    return [json.dumps(tag + "x" * n)]


def test_one_sessions_flood_never_evicts_another_sessions_live_stash(target: Target, clock: Clock):
    """Stashes get 1 MiB of `max_mb` 2. Session A's live stash (its checkpoint names it) is
    the oldest of all; session B stashes 1.6 MB after it. B's stashes go, A's stays."""
    live = stash_key(["A"])
    with make(target, now=clock, max_mb=2, evict_interval=3600) as st:
        st.put_stash(live, "A", _blob(100 * KB, "A"), "anthropic", K1)
        st.put_checkpoint(checkpoint("A#c1", live, K1))
        flood = [stash_key([f"B{i}"]) for i in range(8)]
        for i, k in enumerate(flood):
            clock.t += 1
            st.put_stash(k, "B", _blob(200 * KB, f"B{i}"), "anthropic", K1)
        st.evict()
        assert st.has_stash(live, "A", K1)
        left = [k for k in flood if st.has_stash(k, "B", K1)]
        assert 0 < len(left) < len(flood)  # vacuity: the bound evicted B, and only so far
        assert left == flood[-len(left) :]  # B's least recently used first
        assert st.stats().stash_bytes <= 1024 * KB


def test_one_credentials_flood_of_sessions_never_evicts_another_tenants_stash(
    target: Target, clock: Clock
):
    """Sessions are free to make: one credential opening ten sessions gets the same share as
    another credential's one (quotas per tenant first, then per session within it)."""
    live = stash_key(["A"])
    with make(target, now=clock, max_mb=2, evict_interval=3600) as st:
        st.put_stash(live, "A", _blob(150 * KB, "A"), "anthropic", K1)
        for i in range(10):
            clock.t += 1
            st.put_stash(stash_key([f"B{i}"]), f"B{i}", _blob(200 * KB, f"B{i}"), "openai", K2)
        st.evict()
        assert st.has_stash(live, "A", K1)
        assert st.evicted >= 5  # vacuity: the flood was over the bound
        assert st.stats().stash_bytes <= 1024 * KB


def test_within_a_session_a_checkpoints_stash_goes_last(target: Target, clock: Clock):
    named = stash_key(["named"])
    with make(target, now=clock, max_mb=2, evict_interval=3600) as st:
        st.put_stash(named, "B", _blob(200 * KB, "named"), "anthropic", K1)
        st.put_checkpoint(checkpoint("B#c1", named, K1))
        later = [stash_key([f"later{i}"]) for i in range(6)]
        for i, k in enumerate(later):
            clock.t += 1
            st.put_stash(k, "B", _blob(200 * KB, f"later{i}"), "anthropic", K1)
        st.evict()
        assert st.has_stash(named, "B", K1)  # the oldest, but its marker is live
        assert not st.has_stash(later[0], "B", K1)  # the least recently used unnamed one went


def test_a_flood_reads_the_rows_of_its_own_stashes_only(tmp_path: Path, clock: Clock):
    """Eviction stays index-served: the sums per session come from the index, and rows are
    read for the session over its quota alone (its victims, and the row that ended the walk);
    the 200 stashes of the session within its quota are not read."""
    from tests.state.test_store import _RowCounter

    with SqliteStore(tmp_path / "cg.sqlite3", now=clock, max_mb=2, evict_interval=3600) as st:
        for i in range(200):
            st.put_stash(stash_key([f"a{i}"]), "A", _blob(KB, f"a{i}"), "anthropic", K1)
        clock.t += 1
        counter = _RowCounter(st._conn)  # type: ignore[arg-type]
        st._conn = counter  # type: ignore[assignment]
        for i in range(8):
            clock.t += 1
            st.put_stash(stash_key([f"B{i}"]), "B", _blob(200 * KB, f"B{i}"), "anthropic", K1)
        rows = counter.rows
        assert st.evicted >= 1  # vacuity: the flood was evicted
        assert all(st.has_stash(stash_key([f"a{i}"]), "A", K1) for i in range(200))
        assert rows <= 2 * st.evicted  # each victim and the row that ended its walk, no A's


# -- the head-hash session --------------------------------------------------------------------------


SYSTEM = "You are a helpful agent."
FIRST = {"role": "user", "content": "fix the bug"}


def _body(messages: list[dict[str, Any]]) -> bytes:
    return json.dumps({"model": "m", "system": SYSTEM, "messages": messages}).encode()


def test_the_head_hash_session_is_each_tenants_own_and_the_anonymous_one_is_unchanged():
    index = index_body(_body([FIRST]), ANTHROPIC)
    anonymous = session_of({}, index, ANONYMOUS).id
    assert anonymous == head_hash(SYSTEM, FIRST)  # as before tenancy
    one, two = session_of({}, index, K1).id, session_of({}, index, K2).id
    assert len({anonymous, one, two}) == 3
    assert all(s.startswith("h:") and len(s) == 34 for s in (one, two))
    again = index_body(_body([FIRST]), ANTHROPIC)
    assert session_of({}, again, K1).id == one  # stable
    # An explicit id is the request's, whoever sends it (the state under it is not shared).
    assert session_of({"x-context-guru-session": "A"}, index, K1).id == "A"


def test_an_index_inherited_from_another_tenants_body_gives_each_its_own_session():
    """The memo on an index (`memo["head"]`) is the plain hash: a body indexed from another
    tenant's byte-identical previous turn still resolves to its own tenant's session."""
    cache = MessageCache()
    first = index_body(_body([FIRST]), ANTHROPIC, cache)
    alone = index_body(_body([FIRST]), ANTHROPIC)
    assert session_of({}, first, K1).id == session_of({}, alone, K1).id
    grown = [FIRST, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}]
    inherited = index_body(_body(grown), ANTHROPIC, cache)
    assert inherited.shared > 0  # vacuity: indexed from K1's turn, memo and all
    fresh = index_body(_body(grown), ANTHROPIC)
    assert session_of({}, inherited, K2).id == session_of({}, fresh, K2).id
    assert session_of({}, inherited, K2).id != session_of({}, inherited, K1).id
