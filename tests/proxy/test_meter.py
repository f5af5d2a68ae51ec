"""cg.proxy.meter through the addon's hooks (mitmproxy's taddons): a streamed answer tapped and booked
without a byte changed, a JSON answer, error answers, malformed and missing usage counted, a cut
stream, a rewritten turn's estimate, /_cg/stats and /_cg/sessions, the cg.* commands, prices
from the config, and the summarizer's own usage."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import warnings
from pathlib import Path
from typing import Any

import httpx
import pytest
from mitmproxy import exceptions, http

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from mitmproxy.test import taddons

from cg import components as components_mod
from cg.billing.cache import prompt_of
from cg.billing.tap import UsageTap
from cg.proxy.addon import META, ContextGuru
from cg.summarize.client import HttpPool, Origin, SummarizerClient
from cg.summarize.component import Commission
from cg.summarize.config import ModelConfig
from cg.wire.body import index_body
from cg.wire.dialects import ANTHROPIC
from cg.wire.usage import Usage
from tests.proxy.test_addon import Toy, make_flow

SSE_HEADERS = {"content-type": "text/event-stream; charset=utf-8"}
ANTHROPIC_SSE = (
    b"event: message_start\n"
    b'data: {"type":"message_start","message":{"id":"m1","type":"message","role":"assistant",'
    b'"model":"claude-sonnet-5-5","content":[],"stop_reason":null,"stop_sequence":null,'
    b'"usage":{"input_tokens":11,"cache_creation_input_tokens":2000,'
    b'"cache_read_input_tokens":30000,"output_tokens":1}}}\n\n'
    b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
    b'"content_block":{"type":"text","text":""}}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":"Hi, \\"usage\\" here."}}\n\n'
    b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn",'
    b'"stop_sequence":null},"usage":{"output_tokens":25}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)
STREAMED = Usage(11, 2000, 0, 30000, 25, 1)


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))


def configure(tctx: taddons.context, cg: ContextGuru, tmp_path: Path, **opts: Any) -> None:
    tctx.configure(cg, cg_preset="off", cg_db=str(tmp_path / "cg.sqlite3"), **opts)


def stream_through(cg: ContextGuru, f: http.HTTPFlow, body: bytes, size: int = 50) -> bytes:
    """Run an SSE answer through the hooks as mitmproxy does; what the client received."""
    f.response = http.Response.make(200, b"", SSE_HEADERS)
    cg.responseheaders(f)
    tap = f.response.stream
    assert isinstance(tap, UsageTap)
    out = [tap(body[i : i + size]) for i in range(0, len(body), size)]
    assert tap(b"") == b""
    return b"".join(out)


async def test_a_streamed_answer_is_tapped_unchanged_and_booked(tmp_path: Path) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        configure(tctx, cg, tmp_path)
        f = make_flow(headers={"x-context-guru-session": "sess-1"})
        cg.request(f)
        assert stream_through(cg, f, ANTHROPIC_SSE) == ANTHROPIC_SSE
        await cg.response(f)
        assert f.metadata[META]["ledger"] == {
            "session": "sess-1",
            "rounds": 1,
            "usage": STREAMED.to_json(),
        }
        stats = cg.stats_json()
        assert stats["usage"]["agent"] == STREAMED.to_json()
        assert stats["usage"]["summarizer"]["requests"] == 0
        assert stats["usage_reads"]["read"] == 1 and stats["usage_reads"]["missing"] == 0
        # Not rewritten: what it would have cost unrewritten is what it cost.
        assert stats["savings"]["without_rewrite_usd"] == stats["savings"]["billed_usd"] > 0
        (row,) = cg.sessions_json()["sessions"]
        assert row["id"] == "sess-1" and row["usage"]["agent"]["output_tokens"] == 25
        assert cg.meter.turns == {}  # nothing kept past the flow


async def test_a_json_answer_is_booked_from_its_body(tmp_path: Path) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        configure(tctx, cg, tmp_path)
        f = make_flow(
            path="/v1/chat/completions",
            content=json.dumps(
                {"model": "gpt-6.2-sol", "messages": [{"role": "user", "content": "hi"}]}
            ).encode(),
        )
        cg.request(f)
        answer = {
            "id": "c",
            "object": "chat.completion",
            "model": "gpt-6.2-sol",
            "choices": [],
            "usage": {
                "prompt_tokens": 100,
                "completion_tokens": 5,
                "prompt_tokens_details": {"cached_tokens": 60},
            },
        }
        f.response = http.Response.make(
            200, json.dumps(answer), {"content-type": "application/json"}
        )
        cg.responseheaders(f)
        assert not f.response.stream
        await cg.response(f)
        agent = cg.stats_json()["usage"]["agent"]
        assert (agent["input_tokens"], agent["cache_read_tokens"], agent["output_tokens"]) == (
            40,
            60,
            5,
        )
        assert cg.store is not None
        assert {r.model for r in cg.store.usage_rows()} == {"gpt-6.2-sol"}


@pytest.mark.parametrize(
    ("status", "content", "counter"),
    [
        (529, b'{"type":"error","error":{"type":"overloaded_error"}}', None),
        (200, b'{"type":"message","usage":{"input_tokens":"many"}}', "malformed"),
        (200, b'{"type":"message","usage":null}', "missing"),
        (200, b"not json at all", "malformed"),
    ],
    ids=["error-answer", "wrong-shape", "no-usage", "not-json"],
)
async def test_no_usage_is_counted_never_booked_and_the_answer_is_untouched(
    tmp_path: Path, status: int, content: bytes, counter: str | None
) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        configure(tctx, cg, tmp_path)
        f = make_flow()
        cg.request(f)
        f.response = http.Response.make(status, content, {"content-type": "application/json"})
        await cg.response(f)
        assert f.response.content == content
        reads = cg.stats_json()["usage_reads"]
        counts = {k: v for k, v in reads.items() if v}
        assert counts == ({counter: 1} if counter else {})
        assert cg.stats_json()["usage"]["agent"]["requests"] == 0


async def test_an_openai_stream_without_include_usage_counts_missing(tmp_path: Path) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        configure(tctx, cg, tmp_path)
        f = make_flow(
            path="/v1/chat/completions",
            content=json.dumps(
                {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            ).encode(),
        )
        cg.request(f)
        body = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\ndata: [DONE]\n\n'
        assert stream_through(cg, f, body) == body
        # The request was not changed to ask for usage.
        assert b"include_usage" not in (f.request.content or b"")
        await cg.response(f)
        assert cg.stats.usage_reads.missing == 1 and cg.stats.usage_reads.read == 0


async def test_a_cut_stream_books_what_it_reported_and_counts_it(tmp_path: Path) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        configure(tctx, cg, tmp_path)
        f = make_flow(headers={"x-context-guru-session": "cut"})
        cg.request(f)
        cut = ANTHROPIC_SSE.index(b"event: message_delta") + 30
        stream_through(cg, f, ANTHROPIC_SSE[:cut])
        cg.error(f)
        assert cg.stats.usage_reads.truncated == 1
        agent = cg.stats_json()["usage"]["agent"]
        assert (agent["input_tokens"], agent["output_tokens"]) == (11, 1)  # message_start's


async def test_non_2xx_streams_are_not_tapped(tmp_path: Path) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        configure(tctx, cg, tmp_path)
        f = make_flow()
        cg.request(f)
        f.response = http.Response.make(500, b"", SSE_HEADERS)
        cg.responseheaders(f)
        assert f.response.stream is True


async def test_a_rewritten_turn_books_its_estimate_and_tokens_not_sent(
    tmp_path: Path, toy_config: str
) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        configure(tctx, cg, tmp_path, cg_config=toy_config)
        long = [
            {"role": r, "content": f"{r} says " + "lorem ipsum " * 300}
            for r in ("user", "assistant") * 3
        ]
        content = json.dumps({"model": "claude-sonnet-5-5", "max_tokens": 9, "messages": long})
        f = make_flow(content=content.encode(), headers={"x-context-guru-session": "rw"})
        cg.request(f)
        assert f.metadata[META]["outcome"] == "rewritten"
        answer = {
            "type": "message",
            "model": "claude-sonnet-5-5",
            "usage": {"input_tokens": 40, "output_tokens": 3},
        }
        f.response = http.Response.make(
            200, json.dumps(answer), {"content-type": "application/json"}
        )
        await cg.response(f)
        s = cg.stats_json()["savings"]
        assert s["rewritten_turns"] == 1 and s["tokens_not_sent"] > 0
        # What was sent is counted from the rewrite's shape, never indexed again, and is
        # what indexing the bytes sent counts.
        ledger = cg.meter.ledger
        assert ledger is not None and not ledger._sent._lists
        original = prompt_of(index_body(content.encode(), ANTHROPIC), ledger.facts).tokens
        assert s["tokens_not_sent"] == original - ledger._tokens("anthropic", f.request.content)
        assert s["without_rewrite_usd"] > s["billed_agent_usd"] > 0
        assert s["saved_usd"] == pytest.approx(s["without_rewrite_usd"] - s["billed_usd"])


async def test_the_commands_and_endpoints_answer_the_same(tmp_path: Path) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        configure(tctx, cg, tmp_path)
        f = make_flow(headers={"x-context-guru-session": "cmd"})
        cg.request(f)
        stream_through(cg, f, ANTHROPIC_SSE)
        await cg.response(f)
        stats = json.loads(tctx.master.commands.execute("cg.stats"))
        assert stats["usage"]["agent"] == STREAMED.to_json()
        sessions = json.loads(tctx.master.commands.execute("cg.sessions"))
        assert [s["id"] for s in sessions["sessions"]] == ["cmd"]
        for path in ("/_cg/stats", "/_cg/sessions"):
            g = make_flow(path=path, method="GET", content=b"")
            pending = cg.request(g)
            assert pending is not None  # read off the loop: answered once awaited
            await pending
            assert g.response is not None and g.response.status_code == 200
        assert g.response is not None
        assert json.loads(g.response.content or b"") == sessions


async def test_config_prices_override_and_a_bad_price_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "cg.yaml"
    cfg.write_text(
        "prices:\n  claude-sonnet-5-5: {input: 0, cache_write_5m: 0, cache_write_1h: 0, "
        "cache_read: 0, output: 1000000}\n"
    )
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        configure(tctx, cg, tmp_path, cg_config=str(cfg))
        f = make_flow()
        cg.request(f)
        stream_through(cg, f, ANTHROPIC_SSE)
        await cg.response(f)
        assert cg.stats_json()["savings"]["billed_usd"] == pytest.approx(25.0)  # 25 out × $1
        cfg.write_text("prices:\n  claude-x: {input: -1}\n")
        with pytest.raises(exceptions.OptionsError, match=r"prices\.claude-x"):
            tctx.configure(cg, cg_config=str(cfg), cg_preset="summarize")


async def test_the_summarizer_answer_usage_is_booked_as_summarizer(tmp_path: Path) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        configure(tctx, cg, tmp_path)
        answer = {
            "type": "message",
            "model": "claude-haiku-5-5",
            "content": [{"type": "text", "text": "<summary>s</summary>"}],
            "usage": {"input_tokens": 900, "cache_read_input_tokens": 9000, "output_tokens": 80},
        }
        pool = HttpPool()
        pool._client = httpx.AsyncClient(
            transport=httpx.MockTransport(lambda req: httpx.Response(200, json=answer))
        )
        client = SummarizerClient(
            ModelConfig(source="incoming"), pool, on_usage=cg.meter.summarizer
        )
        job = Commission(
            "sum-1",
            "anthropic",
            "claude-haiku-5-5",
            1,
            4,
            "0" * 32,
            [],
            [],
            [],
            None,
            origin=Origin("http://127.0.0.1:9/v1/messages", {}),
        )
        assert await client("prompt", job) == "<summary>s</summary>"
        await pool.aclose()
        usage = cg.stats_json()["usage"]
        assert usage["summarizer"] == Usage(900, 0, 0, 9000, 80, 1).to_json()
        assert usage["agent"]["requests"] == 0
        assert cg.stats.usage_reads.summarizer_read == 1


@pytest.fixture
def toy_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(components_mod.COMPONENTS, "toy", lambda raw, services: Toy(dict(raw)))
    path = tmp_path / "toy.yaml"
    path.write_text("pipeline: [toy]\n", encoding="utf-8")
    return str(path)


async def test_an_answer_mitmproxy_streamed_itself_counts_missing_not_malformed(
    tmp_path: Path,
) -> None:
    """`stream_large_bodies` streams a big JSON answer without the tap: there is no body to read
    afterwards, which is not a malformed usage."""
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        configure(tctx, cg, tmp_path)
        f = make_flow()
        cg.request(f)
        f.response = http.Response.make(200, b"", {"content-type": "application/json"})
        f.response.stream = True
        await cg.response(f)
        assert (cg.stats.usage_reads.missing, cg.stats.usage_reads.malformed) == (1, 0)


# -- the ledger's bookings, committed together (cg_store_batch_ms) ----------------------------

ANSWER = json.dumps(
    {
        "id": "m",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-5-5",
        "content": [],
        "usage": {"input_tokens": 3, "output_tokens": 4},
    }
)


def _booked(db: Path) -> list[tuple[str, int]]:
    """The ledger's turn counters as another process reads the file now."""
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT session, turns FROM ledger ORDER BY session").fetchall()
    finally:
        conn.close()


async def _answer(cg: ContextGuru, session: str) -> None:
    f = make_flow(headers={"x-context-guru-session": session})
    cg.request(f)
    f.response = http.Response.make(200, ANSWER, {"content-type": "application/json"})
    cg.responseheaders(f)
    await cg.response(f)
    assert f.metadata[META]["ledger"]["session"] == session


async def test_bookings_are_committed_by_the_timer_within_the_delay(tmp_path: Path) -> None:
    cg = ContextGuru()
    fired = asyncio.Event()
    flush = cg.meter.flush

    def flushed() -> None:  # the timer's callback, observed (armed with `self.flush`)
        flush()
        fired.set()

    cg.meter.flush = flushed  # type: ignore[method-assign]
    with taddons.context(cg) as tctx:
        configure(tctx, cg, tmp_path, cg_store_batch_ms=300)
        await _answer(cg, "held-1")
        await _answer(cg, "held-2")
        assert _booked(tmp_path / "cg.sqlite3") == []  # held, not yet in the file
        assert cg.meter.armed() and not fired.is_set()
        await asyncio.wait_for(fired.wait(), 10.0)
        assert _booked(tmp_path / "cg.sqlite3") == [("held-1", 1), ("held-2", 1)]
        assert not cg.meter.armed()
        assert cg.stats.usage_reads.store_errors == 0


async def test_stats_and_exit_commit_what_is_held(tmp_path: Path) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        configure(tctx, cg, tmp_path, cg_store_batch_ms=60_000)
        await _answer(cg, "a")
        assert _booked(tmp_path / "cg.sqlite3") == []
        assert cg.stats_json()["usage"]["agent"]["output_tokens"] == 4  # a read commits
        assert _booked(tmp_path / "cg.sqlite3") == [("a", 1)]
        await _answer(cg, "b")
        assert _booked(tmp_path / "cg.sqlite3") == [("a", 1)]
        cg.done()
        assert _booked(tmp_path / "cg.sqlite3") == [("a", 1), ("b", 1)]


async def test_a_zero_delay_commits_every_answer_as_it_is_booked(tmp_path: Path) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        configure(tctx, cg, tmp_path, cg_store_batch_ms=0)
        await _answer(cg, "now")
        assert _booked(tmp_path / "cg.sqlite3") == [("now", 1)]
        assert not cg.meter.armed()


@pytest.mark.parametrize("bad", [-1, 60_001])
async def test_a_batch_delay_out_of_range_names_the_option(tmp_path: Path, bad: int) -> None:
    cg = ContextGuru()
    with (
        taddons.context(cg) as tctx,
        pytest.raises(exceptions.OptionsError, match="cg_store_batch_ms"),
    ):
        configure(tctx, cg, tmp_path, cg_store_batch_ms=bad)


async def test_a_refused_commit_is_counted_and_tried_again(tmp_path: Path) -> None:
    """Another writer holds the file when the timer fires: the commit fails, is counted, and
    the bookings stay held for the next try, which finds the file free."""
    cg = ContextGuru()
    db = tmp_path / "cg.sqlite3"
    with taddons.context(cg) as tctx:
        configure(tctx, cg, tmp_path, cg_store_batch_ms=60_000)
        await _answer(cg, "kept")
        blocker = sqlite3.connect(db, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            cg.meter.flush()  # what the timer calls
            assert cg.stats.usage_reads.store_errors == 1
            assert cg.meter.armed()  # tried again later
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        cg.meter.flush()
        assert _booked(db) == [("kept", 1)]
        assert cg.stats.usage_reads.store_errors == 1
        cg.meter.close()
        assert not cg.meter.armed()
