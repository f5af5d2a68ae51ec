"""Hostile requests through a real mitmdump (docs/behaviour.md#bounded-work-and-shared-use, issue
29): none kills, stalls or crosses the proxy.

- A decompression bomb (1.7 KB of br, 33 KB of zstd, 1 MB of gzip, a chain: each 1 GiB decoded)
  passes through byte-identical, read no further than the cap, and the proxy's peak RSS stays
  near its idle RSS. Before: mitmdump aborted (`memory allocation of 34359738368 bytes failed`).
- A large body under the cap (one 30 MB unbroken run, 200k tiny messages, 19k of them, 30 MB of
  ordinary messages) is read off the event loop: small turns and `/_cg/health` sent meanwhile
  answer in well under the bound. Before: every other turn waited 6–26 s.
- A second proxy on the same SQLite file is refused at start, naming the first; the file is
  free again once the first stops, or is killed.

The bodies are built streaming (tests/support/bombs.py); the upstream is tests/e2e/hostile.py's sink, a
process of its own, so that the client timing a turn shares no interpreter with it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e import hostile
from tests.e2e.harness import Proxy, new_id, poll
from tests.support import bombs

pytestmark = pytest.mark.e2e

STALL_S = 2.0  # a turn or health check sent meanwhile answers within this (before: 6–26 s)
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, hostile.Sink, float]]:
    """One proxy (default options, its own store) in front of the sink, and its idle RSS."""
    with hostile.proxy_and_sink(tmp_path_factory.mktemp("hostile")) as (proxy, sink):
        yield proxy, sink, hostile.idle_rss(proxy)
        assert not proxy.addon_errors(), proxy.log_text()


BOMBS = [n for n in hostile.cases() if n.startswith("bomb") or n.startswith("gzip, 200 MB")]
LARGE = [n for n in hostile.cases() if n not in BOMBS]


@pytest.mark.parametrize("name", BOMBS)
def test_a_bomb_passes_through_untouched_and_the_proxy_stays_small(
    rig: tuple[Any, hostile.Sink, float], name: str
) -> None:
    proxy, sink, idle = rig
    make, headers = hostile.cases()[name]
    body = make()
    assert len(body) < 1_100_000
    got = hostile.send_hostile(proxy, sink, name, body, headers, idle)
    assert got.status == 200 and got.error is None, got
    assert got.forwarded_identical, got  # the upstream got the client's bytes exactly
    assert (got.outcome, got.bound) == ("passed_through", "cg_max_body_mb"), got
    # The budget (docs/reliability.md, bounded work) is 2× idle plus the cap; the test allows
    # another 32 MiB of slack (what the allocator keeps).
    assert got.peak_rss_mib < 2 * idle + 64, got
    assert got.slowest_turn_ms < STALL_S * 1000 and got.slowest_health_ms < STALL_S * 1000, got


@pytest.mark.parametrize("name", LARGE)
def test_a_large_body_stalls_no_other_turn(rig: tuple[Any, hostile.Sink, float], name: str) -> None:
    proxy, sink, idle = rig
    make, headers = hostile.cases()[name]
    got = hostile.send_hostile(proxy, sink, name, make(), headers, idle)
    assert got.status == 200 and got.error is None and got.forwarded_identical, got
    assert got.turns >= hostile.MIN_ROUNDS, got
    assert got.slowest_turn_ms < STALL_S * 1000, got
    assert got.slowest_health_ms < STALL_S * 1000, got
    assert got.outcome == "passed_through", got  # (the sink's answers carry no summary)
    if "200k" in name or "900k" in name:  # (stopped at the 20,001st element)
        assert got.bound == "cg_max_messages", got


def test_the_large_bodies_were_read_aside(rig: tuple[Any, hostile.Sink, float]) -> None:
    """Vacuity guard: the bodies under every bound were read, in the worker thread (a record
    that only passed them through unread would make the stall test above prove nothing)."""
    proxy = rig[0]
    e2e = new_id()
    with httpx.Client(base_url=proxy.url, trust_env=False, timeout=60) as c:
        r = c.post(
            "/v1/messages",
            content=bombs.tiny_messages(19_000, tag="unseen "),  # (no earlier turn of it)
            headers={"content-type": "application/json", "x-e2e-id": e2e},
        )
    assert r.status_code == 200
    rec = proxy.records.cg(e2e)
    assert rec["messages_in"] == 19_000 and rec["read_aside"].endswith("new bytes"), rec
    assert rec["timings_ms"]["aside"] > 0


# -- one SQLite file, one proxy -------------------------------------------------------------


def test_a_second_proxy_on_the_same_store_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "shared.sqlite3"
    with hostile.Sink.running() as sink:
        first = Proxy.start(sink.url, tmp_path / "a", preset="auto", options=[f"cg_db={db}"])
        try:
            with pytest.raises(RuntimeError) as refused:
                second = Proxy.start(
                    sink.url, tmp_path / "b", preset="auto", options=[f"cg_db={db}"]
                )
                second.stop()  # (only reached when it wrongly started)
            text = str(refused.value)
            assert f"is in use by another context-guru process (pid {first.proc.pid})" in text
            assert "cg_db" in text
            with first.client() as c:  # the first is untouched by it
                assert hostile.small_turn(c, "still-here") > 0
        finally:
            first.stop()
        # Stopped: the file is free for another proxy.
        third = Proxy.start(sink.url, tmp_path / "c", preset="auto", options=[f"cg_db={db}"])
        # Killed (no exit handler runs): the kernel lets go of the claim all the same.
        os.kill(third.proc.pid, signal.SIGKILL)
        third.proc.wait(10)
        third.stop()
        fourth = Proxy.start(sink.url, tmp_path / "d", preset="auto", options=[f"cg_db={db}"])
        fourth.stop()


def test_the_cli_reads_the_store_the_proxy_holds(tmp_path: Path) -> None:
    """A reader claims nothing: `context-guru sessions --db` beside the running proxy."""
    db = tmp_path / "cg.sqlite3"
    with hostile.Sink.running() as sink:
        proxy = Proxy.start(sink.url, tmp_path / "p", preset="auto", options=[f"cg_db={db}"])
        try:
            with proxy.client() as c:
                hostile.small_turn(c, "read-me")
            out = ""
            for _ in poll(10.0):  # (the turn's booking is committed within cg_store_batch_ms)
                run = subprocess.run(
                    [sys.executable, "-m", "cg", "sessions", "--db", str(db)],
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                assert run.returncode == 0, run.stderr
                out = run.stdout
                if "read-me" in out:
                    break
            assert "read-me" in out, out
        finally:
            proxy.stop()
