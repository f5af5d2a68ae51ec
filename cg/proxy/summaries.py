"""Summary jobs off the hot path: started as background tasks when a turn commissions them,
held until their commissioning flow's answer begins (the provider's cache entry exists then),
counted, and shown as flows of their own.

A job outlives the flow that commissioned it, so the tasks are kept by session here, not in the
flow's state; the jobs a flow's answer releases are in the flow's state (`awaiting`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from mitmproxy import http

from cg.pipeline.contract import Commissioner, Component, Job, SummaryJob
from cg.proxy import view as views
from cg.proxy.calls import call_flow
from cg.proxy.flowstate import Flows
from cg.proxy.stats import Stats
from cg.summarize.client import Origin
from cg.wire.upstream import Exchange

log = logging.getLogger("context_guru")


class Summaries:
    def __init__(self, stats: Stats, flows: Flows, show: Callable[[http.HTTPFlow], None]) -> None:
        self.stats = stats
        self.flows = flows
        self.show = show  # adds a finished flow to what shows flows (`Runtime.show`)
        self.tasks: dict[str, asyncio.Task[str]] = {}  # the job in flight, by session

    def cancel(self) -> None:
        """At exit: every job in flight cancelled."""
        for task in list(self.tasks.values()):
            task.cancel()
        self.tasks.clear()

    def commission(
        self,
        commissions: list[tuple[Component, Any]],
        origin: Origin,
        forwarded: bytes | None = None,
        flow_id: str | None = None,
        call_flow_id: str | None = None,
    ) -> None:
        """Start each commissioned summary as a background task; the turn is not held.

        `origin` (the request's endpoint and credential, for an `incoming` summary) and
        `forwarded` (its body as sent upstream, for the shared-cache call) are handed to the job
        in memory and dropped when the job ends. A summary job may wait for flow `flow_id`'s
        answer to begin (`answer_began`), when the provider's cache entry for that body exists;
        its first call's flow is to be `call_flow_id`.
        """
        for comp, job in commissions:
            self.stats.summaries.commissioned += 1
            if not isinstance(job, Job):  # (a component's bug: nothing to run it as)
                log.warning("context-guru: %s commissioned a %s", comp.name, type(job).__name__)
                continue
            job.origin = origin
            if isinstance(job, SummaryJob):
                job.flow_id, job.call_flow_id = flow_id, call_flow_id
                if forwarded is not None:
                    job.forwarded = forwarded
                    st = self.flows.get(flow_id) if flow_id is not None else None
                    if st is not None:
                        job.began = asyncio.Event()
                        st.awaiting.append(job)
            if not isinstance(comp, Commissioner):
                continue
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no event loop (an offline caller): the job cannot run
                self._unawait(flow_id, job)
                comp.abandon(job)
                continue
            task = loop.create_task(self._run(comp.complete, job, flow_id))
            self.tasks[job.session] = task
            task.add_done_callback(functools.partial(self._forget, job.session))

    async def _run(
        self, complete: Callable[[Job], Awaitable[str]], job: Job, flow_id: str | None = None
    ) -> str:
        try:
            outcome = await complete(job)
        except Exception as e:  # noqa: BLE001 - a job's bug is a failed summary, never a crash
            # The type only: a message could quote a header value, i.e. a credential.
            log.warning("context-guru: summary for %s failed: %s", job.session, type(e).__name__)
            outcome = "failed"
        finally:
            self._unawait(flow_id, job)
        counts = self.stats.summaries
        if outcome == "completed":
            counts.completed += 1
        elif outcome == "timed_out":
            counts.timed_out += 1
        elif outcome == "deferred":
            counts.deferred += 1
        else:
            counts.failed += 1
        path, note = (job.path, job.note) if isinstance(job, SummaryJob) else (None, "")
        if path == "shared":
            counts.shared += 1
        elif path == "fallback":
            counts.fallback += 1
        elif path == "standalone":
            counts.standalone += 1
        # The job's decision line: its outcome, which request wrote it, and why that one.
        log.info(
            "context-guru: summary for %s: %s via %s%s",
            job.session,
            outcome,
            path or "no request",
            f" ({note})" if note else "",
        )
        return outcome

    def answer_began(self, flow: http.HTTPFlow) -> None:
        """The flow's answer began (or the flow failed): release the jobs it commissioned."""
        st = self.flows.get(flow.id)
        if st is None or not st.awaiting:
            return
        jobs, st.awaiting = st.awaiting, []
        status = flow.response.status_code if flow.response is not None else None
        for job in jobs:
            job.answer_began(status)

    def _unawait(self, flow_id: str | None, job: Job) -> None:
        """Forget a job that ended (or never ran) before its flow's answer began."""
        st = self.flows.get(flow_id) if flow_id is not None else None
        if st is not None:
            st.awaiting = [j for j in st.awaiting if j is not job]

    def _forget(self, session: str, task: asyncio.Task[str]) -> None:
        if self.tasks.get(session) is task:
            del self.tasks[session]

    async def wait_for_summary(self, session: str, timeout: float = 30.0) -> str | None:
        """Wait for the session's summary in flight, if any; its outcome, or None. For tests."""
        task = self.tasks.get(session)
        if task is None:
            return None
        return await asyncio.wait_for(asyncio.shield(task), timeout)

    def summary_call(self, job: SummaryJob, kind: str, exchange: Exchange) -> None:
        """A summarizer request and its answer: a flow of its own in mitmweb (and in `-w`),
        marked, commented, its credential redacted; never processed by the pipeline."""
        first = job.call_flow_id
        job.call_flow_id = None  # a later attempt or the fallback gets an id of its own
        rec = {
            "v": views.VERSION,
            "action": "summary",
            "dialect": job.dialect,
            "session": job.session,
            "summarizing": [job.head, job.end],
            "call": kind,
            "for_flow": job.flow_id,
            "status": exchange.status,
            "error": exchange.error,
            "reason": f"{kind} request for the summary commissioned by flow {job.flow_id}",
        }
        self.show(call_flow(exchange, rec, first))
