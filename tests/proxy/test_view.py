"""cg.proxy.view: the mitmweb contentviews, through the real addon (a real store, a summary
made by the summarize component with a fake model) — and the bad input each view meets."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

from mitmproxy import contentviews, http
from mitmproxy import io as mio
from mitmproxy.test import taddons, tflow, tutils

from cg.proxy.addon import META, REDACTED, ContextGuru
from cg.proxy.view import RECORD, VERSION, OriginalView, RewriteView, comment
from cg.summarize.component import Summarize
from tests.support.transcripts import CC16, FakeSummarizer, cc_dumps, fixture_body

CONFIG = """
components:
  summarize:
    cache_state: any
    min_tokens: 10
    trigger: {min_request_frac: 0, min_request_tokens: 0}
"""


def flow_of(body: bytes) -> http.HTTPFlow:
    req = tutils.treq(method=b"POST", path=b"/v1/messages", host="api.anthropic.com", content=body)
    req.headers["x-context-guru-session"] = "view-test"
    req.headers["x-api-key"] = "sk-ant-SECRET-view"
    f = tflow.tflow(req=req)
    f.client_conn.peername = ("127.0.0.1", 50000)
    return f


def text_of(result: Any) -> list[str]:
    _, lines = result
    return ["".join(str(t) for _, t in line) for line in lines]


def render(view: Any, f: http.HTTPFlow, data: bytes | None = None) -> list[str]:
    body = f.request.content or b"" if data is None else data
    return text_of(view(body, flow=f, http_message=f.request))


async def summarized(tmp_path: Path, cg: ContextGuru, tctx: Any) -> tuple[bytes, http.HTTPFlow]:
    """A session summarized, and the next turn rewritten: (the client's body, its flow)."""
    cfg = tmp_path / "cg.yaml"
    cfg.write_text(CONFIG, encoding="utf-8")
    tctx.configure(cg, cg_preset="summarize", cg_config=str(cfg), cg_db=str(tmp_path / "db"))
    (comp,) = cg.components
    assert isinstance(comp, Summarize)
    comp.summarizer = FakeSummarizer()
    body = cc_dumps(fixture_body(CC16))
    first = flow_of(body)
    cg.request(first)
    assert await cg.wait_for_summary("view-test") == "completed"
    rec = first.metadata[RECORD]
    assert rec["action"] == "commissioned" and first.marked == ":hourglass_flowing_sand:"
    assert first.comment.startswith("cg: commissioned a summary of messages ")
    assert rec["summary_flow"][:8] in first.comment
    assert cg.views[0].render_priority(body, flow=first, http_message=first.request) == 2
    assert "10→None" not in "\n".join(render(cg.views[0], first))
    f = flow_of(body)
    cg.request(f)
    assert f.metadata[META]["outcome"] == "rewritten", f.metadata[META]  # vacuity
    return body, f


async def test_a_rewritten_flow_reads_as_head_summary_tail(tmp_path: Path) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        body, f = await summarized(tmp_path, cg, tctx)
        rec = f.metadata[RECORD]
        assert rec["v"] == VERSION and rec["action"] == "rewritten"
        json.dumps(rec)  # JSON-serialisable, so it survives -w / -r
        assert len(json.dumps(rec)) < 1000  # small: no text, no headers
        assert f.marked == ":scissors:" and f.comment == comment(rec)
        assert f.comment.startswith("cg: rewritten 34→5 messages") and "tokens" in f.comment
        assert "context_guru_original" not in f.metadata  # no second copy of the body
        view, original = cg.views
        assert isinstance(view, RewriteView) and isinstance(original, OriginalView)
        assert view.render_priority(b"", flow=f, http_message=f.request) == 2
        assert view.render_priority(b"", flow=f, http_message=f.response) == 0
        assert original.render_priority(b"", flow=f, http_message=f.request) == 0

        text = render(view, f)
        assert text[0] == f.comment
        joined = "\n".join(text)
        assert "session view-test" in joined and "preset summarize" in joined
        assert "messages 34 → 5" in joined and "ms in the proxy" in joined
        assert f"stash {rec['stash']}" in joined and "replaced messages 1–30" in joined
        assert any(line.startswith("── head") for line in text)
        assert any(line.startswith("── the summary") for line in text)
        assert any(line.startswith("── tail") for line in text)
        assert max(len(line) for line in text) <= 100  # wrapped, never cut at 160
        sent = json.loads(f.request.content or b"")
        summary = next(
            m["content"]
            for m in sent["messages"]
            if isinstance(m["content"], str) and m["content"].startswith("=== History")
        )
        words = summary.split()
        assert words and all(w in joined for w in words)  # the summary, whole
        assert "[tool_result]" not in joined and "← " in joined and "→ " in joined

        # The original, one click away: rebuilt byte for byte from the body sent and the stash.
        head = " ".join(render(original, f)[:3])
        assert "rebuilt from the body sent and stash" in head
        assert f"{len(body):,} bytes, as the client sent" in head
        assert f.modified()  # mitmweb's Revert is enabled
        f.revert()
        assert f.request.content == body  # Revert brings back what the client sent
        cg.done()
        assert not any(v in contentviews.views for v in cg.views)


async def test_the_rebuilt_original_equals_the_client_bytes(tmp_path: Path) -> None:
    from cg.proxy.view import rebuild_original

    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        body, f = await summarized(tmp_path, cg, tctx)
        rec = f.metadata[RECORD]
        assert rec.get("expand_tool")  # vacuity: the tool was appended and must come out
        stash = cg._stash(rec["stash"])
        assert stash is not None
        assert rebuild_original(f.request.content or b"", rec, stash) == body
        cg.done()


async def test_a_saved_flow_file_keeps_the_record_and_no_key(tmp_path: Path) -> None:
    """`-w` then `-r`: the record survives, the views still work, the key is nowhere."""
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        body, f = await summarized(tmp_path, cg, tctx)
        f.response = tutils.tresp()
        await cg.response(f)
        buf = io.BytesIO()
        mio.FlowWriter(buf).add(f)
        raw = buf.getvalue()
        assert b"sk-ant-SECRET-view" not in raw and REDACTED.encode() in raw
        (loaded,) = list(mio.FlowReader(io.BytesIO(raw)).stream())
        assert isinstance(loaded, http.HTTPFlow) and not loaded.live
        assert loaded.metadata[RECORD] == f.metadata[RECORD]
        view, original = cg.views
        assert view.render_priority(b"", flow=loaded, http_message=loaded.request) == 2
        assert render(view, loaded)[0] == f.comment
        assert f"{len(body):,} bytes, as the client sent" in " ".join(render(original, loaded)[:3])
        before = cg.stats.requests
        cg.request(loaded)  # a flow read from a file is never processed again
        assert cg.stats.requests == before and loaded.request.content == f.request.content
        cg.done()


async def test_an_expired_stash_says_so_and_shows_the_plain_view(tmp_path: Path) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        _, f = await summarized(tmp_path, cg, tctx)
        original = OriginalView(lambda key: None)  # a store that no longer has it
        lines = render(original, f)
        assert "no longer in the store" in lines[0] and len(lines) > 1
        assert "stash" in lines[0] and "{" in "\n".join(lines[1:])  # the JSON body below
        cg.done()


def test_a_flow_without_a_record_says_so_in_one_line() -> None:
    for view in (RewriteView(lambda key: None), OriginalView(lambda key: None)):
        f = tflow.tflow()
        lines = render(view, f, b'{"a": 1}')
        assert lines[0] == "context-guru: the addon did not touch this flow"
        assert len(lines) > 1  # the plain view below
        assert view.render_priority(b"{}", flow=f, http_message=f.request) == 0


def test_an_older_record_says_so_and_falls_back() -> None:
    view = RewriteView(lambda key: None)
    f = tflow.tflow()
    f.metadata[META] = {"outcome": "rewritten"}  # saved before the view record existed
    assert "older context-guru" in render(view, f, b"{}")[0]
    f.metadata[RECORD] = {"v": 0, "action": "rewritten"}
    assert "version 0" in render(view, f, b"{}")[0]
    assert view.render_priority(b"{}", flow=f, http_message=f.request) == 0


def test_a_body_that_is_not_json_says_so() -> None:
    view = RewriteView(lambda key: None)
    f = tflow.tflow()
    f.metadata[RECORD] = {"v": VERSION, "action": "failed_open", "reason": "x"}
    lines = render(view, f, b"\xff not json")
    assert any(line == "context-guru: the body is not JSON" for line in lines)
    original = OriginalView(lambda key: None)
    f.metadata[RECORD] = {"v": VERSION, "action": "rewritten", "stash": "0" * 16}
    assert "no longer in the store" in render(original, f, b"\xff")[0]


def test_a_response_is_not_the_views_business() -> None:
    view = RewriteView(lambda key: None)
    f = tflow.tflow(resp=True)
    f.metadata[RECORD] = {"v": VERSION, "action": "rewritten"}
    assert view.render_priority(b"{}", flow=f, http_message=f.response) == 0
    _, lines = view(b'{"x": 1}', flow=f, http_message=f.response)
    text = ["".join(str(t) for _, t in line) for line in lines]
    assert text[0] == "context-guru: nothing to add about this response" and len(text) > 1


async def test_a_reloaded_script_leaves_one_view_of_each() -> None:
    """mitmproxy reloads a changed script without always running the old one's `done`."""
    first, second = ContextGuru(), ContextGuru()
    with taddons.context(first):
        pass
    with taddons.context(second):
        names = [v.name for v in contentviews.views]
        assert names.count("context-guru") == 1 and names.count("context-guru original") == 1
        assert all(v in contentviews.views for v in second.views)
        second.done()


class Seen:
    """An addon that keeps every flow whose response hook runs (our own calls shown)."""

    def __init__(self) -> None:
        self.flows: list[http.HTTPFlow] = []

    def response(self, flow: http.HTTPFlow) -> None:
        self.flows.append(flow)


def mock_pool(cg: ContextGuru, handler: Any, f: http.HTTPFlow) -> None:
    """Every call upstream the addon makes for `f` answered by `handler`, in process."""
    import httpx

    from cg.proxy.addon import upstream_sni

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    cg.pool._client = client
    sni = upstream_sni(f.request)
    if sni:
        cg.pool._named[sni] = client


async def test_a_refused_rewrite_is_marked_retried(tmp_path: Path) -> None:
    import httpx

    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        _, f = await summarized(tmp_path, cg, tctx)
        mock_pool(cg, lambda req: httpx.Response(200, stream=httpx.ByteStream(b"{}")), f)
        f.response = http.Response.make(
            400, b'{"type":"error","error":{"type":"invalid_request_error","message":"no"}}'
        )
        await cg.response(f)
        rec = f.metadata[RECORD]
        assert "retry_error" not in f.metadata[META], f.metadata[META]
        assert rec["action"] == "retried_original" and f.marked == ":repeat:"
        assert f.comment.startswith("cg: retried with the original: ")
        lines = render(cg.views[1], f)
        assert "the original was re-sent" in lines[0]
        assert render(cg.views[0], f)[0] == f.comment
        cg.done()


async def test_an_expand_round_is_a_flow_of_its_own(tmp_path: Path) -> None:
    import httpx

    cg, seen = ContextGuru(), Seen()
    with taddons.context(cg, seen) as tctx:
        _, f = await summarized(tmp_path, cg, tctx)
        key = f.metadata[RECORD]["stash"]
        final = {
            "id": "msg_2", "type": "message", "role": "assistant", "model": "claude-x",
            "content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn",
            "usage": {"input_tokens": 5, "output_tokens": 1},
        }  # fmt: skip
        mock_pool(cg, lambda req: httpx.Response(200, json=final), f)
        call = {
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
            "content": [
                {"type": "tool_use", "id": "toolu_x", "name": "context_guru_expand",
                 "input": {"id": key}}
            ],
            "stop_reason": "tool_use", "usage": {"input_tokens": 5, "output_tokens": 1},
        }  # fmt: skip
        f.response = http.Response.make(
            200, json.dumps(call).encode(), {"content-type": "application/json"}
        )
        await cg.response(f)
        await asyncio.gather(*cg.showing)
        rounds = [x for x in seen.flows if x.metadata.get(RECORD, {}).get("action") == "expand"]
        assert len(rounds) == 1, [x.comment for x in seen.flows]
        (r,) = rounds
        assert r.marked == ":mag:" and r.comment == f"cg: expand round 1 for flow {f.id[:8]}"
        assert "sk-ant-SECRET-view" not in repr(r.get_state())
        assert r.response is not None and json.loads(r.response.content or b"") == final
        assert b"done" in (f.response.content or b"")  # the final answer (SSE: it streamed)
        cg.done()
