"""What each rewritten turn retained (docs/behaviour.md#retention): the share of the client's facts
the request sent still shows, measured once per rewritten flow and recorded in its decision
record (`retention`), its view record (mitmweb's view and comment) and `/_cg/stats`.

Why not in the request hook: measuring reads every message's facts (~20–30 ms for a cold 1 MB,
400-message body; ~0.14–0.3 ms on a warm turn, whose index inherits the previous turn's facts
and kept-text search: `cg.retention.measure`), and nothing on the request's path needs the
figure. So the request hook costs what it did, and the request goes upstream without waiting.
Why it begins at the answer's headers (`begin`, from `cg.proxy.metering`'s `responseheaders`),
in the worker thread: it then runs while the provider streams its answer, and the answer's hook
(`response`, or `error` for a flow that failed) only records what is done, so the client does
not wait for it at the end of the answer (measured in the hook itself, on the loop, the client
waited ~1 ms more on a 1 MB reuse turn: docs/benchmarks.md). A flow that failed before any
answer is measured by its error hook: on the loop when there is little to read, else in the
worker thread, awaited. Those hooks see every flow once, and what is measured is the metering's
turn (the client's body as indexed, and the plan that made the body sent), which the first of
them takes: a response after an error, or an error after a response, finds nothing to measure
again. Recorded by the hook rather than by a task left running: the record is complete when
the flow is saved (`-w`) or shown.

Only a turn sent `rewritten` whose plan changed a message is measured: an expand-tool-only
injection keeps every message (retention 1 by construction) and a re-sent original
(`retried_original`) was answered for the client's own bytes; neither is recorded.

Fail open: a measurement that raises records `{"error": why}` under the key and is counted
(`failed`); nothing here reaches the answer.

The lost facts' text (at most 5, 120 characters each) is the client's own request's, which the
flow held when it came in (and the stash holds); a credential is not a fact, but a command or a
typed message may quote one, so the request's own credential header values, and strings shaped
like API keys, are masked in it before it is kept.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Sequence
from typing import Any

from mitmproxy import http

from cg.pipeline.rewrite import Record
from cg.proxy import view as views
from cg.proxy.offload import INLINE
from cg.proxy.redact import CREDENTIAL_HEADERS, REDACTED
from cg.proxy.runtime import Runtime
from cg.retention.measure import Retention, of_plan, unread
from cg.wire.body import BodyIndex
from cg.wire.splice import Piece, is_identity

log = logging.getLogger("context_guru")

# Strings shaped like the common API keys and tokens (a command that exports one, a message
# that quotes one): masked in a lost fact's text.
_KEYLIKE = re.compile(
    r"\b(?:sk|pk|rk)-[A-Za-z0-9_-]{16,}"  # OpenAI, Anthropic (sk-ant-…), Stripe
    r"|\bAKIA[0-9A-Z]{16}\b"  # AWS access key ids
    r"|\bgh[pousr]_[A-Za-z0-9]{20,}"  # GitHub
    r"|\bxox[abprs]-[A-Za-z0-9-]{10,}"  # Slack
    r"|\bAIza[0-9A-Za-z_-]{35}"  # Google
    r"|(?i:bearer)\s+[A-Za-z0-9._~+/=-]{16,}"
)
LOST_SHOWN, LOST_CHARS = 5, 120  # lost facts kept in the record, and of each its first characters
SECRET_MIN = 8  # a credential value shorter than this is not searched for (it would mask words)


def begin(rt: Runtime, flow: http.HTTPFlow, record: Record) -> None:
    """At the answer's headers: a rewritten turn's measurement begun in the worker thread, so
    that it runs while the provider streams its answer and the answer's hook finds it done
    (the client does not wait for it at the end of the answer). Call before the meter takes
    the flow's turn; a failure here leaves the measurement to the answer's hook."""
    try:
        st = rt.flows.get(flow.id)
        if st is None or st.retention is not None:
            return
        got = _pending(rt, flow, record)
        if got is not None:
            st.retention = asyncio.ensure_future(rt.offload.chore(_of, *got))
    except Exception:  # noqa: BLE001 - fail open: measured at the answer's end instead
        return


def measure(rt: Runtime, flow: http.HTTPFlow, record: Record) -> Awaitable[None] | None:
    """Record the flow's retention if it is a rewritten turn not measured yet: the one `begin`
    started (at once when it is done, else an awaitable that waits for it), or measured now:
    on the loop when there is little to read, else an awaitable that measures in the worker
    thread (the caller awaits it). Call before the meter takes the flow's turn."""
    try:
        st = rt.flows.get(flow.id)
        early = st.retention if st is not None else None
        if st is not None and early is not None:
            st.retention = None
            if "retention" in record or record.get("outcome") != "rewritten":
                early.cancel()  # (a 400 re-sent the original since: its figure is not this)
                return None
            if early.done() and not early.cancelled():
                _record(rt, flow, record, early.result())
                return None
            return _finish(rt, flow, record, early)
        got = _pending(rt, flow, record)
        if got is None:
            return None
        index, plan = got
        messages, chars = unread(index)
        if messages > INLINE[1] or chars > INLINE[0]:
            return _finish(rt, flow, record, asyncio.ensure_future(rt.offload.chore(_of, *got)))
        _record(rt, flow, record, _of(index, plan))
    except Exception as e:  # noqa: BLE001 - fail open: the answer never sees it
        _record(rt, flow, record, _why(e))
    return None


def _pending(
    rt: Runtime, flow: http.HTTPFlow, record: Record
) -> tuple[BodyIndex, Sequence[Piece]] | None:
    if record.get("outcome") != "rewritten" or "retention" in record:
        return None
    st = rt.flows.get(flow.id)
    turn = st.turn if st is not None else None
    if turn is None or turn.index is None or turn.shape is None:
        return None
    plan = turn.shape.plan
    if is_identity(plan, len(turn.index.messages)):
        return None  # the expand tool alone: every message kept
    return turn.index, plan


def _why(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:200]


def _of(index: BodyIndex, plan: Sequence[Piece]) -> Retention | str:
    """The retention, or why it could not be measured (in the worker thread or on the loop)."""
    try:
        return of_plan(index, plan)
    except Exception as e:  # noqa: BLE001
        return _why(e)


async def _finish(
    rt: Runtime, flow: http.HTTPFlow, record: Record, early: asyncio.Future[Any]
) -> None:
    """A measurement running in the worker thread (begun at the answer's headers, or by the
    hook for a long read), recorded on the loop once it is done."""
    try:
        result = await early
    except asyncio.CancelledError:
        if not early.cancelled():
            raise  # the hook itself is being cancelled
        result = "the measurement was cancelled (the worker thread stopped)"
    except Exception as e:  # noqa: BLE001 - the worker gone (at exit): said, not raised
        result = _why(e)
    _record(rt, flow, record, result)


def _record(rt: Runtime, flow: http.HTTPFlow, record: Record, result: Retention | str) -> None:
    """On the loop: the record, the view and the counters."""
    try:
        if isinstance(result, str):
            doc: dict[str, Any] = {"error": result}
            rt.stats.retention.failed += 1
        else:
            doc = result.to_json(0)  # the lost facts are added below, masked
            secrets = credentials(flow.request.headers)
            # Masked whole, then cut: a key cut at the 120th character would not be matched.
            doc["lost"] = [
                {"kind": f.kind, "text": mask(f.text, secrets)[:LOST_CHARS]}
                for f in result.lost[:LOST_SHOWN]
            ]
            rt.stats.retention.add(result)
        record["retention"] = doc
        views.retained(flow, doc)
    except Exception as e:  # noqa: BLE001
        log.warning("context-guru: retention not recorded: %s", type(e).__name__)


def credentials(headers: http.Headers) -> list[str]:
    """The request's credential header values (and a bearer's token), longest first."""
    out: set[str] = set()
    for name in CREDENTIAL_HEADERS:
        for value in headers.get_all(name):
            value = value.strip()
            token = value.split(None, 1)[1] if " " in value else value
            out.update(v for v in (value, token) if len(v) >= SECRET_MIN)
    return sorted(out, key=len, reverse=True)


def mask(text: str, secrets: Sequence[str] = ()) -> str:
    """`text` with each of `secrets`, and anything shaped like an API key, replaced."""
    for s in secrets:
        text = text.replace(s, REDACTED)
    return _KEYLIKE.sub(REDACTED, text)
