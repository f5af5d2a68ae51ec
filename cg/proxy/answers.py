"""What becomes of a rewritten turn's answer: a streamed one offered the expand tool goes through
the relay (`cg.proxy.relay`), so it streams and is held only if it calls the tool; a buffered one
that calls it is continued here (`cg.expand.continuation`); one the provider refused (400) is
re-sent once with the client's own bytes.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time

from mitmproxy import http
from mitmproxy.net import encoding as net_encoding

from cg.expand import continuation
from cg.expand.tool import TOOL_NAME, names_tool
from cg.pipeline.rewrite import Record
from cg.proxy import view as views
from cg.proxy.calls import call_flow
from cg.proxy.message import content, content_type, upstream_sni
from cg.proxy.relay import HEADER as RELAY_HEADER
from cg.proxy.relay import RelayJob
from cg.proxy.resend import resend
from cg.proxy.runtime import Runtime
from cg.proxy.view import META
from cg.state.session import header
from cg.wire.answers import Reply, ResponseParseError, tool_calls
from cg.wire.upstream import Exchange, provider_message

log = logging.getLogger("context_guru")


def _request_text(raw: bytes, encoding: str | None) -> str:
    """A relayed request's text as `get_content(strict=False)` would give it (decoded when its
    content-encoding is readable), made only when a continuation needs it."""
    body = raw
    if encoding:
        with contextlib.suppress(ValueError):
            decoded = net_encoding.decode(raw, encoding)
            if isinstance(decoded, bytes):
                body = decoded
    return body.decode("utf-8")  # a rewritten body: valid UTF-8


def to_relay(rt: Runtime, flow: http.HTTPFlow, record: Record, tenant: str) -> None:
    """A streamed turn offered our tool goes to the relay (`cg.proxy.relay`), so its answer
    streams and is held only if it calls the tool; without a relay it is buffered."""
    expand = record.get("expand")
    if (
        not rt.relay.port
        or not record.get("stream")
        or not isinstance(expand, dict)
        or not expand.get("injected")
        or record.get("outcome") != "rewritten"
    ):
        return
    req = flow.request
    job = RelayJob(
        req.url,
        req.headers.fields,
        req.raw_content or b"",
        functools.partial(
            _request_text, req.raw_content or b"", req.headers.get("content-encoding")
        ),
        record["dialect"],
        upstream_sni(req),
        rt.resolver(record.get("session"), tenant),
        (req.data.scheme, req.data.host, req.data.port),
    )
    job.times.append(time.perf_counter())
    job.token = rt.relay.add(job)
    # The hop carries neither the body nor the agent's headers (the job holds both, and
    # the relay sends them upstream): mitmproxy writes, and the relay reads, a head of
    # three fields, not ~1 MB and ~20 headers. The flow's own are restored when the
    # answer's headers arrive (`_unrelay`).
    req.headers.fields = (
        (b"host", b"127.0.0.1:%d" % rt.relay.port),
        (b"content-length", b"0"),
        (RELAY_HEADER.encode(), job.token.encode()),
    )
    req.data.content = b""
    # The data fields: the `host` setter would rewrite the Host header as well.
    req.data.scheme, req.data.host, req.data.port = b"http", "127.0.0.1", rt.relay.port
    rt.flows.begin(flow).job = job
    expand["relayed"] = True


class Answers:
    name = "contextguru_answers"  # (unique among every script's addons)

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        """A relayed flow's request as it went upstream again (its hop undone)."""
        if flow.live:
            self._unrelay(flow)

    async def response(self, flow: http.HTTPFlow) -> None:
        """Continue an expand call, or re-send a refused rewrite; what the answer's rounds
        replied is left in the flow's state for the meter."""
        if not flow.live:
            return
        replies = await self._answer(flow)
        st = self.rt.flows.get(flow.id)
        if st is not None:
            st.replies = replies

    def error(self, flow: http.HTTPFlow) -> None:
        if flow.live or flow.id in self.rt.flows:
            self._drop(flow)

    def _unrelay(self, flow: http.HTTPFlow) -> RelayJob | None:
        """The flow's request as it went upstream again (URL, headers, body), and its relay
        token gone."""
        st = self.rt.flows.get(flow.id)
        job = st.job if st is not None else None
        if job is not None:
            self.rt.relay.jobs.pop(job.token, None)  # never reached the relay: forget it (its key)
        if job is not None and header(flow.request.headers, RELAY_HEADER) is not None:
            flow.request.headers.fields = job.headers
            req = flow.request.data
            req.content = job.body
            req.scheme, req.host, req.port = job.origin
        return job

    def _drop(self, flow: http.HTTPFlow) -> tuple[bytes | None, RelayJob | None]:
        """The flow is answered or failed: its URL as the agent sent it again, and its client
        bytes (a rewritten flow's) and relay job forgotten here; both returned."""
        self._unrelay(flow)
        st = self.rt.flows.get(flow.id)
        if st is None:
            return None, None
        original, job, st.original, st.job = st.original, st.job, None, None
        return original, job

    async def _answer(self, flow: http.HTTPFlow) -> list[Reply] | None:
        """A 400 to a rewritten request: re-send the original bytes once, return that answer.
        Returns the continuation's replies when the model called `context_guru_expand`.

        The provider's message is recorded: it is the live signal of a shape bug.
        """
        original, job = self._drop(flow)
        if original is None or flow.response is None:
            return None
        record: Record = flow.metadata.get(META, {})
        if job is not None and len(job.times) == 4:
            t = job.times
            record.setdefault("timings_ms", {})["relay"] = {
                "to_relay": round((t[1] - t[0]) * 1000, 3),
                "upstream_headers": round((t[2] - t[1]) * 1000, 3),
                "body": round((t[3] - t[2]) * 1000, 3),
                "relay_to_response_hook": round((time.perf_counter() - t[3]) * 1000, 3),
            }
        if job is not None and job.gated:
            # Streamed through the relay, which ran any continuation itself.rt.
            if job.continued:
                record["expand"]["rounds"] = job.rounds
                record["expand"]["log"] = job.log
                self.rt.stats.expansions += job.rounds
            if job.error is not None:
                record["expand"]["error"] = job.error
            return job.replies if job.rounds else None
        if job is not None and job.error is not None:
            # Relayed but not gated, for a reason (an encoding the relay cannot read): the
            # answer streamed past as it came, so there is nothing here to read again.
            record["expand"]["error"] = job.error
            return None
        if flow.response.status_code == 200 and record.get("expand", {}).get("injected"):
            return await self._continue(flow, record)
        if flow.response.status_code != 400:
            return None
        self._forget_checkpoints(record)
        record["provider_400"] = provider_message(flow.response.get_content(strict=False))
        try:
            sni = upstream_sni(flow.request)
            flow.response = await resend(self.rt.pool.client(sni), flow.request, original, sni)
        except Exception as e:  # noqa: BLE001 - the client then gets the provider's own 400
            record["retry_error"] = f"{type(e).__name__}: {e}"
            log.warning("context-guru: re-sending the original failed: %s", e)
            return None
        self.rt.stats.retried_original += 1
        record["outcome"] = "retried_original"
        record["reason"] = "the provider refused the rewrite (400); the original was re-sent"
        rec = flow.metadata.get(views.RECORD)
        if isinstance(rec, dict):
            rec["action"] = "retried_original"
            rec["reason"] = record["reason"]
            views.mark(flow, rec)
        log.warning("context-guru: provider refused a rewrite: %s", record["provider_400"])
        return None

    def _forget_checkpoints(self, record: Record) -> None:
        """A checkpoint the provider refused would be refused every turn: drop it."""
        if self.rt.store is None:
            return
        for rec in record.get("components", ()):
            conv = rec.get("conversation")
            if rec.get("reused") and isinstance(conv, str):
                self.rt.store.delete_checkpoint(conv)

    async def _continue(self, flow: http.HTTPFlow, record: Record) -> list[Reply] | None:
        """The model called `context_guru_expand`: answer it here, re-send, return the end.
        Returns every round's reply (for the ledger), or None when nothing was continued."""
        assert flow.response is not None
        dialect = record["dialect"]
        ctype = content_type(flow.response)
        body = content(flow.response, strict=False) or b""
        if not names_tool(body):  # no call to find: not parsed on every turn
            return None
        try:
            first = continuation.parse(dialect, body, ctype)
        except ResponseParseError as e:
            record["expand"]["error"] = f"unreadable response: {e}"
            return None
        if not any(c.name == TOOL_NAME for c in tool_calls(first)):
            return None  # nothing of ours in it: the client gets the provider's bytes as they are
        sent = (flow.request.get_content(strict=False) or b"").decode("utf-8")
        sni = upstream_sni(flow.request)
        out = await continuation.run(
            self.rt.pool.client(sni),
            flow.request.url,
            flow.request.headers.fields,
            dialect,
            sent,
            first,
            bool(record.get("stream")) or ctype.startswith("text/event-stream"),
            # The credential the rounds go upstream with is the one the ids must resolve for.
            self.rt.resolver(
                record.get("session"), self.rt.tenant_of(flow.request.headers, flow.request.path)
            ),
            sni=sni,
            on_round=functools.partial(self._expand_round, flow, record),
        )
        record["expand"]["rounds"] = out.rounds
        record["expand"]["log"] = out.log
        self.rt.stats.expansions += out.rounds
        resp = flow.response
        resp.headers.pop("content-encoding", None)
        resp.headers["content-type"] = out.content_type
        resp.content = out.body
        return out.replies

    def _expand_round(self, flow: http.HTTPFlow, record: Record, ex: Exchange) -> None:
        """One expand round sent on `flow`'s behalf: a flow of its own."""
        rounds = record.setdefault("expand", {}).setdefault("shown", 0) + 1
        record["expand"]["shown"] = rounds
        rec = {
            "v": views.VERSION,
            "action": "expand",
            "dialect": record.get("dialect"),
            "session": (flow.metadata.get(views.RECORD) or {}).get("session"),
            "round": rounds,
            "for_flow": flow.id,
            "status": ex.status,
            "reason": f"the model called {TOOL_NAME}; round {rounds} re-sent for flow {flow.id}",
        }
        self.rt.show(call_flow(ex, rec))
