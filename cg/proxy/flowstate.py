"""What the addon keeps about one provider flow while it is in flight: one record per flow, in
one table with one cap, ended in one place.

A flow's state is made by the request hook (a routed turn, or another provider flow whose
credential must be redacted when it is done) and ended by `Flows.end` when the answer is done,
the flow failed, the proxy exits, or `MAX_FLOWS` newer flows are in flight. The fields a hook
hands to a later one are taken (read and cleared) by that hook, so that a second `error` after
a `response`, or a `response` after an `error`, finds nothing to do twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mitmproxy import http

from cg.pipeline.contract import SummaryJob
from cg.proxy.relay import RelayJob
from cg.wire.answers import Reply

if TYPE_CHECKING:
    from cg.billing.ledger import Turn

MAX_FLOWS = 10_000  # provider flows in flight; the oldest is ended (redacted) past this


@dataclass(slots=True, eq=False)
class FlowState:
    """One provider flow's state between its request and the end of its answer."""

    flow: http.HTTPFlow
    # The client's own bytes of a rewritten request: re-sent once if the provider refuses it.
    original: bytes | None = None
    job: RelayJob | None = None  # its streamed answer goes through the relay (`cg.proxy.relay`)
    # Summary jobs that wait for this flow's answer to begin (the provider's cache entry).
    awaiting: list[SummaryJob] = field(default_factory=list)
    turn: Turn | None = None  # what the usage ledger books when the answer is read
    readable: bool = False  # its body may be indexed after the fact (a bypassed turn's)
    # Every round's reply of an expand continuation (the answer's hook), for the meter.
    replies: list[Reply] | None = None
    # A rewritten turn's retention, measured in the worker thread from the answer's headers on
    # (`cg.proxy.retained.begin`), taken by the answer's hook.
    retention: asyncio.Future[Any] | None = None


class Flows:
    """The flows in flight, oldest first. `on_end` is the one cleanup: it runs for every state
    ended, whatever ended it (the answer, an error, the exit, the cap)."""

    def __init__(self, on_end: Callable[[FlowState], None], cap: int = MAX_FLOWS) -> None:
        self._by_id: dict[str, FlowState] = {}
        self._on_end = on_end
        self.cap = cap

    def begin(self, flow: http.HTTPFlow) -> FlowState:
        """The flow's state, made if it has none (and the oldest ended past the cap)."""
        st = self._by_id.get(flow.id)
        if st is None:
            st = self._by_id[flow.id] = FlowState(flow)
            while len(self._by_id) > self.cap:
                self.end(next(iter(self._by_id)))
        return st

    def get(self, flow_id: str) -> FlowState | None:
        return self._by_id.get(flow_id)

    def end(self, flow_id: str) -> FlowState | None:
        """Forget the flow, running the cleanup; the state it had, or None."""
        st = self._by_id.pop(flow_id, None)
        if st is not None:
            self._on_end(st)
        return st

    def end_all(self) -> None:
        for flow_id in list(self._by_id):
            self.end(flow_id)

    def __contains__(self, flow_id: object) -> bool:
        return flow_id in self._by_id

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[FlowState]:
        return iter(list(self._by_id.values()))
