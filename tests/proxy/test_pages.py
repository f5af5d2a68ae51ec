"""The control answers that read pages of the store, through the addon's hooks (taddons, a real
SQLite file): `limit` and `cursor` checked with a 400 naming the one that is wrong, `next`
followed to the end on `/_cg/sessions`, the dashboard and `cg.sessions`; only these answers (and
`/_cg/stats`) leave the event loop, provider turns and the other endpoints answer at once; and
what the loop mutates is read as it stood when the request came."""

from __future__ import annotations

import json
import re
import threading
import warnings
from collections import deque
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from mitmproxy import exceptions, http

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from mitmproxy.test import taddons

from cg.billing.listing import PAGE_MAX, cursor_of
from cg.proxy.addon import ContextGuru
from cg.state.records import stash_key
from cg.wire.usage import Usage
from tests.proxy.test_addon import make_flow

SESSIONS = ["s0", "s1", "s2", "s3", "s4"]  # booked in this order: s4 is the most recent


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))


@pytest.fixture
async def addon(tmp_path: Path) -> AsyncIterator[tuple[ContextGuru, taddons.context]]:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        tctx.configure(cg, cg_preset="off", cg_db=str(tmp_path / "cg.sqlite3"))
        assert cg.store is not None
        t = [1000.0]
        cg.store.now = lambda: t[0]
        for s in SESSIONS:
            t[0] += 1
            cg.store.record_usage(s, [("agent", "claude-test", "", Usage(1, requests=1))])
        yield cg, tctx
        cg.done()


async def get(cg: ContextGuru, path: str) -> tuple[http.Response, bool]:
    """The answer, and whether the hook left it pending (read off the loop)."""
    f = make_flow(path=path, method="GET", content=b"")
    pending = cg.request(f)
    if pending is not None:
        assert f.response is None
        await pending
    assert f.response is not None
    return f.response, pending is not None


def doc(resp: http.Response) -> Any:
    return json.loads(resp.content or b"")


@pytest.mark.parametrize("endpoint", ["/_cg/sessions", "/_cg/"])
@pytest.mark.parametrize(
    ("query", "name"),
    [
        ("limit=0", "limit"),
        (f"limit={PAGE_MAX + 1}", "limit"),
        ("limit=ten", "limit"),
        ("limit=-3", "limit"),
        ("limit=%EF%BC%95", "limit"),  # a fullwidth digit: isdigit(), not a number we take
        ("cursor=not-a-cursor", "cursor"),
        ("cursor=WzEsMiwzXQ", "cursor"),  # base64url of [1,2,3]
        ("cursor=WyJ4IiwieSJd", "cursor"),  # ["x","y"]
        ("cursor=W051TGwsInMiXQ", "cursor"),  # [NuLl,"s"]: not JSON
    ],
)
async def test_a_bad_page_parameter_is_a_400_naming_it(addon, endpoint, query, name) -> None:
    cg, _ = addon
    resp, pending = await get(cg, f"{endpoint}?{query}")
    assert resp.status_code == 400 and not pending
    assert doc(resp)["parameter"] == name and doc(resp)["error"].startswith(f"{name}: ")


async def test_next_is_followed_to_the_last_page(addon) -> None:
    cg, _ = addon
    listed: list[str] = []
    path = "/_cg/sessions?limit=2"
    pages = 0
    while True:
        resp, pending = await get(cg, path)
        assert resp.status_code == 200 and pending
        page = doc(resp)
        listed += [s["id"] for s in page["sessions"]]
        pages += 1
        if page["next"] is None:
            break
        path = f"/_cg/sessions?limit=2&cursor={page['next']}"
    assert listed == SESSIONS[::-1] and pages == 3
    resp, _ = await get(cg, "/_cg/sessions")  # the default page holds them all
    assert [s["id"] for s in doc(resp)["sessions"]] == SESSIONS[::-1] and doc(resp)["next"] is None


async def test_the_dashboard_shows_a_page_with_links_on_and_back(addon) -> None:
    cg, _ = addon
    resp, pending = await get(cg, "/_cg/?limit=2")
    page = (resp.content or b"").decode()
    assert pending and re.findall(r'<tr data-session="([^"]+)"', page) == ["s4", "s3"]
    link = re.search(r'<a id="next-page" href="\?([^"]+)"', page)
    assert link is not None and 'id="first-page"' not in page
    resp, _ = await get(cg, "/_cg/?" + link.group(1).replace("&amp;", "&"))
    page = (resp.content or b"").decode()
    assert re.findall(r'<tr data-session="([^"]+)"', page) == ["s2", "s1"]
    assert 'id="first-page" href="?limit=2"' in page and 'id="next-page"' in page


async def test_only_the_answers_that_read_pages_leave_the_loop(addon) -> None:
    cg, _ = addon
    assert cg.store is not None
    key = stash_key(['{"role":"user","content":"x"}'])
    cg.store.put_stash(key, "s0", ['{"role":"user","content":"x"}'], "anthropic")
    for path in ("/_cg/sessions", "/_cg/", "/_cg/stats"):
        resp, pending = await get(cg, path)
        assert pending and resp.status_code == 200, path
    for path, status in (("/_cg/health", 200), (f"/_cg/expand?id={key}", 200), ("/_cg/x", 404)):
        resp, pending = await get(cg, path)
        assert not pending and resp.status_code == status, path
    turn = make_flow()
    assert cg.request(turn) is None  # a provider turn: handled in the hook, at once


class Watched(deque[Any]):
    """A chart history that notes which threads iterate it."""

    threads: set[str]

    def __iter__(self) -> Iterator[Any]:
        self.threads.add(threading.current_thread().name)
        return super().__iter__()


async def test_what_the_loop_mutates_is_read_on_the_loop(addon) -> None:
    """The counters as they stood when the request came; the chart's points copied on the
    loop's thread, never iterated by the worker that prices them."""
    cg, _ = addon
    ledger = cg.meter.ledger
    assert ledger is not None
    points = Watched([(1.0, False, [], 0.0), (2.0, True, [], 0.0)])
    points.threads = set()
    ledger.history["s4"] = points
    before = cg.stats.requests
    stats = make_flow(path="/_cg/stats", method="GET", content=b"")
    board = make_flow(path="/_cg/", method="GET", content=b"")
    pending = [cg.request(stats), cg.request(board)]
    cg.stats.requests += 7  # the loop counts on while the answers are read
    for p in pending:
        assert p is not None
        await p
    assert stats.response is not None and board.response is not None
    assert json.loads(stats.response.content or b"")["requests"] == before
    page = (board.response.content or b"").decode()
    assert f'data-figure="requests" data-value="{before}"' in page
    assert 'data-chart="s4"' in page and page.count("<circle") == 1  # drawn from the copy
    assert points.threads == {threading.current_thread().name}


async def test_the_sessions_command_takes_a_cursor_and_a_limit(addon) -> None:
    _, tctx = addon
    first = json.loads(tctx.master.commands.execute("cg.sessions '' 3"))
    assert [s["id"] for s in first["sessions"]] == ["s4", "s3", "s2"] and first["next"]
    rest = json.loads(tctx.master.commands.execute(f"cg.sessions {first['next']} 3"))
    assert [s["id"] for s in rest["sessions"]] == ["s1", "s0"] and rest["next"] is None
    assert first["next"] == cursor_of((1003.0, "s2"))
    with pytest.raises(exceptions.CommandError, match="cursor"):
        tctx.master.commands.execute("cg.sessions garbage")
    with pytest.raises(exceptions.CommandError, match="limit"):
        tctx.master.commands.execute("cg.sessions '' 0")
