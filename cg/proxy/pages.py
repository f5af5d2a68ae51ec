"""The control answers that read what grows with the store — `/_cg/sessions`, the dashboard
`/_cg/`, `/_cg/stats`' ledger totals — answered off the event loop.

The event loop carries every agent's turn: an answer that reads the store (a page of sessions,
the ledger's totals) runs in a worker thread of its own (`OffLoop`, two threads: never the
loop's default executor, which mitmproxy's name lookups share), on the store's own connection
for it (`Store._view`). What only the loop mutates (the counters, the dashboard's chart
history) is copied by the handler, on the loop, before the thread starts. `/_cg/health` and
`/_cg/expand` (one key) answer at once, on the loop, as before.

Page parameters (`/_cg/sessions`, `/_cg/`): `limit` (1 to 500, default 50) and `cursor` (a
page's `next`); anything else is a 400 naming the parameter.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from mitmproxy import http

from cg.billing.ledger import Ledger
from cg.billing.listing import BadPage, page_key, page_limit, sessions_named, sessions_page
from cg.proxy import control

WORKERS = 2  # control answers read at once; more wait their turn (each takes milliseconds)

Page = tuple[int, str | None]  # (limit, cursor)
T = TypeVar("T")


class OffLoop:
    """Worker threads for the control answers, started on the first one."""

    def __init__(self, workers: int = WORKERS) -> None:
        self.workers = workers
        self._pool: ThreadPoolExecutor | None = None

    async def run(self, work: Callable[[], T]) -> T:
        """`work()` in a worker thread; the loop serves other flows meanwhile."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="cg-control")
        return await asyncio.get_running_loop().run_in_executor(self._pool, work)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def page_args(flow: http.HTTPFlow) -> Page | http.Response:
    """The request's `limit` and `cursor`, or the 400 that names the one that is wrong."""
    query = flow.request.query
    try:
        limit = page_limit(query.get("limit"))
        cursor = query.get("cursor") or None
        if cursor is not None:
            page_key(cursor)
    except BadPage as e:
        return control.json_response(400, {"error": str(e), "parameter": e.name})
    return (limit, cursor)


def sessions_doc(
    ledger: Ledger | None,
    count_tokens: Callable[[str], int],
    scope: str | None,
    limit: int,
    cursor: str | None,
) -> dict[str, Any]:
    """`GET /_cg/sessions`: a page of sessions (`scope`: that session alone, for a remote
    caller), with `next`. An unreadable store is an empty page with its `error`."""
    if ledger is None:
        return {"sessions": [], "next": None}
    try:
        if scope is not None:
            rows = sessions_named(ledger.store, ledger.prices, count_tokens, [scope])
            return {"sessions": rows, "next": None}
        return sessions_page(ledger.store, ledger.prices, count_tokens, limit, cursor)
    except Exception as e:  # noqa: BLE001 - an unreadable store must not break the endpoint
        return {"sessions": [], "next": None, "error": str(e)}


def href(limit: int, cursor: str | None) -> str:
    """A link from the dashboard to its page after `cursor` (relative: `/_cg/?…`)."""
    args = {"limit": str(limit)} if limit != page_limit(None) else {}
    if cursor:
        args["cursor"] = cursor
    return "?" + urllib.parse.urlencode(args) if args else "./"
