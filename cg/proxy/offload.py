"""Long reads off the event loop (docs/behaviour.md#bounded-work-and-shared-use): one client's large
body never stalls another's turn or `/_cg/health`.

Every flow's hooks run on mitmproxy's one event loop, so a request that takes the addon half a
second to read (a cold 30 MB body, 20,000 tiny messages, a content-encoded body to inflate) held
every other connection that long. Such a request is read here instead, in one worker thread,
while the loop serves everyone else; the request hook returns an awaitable (mitmproxy awaits
it) only for these, so an ordinary turn stays a plain synchronous call.

What goes to the worker:

    a content-encoded body longer than ENCODED_INLINE,   (its decoding is the long part: a
    or one that decodes to more than INLINE's bytes      1.7 KB brotli body is 1 GiB, read up
                                                          to the cap in the worker)
    a body whose part to read is over INLINE             (what no remembered previous turn of
                                                          its session repeats: a warm turn's
                                                          new messages, or a cold body whole)

The worker reads one body at a time: what waits behind it is bounded (`WAITING_MAX`), and a
body past that passes through untouched, said in its record, rather than wait without end. The
state the worker touches is shared with the loop and safe for it (the store's own lock, the
token counter's, `FactsCache`'s GIL-atomic memos); what only the loop may touch (the message
cache, the ledger, the flow) is done back on the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
from collections.abc import Callable
from typing import TypeVar

from cg.wire.body import Inline

ENCODED_INLINE = 64 * 1024  # compressed bytes decoded on the loop, at most
INLINE: Inline = (256 * 1024, 2048)  # new bytes, new objects a turn may read on the loop
WAITING_MAX = 8  # bodies read or waiting in the worker; past it, the next passes through
SWITCH_S = 0.0005  # the interpreter's thread switch interval while the worker reads

_T = TypeVar("_T")


class Offload:
    """The worker thread and what waits for it."""

    def __init__(self) -> None:
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.waiting = 0  # bodies in the worker or queued for it
        self.read = 0  # bodies read off the loop
        self.busy = 0  # bodies passed through because too many waited
        self._interval = sys.getswitchinterval()  # restored once the worker is idle

    def full(self) -> bool:
        return self.waiting >= WAITING_MAX

    async def run(self, fn: Callable[..., _T], *args: object) -> _T:
        """`fn(*args)` in the worker thread; the loop serves others meanwhile. While the
        worker runs, the interpreter switches threads every SWITCH_S: a turn on the loop waits
        that long for the GIL at each of its many system calls, not the default 5 ms."""
        if self.waiting == 0:
            self._interval = sys.getswitchinterval()
            sys.setswitchinterval(min(SWITCH_S, self._interval))
        self.waiting += 1
        try:
            return await self.chore(fn, *args)
        finally:
            self.waiting -= 1
            self.read += 1
            if self.waiting == 0:
                sys.setswitchinterval(self._interval)

    async def chore(self, fn: Callable[..., _T], *args: object) -> _T:
        """`fn(*args)` in the worker thread, after what is there: bookkeeping (a large batch of
        token counts written back) that no request waits for and no bound counts."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, "cg-large-body")
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
