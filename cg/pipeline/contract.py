"""What a pipeline component is, and what it is told and answers: the bottom of `cg.pipeline`.

A component (`summarize`, or one of yours) gets a `RequestContext` — the indexed request, its
session, its tenant, its headers (never persisted), the clock — and the plan so far, and
answers a `Step`: a new `Plan` of the messages (`cg.wire.splice`: Keep, Cut, Insert) or None to
skip, with a reason either way, what it stashed, and any work to run off the hot path
(`commission`, run by a `Commissioner`'s `complete`; a `Job`, and a `SummaryJob` when its
runner is to hand it the forwarded body and hold it until the turn's answer begins). Components import this module; the
runner and `rewrite_body` above it never import a component.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from cg.wire.body import BodyIndex
from cg.wire.splice import Plan


@dataclass(slots=True)
class RequestContext:
    """What a component may know about a request. `headers` are never persisted. `tenant` is
    who sent it (`cg.state.tenant.fingerprint` of its credential; "" for none): state a
    component keeps for the request is written with it and read back only by it."""

    index: BodyIndex
    session: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    now: float = 0.0
    tenant: str = ""


@dataclass(slots=True)
class Step:
    """A component's answer: `plan` None means it skipped; `reason` says why, either way."""

    plan: Plan | None
    reason: str
    detail: dict[str, Any] = field(default_factory=dict)
    stash_required: bool = False
    stashed: frozenset[int] = frozenset()
    commission: Any = None


class Component(Protocol):
    name: str

    def apply(self, req: RequestContext, plan: Plan) -> Step: ...


@runtime_checkable
class Invalidates(Protocol):
    """A component that keeps per-conversation state (a checkpoint) and must forget it when the
    agent compacts its own history. Returns what it forgot (for the record), or None."""

    def invalidate(self, req: RequestContext) -> str | None: ...


@runtime_checkable
class Commissioner(Protocol):
    """A component whose steps may commission work: the caller runs `complete` off the hot
    path, or `abandon`s a job it cannot run."""

    async def complete(self, job: Any) -> str: ...

    def abandon(self, job: Any) -> None: ...


@runtime_checkable
class Job(Protocol):
    """A commission as its runner sees it: the session it is for (one job at a time per
    session), and the endpoint and credential its calls go with (`origin`: set by the runner,
    held in memory only, dropped by the job when it ends)."""

    session: str
    origin: Any


@runtime_checkable
class SummaryJob(Job, Protocol):
    """A summary job (`cg.summarize.component.Commission`): the runner also hands it the body
    as forwarded upstream (the shared-cache call) and tells it when the commissioning flow's
    answer began; it shows its calls as flows of their own, named after that flow."""

    dialect: str
    head: int
    end: int
    forwarded: bytes | None
    began: asyncio.Event | None
    flow_id: str | None
    call_flow_id: str | None

    @property
    def path(self) -> str | None:
        """Which request wrote (or tried to write) the summary, once it ended."""

    @property
    def note(self) -> str:
        """Why that request, for the log line."""

    def answer_began(self, status: int | None) -> None: ...
