"""The one place the pipeline meets raw bytes: index -> pipeline -> splice -> validate.

`rewrite_body` never raises and never returns bytes that failed a check: on any error or any
violation the rewrite introduced, it returns `body=None` (forward the original) and says why.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from cg.expand.tool import InjectMode, append_tool, inject_reason
from cg.pipeline.contract import Component, Invalidates, RequestContext
from cg.pipeline.runner import PipelineResult, run_pipeline
from cg.state.session import session_of
from cg.state.store import Store
from cg.wire.body import BodyIndex, BodyRejected, MessageCache, index_body
from cg.wire.dialects import Dialect
from cg.wire.shape import (
    check_wire_roles_at,
    introduced,
    separated,
    validate_index,
    validate_shape,
)
from cg.wire.splice import is_identity, plan_sources, plan_views, splice_text

Outcome = Literal["passed_through", "rewritten", "failed_open"]


@dataclass(slots=True)
class Rewrite:
    """`body` is the new body to send, or None to send the original bytes unchanged; `index`
    the client's body as indexed (None when it could not be), for readers after the hot path."""

    body: bytes | None
    record: dict[str, Any]
    commissions: list[tuple[Component, Any]] = field(default_factory=list)
    index: BodyIndex | None = None

    @property
    def outcome(self) -> Outcome:
        o: Outcome = self.record["outcome"]
        return o


def rewrite_body(
    raw: bytes,
    dialect: Dialect,
    components: Sequence[Component],
    *,
    headers: Mapping[str, str] | None = None,
    now: float | None = None,
    cache: MessageCache | None = None,
    expand: ExpandPolicy | None = None,
    agent_compaction: str | None = None,
) -> Rewrite:
    """Run one request body through the pipeline. `headers` are read, never stored.

    `agent_compaction`: the request is the agent compacting its own history (why we know): it
    passes through untouched, and each component that keeps per-conversation state forgets it
    (`Invalidates`), since the history that follows is the agent's own summary.
    """
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    record: dict[str, Any] = {"dialect": dialect.name, "timings_ms": timings}

    def lap(name: str, since: float) -> float:
        now = time.perf_counter()
        timings[name] = round((now - since) * 1000, 3)
        return now

    result: PipelineResult | None = None
    index: BodyIndex | None = None

    def done(outcome: Outcome, reason: str, body: bytes | None = None) -> Rewrite:
        record["outcome"] = outcome
        record["reason"] = reason
        timings["total"] = round((time.perf_counter() - t0) * 1000, 3)
        return Rewrite(body, record, result.commissions if result is not None else [], index)

    try:
        try:
            index = index_body(raw, dialect, cache)
        except BodyRejected as e:
            return done("passed_through", str(e))
        t = lap("index", t0)
        record["messages_in"] = len(index.messages)
        stream = index.members.get("stream")
        record["stream"] = stream is not None and stream.value is True
        before = validate_index(index)
        if before:
            record["input_violations"] = [v.to_json() for v in before]

        # Resolved here even with no pipeline: the usage ledger books the answer under it.
        sid = session_of(headers or {}, index)
        record["session"] = sid.id
        if not components and agent_compaction is None:
            return done("passed_through", "no components in the pipeline")
        req = RequestContext(index, sid.id, headers or {}, time.time() if now is None else now)
        if agent_compaction is not None:
            forgot = [c.invalidate(req) for c in components if isinstance(c, Invalidates)]
            record["invalidated"] = [f for f in forgot if f]
            return done("passed_through", agent_compaction)
        if before and dialect.strict_input:
            # The provider will refuse it (or has its own reading of it): it answers as it would.
            return done(
                "passed_through", f"the input already breaks {before[0].rule}: {before[0].message}"
            )
        result = run_pipeline(components, req)
        record["components"] = result.records
        t = lap("pipeline", t)
        # The new body's text: spliced, or (only if the expand tool goes in) the body whole.
        text: str | None = None
        size = len(index.chars)
        spliced = not is_identity(result.plan, len(index.messages))
        if spliced:
            text = splice_text(index, result.plan)
            t = lap("splice", t)
            record["messages_out"] = len(result.plan)
            sources = plan_sources(result.plan)
            after = validate_shape(plan_views(index, result.plan), dialect)
            after += separated(index.views, sources, dialect)
            bad = introduced(before, after, sources)
            if bad:
                lap("validate", t)
                record["violations"] = [v.to_json() for v in bad]
                return done("failed_open", f"rewrite introduced {bad[0].rule}: {bad[0].message}")
        # Where the rebuilt array sits in the final text: it starts where it did, unless the
        # expand tool went into a `tools` member before it.
        arr_start = index.array.start
        arr_end = index.array.end + (len(text) - size if text is not None else 0)
        if expand is not None:
            grown = len(text) if text is not None else size
            text, _ = _inject(index, text, expand, sid.id, record)
            tools = index.members.get("tools")
            if text is not None and tools is not None and tools.start < arr_start:
                arr_start += len(text) - grown
                arr_end += len(text) - grown
        if text is None:  # neither spliced nor given the tool: the body as it came
            return done("passed_through", "no component acted")
        new = text.encode("utf-8")
        # index_body admits only wire-legal roles, so any role violation here is the rewrite's.
        bad = check_wire_roles_at(text, arr_start, arr_end, dialect)
        lap("validate", t)
        if bad:
            record["violations"] = [v.to_json() for v in bad]
            return done("failed_open", f"rewrite introduced {bad[0].rule}: {bad[0].message}")
        return done("rewritten", "rewritten" if spliced else "expand tool injected", new)
    except Exception as e:  # noqa: BLE001 - fail open on anything at all
        return done("failed_open", f"internal error: {type(e).__name__}: {e}")


@dataclass(frozen=True, slots=True)
class ExpandPolicy:
    """When to offer the model the `context_guru_expand` tool, and where ids resolve."""

    mode: InjectMode
    store: Store | None


def _inject(
    index: BodyIndex, text: str | None, policy: ExpandPolicy, session: str, record: dict[str, Any]
) -> tuple[str | None, bool]:
    """`text` (None: the body as it came) with the expand tool appended when the policy says
    so; records why (not). The body as it came is searched for markers in its bytes, and its
    text built whole only when the tool goes in."""
    tools = index.members.get("tools")
    choice = index.members.get("tool_choice")
    if tools is not None and not isinstance(tools.value, list):
        # `"tools": null` and the like: nothing to append to (OpenAI clients send null).
        record["expand"] = {"injected": False, "reason": "the request's tools is not an array"}
        return text, False
    if (
        policy.mode != "never"
        and not (tools is not None and tools.value)
        and any(v.kind == "additional_tools" for v in index.views)
    ):
        # Codex declares its tools in an input item; a top-level `tools` array beside it would
        # change how the request's tools are rendered, for a tool the model was never told of.
        record["expand"] = {
            "injected": False,
            "reason": "the tools live in an additional_tools item, not in tools",
        }
        return text, False
    ok, why = inject_reason(
        policy.mode,
        index.dialect.name,
        tools.value if tools else None,
        choice.value if choice else None,
        text if text is not None else index.raw,
        policy.store,
        session,
    )
    record["expand"] = {"injected": ok, "reason": why}
    if not ok:
        return text, False
    if text is None:
        text = index.text
    span = None
    if tools is not None:
        # Members after `messages` moved by however much the messages array changed length.
        shift = len(text) - len(index.chars) if tools.start > index.array.start else 0
        span = (tools.start + shift, tools.end + shift)
    return append_tool(text, span, len(text.rstrip(" \t\r\n")), index.dialect.name), True
