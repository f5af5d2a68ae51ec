"""The session list at 10,000 sessions through a real mitmdump (issue 29): `/_cg/sessions` and the
dashboard answer a page by index, off the event loop, so an agent turn and `/_cg/health` sent
while they are fetched over and over answer at once; paging by `next` lists every session once,
most recently seen first.

The store is written straight into the SQLite file before the proxy starts
(`bench.session_page.populate`: half the sessions with a checkpoint, one in ten of those with
three conversations). Bounds are generous (seconds, where a page takes tens of milliseconds):
the whole list on the loop took ~20 s a request, and a turn sent meanwhile waited as long.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from bench.session_page import populate, session_id
from tests.e2e.harness import Proxy
from tests.support.fakeprovider import FakeProvider

pytestmark = pytest.mark.e2e

SESSIONS = 10_000
TURN_BOUND = 2.0  # seconds: a small turn, or /_cg/health, while pages are fetched
PAGE_BOUND = 3.0  # seconds: one page of /_cg/sessions, or the dashboard
TURNS = 12


@pytest.fixture(scope="module")
def crowded(provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    work = tmp_path_factory.mktemp("sessions-10k")
    db = work / "cg.sqlite3"
    populate(db, SESSIONS)
    with Proxy.start(provider.url, work, options=[f"cg_db={db}"]) as p:
        yield p


def turn(i: int) -> dict[str, Any]:
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": f"small turn {i}"}],
    }


class Fetcher(threading.Thread):
    """Fetches a page of `/_cg/sessions` (following `next`) and the dashboard, one after the
    other, until stopped; keeps when each request was in flight."""

    def __init__(self, proxy: Proxy) -> None:
        super().__init__(name="fetch-pages", daemon=True)
        self.proxy = proxy
        self.stop = threading.Event()
        self.started = threading.Event()
        self.done: list[tuple[str, float, float, int]] = []  # path, start, end, status
        self.error: BaseException | None = None

    def run(self) -> None:
        cursor: str | None = None
        try:
            with self.proxy.client(timeout=120.0) as c:
                while not self.stop.is_set():
                    for path in (f"/_cg/sessions?cursor={cursor}" if cursor else "/_cg/sessions",
                                 "/_cg/"):  # fmt: skip
                        t0 = time.monotonic()
                        self.started.set()
                        r = c.get(path)
                        self.done.append((path.split("?")[0], t0, time.monotonic(), r.status_code))
                        if path.startswith("/_cg/sessions") and r.status_code == 200:
                            cursor = r.json()["next"]
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e

    def in_flight(self, t: float) -> bool:
        return any(t0 <= t <= t1 for _, t0, t1, _ in self.done)


def test_a_turn_and_health_answer_at_once_while_the_session_list_is_fetched(crowded: Proxy):
    fetcher = Fetcher(crowded)
    fetcher.start()
    assert fetcher.started.wait(30), "the fetcher never sent a request"
    slow: list[str] = []
    starts: list[float] = []
    try:
        with crowded.client(timeout=5 * TURN_BOUND) as c:
            for i in range(TURNS):
                for what, send in (
                    ("turn", functools.partial(c.post, "/v1/messages", json=turn(i))),
                    ("health", functools.partial(c.get, "/_cg/health")),
                ):
                    t0 = time.monotonic()
                    try:
                        r = send()
                        took, status = time.monotonic() - t0, r.status_code
                    except httpx.TimeoutException:
                        took, status = float("inf"), 0
                    starts.append(t0)
                    if status != 200 or took > TURN_BOUND:
                        slow.append(f"{what} {i}: HTTP {status} after {took:.2f} s")
    finally:
        fetcher.stop.set()
        fetcher.join(120)
    assert not slow, f"while the session list was fetched: {slow}"
    assert fetcher.error is None, fetcher.error
    # Vacuity guard: the turns were sent while pages were being read, not between them.
    overlapped = sum(fetcher.in_flight(t) for t in starts)
    assert overlapped >= len(starts) // 2, (overlapped, len(starts), fetcher.done)
    pages = [(p, t1 - t0, s) for p, t0, t1, s in fetcher.done]
    assert {p for p, _, _ in pages} == {"/_cg/sessions", "/_cg/"} and len(pages) >= 4, pages
    assert all(s == 200 and took <= PAGE_BOUND for _, took, s in pages), pages


def test_paging_by_next_lists_every_session_once_most_recently_seen_first(crowded: Proxy):
    listed: list[dict[str, Any]] = []
    cursor: str | None = None
    with crowded.client() as c:
        while True:
            query = {"limit": "500", **({"cursor": cursor} if cursor else {})}
            t0 = time.monotonic()
            r = c.get("/_cg/sessions", params=query)
            assert r.status_code == 200 and time.monotonic() - t0 <= PAGE_BOUND, r.text[:200]
            doc = r.json()
            assert len(doc["sessions"]) == 500 or doc["next"] is None
            listed += doc["sessions"]
            cursor = doc["next"]
            if cursor is None:
                break
    ids = [s["id"] for s in listed]
    assert len(ids) == len(set(ids)), "a session was listed twice"
    assert [x for x in ids if x.startswith("bench-")] == [session_id(i) for i in range(SESSIONS)]
    keys = [(s["last_seen"], s["id"]) for s in listed]
    assert keys == sorted(keys, reverse=True)
    mine = [s for s in listed if s["id"].startswith("bench-")]
    with_cp = [s for s in mine if s["checkpoint"] is not None]
    assert len(with_cp) == SESSIONS // 2
    assert {s["checkpoint"]["conversations"] for s in with_cp} == {1, 3}
    assert all(s["usage"]["agent"]["requests"] == 3 for s in mine)


def test_the_dashboard_shows_one_page_and_links_to_the_next(crowded: Proxy):
    with crowded.client() as c:
        first = c.get("/_cg/")
        assert first.status_code == 200
        rows = re.findall(r'<tr data-session="([^"]+)"', first.text)
        link = re.search(r'<a id="next-page" href="\?([^"]+)"', first.text)
        assert len(rows) == 50 and link is not None
        second = c.get("/_cg/?" + link.group(1).replace("&amp;", "&"))
        assert second.status_code == 200 and 'id="first-page"' in second.text
        more = re.findall(r'<tr data-session="([^"]+)"', second.text)
    assert len(more) == 50 and not set(rows) & set(more)
