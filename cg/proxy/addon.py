"""context-guru as mitmproxy addons, and all of them as one object.

`addons()` is what `cg_addon.py` gives mitmproxy: small addons sharing one `Runtime`, in the order
mitmproxy must call them (it calls each hook on each addon in list order, awaiting each):

    runtime     options, configuration, store, pipelines, pools, the flows in flight
    control     the `/_cg/` endpoints and commands (a control request goes no further)
    rewriter    a provider turn's request rewritten; its summaries commissioned and released
    answers     the relay of a streamed turn, the expand continuation, the 400 re-send
    metering    the answer's usage booked (after any continuation or re-send)
    redactor    other provider flows held; every provider flow's credential redacted, its
                state ended (last: the others are done with the flow)
    views       mitmweb's contentviews

`ContextGuru` calls each hook on each of them in that order, as mitmproxy does: for tests,
benches and callers that drive the hooks themselves.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from mitmproxy import http

from cg.pipeline.contract import Component
from cg.proxy.answers import Answers, _request_text
from cg.proxy.endpoints import Control
from cg.proxy.message import upstream_sni
from cg.proxy.meter import Meter
from cg.proxy.metering import Metering
from cg.proxy.redact import CREDENTIAL_HEADERS, REDACTED, Redactor, redact, redact_backup
from cg.proxy.rewriting import BYPASS_HEADER, BYPASS_VALUES, Rewriter
from cg.proxy.runtime import (
    FACTS_INLINE,
    STORE_BUSY_MS,
    STORE_RETRY,
    Runtime,
    control_token,
    repeated_options,
    unknown_options,
)
from cg.proxy.view import META, Views
from cg.summarize.client import SummarizerClient
from cg.wire.upstream import Exchange

__all__ = [
    "BYPASS_HEADER",
    "BYPASS_VALUES",
    "CREDENTIAL_HEADERS",
    "FACTS_INLINE",
    "META",
    "REDACTED",
    "STORE_BUSY_MS",
    "STORE_RETRY",
    "ContextGuru",
    "SummarizerClient",
    "_request_text",
    "addons",
    "control_token",
    "redact",
    "redact_backup",
    "repeated_options",
    "unknown_options",
    "upstream_sni",
]

HOOKS = ("load", "configure", "running", "done", "request", "responseheaders", "response", "error")


def addons(rt: Runtime | None = None) -> list[Any]:
    """context-guru's addons on one runtime, in the order mitmproxy is to call them."""
    rt = rt if rt is not None else Runtime()
    control = Control(rt)
    views = Views(rt.stash)
    return [rt, control, Rewriter(rt), Answers(rt), Metering(rt), Redactor(rt), views]


class ContextGuru:
    """Every addon of `addons()` as one: each hook called on each of them, in order, an
    awaitable one awaited before the next is called (as mitmproxy's addon manager does). What
    it does not have is the runtime's (`self.rt`)."""

    def __init__(self) -> None:
        self.rt = Runtime()
        self.parts = addons(self.rt)
        self._chain: dict[str, list[Callable[..., Any]]] = {
            name: [getattr(p, name) for p in self.parts if hasattr(p, name)] for name in HOOKS
        }
        control = next(p for p in self.parts if isinstance(p, Control))
        # mitmproxy finds commands by attribute: the control addon's, as this object's too.
        self.stats_command = control.stats_command
        self.sessions_command = control.sessions_command
        self.stats_json = control.stats_json
        self.sessions_json = control.sessions_json
        views = next(p for p in self.parts if isinstance(p, Views))
        self.views = views.views

    def __getattr__(self, name: str) -> Any:
        if name in ("rt", "parts", "_chain"):  # (not made yet: no runtime to ask)
            raise AttributeError(name)
        return getattr(self.rt, name)

    # -- what tests read of the parts ---------------------------------------------------------

    @property
    def live(self) -> dict[str, http.HTTPFlow]:
        """The provider flows in flight (whose credential is redacted when done), by id."""
        return {st.flow.id: st.flow for st in self.rt.flows}

    @property
    def awaiting(self) -> dict[str, list[Any]]:
        """Summary jobs waiting for their commissioning flow's answer to begin, by flow id."""
        return {st.flow.id: list(st.awaiting) for st in self.rt.flows if st.awaiting}

    @property
    def meter(self) -> Meter:
        return self.rt.meter

    @property
    def tasks(self) -> dict[str, Any]:
        return self.rt.summaries.tasks

    @property
    def components(self) -> list[Component]:
        return self.rt.components

    def _stash(self, key: str) -> Any:
        return self.rt.stash(key)

    def _summary_call(self, job: Any, kind: str, exchange: Exchange) -> None:
        self.rt.summaries.summary_call(job, kind, exchange)

    async def wait_for_summary(self, session: str, timeout: float = 30.0) -> str | None:
        return await self.rt.summaries.wait_for_summary(session, timeout)

    # -- the hooks, called on each part ------------------------------------------------------

    def _call(self, name: str, *args: Any) -> Awaitable[None] | None:
        chain = self._chain[name]
        for i, hook in enumerate(chain):
            ret = hook(*args)
            if inspect.isawaitable(ret):
                return self._rest(ret, chain[i + 1 :], args)
        return None

    @staticmethod
    async def _rest(first: Awaitable[Any], rest: list[Callable[..., Any]], args: Any) -> None:
        await first
        for hook in rest:
            ret = hook(*args)
            if inspect.isawaitable(ret):
                await ret

    def load(self, loader: Any) -> None:
        self._call("load", loader)

    def configure(self, updated: set[str]) -> None:
        self._call("configure", updated)

    def running(self) -> None:
        self._call("running")

    def done(self) -> None:
        self._call("done")

    def request(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        return self._call("request", flow)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        self._call("responseheaders", flow)

    async def response(self, flow: http.HTTPFlow) -> None:
        ret = self._call("response", flow)
        if ret is not None:
            await ret

    def error(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        """An awaitable when a hook's work goes on in the worker thread (await it, as
        mitmproxy does): the rest of the addons' hooks run after it."""
        return self._call("error", flow)
