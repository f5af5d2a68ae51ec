"""Our own calls upstream shown as flows (cg.proxy.calls): a summarizer request and its answer
go through the master's hooks as a finished, non-live flow — marked, commented, the key
redacted — and the addon never processes it."""

from __future__ import annotations

import asyncio
import json

import httpx
from mitmproxy import http
from mitmproxy.test import taddons

from cg.proxy.addon import ContextGuru
from cg.proxy.view import RECORD
from cg.summarize.client import HttpPool, Origin, SummarizerClient
from cg.summarize.component import Commission
from cg.summarize.config import ModelConfig

SECRET = "sk-ant-SECRET-calls"


class Seen:
    """An addon that collects every flow whose response hook runs."""

    def __init__(self) -> None:
        self.flows: list[http.HTTPFlow] = []

    def response(self, flow: http.HTTPFlow) -> None:
        self.flows.append(flow)


async def test_a_summarizer_call_becomes_a_marked_redacted_flow() -> None:
    cg, seen = ContextGuru(), Seen()
    with taddons.context(cg, seen):
        answer = {
            "type": "message",
            "content": [{"type": "text", "text": "<summary>the summary</summary>"}],
            "usage": {"input_tokens": 9, "output_tokens": 3},
        }
        pool = HttpPool()
        pool._client = httpx.AsyncClient(
            transport=httpx.MockTransport(lambda req: httpx.Response(200, json=answer))
        )
        client = SummarizerClient(ModelConfig(source="incoming"), pool, on_call=cg._summary_call)
        job = Commission(
            "sess-calls", "anthropic", "claude-x", 2, 32, "0" * 32, [], [], [], None,
            origin=Origin("https://api.anthropic.com/v1/messages", {"x-api-key": SECRET}),
        )  # fmt: skip
        job.flow_id, job.call_flow_id = "commissioning-flow-id", "0f0f0f0f-summary-flow"
        assert await client("summarize this", job) == "<summary>the summary</summary>"
        await asyncio.gather(*cg.showing)
        await pool.aclose()
        (f,) = seen.flows
        assert f.id == "0f0f0f0f-summary-flow" and not f.live
        assert f.marked == ":memo:"
        assert f.comment.startswith("cg: summary of messages 2–31 for session sess-calls")
        assert "commissi" in f.comment and "for flow commissi" in f.comment
        assert f.metadata[RECORD]["action"] == "summary"
        assert f.request.host == "api.anthropic.com" and f.request.path == "/v1/messages"
        assert json.loads(f.request.content or b"")["messages"][0]["content"] == "summarize this"
        assert f.response is not None and f.response.status_code == 200
        assert json.loads(f.response.content or b"") == answer
        assert SECRET not in repr(f.get_state())  # the key is in no part of the flow
        assert f.request.headers["x-api-key"] == "[redacted by context-guru]"
        assert cg.stats.requests == 0  # never itself processed by the pipeline
        view = cg.views[0]
        assert view.render_priority(b"", flow=f, http_message=f.request) == 2
        _, lines = view(f.request.content or b"", flow=f, http_message=f.request)
        text = ["".join(str(t) for _, t in line) for line in lines]
        assert text[0] == f.comment and any("summarize this" in line for line in text)
        cg.done()


async def test_a_failed_call_is_a_flow_with_its_error() -> None:
    cg, seen = ContextGuru(), Seen()

    class ErrorSeen(Seen):
        def error(self, flow: http.HTTPFlow) -> None:
            self.flows.append(flow)

    errors = ErrorSeen()
    with taddons.context(cg, seen, errors):

        def refuse(req: httpx.Request) -> httpx.Response:
            raise httpx.ConnectError("refused", request=req)

        pool = HttpPool()
        pool._client = httpx.AsyncClient(transport=httpx.MockTransport(refuse))
        client = SummarizerClient(
            ModelConfig(source="incoming"), pool, on_call=cg._summary_call, timeout=0.5
        )
        job = Commission(
            "sess-err", "anthropic", "claude-x", 1, 4, "0" * 32, [], [], [], None,
            origin=Origin("http://127.0.0.1:9/v1/messages", {"authorization": "Bearer " + SECRET}),
        )  # fmt: skip
        job.flow_id = "f"
        try:
            await client("p", job)
        except Exception as e:  # noqa: BLE001 - it fails; the flows are what is tested
            assert "ConnectError" in str(e)
        await asyncio.gather(*cg.showing)
        await pool.aclose()
        assert errors.flows and all(f.error is not None for f in errors.flows)  # vacuity
        assert all(SECRET not in repr(f.get_state()) for f in errors.flows)
        cg.done()
