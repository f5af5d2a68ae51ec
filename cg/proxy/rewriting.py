"""The request hook of a provider turn: guards, then its body read (bounded) and rewritten by
`cg.pipeline.rewrite.rewrite_body`, assigned once, or the original left untouched.

One request, in order: control endpoint (`cg.proxy.endpoints`)? -> provider route? -> allowed
host? -> bypass? -> store usable? -> size cap? -> `rewrite_body` (index, pipeline, splice,
validate) -> assign the new body once. Every provider flow ends with its decision record in
`flow.metadata["context_guru"]`. The turn's summaries are commissioned here too, and released
when its answer begins (`responseheaders`, `error`).
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable
from typing import Any

from mitmproxy import http

from cg.billing.cache import prompt_of
from cg.pipeline.contract import Component
from cg.pipeline.rewrite import Record, Rewrite, rewrite_body
from cg.proxy import control, offload, turnlog
from cg.proxy import view as views
from cg.proxy.agents import codex_compaction
from cg.proxy.answers import to_relay
from cg.proxy.message import bounded_content, set_content, upstream_sni
from cg.proxy.runtime import Runtime
from cg.proxy.view import META
from cg.settings import host_allowed
from cg.state.session import header
from cg.state.tenant import ANONYMOUS
from cg.summarize.client import Origin
from cg.wire import decode
from cg.wire.dialects import ANTHROPIC, Dialect, route, signed

log = logging.getLogger("context_guru")

BYPASS_HEADER = "x-context-guru-bypass"
# What people write to switch a thing on: `1` is documented, `true` was silently not a bypass.
BYPASS_VALUES = frozenset({"1", "true", "yes", "on"})


def _passed(dialect: str, outcome: str, reason: str) -> Record:
    """The record of a request whose body was not read."""
    record: Record = {"dialect": dialect, "outcome": outcome, "reason": reason}
    if reason.endswith("is over cg_max_body_mb"):
        record["bound"] = "cg_max_body_mb"
    return record


def _over_cap(dialect: str, e: decode.TooLarge) -> Record:
    record = _passed(
        dialect,
        "passed_through",
        f"body {e} (cg_max_body_mb): passed through without being decoded further",
    )
    record["bound"] = "cg_max_body_mb"
    return record


class Rewriter:
    name = "contextguru_rewriter"  # (unique among every script's addons)

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        """The answer began: the summary jobs the turn commissioned may run now."""
        if flow.live:
            self.rt.summaries.answer_began(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        """The flow failed before (or while) answering: its summary jobs run without it."""
        if flow.live or flow.id in self.rt.flows:
            self.rt.summaries.answer_began(flow)

    def request(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        """A provider request: guards, then its body read (bounded) and rewritten, assigned
        once. A body too long to read on the event loop is read in the worker thread
        (`cg.proxy.offload`), and a control request that reads pages of the store is answered
        in another (`cg.proxy.pages`): then an awaitable is returned, which mitmproxy awaits
        (other flows go on meanwhile)."""
        if not flow.live:
            # A flow read from a file (`-r`, mitmweb's open) or one of our own calls shown as a
            # flow: nothing goes upstream, so nothing is rewritten, counted or booked.
            return None
        req = flow.request
        if control.is_control(req.path):
            return None  # (answered by `cg.proxy.endpoints`)
        dialect = route(req.method, req.path)
        if dialect is None and (why := signed(req.method, req.path)) is not None:
            self._signed(flow, why)
            return None
        # By name (the Host header): in transparent/local mode, and in a CONNECT tunnel,
        # `req.host` is the address connected to, not the provider's name.
        if dialect is None or (self.rt.hosts and not host_allowed(req.pretty_host, self.rt.hosts)):
            # (`pretty_host` parses the Host header: only asked when cg_hosts is set; another
            # provider flow is held by `cg.proxy.redact`, to redact its key once done)
            return None
        self.rt.stats.requests += 1
        self.rt.flows.begin(flow)
        if req.data.host not in self.rt.providers.seen:  # its siblings are a provider's too
            self.rt.providers.learn(req.data.host)
        t0 = time.perf_counter()
        try:
            down = self.rt._store_down() if any(self.rt.pipelines.values()) else None
        except Exception as e:  # noqa: BLE001 - a hook never raises: pass through, say why
            down = f"the store could not be checked ({type(e).__name__}: {e})"
        passing = self._passing(req, down)
        if passing is not None:
            self._conclude(flow, t0, _passed(dialect.name, *passing))
            return None
        encoding = header(req.headers, "content-encoding")
        if encoding and len(req.raw_content or b"") > offload.ENCODED_INLINE:
            return self._aside(flow, dialect, t0, None, "a content-encoded body to decode")
        # A content-encoded body is decoded here only as far as a turn is read here: one that
        # goes on decoding past that (a 1.7 KB brotli body of 1 GiB) goes on in the worker.
        inline = min(self.rt.max_body, offload.INLINE[0]) if encoding else self.rt.max_body
        try:
            raw = bounded_content(req, inline)
        except decode.TooLarge as e:
            if inline < self.rt.max_body:
                return self._aside(flow, dialect, t0, None, "a content-encoded body to decode")
            self._conclude(flow, t0, _over_cap(dialect.name, e))
            return None
        except ValueError as e:
            self._conclude(
                flow, t0, _passed(dialect.name, "passed_through", f"cannot decode body: {e}")
            )
            return None
        preset, components, why = self.rt.pipeline_for(req.headers, dialect.name)
        tenant = self.rt.tenant_of(req.headers, req.path)
        result = rewrite_body(
            raw,
            dialect,
            components,
            headers=req.headers,
            cache=self.rt.cache,
            expand=self.rt.expand,
            agent_compaction=codex_compaction(req.headers),
            max_messages=self.rt.max_messages,
            inline=offload.INLINE,
            tenant=tenant,
            path=req.path,
        )
        if result.deferred is not None:
            return self._aside(flow, dialect, t0, raw, result.deferred)
        self._conclude(flow, t0, result.record, raw, result, preset, why, tenant)
        return None

    def _signed(self, flow: http.HTTPFlow, why: str) -> None:
        """A model request signed over its body (Bedrock's): passed through untouched, and the
        record says why (no usage is read from it: its stream is AWS's binary framing)."""
        req = flow.request
        if self.rt.hosts and not host_allowed(req.pretty_host, self.rt.hosts):
            return
        self.rt.stats.requests += 1
        self.rt.flows.begin(flow)  # (its signature's credential is redacted once it is done)
        record = _passed(ANTHROPIC.name, "passed_through", why)
        self.rt.stats.count(record["outcome"])
        flow.metadata[META] = record
        shown = views.view_record(record)
        views.mark(flow, shown)
        turnlog.turn(shown, self.rt.quiet)

    def _aside(
        self,
        flow: http.HTTPFlow,
        dialect: Dialect,
        t0: float,
        raw: bytes | None,
        why: str,
    ) -> Awaitable[None] | None:
        """The request read in the worker thread (`raw`: its decoded body, or None to decode it
        there too); while too many wait for it, passed through instead."""
        if self.rt.offload.full():
            self.rt.offload.busy += 1
            reason = (
                f"{self.rt.offload.waiting} large bodies are being read already: this one "
                f"({why}) passes through unread"
            )
            record = _passed(dialect.name, "passed_through", reason)
            record["bound"] = "large bodies in flight"
            self._conclude(flow, t0, record)
            return None
        return self._read_aside(flow, dialect, t0, raw, why)

    async def _read_aside(
        self, flow: http.HTTPFlow, dialect: Dialect, t0: float, raw: bytes | None, why: str
    ) -> None:
        req = flow.request
        preset, components, reason = self.rt.pipeline_for(req.headers, dialect.name)
        tenant = self.rt.tenant_of(req.headers, req.path)
        started = time.perf_counter()
        try:
            raw, result = await self.rt.offload.run(
                self._read_whole,
                raw,
                req.raw_content or b"",
                header(req.headers, "content-encoding") or "",
                dialect,
                components,
                req.headers,
                codex_compaction(req.headers),
                tenant,
                req.path,
            )
        except Exception as e:  # noqa: BLE001 - a hook never raises: pass through, say why
            record = _passed(
                dialect.name, "failed_open", f"internal error: {type(e).__name__}: {e}"
            )
            self._conclude(flow, t0, record)
            return
        if isinstance(result, dict):  # (a record: the body was not read)
            result["read_aside"] = why
            result.setdefault("timings_ms", {})["aside"] = round(
                (time.perf_counter() - started) * 1000, 3
            )
            self._conclude(flow, t0, result)
            return
        result.record.setdefault("timings_ms", {})["aside"] = round(
            (time.perf_counter() - started) * 1000, 3
        )
        result.record["read_aside"] = why
        if result.index is not None:
            self.rt.cache.remember(result.index)  # (on the loop: the cache is the loop's alone)
        self._conclude(flow, t0, result.record, raw, result, preset, reason, tenant)

    def _read_whole(
        self,
        raw: bytes | None,
        content: bytes,
        encoding: str,
        dialect: Dialect,
        components: list[Component],
        headers: Any,
        compaction: str | None,
        tenant: str,
        path: str = "",
    ) -> tuple[bytes | None, Rewrite | Record]:
        """In the worker thread: the body decoded (bounded) unless it was, and rewritten, read
        whole (no message cache: it is the loop's). Returns the decoded body and the rewrite,
        or a pass-through record when the body cannot be read."""
        if raw is None:
            try:
                raw = decode.decode(content, encoding, self.rt.max_body)
            except decode.TooLarge as e:
                return None, _over_cap(dialect.name, e)
            except ValueError as e:
                return None, _passed(dialect.name, "passed_through", f"cannot decode body: {e}")
        result = rewrite_body(
            raw,
            dialect,
            components,
            headers=headers,
            expand=self.rt.expand,
            agent_compaction=compaction,
            max_messages=self.rt.max_messages,
            tenant=tenant,
            path=path,
        )
        if result.index is not None and "components" in result.record:
            # The usage ledger's prompt-cache shape of it, made here (memoised on the index):
            # the answer books it on the loop, where a body of many messages is long to read.
            with contextlib.suppress(Exception):
                prompt_of(result.index, self.rt.facts)
        return raw, result

    def _conclude(
        self,
        flow: http.HTTPFlow,
        t0: float,
        record: Record,
        raw: bytes | None = None,
        result: Rewrite | None = None,
        preset: str = "",
        why: str = "",
        tenant: str = ANONYMOUS,
    ) -> None:
        """The request's end, on the loop: a rewrite assigned once (or the original left
        untouched), its summaries commissioned, its record kept, its usage metered."""
        req = flow.request
        summary_flow: str | None = None
        index = result.index if result is not None else None
        shape = result.shape if result is not None else None
        if result is not None and raw is not None:
            record["preset"] = preset
            record["preset_reason"] = why
            self._count_components(record)
            if result.body is not None:
                original, fields = req.raw_content, req.headers.fields
                if self.rt.keep_backup:  # mitmweb's Revert: the request as it came (by reference)
                    flow.backup()  # type: ignore[no-untyped-call]
                try:
                    set_content(req, result.body)
                    self.rt.flows.begin(flow).original = original
                except Exception as e:  # noqa: BLE001 - an encoder error must fail open
                    req.headers.fields, req.raw_content = fields, original
                    record["outcome"] = "failed_open"
                    record["reason"] = f"cannot re-encode body: {e}"
            if result.commissions:
                # The body as it goes upstream: what the provider caches for this session.
                sent = result.body if record["outcome"] == "rewritten" else raw
                origin = Origin.of(req.url, req.headers, upstream_sni(req))
                summary_flow = str(uuid.uuid4())
                self.rt.summaries.commission(
                    result.commissions, origin, sent, flow.id, summary_flow
                )
            # Last: the summary's origin above is the provider, never the relay.
            try:
                to_relay(self.rt, flow, record, tenant)
            except Exception as e:  # noqa: BLE001 - without the relay the answer is buffered
                log.warning("context-guru: relay not used: %s", type(e).__name__)
        self.rt.stats.count(record["outcome"])
        record.setdefault("timings_ms", {})["hook"] = round((time.perf_counter() - t0) * 1000, 3)
        flow.metadata[META] = record
        self.rt.meter.note(flow, record, index, self.rt.max_body, shape)
        self.rt.meter.arm()  # the session's clock, if the pipeline held one
        shown = views.view_record(
            record,
            commissioned=summary_flow is not None,
            summary_flow=summary_flow,
            client_bytes=len(raw) if raw is not None else None,
        )
        views.mark(flow, shown)
        turnlog.turn(shown, self.rt.quiet)  # (a failed-open turn's line is a warning, always)
        return None

    def _passing(self, req: http.Request, down: str | None) -> tuple[str, str] | None:
        """(outcome, reason) for a provider request passed through without reading its body:
        bypassed, the store down, a streamed body, or one whose very bytes are over
        cg_max_body_mb (what it decodes to is bounded as it is decoded); else None."""
        asked = header(req.headers, BYPASS_HEADER)
        if asked is not None and asked.strip().lower() in BYPASS_VALUES:
            return "bypassed", f"{BYPASS_HEADER}: {asked.strip()}"
        if down is not None:
            return "passed_through", f"{down}: passing through until it works"
        if req.raw_content is None:
            return "passed_through", "body streamed"
        if len(req.raw_content) > self.rt.max_body:
            return "passed_through", f"body of {len(req.raw_content)} bytes is over cg_max_body_mb"
        return None

    def _count_components(self, record: Record) -> None:
        for rec in record.get("components", ()):
            if rec.get("reused") and record.get("outcome") == "rewritten":
                self.rt.stats.summaries.reused += 1
                self.rt.stats.tokens_before += int(rec.get("tokens", 0))
                self.rt.stats.tokens_after += int(rec.get("tokens_after", 0))
