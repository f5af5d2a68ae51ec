"""cg.proxy.view: the mitmweb contentview of a rewritten request, through the real addon."""

from __future__ import annotations

from pathlib import Path

from mitmproxy import contentviews, http
from mitmproxy.test import taddons, tflow, tutils

from cg.proxy.addon import META, ContextGuru
from cg.proxy.view import ORIGINAL, RewriteView, comment
from cg.summarize.component import Summarize
from tests.transcripts import CC16, FakeSummarizer, cc_dumps, fixture_body

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
    f = tflow.tflow(req=req)
    f.client_conn.peername = ("127.0.0.1", 50000)
    return f


def render(view: RewriteView, f: http.HTTPFlow) -> list[str]:
    _, lines = view(f.request.content or b"", flow=f, http_message=f.request)
    return ["".join(str(t) for _, t in line) for line in lines]


async def test_a_rewritten_flow_shows_kept_summary_and_the_replaced_span(tmp_path: Path) -> None:
    cfg = tmp_path / "cg.yaml"
    cfg.write_text(CONFIG, encoding="utf-8")
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        tctx.configure(cg, cg_preset="summarize", cg_config=str(cfg), cg_db=str(tmp_path / "db"))
        (comp,) = cg.components
        assert isinstance(comp, Summarize)
        comp.summarizer = FakeSummarizer()
        body = cc_dumps(fixture_body(CC16))

        first = flow_of(body)
        cg.request(first)
        assert await cg.wait_for_summary("view-test") == "completed"
        assert cg.view.render_priority(body, flow=first, http_message=first.request) == 0

        f = flow_of(body)
        cg.request(f)
        record = f.metadata[META]
        assert record["outcome"] == "rewritten", record  # vacuity: the view has a rewrite to show
        assert f.comment == comment(record) and "tokens" in f.comment
        assert f.metadata[ORIGINAL] == body.decode()
        assert cg.view.render_priority(b"", flow=f, http_message=f.request) == 2
        assert cg.view.render_priority(b"", flow=f, http_message=f.response) == 0

        text = render(cg.view, f)
        assert text[0].startswith("cg: 34→5 messages")
        assert sum("SUMMARY" in line for line in text) == 1
        assert any(line.startswith("replaced span") and "30 messages" in line for line in text)
        assert any("original body" in line for line in text)
        assert cg.view in contentviews.views
        cg.done()
        assert cg.view not in contentviews.views


def test_a_flow_without_a_record_says_so() -> None:
    view = RewriteView(lambda key: None)
    f = tflow.tflow()
    title, lines = view(b"{}", flow=f, http_message=f.request)
    assert title == "context-guru" and "no context-guru decision" in str(list(lines))


async def test_a_reloaded_script_leaves_one_view() -> None:
    """mitmproxy reloads a changed script without always running the old one's `done`."""
    first, second = ContextGuru(), ContextGuru()
    with taddons.context(first):
        pass
    with taddons.context(second):
        names = [v.name for v in contentviews.views]
        assert names.count("context-guru") == 1 and second.view in contentviews.views
        second.done()
