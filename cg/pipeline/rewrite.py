"""The one place the pipeline meets raw bytes: index -> pipeline -> splice -> validate.

`rewrite_body` never raises and never returns bytes that failed a check: on any error or any
violation the rewrite introduced, it returns `body=None` (forward the original) and says why.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal, TypedDict, cast

from cg.expand.tool import InjectMode, inject_reason, tool_insertion
from cg.pipeline.contract import Component, Invalidates, RequestContext
from cg.pipeline.runner import PipelineResult, run_pipeline
from cg.state import Store
from cg.state.session import session_of
from cg.state.tenant import describe
from cg.state.tokens import REQUEST_BUDGET_CHARS, budget
from cg.wire.body import (
    BodyIndex,
    BodyRejected,
    Deferred,
    Inline,
    MessageCache,
    OverBound,
    index_body,
)
from cg.wire.dialects import Dialect
from cg.wire.shape import (
    check_wire_array,
    introduced,
    separated,
    validate_index,
    validate_shape,
)
from cg.wire.splice import (
    Bytes,
    SentShape,
    apply_edits,
    is_identity,
    plan_sources,
    plan_views,
    splice_array_bytes,
)

RewriteOutcome = Literal["passed_through", "rewritten", "failed_open"]


class Record(TypedDict, total=False):
    """The decision record as `flow.metadata["context_guru"]` holds it (a plain dict, for `-w`
    files and mitmweb): a `Decision`'s JSON, then what the proxy learns after it. Every key any
    module writes is declared here, so a misspelt or mistyped one is a type error."""

    dialect: str
    timings_ms: dict[str, Any]
    bound: str  # which bound a body over it met (cg_max_body_mb, cg_max_messages, …)
    messages_in: int
    stream: bool
    input_violations: list[dict[str, Any]]
    session: str
    tenant: str
    session_skipped: list[str]
    invalidated: list[str]
    components: list[dict[str, Any]]
    messages_out: int
    violations: list[dict[str, Any]]
    expand: dict[str, Any]
    # `passed_through`, `rewritten`, `failed_open`; the proxy's own: `bypassed`,
    # `retried_original`.
    outcome: str
    reason: str
    # What the proxy adds once the decision is made.
    preset: str
    preset_reason: str
    read_aside: str  # why the body was read in the worker thread
    ledger: dict[str, Any]  # the answer's usage, as booked
    provider_400: str  # the provider's message when it refused the rewrite
    retry_error: str  # why re-sending the original failed
    # Added by the proxy once the answer is done (`cg.proxy.retained`): a rewritten turn's
    # `Retention.to_json()`, or `{"error": why}` when measuring it failed.
    retention: dict[str, Any]


@dataclass(slots=True)
class Draft:
    """The decision being made, filled in as `rewrite_body` goes (`freeze` makes it the
    record). Unset fields (None) are left out of the record."""

    dialect: str
    timings_ms: dict[str, float] = field(default_factory=dict)
    bound: str | None = None
    messages_in: int | None = None
    stream: bool | None = None
    input_violations: list[dict[str, Any]] | None = None
    session: str | None = None
    tenant: str | None = None
    session_skipped: list[str] | None = None
    invalidated: list[str] | None = None
    components: list[dict[str, Any]] | None = None
    messages_out: int | None = None
    violations: list[dict[str, Any]] | None = None
    expand: dict[str, Any] | None = None

    def freeze(self, outcome: RewriteOutcome, reason: str) -> Decision:
        return Decision(
            **{name: getattr(self, name) for name in _DRAFTED}, outcome=outcome, reason=reason
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """What `rewrite_body` decided for one request body, and why: the decision record (the
    documented keys, docs/behaviour.md), made once. `to_json` is the form
    `flow.metadata["context_guru"]` holds (and `-w` files, mitmweb's view and the e2e tests
    read); the proxy adds what it learns later (the preset, the answer's ledger and expand
    rounds, a re-send) to that form. The fields are declared in the order the record's keys
    were always written; a `Draft`'s fields are these but the last two."""

    dialect: str
    timings_ms: dict[str, float]
    bound: str | None = None  # which bound a body over it met (cg_max_messages, …)
    messages_in: int | None = None
    stream: bool | None = None
    input_violations: list[dict[str, Any]] | None = None  # the client's own, as it came
    session: str | None = None
    tenant: str | None = None  # `cg.state.tenant.describe`: bound, anonymous or unbound
    session_skipped: list[str] | None = None
    invalidated: list[str] | None = None  # what an agent's own compaction made us forget
    components: list[dict[str, Any]] | None = None  # each component's own record, in order
    messages_out: int | None = None
    violations: list[dict[str, Any]] | None = None  # what the rewrite would have introduced
    expand: dict[str, Any] | None = None  # whether the expand tool went in, and why
    outcome: RewriteOutcome
    reason: str

    def to_json(self) -> Record:
        """The record as a JSON object, its keys in the fields' order, unset ones left out: a
        fresh dict (and fresh `timings_ms` and `expand`, which the proxy adds to)."""
        out: dict[str, Any] = {}
        for name in _DECIDED:
            value = getattr(self, name)
            if value is not None:
                out[name] = dict(value) if name in _COPIED else value
        return cast(Record, out)


_DRAFTED = tuple(f.name for f in fields(Draft))
_DECIDED = tuple(f.name for f in fields(Decision))
_COPIED = frozenset({"timings_ms", "expand"})  # the proxy adds to these in the flow's copy


@dataclass(slots=True)
class Rewrite:
    """`body` is the new body to send, or None to send the original bytes unchanged; `index`
    the client's body as indexed (None when it could not be), for readers after the hot path.
    `record` is the decision's JSON form, made once here: the proxy keeps it on the flow and
    adds to it."""

    body: bytes | None
    decision: Decision
    commissions: list[tuple[Component, Any]] = field(default_factory=list)
    index: BodyIndex | None = None
    shape: SentShape | None = None  # what `body` is made of, when there is one
    # Why the body was not read here (over the `inline` limits): the caller reads it elsewhere.
    deferred: str | None = None
    record: Record = field(init=False)

    def __post_init__(self) -> None:
        self.record = self.decision.to_json()

    @property
    def outcome(self) -> RewriteOutcome:
        o: RewriteOutcome = self.record["outcome"]  # type: ignore[assignment] # the proxy may change it
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
    max_messages: int | None = None,
    inline: Inline | None = None,
    tenant: str = "",
    path: str = "",
) -> Rewrite:
    """Run one request body through the pipeline. `headers` are read, never stored.

    `path`: the request's path, where a dialect's requests name their model or ask for a
    stream (`Dialect.url_model`, `.url_streams`: Gemini's) rather than in the body.

    `tenant`: who sent it (`cg.state.tenant.fingerprint` of its credential, made by the caller,
    which holds the store's key; "" for none). The head-hash session includes it, the state the
    components keep is its own, and the expand tool goes in only for markers it may expand.

    `agent_compaction`: the request is the agent compacting its own history (why we know): it
    passes through untouched, and each component that keeps per-conversation state forgets it
    (`Invalidates`), since the history that follows is the agent's own summary.
    `max_messages`: a transcript longer than this passes through (`bound` in the record), found
    before the rest of it is read. The texts of one call are counted within one token budget
    (`cg.state.tokens.budget`): however long, a request costs a bounded tokenisation.
    `inline` (new bytes, new objects): a body whose unread part is over either returns at once,
    unread, with `deferred` saying why (the caller reads it off the event loop).
    """
    with budget(REQUEST_BUDGET_CHARS):
        return _rewrite(
            raw,
            dialect,
            components,
            headers,
            now,
            cache,
            expand,
            agent_compaction,
            max_messages,
            inline,
            tenant,
            path,
        )


def _rewrite(
    raw: bytes,
    dialect: Dialect,
    components: Sequence[Component],
    headers: Mapping[str, str] | None,
    now: float | None,
    cache: MessageCache | None,
    expand: ExpandPolicy | None,
    agent_compaction: str | None,
    max_messages: int | None,
    inline: Inline | None,
    tenant: str,
    path: str = "",
) -> Rewrite:
    t0 = time.perf_counter()
    record = Draft(dialect.name)
    timings = record.timings_ms

    def lap(name: str, since: float) -> float:
        now = time.perf_counter()
        timings[name] = round((now - since) * 1000, 3)
        return now

    result: PipelineResult | None = None
    index: BodyIndex | None = None

    def done(
        outcome: RewriteOutcome,
        reason: str,
        body: bytes | None = None,
        shape: SentShape | None = None,
    ) -> Rewrite:
        timings["total"] = round((time.perf_counter() - t0) * 1000, 3)
        commissions = result.commissions if result is not None else []
        return Rewrite(body, record.freeze(outcome, reason), commissions, index, shape)

    try:
        try:
            index = index_body(raw, dialect, cache, max_messages, inline)
        except Deferred as e:
            out = done("passed_through", f"deferred: {e}")
            out.deferred = str(e)
            return out
        except OverBound as e:
            record.bound = e.bound
            return done("passed_through", str(e))
        except BodyRejected as e:
            return done("passed_through", str(e))
        t = lap("index", t0)
        record.messages_in = len(index.messages)
        index.url_model = dialect.url_model(path)
        stream = index.members.get("stream")
        record.stream = (stream is not None and stream.value is True) or dialect.url_streams(path)
        before = validate_index(index)
        if before:
            record.input_violations = [v.to_json() for v in before]

        # Resolved here even with no pipeline: the usage ledger books the answer under it.
        sid = session_of(headers or {}, index, tenant)
        record.session = sid.id
        record.tenant = describe(tenant)
        if sid.skipped:  # an explicit id not usable: said, or the user's name is lost unseen
            record.session_skipped = list(sid.skipped)
        if not components and agent_compaction is None:
            return done("passed_through", "no components in the pipeline")
        req = RequestContext(
            index, sid.id, headers or {}, time.time() if now is None else now, tenant
        )
        if agent_compaction is not None:
            forgot = [c.invalidate(req) for c in components if isinstance(c, Invalidates)]
            record.invalidated = [f for f in forgot if f]
            return done("passed_through", agent_compaction)
        if before and dialect.strict_input:
            # The provider will refuse it (or has its own reading of it): it answers as it would.
            return done(
                "passed_through", f"the input already breaks {before[0].rule}: {before[0].message}"
            )
        result = run_pipeline(components, req)
        record.components = result.records
        if any(r.get("tenant") == "unbound" for r in result.records):
            record.tenant = describe(tenant, unbound=True)
        t = lap("pipeline", t)
        # The new body as edits of the client's bytes: the rebuilt array (if spliced) and the
        # expand tool (if it goes in), joined once at the end; every other byte is the client's.
        edits: list[tuple[int, int, Sequence[Bytes]]] = []
        array: list[Bytes] = []
        spliced = not is_identity(result.plan, len(index.messages))
        if spliced:
            start, end, array = splice_array_bytes(index, result.plan)
            edits.append((start, end, array))
            t = lap("splice", t)
            record.messages_out = len(result.plan)
            sources = plan_sources(result.plan)
            after = validate_shape(plan_views(index, result.plan), dialect)
            after += separated(index.views, sources, dialect)
            bad = introduced(before, after, sources)
            if not bad:
                # index_body admits only wire-legal roles, so any role violation in the rebuilt
                # array is the rewrite's; the rest of the body is the client's own bytes.
                bad = check_wire_array(index, result.plan, array)
            if bad:
                lap("validate", t)
                record.violations = [v.to_json() for v in bad]
                return done("failed_open", f"rewrite introduced {bad[0].rule}: {bad[0].message}")
        tool = None
        if expand is not None:
            # The body about to go, in parts (the array edit applied where there is one): its
            # markers are searched where they lie, nothing joined for it.
            view = memoryview(index.raw)
            sent = (view[: edits[0][0]], *array, view[edits[0][1] :]) if edits else (index.raw,)
            notes: dict[str, Any] = {}
            tool = _inject(index, sent, expand, sid.id, notes, tenant)
            record.expand = notes.get("expand")
            if tool is not None:
                at, part = tool
                edits.append((at, at, (part,)))
        if not edits:  # neither spliced nor given the tool: the body as it came
            return done("passed_through", "no component acted")
        new = apply_edits(index.raw, edits)
        lap("validate", t)
        why = "rewritten" if spliced else "expand tool injected"
        return done("rewritten", why, new, SentShape(result.plan, tool))
    except Exception as e:  # noqa: BLE001 - fail open on anything at all
        return done("failed_open", f"internal error: {type(e).__name__}: {e}")


@dataclass(frozen=True, slots=True)
class ExpandPolicy:
    """When to offer the model the `context_guru_expand` tool, and where ids resolve."""

    mode: InjectMode
    store: Store | None


def _inject(
    index: BodyIndex,
    sent: Sequence[Bytes],
    policy: ExpandPolicy,
    session: str,
    record: dict[str, Any],
    tenant: str = "",
) -> tuple[int, bytes] | None:
    """Where the expand tool goes into the client's bytes, and what goes there, when the
    policy says it goes in (None: not); records why (not). `sent` is the body about to go
    upstream, in parts, searched for markers where it lies; a marker counts only when it
    resolves for `session` and `tenant`."""
    tools = index.members.get("tools")
    choice = index.members.get(index.dialect.tool_choice_member)
    if policy.mode != "never" and index.wrapped is not None:
        # Its answers come wrapped too (Code Assist's `response`): the continuation that
        # answers the model's call would have to re-wrap every round; not offered.
        record["expand"] = {
            "injected": False,
            "reason": f"the request is wrapped in {index.wrapped!r} (Code Assist): not offered",
        }
        return None
    if tools is not None and not isinstance(tools.value, list):
        # `"tools": null` and the like: nothing to append to (OpenAI clients send null).
        record["expand"] = {"injected": False, "reason": "the request's tools is not an array"}
        return None
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
        return None
    ok, why = inject_reason(
        policy.mode,
        index.dialect.name,
        tools.value if tools else None,
        choice.value if choice else None,
        sent,
        policy.store,
        session,
        tenant,
    )
    record["expand"] = {"injected": ok, "reason": why}
    return tool_insertion(index) if ok else None
