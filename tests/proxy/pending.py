"""Control answers that the request hook leaves pending, driven to their end in a sync test.

The session list, the dashboard and `/_cg/stats` read the store off the event loop: the hook
returns an awaitable, which mitmproxy awaits on its loop (tests/e2e/test_session_list_e2e.py
holds that the loop serves other turns meanwhile). A test helper that is not a coroutine, called
inside an async test's running loop, cannot await it there: it runs it to its end on a loop of
its own, in a helper thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor

TIMEOUT = 30.0


async def _awaited(pending: Awaitable[None]) -> None:
    await pending


def finish(pending: Awaitable[None] | None) -> None:
    """Wait for a pending control answer (None: the hook answered at once)."""
    if pending is None:
        return
    with ThreadPoolExecutor(1, thread_name_prefix="test-answer") as pool:
        pool.submit(asyncio.run, _awaited(pending)).result(TIMEOUT)
