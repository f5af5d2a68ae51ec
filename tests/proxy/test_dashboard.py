"""`GET /_cg/`: the savings dashboard, through the real addon — an empty store renders, a
summarized session's figures are the JSON endpoints' own, remote callers are refused, and
nothing from outside is rendered unescaped."""

from __future__ import annotations

import html
import re
from pathlib import Path

from mitmproxy import http
from mitmproxy.test import taddons, tflow, tutils

from cg.proxy.addon import ContextGuru
from cg.proxy.dashboard import CSP, render
from tests.proxy.pending import finish

LOCAL = ("127.0.0.1", 50000)


def get(cg: ContextGuru, path: str = "/_cg/", peer: tuple[str, int] = LOCAL) -> http.Response:
    req = tutils.treq(method=b"GET", path=path.encode(), host="proxy.test", content=b"")
    f = tflow.tflow(req=req)
    f.client_conn.peername = peer
    finish(cg.request(f))
    assert f.response is not None
    return f.response


def figures(page: str) -> dict[str, str]:
    return dict(re.findall(r'data-figure="([^"]+)" data-value="([^"]*)"', page))


async def test_an_empty_store_renders(tmp_path: Path) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        tctx.configure(cg, cg_preset="summarize", cg_db=str(tmp_path / "cg.sqlite3"))
        resp = get(cg)
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/html")
        assert resp.headers["content-security-policy"] == CSP
        page = (resp.content or b"").decode()
        assert "No sessions yet" in page and "<svg" not in page
        assert figures(page)["requests"] == "0"
        assert "ESTIMATE" in page
        assert "<script" not in page and "http://" not in page and "https://" not in page
        cg.done()


async def test_a_remote_caller_is_refused(tmp_path: Path) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        tctx.configure(cg, cg_preset="summarize", cg_db=str(tmp_path / "cg.sqlite3"))
        assert get(cg, peer=("203.0.113.7", 5)).status_code == 403
        cg.done()


def test_figures_and_chart_come_from_the_json() -> None:
    stats = {
        "requests": 14,
        "rewritten": 6,
        "failed_open": 0,
        "retried_original": 0,
        "summaries": {"completed": 1},
        "retention": {
            "turns": 3,
            "mean": 0.6111,
            "min": 0.5,
            "by_kind": {"user": 1.0, "file": None, "command": 0.25, "error": None},
            "failed": 0,
        },
        "savings": {
            "tokens_not_sent": 1234,
            "billed_usd": 0.5,
            "billed_summarizer_usd": 0.01,
            "without_rewrite_usd": 0.9,
            "saved_usd": 0.4,
            "note": "n",
        },
    }
    sid = '<script>alert("x")</script>'
    sessions = [
        {
            "id": sid,
            "last_seen": 0.0,
            "checkpoint": {"covered_messages": 30, "summary_tokens": 99},
            "savings": {"turns": 14, "rewritten_turns": 6, "saved_usd": 0.4},
        }
    ]
    history = {
        sid: [
            {"billed_usd": 0.1, "without_rewrite_usd": 0.1, "rewritten": False},
            {"billed_usd": 0.05, "without_rewrite_usd": 0.2, "rewritten": True},
        ]
    }
    page = render(stats, sessions, history, now=10.0)
    f = figures(page)
    assert f["saved_usd"] == "0.4" and f["tokens_not_sent"] == "1234" and f["requests"] == "14"
    assert f["session:saved_usd"] == "0.4"
    assert "<script>" not in page and html.escape(sid) in page  # escaped, never run
    assert page.count("<polyline") == 2 and 'data-series="without"' in page
    assert "30 messages → 99 tokens" in page
    assert f["retention.turns"] == "3" and f["retention.mean"] == "0.6111"
    assert f["retention.min"] == "0.5" and f["retention.by_kind.command"] == "0.25"
    assert f["retention.by_kind.file"] == ""  # no file fact in any turn: null, shown as none
    table = page[page.index('<table id="retention">') :]
    assert "61.1%" in table and "25.0%" in table and "none" in table


def test_no_turn_measured_yet_reads_none() -> None:
    f = figures(render({"retention": {"turns": 0, "mean": None, "min": None}}, [], {}, now=1.0))
    assert f["retention.turns"] == "0" and f["retention.mean"] == "" and f["retention.min"] == ""
