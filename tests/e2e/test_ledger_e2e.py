"""The usage ledger through a real `mitmdump -s cg_addon.py`: the tap changes no byte and holds
nothing back, both SDKs' usage lands in the ledger per session (agent and summarizer apart),
the ledger survives a restart on the same SQLite file, and `/_cg/stats`, `/_cg/sessions` and the
CLI report it.

The fake provider's `Reply(usage=…)` makes every answer's usage known in advance, so each
assertion is an exact sum of what the provider reported.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cg.cli import main as cli
from tests.e2e.harness import Proxy, by_id, low, new_id, received, start_summarize
from tests.e2e.sdk_sessions import SdkClient
from tests.support.fakeprovider import FakeProvider, Reply

pytestmark = pytest.mark.e2e

KEY = "sk-ledger-e2e-0001"
A_USAGE = {
    "input_tokens": 21,
    "cache_creation_input_tokens": 1200,
    "cache_read_input_tokens": 48000,
    "output_tokens": 77,
}
O_USAGE = {
    "prompt_tokens": 5000,
    "completion_tokens": 40,
    "total_tokens": 5040,
    "prompt_tokens_details": {"cached_tokens": 4096},
}
ZERO = {
    "input_tokens": 0,
    "cache_write_tokens": 0,
    "cache_read_tokens": 0,
    "output_tokens": 0,
    "requests": 0,
}


def neutral(dialect: str, usage: dict[str, Any], n: int = 1) -> dict[str, int]:
    """A provider usage object in the ledger's five keys, n times over."""
    if dialect == "anthropic":
        one = {
            "input_tokens": usage["input_tokens"],
            "cache_write_tokens": usage.get("cache_creation_input_tokens", 0),
            "cache_read_tokens": usage.get("cache_read_input_tokens", 0),
            "output_tokens": usage["output_tokens"],
        }
    else:
        cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
        one = {
            "input_tokens": usage["prompt_tokens"] - cached,
            "cache_write_tokens": 0,
            "cache_read_tokens": cached,
            "output_tokens": usage["completion_tokens"],
        }
    return {**{k: v * n for k, v in one.items()}, "requests": n}


def sessions(proxy: Proxy) -> dict[str, Any]:
    return proxy.sessions()


@pytest.fixture(scope="module")
def lproxy(provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    """The `off` preset on its own SQLite file: a pure pass-through that still meters."""
    work = tmp_path_factory.mktemp("proxy-ledger")
    with Proxy.start(
        provider.url, work, preset="off", options=[f"cg_db={work / 'cg.sqlite3'}"]
    ) as p:
        yield p


MSGS: list[Any] = [{"role": "user", "content": "Say hello. Ünïcödé ✓"}]


# -- the tap: no byte changed, nothing held back ----------------------------------------------------


def test_a_tapped_stream_reaches_the_client_before_the_provider_finishes(lproxy, provider):
    """The provider holds its answer after the first text delta until the client has it."""
    gate = threading.Event()
    reply = Reply(gate=gate, usage=A_USAGE)
    provider.script(reply)
    session = uuid.uuid4().hex
    eid = new_id()
    with (
        SdkClient(lproxy, "anthropic", key=KEY, session=session) as client,
        client.sdk.messages.stream(
            model="claude-sonnet-5-5", max_tokens=50, messages=MSGS, extra_headers={"x-e2e-id": eid}
        ) as s,
    ):
        for _ in s.text_stream:
            gate.set()
        final = s.get_final_message()
    assert gate.is_set() and not reply.gate_timed_out, "the proxy held the stream back"
    assert final.usage.output_tokens == A_USAGE["output_tokens"]
    cg = lproxy.records.cg(eid)
    assert cg["outcome"] == "passed_through"
    assert cg["ledger"] == {"session": session, "rounds": 1, "usage": neutral("anthropic", A_USAGE)}
    assert sessions(lproxy)[session]["usage"]["agent"] == neutral("anthropic", A_USAGE)


def test_the_tap_changes_no_byte_of_a_stream(lproxy, provider):
    """Frames written as the provider wrote them — CRLF endings, an event split across network
    chunks, a character split mid-UTF-8, "usage" inside the text — arrive byte for byte."""
    usage = {"input_tokens": 9, "cache_read_input_tokens": 100, "output_tokens": 3}
    start = {"type": "message_start", "message": {
        "id": "msg_x", "type": "message", "role": "assistant", "model": "claude-haiku-5-5",
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {**usage, "output_tokens": 1}}}  # fmt: skip
    text = 'the "usage": {"output_tokens": 999} is just text ☃'
    stream = (
        f"event: message_start\r\ndata: {json.dumps(start)}\r\n\r\n"
        'event: content_block_start\r\ndata: {"type":"content_block_start","index":0,'
        '"content_block":{"type":"text","text":""}}\r\n\r\n'
        "event: content_block_delta\r\ndata: "
        + json.dumps({"type": "content_block_delta", "index": 0,
                      "delta": {"type": "text_delta", "text": text}}, ensure_ascii=False)
        + "\r\n\r\n"
        'event: content_block_stop\r\ndata: {"type":"content_block_stop","index":0}\r\n\r\n'
        'event: message_delta\r\ndata: {"type":"message_delta","delta":{"stop_reason":'
        '"end_turn","stop_sequence":null},"usage":{"output_tokens":3}}\r\n\r\n'
        'event: message_stop\r\ndata: {"type":"message_stop"}\r\n\r\n'
    ).encode()  # fmt: skip
    snow = stream.index("☃".encode())
    cuts = [0, 17, stream.index(b"usage"), snow + 1, snow + 2, stream.index(b"message_delta")]
    frames = [stream[a:b] for a, b in zip(cuts, [*cuts[1:], len(stream)], strict=True)]
    provider.script(Reply(frames=frames))
    session, eid = uuid.uuid4().hex, new_id()
    body = json.dumps({"model": "claude-haiku-5-5", "max_tokens": 9, "stream": True,
                       "messages": MSGS}).encode()  # fmt: skip
    headers = {"x-e2e-id": eid, "x-context-guru-session": session}
    with lproxy.client() as c, c.stream("POST", "/v1/messages", content=body, headers=headers) as r:
        got = b"".join(r.iter_raw())
    assert got == stream
    assert received(provider, eid).body == body
    cg = lproxy.records.cg(eid)
    assert cg["ledger"]["usage"] == {"input_tokens": 9, "cache_write_tokens": 0,
                                     "cache_read_tokens": 100, "output_tokens": 3, "requests": 1}  # fmt: skip


# -- both SDKs, streamed and not --------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", ["anthropic", "openai"])
def test_each_sdks_usage_lands_in_its_sessions_ledger(lproxy, provider, dialect, stream):
    session = uuid.uuid4().hex
    usage = A_USAGE if dialect == "anthropic" else O_USAGE
    provider.script(Reply(usage=usage), Reply(usage=usage))
    for _ in range(2):
        with SdkClient(lproxy, dialect, key=KEY, session=session) as c:
            if dialect == "anthropic":
                t = c.call(stream, model="claude-sonnet-5-5", max_tokens=50, messages=MSGS)
                told = t.result["usage"]["output_tokens"]
            elif stream:
                opts = {"include_usage": True}
                t = c.call(stream, model="gpt-6.2-sol", messages=MSGS, stream_options=opts)
                told = next(ch["usage"] for ch in t.chunks if ch.get("usage"))["completion_tokens"]
            else:
                t = c.call(stream, model="gpt-6.2-sol", messages=MSGS)
                told = t.result["usage"]["completion_tokens"]
        assert told == neutral(dialect, usage)["output_tokens"]  # the client's own, untouched
    row = sessions(lproxy)[session]
    assert row["usage"] == {"agent": neutral(dialect, usage, 2), "summarizer": ZERO}
    s = row["savings"]
    assert (s["turns"], s["rewritten_turns"], s["unpriced_models"]) == (2, 0, [])
    assert s["billed_usd"] > 0 and s["without_rewrite_usd"] == s["billed_usd"]
    assert s["saved_usd"] == 0


def test_an_openai_stream_without_include_usage_is_counted_missing(lproxy, provider):
    before = lproxy.stats()["usage_reads"]["missing"]
    session = uuid.uuid4().hex
    with SdkClient(lproxy, "openai", key=KEY, session=session) as o:
        t = o.call(stream=True, model="gpt-6.2-sol", messages=MSGS)
    assert t.text
    assert "stream_options" not in received(provider, t.eid).json()  # never asked for it
    assert lproxy.stats()["usage_reads"]["missing"] == before + 1
    assert session not in sessions(lproxy)


# -- agent and summarizer apart; savings after a splice ------------------------------------------


LOW = low(resummarize_tokens=100_000)
S_USAGE = {"input_tokens": 3000, "cache_read_input_tokens": 0, "output_tokens": 150}


def transcript(n: int) -> list[Any]:
    out: list[Any] = [{"role": "user", "content": "Task: make the parser tests pass."}]
    for i in range(1, n):
        role = "assistant" if i % 2 else "user"
        out.append({"role": role, "content": f"Step {i}: " + "reading parser.py " * 80})
    return out


def test_agent_and_summarizer_are_booked_apart_and_a_splice_shows_savings(
    provider, tmp_path: Path, proxies, request
):
    proxy = proxies(start_summarize(provider.url, tmp_path, LOW))
    session = uuid.uuid4().hex
    client = SdkClient(proxy, "anthropic", key=KEY, session=session)
    request.addfinalizer(client.http.close)
    provider.script_summarizer(Reply(text="<summary>They fixed the parser.</summary>",
                                     usage=S_USAGE))  # fmt: skip
    provider.script(Reply(usage=A_USAGE), Reply(usage=A_USAGE))
    client.call(model="claude-sonnet-5-5", max_tokens=50, messages=transcript(7))
    proxy.wait_count({"completed": 0}, "completed")
    t2 = client.call(model="claude-sonnet-5-5", max_tokens=50, messages=transcript(9))
    assert proxy.records.cg(t2.eid)["outcome"] == "rewritten"
    assert len(provider.wait_for(1, where=by_id(t2.eid))) == 1

    row = sessions(proxy)[session]
    assert row["usage"]["agent"] == neutral("anthropic", A_USAGE, 2)
    assert row["usage"]["summarizer"] == neutral("anthropic", S_USAGE)
    assert row["checkpoint"]["covered_messages"] > 0 and row["checkpoint"]["summary_tokens"] > 0
    s = row["savings"]
    assert (s["turns"], s["rewritten_turns"], s["estimate_skipped_turns"]) == (2, 1, 0)
    assert s["tokens_not_sent"] > 0
    assert s["without_rewrite_usd"] > 0 and s["billed_summarizer_usd"] > 0
    assert s["saved_usd"] == pytest.approx(
        s["without_rewrite_usd"] - s["billed_agent_usd"] - s["billed_summarizer_usd"], abs=2e-6
    )
    stats = proxy.stats()
    assert stats["usage"]["summarizer"] == neutral("anthropic", S_USAGE)
    assert stats["usage_reads"]["summarizer_read"] == 1


# -- a restart, and the CLI ----------------------------------------------------------------------


def test_the_ledger_survives_a_restart_and_the_cli_reads_it(provider, tmp_path: Path, capsys):
    db = tmp_path / "cg.sqlite3"
    session = uuid.uuid4().hex
    with Proxy.start(
        provider.url, tmp_path / "one", preset="off", options=[f"cg_db={db}"]
    ) as first:
        provider.script(Reply(usage=A_USAGE))
        with SdkClient(first, "anthropic", key=KEY, session=session) as client:
            client.call(model="claude-sonnet-5-5", max_tokens=9, messages=MSGS)
        before = first.stats()["usage"]
        assert before["agent"]["requests"] >= 1

    with Proxy.start(
        provider.url, tmp_path / "two", preset="off", options=[f"cg_db={db}"]
    ) as second:
        again = second.stats()
        assert again["ledger"]["usage"] == before  # the whole ledger, under `ledger`
        assert again["usage"]["agent"] == ZERO  # since this process started: nothing yet
        assert sessions(second)[session]["usage"]["agent"] == neutral("anthropic", A_USAGE)
        assert cli(["stats", "--proxy", second.url, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["ledger"]["usage"] == before

    assert cli(["sessions", "--db", str(db), "--json"]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows[session]["usage"]["agent"] == neutral("anthropic", A_USAGE)
    assert cli(["stats", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "without rewrite (ESTIMATE)" in out and "saved (ESTIMATE)" in out
