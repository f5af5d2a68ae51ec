"""Injected faults, through a real mitmdump: each with what must happen — the agent's traffic keeps
flowing (every turn answered, byte-identical when nothing could be spliced), nothing stashed is
lost, and the fault is counted or reported.

    the summarizer   429 with retry-after, garbage, a tool-call-only answer, a slow drip
                     (500s, a blank answer, a hang and an unreachable endpoint are in
                     tests/e2e/test_summarize_e2e.py)
    the store        locked by another process; read-only at start; the disk full; the file
                     deleted while open; corrupt at start. /_cg/health says so (`store`), the
                     requests pass through with the reason, and the addon acts again once the
                     fault is gone
    the upstream     resets the connection mid-answer

The read-only and disk-full cases mount a small tmpfs (root, as CI runs); without it they skip,
saying so.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from tests.e2e.harness import (
    Proxy,
    assert_forwarded_unchanged,
    low,
    poll,
    received,
    start_summarize,
)
from tests.e2e.sdk_sessions import Exchange, SdkClient, anthropic_messages
from tests.support.fakeprovider import DEFAULT_TEXT, FakeProvider, Reply, anthropic_error

pytestmark = pytest.mark.e2e

# The standalone prompt only: one summarizer request per attempt, counted plainly.
LOW = low(resummarize_tokens=1_000_000, model={"share_cache": "never"})
HEADER = b"=== History Summary ==="


def health(proxy: Proxy) -> dict[str, Any]:
    with proxy.client(timeout=5.0) as c:
        r = c.get("/_cg/health")
    doc: dict[str, Any] = r.json()
    assert r.status_code == 200 and doc["serving"] is True  # the addon serves, whatever the store
    assert doc["ok"] is doc["store"]["ok"]  # ...and is ok only while the store is usable
    return doc


def wait_store(proxy: Proxy, ok: bool, timeout: float = 15.0) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for _ in poll(timeout):
        doc = health(proxy)["store"]
        if doc["ok"] is ok:
            return doc
    raise TimeoutError(f"/_cg/health store never became ok={ok}: {doc}")


def about(session: str) -> Any:
    return lambda r: r.is_summarizer and f"Task {session}:".encode() in r.body


def passes(agent: SdkClient, provider: FakeProvider, n: int) -> Exchange:
    """One turn that must reach the provider exactly as the agent sent it."""
    t = agent.turn(anthropic_messages(agent.session, n))
    assert t.text == DEFAULT_TEXT
    assert_forwarded_unchanged(t.request, received(provider, t.eid))
    return t


def settled(proxy: Proxy) -> dict[str, int]:
    """The counters once no summary is in flight (every commissioned one has ended)."""
    for _ in poll(15.0):
        c = proxy.counts()
        if c["commissioned"] == c["completed"] + c["failed"] + c["timed_out"]:
            return c
    raise TimeoutError(f"a summary never ended: {proxy.counts()}")


def acts_again(agent: SdkClient, proxy: Proxy, provider: FakeProvider, n: int = 9) -> Exchange:
    """The addon is back: turns go until one is spliced (a summary commissioned, written and
    used); that turn carries the summary. At most a few turns, each after the summaries end."""
    for _ in range(6):
        t = agent.turn(anthropic_messages(agent.session, n))
        if proxy.records.cg(t.eid)["outcome"] == "rewritten":
            assert HEADER in received(provider, t.eid).body
            return t
        settled(proxy)
        n += 2
    raise AssertionError(f"the addon never spliced again: {proxy.counts()}")


# -- the summarizer ------------------------------------------------------------------------------


def test_a_429_with_retry_after_is_retried_and_the_summary_completes(provider, tmp_path, proxies):
    proxy = proxies(start_summarize(provider.url, tmp_path, LOW))
    limited = anthropic_error(429, "rate_limit_error", "slow down")
    limited.headers["retry-after"] = "1"
    provider.script_summarizer(limited, limited)
    with SdkClient(proxy, "anthropic") as agent:
        c0 = proxy.counts()
        passes(agent, provider, 7)
        c1 = proxy.wait_count(c0, "completed")
        assert c1["failed"] == c0["failed"]
        assert len(provider.wait_for(3, where=about(agent.session))) == 3  # 429, 429, 200
        t = agent.turn(anthropic_messages(agent.session, 9))
        assert HEADER in received(provider, t.eid).body


@pytest.mark.parametrize(
    ("name", "replies"),
    [
        ("429 every time", [anthropic_error(429, "rate_limit_error", "no")] * 3),
        ("not JSON", [Reply(200, body=b"<html>502 Bad Gateway</html>", headers={})]),
        ("JSON of another shape", [Reply.json(200, {"ok": True, "content": "nope"})]),
        (
            "only a tool call",
            [
                Reply.json(
                    200,
                    {
                        "id": "msg_x",
                        "type": "message",
                        "role": "assistant",
                        "model": "claude-test",
                        "content": [
                            {"type": "tool_use", "id": "toolu_x", "name": "Bash", "input": {}}
                        ],
                        "stop_reason": "tool_use",
                        "stop_sequence": None,
                        "usage": {"input_tokens": 5, "output_tokens": 5},
                    },
                )
            ],
        ),
    ],
)
def test_a_summarizer_answer_that_is_no_summary_is_counted_and_nothing_breaks(
    provider, tmp_path, proxies, name, replies
):
    proxy = proxies(start_summarize(provider.url, tmp_path, LOW))
    for r in replies:
        r.headers.setdefault("retry-after", "0")
    provider.script_summarizer(*replies)
    with SdkClient(proxy, "anthropic") as agent:
        c0 = proxy.counts()
        passes(agent, provider, 7)
        c1 = proxy.wait_count(c0, "failed")
        assert c1["completed"] == c0["completed"], name
        passes(agent, provider, 9)  # no checkpoint: the next turn goes as sent
        acts_again(agent, proxy, provider, 11)  # and the next summary, a good one, is used


def test_a_summarizer_that_drips_its_answer_times_out_without_holding_a_turn(
    provider, tmp_path, proxies
):
    proxy = proxies(
        start_summarize(provider.url, tmp_path, LOW, env={"CONTEXT_GURU_SUMMARIZE_TIMEOUT": "3"})
    )
    slow = Reply(text="<summary>late</summary>", drip=0.05)  # ~15 s for its ~300 bytes
    provider.script_summarizer(slow)
    with SdkClient(proxy, "anthropic") as agent:
        c0 = proxy.counts()
        t1 = passes(agent, provider, 7)
        provider.wait_for(1, where=about(agent.session))
        t2 = passes(agent, provider, 9)  # answered while the summarizer drips
        assert max(t1.seconds, t2.seconds) < 2.5  # not held for the 3 s deadline
        c1 = proxy.wait_count(c0, "timed_out")
        assert (c1["completed"], c1["failed"]) == (c0["completed"], c0["failed"])
        passes(agent, provider, 11)  # nothing late was spliced


# -- the store -----------------------------------------------------------------------------------

LOCKER = """
import sqlite3, sys
c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
c.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def locked(db: Path) -> Iterator[None]:
    """Another process holds the store's write lock until the block ends."""
    proc = subprocess.Popen(
        [sys.executable, "-c", LOCKER, str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "locked\n"
        yield
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_a_store_locked_by_another_process_passes_turns_through_then_recovers(
    provider, tmp_path, proxies
):
    db = tmp_path / "cg.sqlite3"
    proxy = proxies(start_summarize(provider.url, tmp_path, LOW, db=db))
    with SdkClient(proxy, "anthropic") as agent:
        with locked(db):
            turns = [passes(agent, provider, n) for n in (7, 9, 11)]
            assert all(t.seconds < 3.0 for t in turns), [t.seconds for t in turns]
            reasons = [proxy.records.cg(t.eid).get("reason", "") for t in turns]
            assert any("store" in r for r in reasons), reasons
            store = wait_store(proxy, ok=False)
            assert "locked" in store["error"]
            assert proxy.counts()["commissioned"] == 0
        wait_store(proxy, ok=True)
        acts_again(agent, proxy, provider, 13)


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def remount(path: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], check=True)


def test_a_read_only_store_at_start_passes_through_and_acts_once_writable(
    provider, tmp_path, proxies
):
    with tmpfs(tmp_path / "ro", "4m") as fs:
        db = fs / "cg.sqlite3"
        with sqlite3.connect(db) as conn:  # a store that exists, on a file system gone read-only
            conn.execute("PRAGMA journal_mode = WAL")
        conn.close()
        remount(fs, "ro")
        proxy = proxies(start_summarize(provider.url, tmp_path / "proxy", LOW, db=db))
        store = wait_store(proxy, ok=False)
        assert "cg.sqlite3" in store["error"], store
        with SdkClient(proxy, "anthropic") as agent:
            t = passes(agent, provider, 7)
            assert "store is unavailable" in proxy.records.cg(t.eid)["reason"]
            assert proxy.counts()["commissioned"] == 0
            remount(fs, "rw")
            wait_store(proxy, ok=True)  # re-opened within STORE_RETRY (asking health retries)
            acts_again(agent, proxy, provider, 9)
        proxy.stop()


def test_a_full_disk_passes_turns_through_loses_no_stash_and_recovers(provider, tmp_path, proxies):
    with tmpfs(tmp_path / "full", "2m") as fs:
        db = fs / "cg.sqlite3"
        proxy = proxies(start_summarize(provider.url, tmp_path / "proxy", LOW, db=db))
        with SdkClient(proxy, "anthropic") as agent:
            first = acts_again(agent, proxy, provider, 7)  # a stash written before the fault
            key = stash_key_of(received(provider, first.eid).body)
            filler = fs / "filler"
            with filler.open("wb", buffering=0) as f, contextlib.suppress(OSError):
                while True:  # every free block taken
                    f.write(b"\0" * 65536)
            other = SdkClient(proxy, "anthropic")
            with other:
                for n in (7, 9, 11, 13):  # a new session: each turn writes, and cannot
                    passes(other, provider, n)
                store = wait_store(proxy, ok=False)
                assert "full" in store["error"], store
                assert expand(proxy, key) == 200  # what was stashed is still there
                filler.unlink()
                wait_store(proxy, ok=True)
                acts_again(other, proxy, provider, 15)
            assert expand(proxy, key) == 200
        proxy.stop()


def stash_key_of(body: bytes) -> str:
    import re

    m = re.search(rb"<<cg:([0-9a-f]{24})>>", body)
    assert m is not None, "no marker in the spliced body"
    return m.group(1).decode()


def expand(proxy: Proxy, key: str) -> int:
    with proxy.client(timeout=5.0) as c:
        return c.get("/_cg/expand", params={"id": key}).status_code


def test_a_store_deleted_while_open_is_written_back_with_everything(provider, tmp_path, proxies):
    db = tmp_path / "cg.sqlite3"
    proxy = proxies(start_summarize(provider.url, tmp_path / "a", LOW, db=db))
    with SdkClient(proxy, "anthropic") as agent:
        t = acts_again(agent, proxy, provider, 7)
        key = stash_key_of(received(provider, t.eid).body)
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{db}{suffix}")
        assert not db.exists()
        passes_or_spliced = agent.turn(anthropic_messages(agent.session, 13))
        assert passes_or_spliced.text == DEFAULT_TEXT
        assert db.exists(), "the store was not written back"
        assert expand(proxy, key) == 200
        assert wait_store(proxy, ok=True)
    proxy.stop()
    assert any("written back" in line for line in proxy.log), proxy.log_text()
    again = proxies(start_summarize(provider.url, tmp_path / "b", LOW, db=db))
    assert expand(again, key) == 200  # a restart on the same path finds it too


def test_a_corrupt_store_at_start_is_reported_passes_through_until_replaced(
    provider, tmp_path, proxies
):
    db = tmp_path / "cg.sqlite3"
    db.write_bytes(b"this is not a database, " * 400)
    proxy = proxies(start_summarize(provider.url, tmp_path / "proxy", LOW, db=db))
    store = wait_store(proxy, ok=False)
    assert "not a database" in store["error"], store
    assert any("passing every request through" in line for line in proxy.log)
    with SdkClient(proxy, "anthropic") as agent:
        t = passes(agent, provider, 7)
        assert "store is unavailable" in proxy.records.cg(t.eid)["reason"]
        db.unlink()  # the operator moves the bad file away
        wait_store(proxy, ok=True)
        acts_again(agent, proxy, provider, 9)


# -- the upstream ---------------------------------------------------------------------------------


def test_an_upstream_reset_mid_answer_reaches_the_client_as_a_cut_and_is_counted(
    provider, tmp_path, proxies
):
    proxy = proxies(start_summarize(provider.url, tmp_path, LOW))
    cut = Reply(reset_after=4)  # message_start, block start, ping, one delta: then RST
    with SdkClient(proxy, "anthropic") as agent:
        c0 = proxy.stats()["usage_reads"]
        provider.script(cut)
        with pytest.raises((anthropic.APIError, httpx.TransportError)):
            agent.turn(anthropic_messages(agent.session, 5), stream=True)
        assert cut.answered.wait(10)
        eid = agent.capture.sent[-1].headers["x-e2e-id"]
        line = proxy.records.wait(eid)
        assert line["phase"] == "error" and line["cg"]["outcome"] == "passed_through", line
        reads = proxy.wait_stats(lambda s: s["usage_reads"]["truncated"] > c0["truncated"])
        assert reads["usage_reads"]["tap_errors"] == c0["tap_errors"]
        t = agent.turn(anthropic_messages(agent.session, 5), stream=True)  # the next one: fine
        assert t.text == DEFAULT_TEXT


def test_the_fault_helpers_are_not_vacuous(tmp_path):
    """The lock holder really holds the write lock; the drip really is slower than the
    deadline the drip test sets."""
    db = tmp_path / "x.sqlite3"
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    with locked(db):
        other = sqlite3.connect(db, timeout=0.1)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            other.execute("INSERT INTO t VALUES (1)")
        other.close()
    body = f'{{"content":[{{"type":"text","text":"<summary>late</summary>"}}]}}{"x" * 200}'
    assert len(body) * 0.05 > 3.0
