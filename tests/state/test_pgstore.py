"""What only the PostgreSQL store has, on a real server (tests/conftest.py): claims with leases
across instances, a cache kept true by LISTEN/NOTIFY (a cached read costs no round trip), a
database restarted under it, the password never shown, psycopg never imported for SQLite.

The semantics it shares with the SQLite store are tested on both engines in test_store.py."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import pytest

from cg.settings import StoreConfig
from cg.state import open_store
from cg.state.pgstore import PgStore, redact_url
from cg.state.records import Checkpoint, StoreError, stash_key
from cg.state.sqlite import SqliteStore
from tests.support.pgserver import PgServer


def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait (bounded, polling) for `cond`; a condition, never a fixed sleep."""
    pause = threading.Event()
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError("condition not met")
        pause.wait(0.01)


def cp(conv: str, chash: str = "h1", summary: str = "S") -> Checkpoint:
    return Checkpoint(conv, summary, 1, 3, chash, None, '{"role":"user","content":"S"}')


@pytest.fixture
def two(pg_url: str) -> Iterator[tuple[PgStore, PgStore]]:
    a, b = PgStore(pg_url, lease_seconds=0.6), PgStore(pg_url, lease_seconds=0.6)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def test_redact_url_hides_only_the_password():
    assert redact_url("postgresql://u:s3cret@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert redact_url("postgresql://u@h/db") == "postgresql://u@h/db"
    assert redact_url("postgres://u:p%40ss@h/db?sslmode=require") == (
        "postgres://u:***@h/db?sslmode=require"
    )


def test_the_password_is_never_shown(pg_url: str, pg_server: PgServer):
    pw = pg_server.password
    with PgStore(pg_url) as st:
        assert pw not in st.path and "***" in st.path
        assert pw not in repr(st.describe()) and pw not in repr(st.stats())
    bad = pg_url.replace(pw, pw + "x")
    with pytest.raises(StoreError) as e:
        PgStore(bad)
    assert pw not in str(e.value) and "password authentication failed" in str(e.value)
    down = f"postgresql://cg:{pw}@127.0.0.1:1/x"
    with pytest.raises(StoreError) as e:
        PgStore(down)
    assert pw not in str(e.value) and "cannot open the store" in str(e.value)


def test_store_open_picks_the_engine(pg_url: str, tmp_path):
    with open_store(StoreConfig(path=str(tmp_path / "a.sqlite3"))) as st:
        assert type(st) is SqliteStore
    with open_store(StoreConfig(url=pg_url)) as st:
        assert isinstance(st, PgStore)
    with open_store(StoreConfig(), pg_url) as st:  # cg_db=postgresql://…
        assert isinstance(st, PgStore)


def test_importing_cg_does_not_import_psycopg():
    code = (
        "import sys, cg, cg.state.sqlite, cg.proxy.addon, cg.summarize.component\n"
        "assert 'psycopg' not in sys.modules, 'psycopg imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_exactly_one_of_many_concurrent_claims_wins(two: tuple[PgStore, PgStore]):
    a, b = two

    async def race() -> list[bool]:
        return list(await asyncio.gather(*(s.claim("sess#c1", None) for s in (a, b, a, b, b, a))))

    won = asyncio.run(race())
    # An instance re-claiming what it holds is still one holder: the winner's both calls win.
    holders = {h for _, h, _ in a.claims()}
    assert len(holders) == 1
    assert won.count(True) == 3 and (won[0] == won[2] == won[5])


def test_a_claim_is_refused_once_a_newer_checkpoint_exists(two: tuple[PgStore, PgStore]):
    a, b = two
    assert asyncio.run(a.claim("s#1", None))
    a.put_checkpoint(cp("s#1", "h1"))
    a.flush()
    # b decided on "no checkpoint": a's is newer, reuse it (even before a releases its claim).
    assert not asyncio.run(b.claim("s#1", None))
    # Decided on a's checkpoint (a roll-forward): not while a holds the lease ...
    assert not asyncio.run(b.claim("s#1", "h1"))
    a.release("s#1")
    a.flush()
    assert a.claims() == []
    # ... granted once a let go; and still refused to a decision made on no checkpoint.
    assert not asyncio.run(b.claim("s#1", None))
    assert asyncio.run(b.claim("s#1", "h1"))


def test_a_lease_is_renewed_while_held_and_taken_over_once_it_runs_out(
    two: tuple[PgStore, PgStore],
):
    a, b = two
    assert asyncio.run(a.claim("s#2", None))
    t0 = time.monotonic()
    # Past two whole leases a still holds it: its writer renews it.
    until(lambda: time.monotonic() - t0 > 1.3)
    assert not asyncio.run(b.claim("s#2", None))
    # a dies (stops renewing, as a killed process does): b takes it over once the lease ends.
    a._held.clear()
    until(lambda: asyncio.run(b.claim("s#2", None)), timeout=5)
    assert {h for _, h, _ in b.claims()} == {b.instance}
    # A failed job releases its claim.
    b.release("s#2")
    b.flush()
    assert b.claims() == []


def test_a_checkpoint_written_elsewhere_is_seen_and_then_served_from_the_cache(
    two: tuple[PgStore, PgStore],
):
    a, b = two
    assert b.get_checkpoint("s#3") is None  # cached: none
    a.put_checkpoint(cp("s#3", "h1", "first"))
    until(lambda: (got := b.get_checkpoint("s#3")) is not None and got.summary == "first")
    misses = b.cache.misses
    for _ in range(100):
        got = b.get_checkpoint("s#3")
        assert got is not None and got.summary == "first"
    assert b.cache.misses == misses  # no round trip: every read came from the cache
    a.put_checkpoint(cp("s#3", "h2", "second"))
    until(lambda: (got := b.get_checkpoint("s#3")) is not None and got.summary == "second")
    a.delete_checkpoint("s#3")
    until(lambda: b.get_checkpoint("s#3") is None)


def test_session_clocks_travel_in_the_notices(two: tuple[PgStore, PgStore]):
    a, b = two
    a.touch_session("sx", now=100.0, cache_ttl=300.0)
    until(lambda: (r := b.get_session("sx")) is not None and r.last_request == 100.0)
    misses = b.cache.misses
    b.touch_session("sx", now=101.0)
    until(lambda: (r := a.get_session("sx")) is not None and r.last_request == 101.0)
    prev = a.touch_session("sx", now=102.0)
    assert prev is not None and prev.last_request == 101.0 and prev.cache_ttl is None
    assert b.cache.misses == misses


def test_a_restarted_database_is_reconnected_and_queued_writes_land(
    pg_url: str, pg_server: PgServer
):
    with PgStore(pg_url) as st:
        key = stash_key(['{"a": 1}'])
        st.put_stash(key, "s", ['{"a": 1}'], "anthropic")
        st.flush()
        pg_server.stop()
        try:
            until(lambda: not st.listening)
            with pytest.raises(StoreError):
                st.get_checkpoint("s#gone")  # not cached any more: a round trip, which fails
            assert st.error is not None and pg_server.password not in st.error
            # A ledger write while the database is down is kept for after the reconnect.
            from cg.wire.usage import Usage

            st.record_usage("s", [("agent", "m", "", Usage(1, 0, 0, 0, 2, 1))])
        finally:
            pg_server.start()

        def usable() -> bool:
            try:
                st.probe()
            except StoreError:
                return False
            return True

        until(usable, timeout=20)
        assert st.describe()["listening"] and not st.__dict__["error"]
        assert [r.usage.output_tokens for r in st.usage_rows("s")] == [2]
        assert st.get_stash(key, "s") is not None


def test_instances_starting_together_migrate_once(pg_url: str):
    stores: list[PgStore] = []
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            stores.append(PgStore(pg_url))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for s in stores:
        s.close()
    assert not errors and len(stores) == 4
    assert str(urlsplit(pg_url).password) not in stores[0].path


def test_a_read_after_a_refused_write_still_waits_for_the_writes_queued(pg_url: str):
    """A write the database refused leaves `error` set until the next one commits; the server
    is up all the while, so a read still waits for this process's queued writes (it skipped
    them, and read a ledger without the answer just booked: the gathered-writes test below
    flaked so under load). Only a writer without its server (`down`) skips the wait."""
    from cg.wire.usage import Usage

    with PgStore(pg_url) as st:
        st.error = "record_usage on the store: a refused write"  # as the writer leaves it
        st.record_usage("a", [("agent", "m", "", Usage(5, 0, 0, 0, 7, 1))])  # gathered first
        rows = st.usage_rows("a")
        assert [(r.usage.input_tokens, r.usage.output_tokens) for r in rows] == [(5, 7)]
        assert not st.down


def test_gathered_writes_commit_together_and_a_bad_one_drops_alone(pg_url: str):
    from cg.wire.usage import Usage

    with PgStore(pg_url) as st:
        st.touch_session("a", now=1.0)
        st.record_usage("a", [("agent", "m", "", Usage(2**70, 0, 0, 0, 0, 1))])  # > BIGINT
        st.record_usage("a", [("agent", "m", "", Usage(5, 0, 0, 0, 7, 1))])
        st.touch_session("b", now=2.0)
        rows = st.usage_rows("a")  # waits for the writes
        assert [(r.usage.input_tokens, r.usage.output_tokens) for r in rows] == [(5, 7)]
        assert (
            st.dropped == 1
        )  # counted (health: store.dropped); the error cleared by the next write
        assert {i.session for i in st.sessions()} == {"a", "b"}
