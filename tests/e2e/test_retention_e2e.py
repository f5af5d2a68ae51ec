"""A summarized session through a real mitmdump: every rewritten turn's decision record carries its
retention once its answer is done — a 200, an overloaded 529, a stream the provider cut — the
flow file mitmdump saved holds it with the view's, and `/_cg/stats` aggregates exactly those
turns. The facts counted are the client's request's, found here from the bytes the test sent."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import httpx
import pytest
from mitmproxy import http
from mitmproxy import io as mio

from cg.retention.measure import request_facts
from cg.wire.body import index_body
from cg.wire.dialects import DIALECTS
from tests.e2e.harness import Proxy, low, new_id, start_summarize
from tests.e2e.web import SUMMARY, transcript
from tests.support.fakeprovider import FakeProvider, Reply

pytestmark = pytest.mark.e2e

SESSION = "retention-e2e"
HEADERS = {
    "x-api-key": "sk-ant-RETENTION-E2E-0001",
    "anthropic-version": "2023-06-01",
    "x-context-guru-session": SESSION,
    "content-type": "application/json",
}


def body(steps: int, stream: bool = False) -> bytes:
    doc = {
        "model": "claude-test",
        "max_tokens": 64,
        "system": "You are a careful engineer.",
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
        "messages": transcript(steps),
        **({"stream": True} if stream else {}),
    }
    return json.dumps(doc).encode()


def facts_of(raw: bytes) -> int:
    return len(request_facts(index_body(raw, DIALECTS["anthropic"])))


def send(c: httpx.Client, raw: bytes) -> tuple[str, httpx.Response]:
    eid = new_id()
    return eid, c.post("/v1/messages", content=raw, headers={**HEADERS, "x-e2e-id": eid})


def test_every_rewritten_turn_records_its_retention(
    provider: FakeProvider, tmp_path: Path, proxies: Any
) -> None:
    flows = tmp_path / "flows.mitm"
    summarize = low(min_messages=6, resummarize_tokens=3000, model={"share_cache": "never"})
    proxy: Proxy = proxies(
        start_summarize(
            provider.url,
            tmp_path,
            summarize,
            # Without the tool no relay: a cut stream is the flow's own error.
            options=[f"save_stream_file={flows}", "cg_expand_inject=never"],
        )
    )
    provider.script_summarizer(Reply(text=f"<summary>{SUMMARY}</summary>"))
    sent: dict[str, bytes] = {}
    with httpx.Client(base_url=proxy.url, trust_env=False, timeout=30) as c:
        for steps in range(2, 6):
            raw = body(steps)
            eid, r = send(c, raw)
            assert r.status_code == 200, r.text
            sent[eid] = raw
            if any("commission" in comp for comp in proxy.records.cg(eid).get("components", ())):
                proxy.wait_stats(lambda s: s["summaries"]["completed"] >= 1, 30)
        provider.script(Reply(status=529, body=b'{"type":"error","error":{"type":"overloaded"}}'))
        eid, r = send(c, body(6))
        assert r.status_code == 529
        sent[overloaded := eid] = body(6)
        cut = Reply(reset_after=4)  # message_start, block start, ping, one delta: then RST
        provider.script(cut)
        raw = body(7, stream=True)
        eid = new_id()
        with (
            pytest.raises(httpx.TransportError),
            c.stream(
                "POST", "/v1/messages", content=raw, headers={**HEADERS, "x-e2e-id": eid}
            ) as s,
        ):
            for _ in s.iter_bytes():
                pass
        assert cut.answered.wait(10)
        sent[cut_id := eid] = raw

    lines = {eid: proxy.records.wait(eid) for eid in sent}
    assert lines[cut_id]["phase"] == "error" and lines[overloaded]["status"] == 529
    rewritten = {eid: x["cg"] for eid, x in lines.items() if x["cg"]["outcome"] == "rewritten"}
    assert overloaded in rewritten and cut_id in rewritten and len(rewritten) >= 4, lines
    for eid, line in lines.items():
        rec = line["cg"]
        if eid not in rewritten:
            assert "retention" not in rec, rec
            continue
        got = rec["retention"]
        assert got["facts"] == facts_of(sent[eid]) > 0, (got, rec["reason"])
        assert 0 < got["visible"] <= got["facts"], got  # the head and the tail kept theirs
        assert len(got["lost"]) == min(5, got["facts"] - got["visible"]), got
        assert got["ratio"] == round(got["visible"] / got["facts"], 4)

    ratios = [r["retention"]["ratio"] for r in rewritten.values()]
    stats = proxy.stats()["retention"]
    assert stats["turns"] == len(ratios) and stats["failed"] == 0
    assert stats["mean"] == pytest.approx(statistics.mean(ratios), abs=1e-3)
    assert stats["min"] == pytest.approx(min(ratios), abs=1e-4)

    proxy.stop()  # the flow file complete
    with flows.open("rb") as fh:
        saved = {
            f.request.headers.get("x-e2e-id"): f
            for f in mio.FlowReader(fh).stream()
            if isinstance(f, http.HTTPFlow)
        }
    for eid, rec in rewritten.items():
        f = saved[eid]
        assert f.metadata["context_guru"]["retention"] == rec["retention"]
        view = f.metadata["context_guru_view"]["retention"]
        assert view["ratio"] == rec["retention"]["ratio"] and "lost" not in view
        assert f.comment.endswith(" facts retained"), f.comment
        assert HEADERS["x-api-key"] not in json.dumps(f.metadata)
