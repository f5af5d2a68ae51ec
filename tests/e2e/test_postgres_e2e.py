"""Several proxies, one memory: real `mitmdump -s cg_addon.py` instances on one PostgreSQL
database (the suite's own server, tests/conftest.py), a session's turns sent round-robin.

- three instances, the same qualifying turn seen by all three: one summarizer call (the two
  others are `deferred`), then the byte-identical summary spliced by every instance, and its
  stash expanded by any of them;
- the claim's holder killed (-9) mid-commission: once its lease runs out, another instance takes
  the conversation over and the session is summarized;
- the database stopped mid-session: every turn is still answered (passed through as sent, the
  reason recorded), and once it is back the store reconnects and splicing resumes.

Waits are conditions: the stats counters, the database's claims table, and a ping notice each
instance reports in `/_cg/health` once it has applied every change committed before it.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.harness import Proxy, assert_forwarded_unchanged, low, poll, received
from tests.e2e.sdk_sessions import SdkClient, anthropic_messages
from tests.support.fakeprovider import DEFAULT_TEXT, FakeProvider, Recorded, Reply
from tests.support.pgserver import PgServer

pytestmark = pytest.mark.e2e

MARKER = re.compile(r"<<cg:([0-9a-f]+)>>")
# Triggers a short transcript passes; no roll-forward (one summary per session); the
# standalone prompt (no wait on the commissioning answer); a short lease for the takeover.
SUMMARIZE = {**low(resummarize_tokens=100_000), "model": {"share_cache": "never"}}
LEASE = 1.5


def start(provider: FakeProvider, url: str, workdir: Path, n: int) -> list[Proxy]:
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "cg.yaml"
    config.write_text(
        yaml.safe_dump({"components": {"summarize": SUMMARIZE}, "store": {"lease_seconds": LEASE}})
    )
    out: list[Proxy] = []
    try:
        for i in range(n):
            out.append(
                Proxy.start(
                    provider.url,
                    workdir / f"instance{i}",
                    preset="summarize",
                    options=[f"cg_db={url}", f"cg_config={config}"],
                )
            )
    except BaseException:
        for p in out:
            p.stop()
        raise
    return out


@pytest.fixture
def instances(
    provider: FakeProvider, pg_url: str, tmp_path: Path
) -> Iterator[Callable[[int], list[Proxy]]]:
    started: list[Proxy] = []

    def make(n: int) -> list[Proxy]:
        ps = start(provider, pg_url, tmp_path, n)
        started.extend(ps)
        return ps

    yield make
    for p in started:
        p.stop()  # by PID; a killed one is already gone


def health(p: Proxy) -> dict[str, Any]:
    with p.client(timeout=5.0) as c:
        doc: dict[str, Any] = c.get("/_cg/health").json()
    return doc


def caught_up(url: str, proxies: list[Proxy], within: float = 30.0) -> None:
    """Every instance has applied every change committed so far (notices come in commit order,
    so one that saw this ping saw all before it).

    The ping is sent again until each instance has seen one: an instance whose listening
    connection is being re-established (after the database restarted, `ok` can come back before
    its LISTEN does) misses a notice sent in between, and one it sees later still proves it has
    applied everything committed before that one."""
    import psycopg

    seen: set[int] = set()
    for _ in poll(within):
        token = uuid.uuid4().hex
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("SELECT pg_notify('cg_store', %s)", (f"p {token}",))
        for _ in poll(2.0):
            for p in proxies:
                if p.port not in seen and health(p)["store"].get("cache", {}).get("ping") == token:
                    seen.add(p.port)
            if len(seen) == len(proxies):
                return
    missing = [p.port for p in proxies if p.port not in seen]
    raise TimeoutError(f"instances on ports {missing} never saw a ping")


def summaries_of(provider: FakeProvider, tag: str) -> list[Recorded]:
    return [r for r in provider.requests if r.is_summarizer and f"Task {tag}:".encode() in r.body]


def summary_of(got: Recorded) -> bytes:
    """The spliced summary message a provider request carries (position 1: keep_first 1)."""
    msgs = got.json()["messages"]
    assert len(msgs) >= 2
    text = msgs[1]["content"]
    assert isinstance(text, str) and text.startswith("=== History Summary ==="), msgs[1]
    return json.dumps(msgs[1]).encode()


def no_password(pw: str, proxies: list[Proxy]) -> None:
    for p in proxies:
        assert pw not in p.log_text()
        with p.client(timeout=5.0) as c:
            for path in ("/_cg/health", "/_cg/stats", "/_cg/sessions"):
                assert pw not in c.get(path).text, path
        assert pw not in p.records.path.read_text(encoding="utf-8")


def test_three_instances_round_robin_one_summary_the_same_bytes_everywhere(
    instances: Callable[[int], list[Proxy]],
    provider: FakeProvider,
    pg_url: str,
    pg_server: PgServer,
) -> None:
    ps = instances(3)
    for p in ps:
        store = health(p)["store"]
        assert store["ok"] and store["engine"] == "postgresql" and store["listening"]
    session = uuid.uuid4().hex
    tag = session
    agents = [SdkClient(p, "anthropic", session=session) for p in ps]
    try:
        # The same qualifying turn reaches all three while the first one's summary is held.
        hold = threading.Event()
        provider.script_summarizer(Reply(hold=hold, hold_timeout=60))
        c0 = [p.counts() for p in ps]
        t = agents[0].turn(anthropic_messages(tag, 7))
        assert t.text == DEFAULT_TEXT
        provider.wait_for(1, where=lambda r: r.is_summarizer and f"Task {tag}:".encode() in r.body)
        for i in (1, 2):
            t = agents[i].turn(anthropic_messages(tag, 7))
            assert t.text == DEFAULT_TEXT
            assert ps[i].records.cg(t.eid)["outcome"] == "passed_through"
            ps[i].wait_count(c0[i], "deferred")  # it tried, and did not call the summarizer
        hold.set()
        ps[0].wait_count(c0[0], "completed")
        assert len(summaries_of(provider, tag)) == 1
        caught_up(pg_url, ps)

        # Round-robin: every instance splices the byte-identical summary, with no model call.
        seen: list[bytes] = []
        for n, i in zip((9, 11, 13, 15, 17, 19), (1, 2, 0, 1, 2, 0), strict=True):
            t = agents[i].turn(anthropic_messages(tag, n), stream=n % 4 == 1)
            assert t.text == DEFAULT_TEXT
            cg = ps[i].records.cg(t.eid)  # it landed on instance i
            assert cg["outcome"] == "rewritten", json.dumps(cg)
            seen.append(summary_of(received(provider, t.eid)))
        assert len(set(seen)) == 1
        assert len(summaries_of(provider, tag)) == 1
        counts = [p.counts() for p in ps]
        assert sum(c["completed"] - b["completed"] for c, b in zip(counts, c0, strict=True)) == 1
        assert all(c["reused"] - b["reused"] == 2 for c, b in zip(counts, c0, strict=True))

        # Any instance answers the expand of the stash.
        m = MARKER.search(seen[0].decode())
        assert m is not None
        sent = anthropic_messages(tag, 7)[1:4]
        for p in ps:
            with p.client() as c:
                r = c.get("/_cg/expand", params={"id": m.group(1)})
            assert r.status_code == 200, r.text
            assert r.json()["messages"] == sent
        no_password(pg_server.password, ps)
        # Nothing in the database holds the agent's key (and the dump is not empty).
        dump = database_text(pg_url)
        assert session in dump and "=== History Summary ===" in dump
        assert "sk-e2e" not in dump
    finally:
        for a in agents:
            a.__exit__()


def database_text(url: str) -> str:
    """Every row of every context-guru table, as text."""
    import psycopg

    out: list[str] = []
    with psycopg.connect(url, autocommit=True) as c:
        tables = c.execute(
            "SELECT tablename FROM pg_tables WHERE tablename LIKE 'cg\\_%' ORDER BY 1"
        ).fetchall()
        assert len(tables) >= 7, tables
        for (t,) in tables:
            for row in c.execute(f"SELECT * FROM {t}").fetchall():
                out.append(
                    repr(
                        [
                            bytes(v).decode("utf-8", "replace")
                            if isinstance(v, memoryview | bytes)
                            else v
                            for v in row
                        ]
                    )
                )
    return "\n".join(out)


def test_a_holder_killed_mid_commission_loses_its_lease_to_another_instance(
    instances: Callable[[int], list[Proxy]], provider: FakeProvider, pg_url: str
) -> None:
    import psycopg

    ps = instances(3)
    session = uuid.uuid4().hex
    tag = session
    agents = [SdkClient(p, "anthropic", session=session) for p in ps]
    hold = threading.Event()
    try:
        provider.script_summarizer(Reply(hold=hold, hold_timeout=60))
        agents[0].turn(anthropic_messages(tag, 7))
        provider.wait_for(1, where=lambda r: r.is_summarizer and f"Task {tag}:".encode() in r.body)
        with psycopg.connect(pg_url, autocommit=True) as c:
            claims = c.execute("SELECT conversation FROM cg_claims").fetchall()
        assert [row[0].split("#")[0] for row in claims] == [session]
        c1 = ps[1].counts()
        # A turn while the holder lives: deferred to it.
        agents[1].turn(anthropic_messages(tag, 9))
        ps[1].wait_count(c1, "deferred")

        ps[0].proc.kill()  # kill -9, by PID, mid-commission
        ps[0].proc.wait(10)
        hold.set()
        with psycopg.connect(pg_url, autocommit=True) as c:
            for _ in poll(LEASE * 10):
                live = c.execute(
                    "SELECT count(*) FROM cg_claims WHERE lease_until > "
                    "extract(epoch from clock_timestamp())"
                ).fetchone()
                if live is not None and live[0] == 0:
                    break
            else:
                raise TimeoutError("the dead holder's lease never ran out")

        c1 = ps[1].counts()
        agents[1].turn(anthropic_messages(tag, 11))  # takes the conversation over
        ps[1].wait_count(c1, "completed")
        assert len(summaries_of(provider, tag)) == 2  # the dead one's, and the taker's
        caught_up(pg_url, ps[1:])
        seen = []
        for n, i in ((13, 2), (15, 1)):
            t = agents[i].turn(anthropic_messages(tag, n))
            assert ps[i].records.cg(t.eid)["outcome"] == "rewritten"
            seen.append(summary_of(received(provider, t.eid)))
        assert seen[0] == seen[1]
        assert len(summaries_of(provider, tag)) == 2
    finally:
        hold.set()
        for a in agents:
            a.__exit__()


def test_the_database_restarted_mid_session_traffic_flows_and_the_store_reconnects(
    instances: Callable[[int], list[Proxy]],
    provider: FakeProvider,
    pg_url: str,
    pg_server: PgServer,
) -> None:
    ps = instances(2)
    session = uuid.uuid4().hex
    tag = session
    agents = [SdkClient(p, "anthropic", session=session) for p in ps]
    try:
        c0 = ps[0].counts()
        agents[0].turn(anthropic_messages(tag, 7))
        ps[0].wait_count(c0, "completed")
        caught_up(pg_url, ps)
        t = agents[1].turn(anthropic_messages(tag, 9))
        assert ps[1].records.cg(t.eid)["outcome"] == "rewritten"
        before = summary_of(received(provider, t.eid))

        pg_server.stop()
        try:
            for p in ps:
                for _ in poll(15.0):
                    if not health(p)["store"]["ok"]:
                        break
                else:
                    raise TimeoutError("the store never said it was down")
            for n, i in ((11, 0), (13, 1), (15, 0)):
                t = agents[i].turn(anthropic_messages(tag, n))
                assert t.text == DEFAULT_TEXT  # answered: fail open
                cg = ps[i].records.cg(t.eid)
                assert cg["outcome"] == "passed_through", cg
                assert "store" in cg["reason"], cg
                assert_forwarded_unchanged(t.request, received(provider, t.eid))
        finally:
            pg_server.start()

        for p in ps:
            for _ in poll(30.0):
                if health(p)["store"]["ok"]:
                    break
            else:
                raise TimeoutError("the store never reconnected")
        caught_up(pg_url, ps)
        for n, i in ((17, 1), (19, 0)):
            t = agents[i].turn(anthropic_messages(tag, n))
            cg = ps[i].records.cg(t.eid)
            assert cg["outcome"] == "rewritten", json.dumps(cg)
            assert summary_of(received(provider, t.eid)) == before
        assert len(summaries_of(provider, tag)) == 1
        no_password(pg_server.password, ps)
    finally:
        for a in agents:
            a.__exit__()
