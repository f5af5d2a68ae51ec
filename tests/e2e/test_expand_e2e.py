"""Expand (docs/behaviour.md#expand) through a real `mitmdump -s cg_addon.py`, driven by the
official SDKs.

One proxy runs the `summarize` preset with lowered triggers and its own `cg_db`. Each test primes
its own session: turn 1 commissions a summary (forwarded untouched), the summary completes in the
background, and turn 2 is spliced — `[head, summary with <<cg:KEY>>, tail]` — and, when the
request declares tools, gets `context_guru_expand` appended.

The "model" is the fake provider's responder: it reads each request it receives the way a model
would — the id comes from the marker in the spliced summary, a call is made only when the request
declares the tool — and answers in the form asked for (JSON, or SSE when `"stream": true`).
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from cg.expand.tool import TOOL_JSON, TOOL_NAME
from tests.e2e.harness import (
    Proxy,
    assert_forwarded_unchanged,
    by_id,
    low,
    message_sources,
    new_id,
    received,
    start_summarize,
)
from tests.e2e.sdk_sessions import (
    Exchange,
    SdkClient,
    answer,
    anthropic_messages,
    messages,
    provider_message,
)
from tests.support.fakeprovider import DEFAULT_TEXT, FakeProvider, Recorded, Reply

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from mitmproxy.test import taddons, tflow, tutils

pytestmark = pytest.mark.e2e

MARKER = re.compile(r"<<cg:([0-9a-f]{24})>>")
FINAL = "Final answer: the failing test was test_nested ✓"
ANTHROPIC_TOOLS = [
    {
        "name": "Bash",
        "description": "Run a shell command.",
        "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    }
]
OPENAI_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
    }
]
# The credential an `Agent` sends (the SDKs' own header for it, `SdkClient`'s default key): a
# raw request continuing an agent's session sends it too, since the session's state is that
# credential's (docs/behaviour.md#tenancy).
CREDENTIAL = {"anthropic": {"x-api-key": "sk-e2e"}, "openai": {"authorization": "Bearer sk-e2e"}}
# What turn 1 commissions: messages[HEAD:CUT] of its transcript are summarized and stashed.
SPAN = {"anthropic": (1, 4), "openai": (1, 5)}
FIRST_LEN = {"anthropic": 7, "openai": 8}


# -- the scripted model --------------------------------------------------------------------------


def tool_names(dialect: str, body: dict[str, Any]) -> list[str]:
    tools = body.get("tools") or []
    if dialect == "anthropic":
        return [t.get("name") for t in tools]
    return [t.get("function", {}).get("name") for t in tools]


def our_results(dialect: str, body: dict[str, Any]) -> list[str]:
    """The texts of the tool results answering our calls at the end of `messages`."""
    msgs = body["messages"]
    if dialect == "anthropic":
        last = msgs[-1]
        if last["role"] != "user" or not isinstance(last["content"], list):
            return []
        return [b["content"] for b in last["content"] if b.get("type") == "tool_result"]
    out = []
    for m in reversed(msgs):
        if m["role"] != "tool":
            break
        out.append(m["content"])
    return out[::-1]


@dataclass
class Model:
    """What the scripted model does. `expand`: call the tool when it is declared (with the
    marker's id, or `key` when set); `always`: call it on every request that declares it, even
    after an answer; `also`: a client tool called beside it."""

    dialect: str
    key: str | None = None
    always: bool = False
    also: bool = False
    calls: int = 0

    def __call__(self, rec: Recorded) -> Reply | None:
        body = rec.json()
        if TOOL_NAME not in tool_names(self.dialect, body):
            return None  # a request without our tool gets the provider's default answer
        done = our_results(self.dialect, body)
        if done and not self.always:
            return answer(
                rec, provider_message(self.dialect, 99, FINAL, [], (2000, 11)), self.dialect
            )
        m = MARKER.search(json.dumps(body["messages"], ensure_ascii=False))
        assert m is not None, "the tool was offered without a marker"
        self.calls += 1
        calls = [(f"toolu_x{self.calls}", TOOL_NAME, {"id": self.key or m.group(1)})]
        if self.also:
            own = "Bash" if self.dialect == "anthropic" else "bash"
            calls.append((f"toolu_own{self.calls}", own, {"cmd": "ls"}))
        text = f"Looking closer, round {self.calls}."
        return answer(
            rec, provider_message(self.dialect, self.calls, text, calls, (1000, 7)), self.dialect
        )


@pytest.fixture
def model(provider: FakeProvider) -> Iterator[Callable[..., Model]]:
    def install(dialect: str, **kw: Any) -> Model:
        m = Model(dialect, **kw)
        provider.responder = m
        return m

    yield install
    provider.responder = None


# -- the proxy and an agent ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def xproxy(provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    with start_summarize(provider.url, tmp_path_factory.mktemp("proxy-expand"), low()) as p:
        yield p


def db_of(proxy: Proxy) -> Path:
    return proxy.records.path.parent / "cg.sqlite3"


class Agent(SdkClient):
    """An agent whose turns carry a tool of its own (unless `tools=False`); `prime` runs turn 1."""

    def __init__(self, proxy: Proxy, provider: FakeProvider, dialect: str) -> None:
        super().__init__(proxy, dialect)
        self.provider = provider

    def send(self, n: int, *, stream: bool = False, tools: bool = True, **extra: Any) -> Exchange:
        """A turn of the session's first `n` messages."""
        if tools:
            extra["tools"] = ANTHROPIC_TOOLS if self.dialect == "anthropic" else OPENAI_TOOLS
        return self.turn(messages(self.dialect, self.session, n), stream=stream, **extra)

    def prime(self) -> Exchange:
        """Turn 1: commission a summary and wait until it is stored."""
        before = self.proxy.counts()
        t1 = self.send(FIRST_LEN[self.dialect])
        assert_forwarded_unchanged(t1.request, received(self.provider, t1.eid))
        self.proxy.wait_count(before, "completed")
        return t1


def stash_keys(proxy: Proxy, session: str) -> list[str]:
    with closing(sqlite3.connect(db_of(proxy))) as conn:
        rows = conn.execute("SELECT key FROM stashes WHERE session = ?", (session,)).fetchall()
    return [r[0] for r in rows]


def member(body: bytes, key: str) -> bytes | None:
    """The raw bytes of top-level member `key`'s value (an independent reader)."""
    s = body.decode("utf-8")
    dec = json.JSONDecoder()
    i = s.index("{") + 1
    while True:
        while s[i] in " \t\r\n,":
            i += 1
        if s[i] == "}":
            return None
        k, i = dec.raw_decode(s, i)
        while s[i] in " \t\r\n:":
            i += 1
        _, j = dec.raw_decode(s, i)
        if k == key:
            return s[i:j].encode()
        i = j


def client_calls(dialect: str, result: dict[str, Any]) -> list[str]:
    if dialect == "anthropic":
        return [b["name"] for b in result["content"] if b["type"] == "tool_use"]
    calls = result["choices"][0]["message"].get("tool_calls") or []
    return [c["function"]["name"] for c in calls]


def stop_reason(dialect: str, result: dict[str, Any]) -> str:
    if dialect == "anthropic":
        return str(result["stop_reason"])
    return str(result["choices"][0]["finish_reason"])


def usage(dialect: str, result: dict[str, Any]) -> tuple[int, int]:
    u = result["usage"]
    if dialect == "anthropic":
        return u["input_tokens"], u["output_tokens"]
    return u["prompt_tokens"], u["completion_tokens"]


DIALECT_STREAM = [
    pytest.param("anthropic", False, id="anthropic-json"),
    pytest.param("anthropic", True, id="anthropic-sse"),
    pytest.param("openai", False, id="openai-json"),
    pytest.param("openai", True, id="openai-sse"),
]


# -- the model expands ------------------------------------------------------------------------------


@pytest.mark.parametrize(("dialect", "stream"), DIALECT_STREAM)
def test_the_model_expands_and_the_client_gets_the_final_answer_only(
    xproxy, provider, model, dialect, stream
):
    m = model(dialect)
    with Agent(xproxy, provider, dialect) as agent:
        t1 = agent.prime()
        (key,) = stash_keys(xproxy, agent.session)
        n = FIRST_LEN[dialect] + 2
        t2 = agent.send(n, stream=stream)

    # The client: the final answer, no call to a tool it never declared; usage: the final
    # round's input side (the context as it now is) and the output of both rounds. A streamed
    # answer reached the client as it came up to our call: the first round's text, then the
    # final round's.
    assert t2.text == ("Looking closer, round 1." if stream else "") + FINAL
    assert client_calls(dialect, t2.result) == []
    assert stop_reason(dialect, t2.result) == ("end_turn" if dialect == "anthropic" else "stop")
    assert TOOL_NAME not in json.dumps(t2.result) + json.dumps(t2.chunks)
    assert usage(dialect, t2.result) == (2000, 7 + 11)
    if dialect == "openai" and stream:
        assert all(c["choices"] for c in t2.chunks[:-1]) and t2.chunks[-1]["usage"]

    # The provider: the rewritten request (tool injected, marker in it), then one continuation.
    first, cont = provider.wait_for(2, where=by_id(t2.eid))
    assert m.calls == 1
    fbody = first.json()
    assert tool_names(dialect, fbody)[-1] == TOOL_NAME
    assert MARKER.search(first.body.decode()).group(1) == key  # type: ignore[union-attr]
    fpre, fmsgs, fpost = message_sources(first.body)
    cpre, cmsgs, cpost = message_sources(cont.body)
    assert (cpre, cpost) == (fpre, fpost)  # model, system, tools (ours too), stream: as sent
    assert cmsgs[: len(fmsgs)] == fmsgs  # every earlier message byte for byte
    new = [json.loads(x) for x in cmsgs[len(fmsgs) :]]
    assert new[0]["role"] == "assistant"
    if dialect == "anthropic":
        assert [b["type"] for b in new[0]["content"]] == ["thinking", "text", "tool_use"]
        assert new[0]["content"][0]["signature"] == "c2ln"
        assert new[0]["content"][2]["input"] == {"id": key}
        assert len(new) == 2 and new[1]["role"] == "user"
    else:
        assert json.loads(new[0]["tool_calls"][0]["function"]["arguments"]) == {"id": key}
        assert [x["role"] for x in new[1:]] == ["tool"]
    (text,) = our_results(dialect, cont.json())
    # The stash's original bytes: turn 1's messages[HEAD:CUT] exactly as the client sent them.
    head, cut = SPAN[dialect]
    _, t1_msgs, _ = message_sources(t1.request.content)
    for src in t1_msgs[head:cut]:
        assert src.decode() in text
    assert text.startswith(f"The {cut - head} messages that the summary <<cg:{key}>> replaced")
    # The continuation carries the agent's own headers.
    for name in ("x-api-key", "authorization", "x-context-guru-session", "x-e2e-id"):
        assert cont.header(name) == first.header(name)
    assert cont.header("x-context-guru") is None

    cg = xproxy.records.cg(t2.eid)
    assert cg["outcome"] == "rewritten"
    assert cg["expand"]["injected"] is True
    assert cg["expand"]["rounds"] == 1
    # The ledger books both rounds in full, each once, whatever the client was told.
    assert cg["ledger"]["rounds"] == 2
    booked = cg["ledger"]["usage"]
    assert (booked["input_tokens"], booked["output_tokens"]) == (1000 + 2000, 7 + 11)


@pytest.mark.parametrize("dialect", ["anthropic", "openai"])
def test_a_call_spelling_our_tools_name_with_escapes_is_still_answered(xproxy, provider, dialect):
    """The response hook skips parsing an answer that cannot call our tool (its name is not
    in it); a JSON answer may spell the name with `\\u` escapes, and is still read."""
    m = Model(dialect)
    escaped = b"context\\u005fguru_expand"

    def respond(rec: Recorded) -> Reply | None:
        reply = m(rec)
        if reply is not None and reply.body is not None and TOOL_NAME.encode() in reply.body:
            reply.body = reply.body.replace(TOOL_NAME.encode(), escaped)
        return reply

    provider.responder = respond
    try:
        with Agent(xproxy, provider, dialect) as agent:
            agent.prime()
            t2 = agent.send(FIRST_LEN[dialect] + 2)
    finally:
        provider.responder = None
    first, _ = provider.wait_for(2, where=by_id(t2.eid))  # the call, then the continuation
    assert TOOL_NAME.encode() in first.body  # offered as always
    assert m.calls == 1  # vacuity guard: the model called the tool, in the escaped spelling
    assert t2.text == FINAL
    assert xproxy.records.cg(t2.eid)["expand"]["rounds"] == 1


@pytest.mark.parametrize(("dialect", "stream"), [DIALECT_STREAM[1], DIALECT_STREAM[2]])
def test_the_loop_stops_after_three_continuations(xproxy, provider, model, dialect, stream):
    m = model(dialect, always=True)
    with Agent(xproxy, provider, dialect) as agent:
        agent.prime()
        t2 = agent.send(FIRST_LEN[dialect] + 2, stream=stream)
    got = provider.wait_for(1, where=by_id(t2.eid))
    assert len(got) == 4, "the first request and exactly three continuations"
    assert m.calls == 4
    assert client_calls(dialect, t2.result) == []
    assert TOOL_NAME not in json.dumps(t2.result) + json.dumps(t2.chunks)
    # Streamed: the first round's text went out before its call began.
    assert t2.text == ("Looking closer, round 1." if stream else "") + "Looking closer, round 4."
    assert stop_reason(dialect, t2.result) == ("end_turn" if dialect == "anthropic" else "stop")
    assert usage(dialect, t2.result) == (1000, 4 * 7)
    cg = xproxy.records.cg(t2.eid)
    assert cg["expand"]["rounds"] == 3
    assert cg["ledger"]["rounds"] == 4
    assert cg["ledger"]["usage"]["input_tokens"] == 4 * 1000


@pytest.mark.parametrize("dialect", ["anthropic", "openai"])
def test_an_unknown_or_foreign_id_is_answered_no_longer_available(xproxy, provider, model, dialect):
    with Agent(xproxy, provider, "anthropic") as other:
        other.prime()
        (foreign,) = stash_keys(xproxy, other.session)
    for key in ("0" * 24, foreign):  # never stashed; stashed by another session
        model(dialect, key=key)
        with Agent(xproxy, provider, dialect) as agent:
            agent.prime()
            assert key not in stash_keys(xproxy, agent.session)
            t2 = agent.send(FIRST_LEN[dialect] + 2)
        _, cont = provider.wait_for(2, where=by_id(t2.eid))
        (text,) = our_results(dialect, cont.json())
        assert text.startswith(f"context_guru_expand: id '{key}' is no longer available")
        assert t2.text == FINAL


@pytest.mark.parametrize("dialect", ["anthropic", "openai"])
def test_mixed_calls_give_the_client_its_own_call_only(xproxy, provider, model, dialect):
    model(dialect, also=True)
    with Agent(xproxy, provider, dialect) as agent:
        agent.prime()
        t2 = agent.send(FIRST_LEN[dialect] + 2, stream=True)
    assert len(provider.wait_for(1, where=by_id(t2.eid))) == 1  # nothing re-sent
    own = "Bash" if dialect == "anthropic" else "bash"
    assert client_calls(dialect, t2.result) == [own]
    assert stop_reason(dialect, t2.result) == (
        "tool_use" if dialect == "anthropic" else "tool_calls"
    )
    assert TOOL_NAME not in json.dumps(t2.result) + json.dumps(t2.chunks)
    assert t2.text == "Looking closer, round 1."
    assert xproxy.records.cg(t2.eid)["expand"]["rounds"] == 0


# -- when the tool is not injected -------------------------------------------------------------------


def outside_messages(sent: httpx.Request, got: Recorded) -> None:
    """Every byte outside `messages` (so `tools`, `tool_choice`) reached the provider as sent."""
    spre, _, spost = message_sources(sent.content)
    gpre, _, gpost = message_sources(got.body)
    assert (gpre, gpost) == (spre, spost)


@pytest.mark.parametrize(
    ("dialect", "extra", "reason"),
    [
        ("anthropic", {"tools": False}, "the request declares no tools"),
        ("openai", {"tools": False}, "the request declares no tools"),
        ("anthropic", {"tool_choice": {"type": "any"}}, "tool_choice forces a choice"),
        (
            "anthropic",
            {"tool_choice": {"type": "tool", "name": "Bash"}},
            "tool_choice forces a choice",
        ),
        ("openai", {"tool_choice": "required"}, "tool_choice forces a choice"),
    ],
    ids=["anthropic-no-tools", "openai-no-tools", "any", "tool", "required"],
)
def test_no_injection_without_tools_or_under_a_forced_choice(
    xproxy, provider, model, dialect, extra, reason
):
    model(dialect)
    with Agent(xproxy, provider, dialect) as agent:
        agent.prime()
        t2 = agent.send(FIRST_LEN[dialect] + 2, **extra)
    got = received(provider, t2.eid)  # exactly one: nothing to continue
    assert MARKER.search(got.body.decode())  # the vacuity guard: spliced, with a marker
    outside_messages(t2.request, got)
    assert TOOL_NAME.encode() not in (member(got.body, "tools") or b"")
    cg = xproxy.records.cg(t2.eid)
    assert cg["outcome"] == "rewritten"
    assert cg["expand"] == {"injected": False, "reason": reason}
    assert t2.text == DEFAULT_TEXT


@pytest.mark.parametrize("dialect", ["anthropic", "openai"])
def test_no_injection_without_a_marker(xproxy, provider, model, dialect):
    model(dialect)
    with Agent(xproxy, provider, dialect) as agent:
        t = agent.send(3)  # too short to summarize: nothing spliced, no marker
    assert_forwarded_unchanged(t.request, received(provider, t.eid))
    cg = xproxy.records.cg(t.eid)
    assert cg["outcome"] == "passed_through"
    assert cg["expand"] == {"injected": False, "reason": "no resolvable marker"}


@pytest.mark.parametrize("dialect", ["anthropic", "openai"])
def test_the_injected_tool_bytes_are_identical_across_turns(xproxy, provider, dialect):
    with Agent(xproxy, provider, dialect) as agent:
        agent.prime()
        n = FIRST_LEN[dialect]
        t2 = agent.send(n + 2)
        t3 = agent.send(n + 4, stream=True)
    tools = []
    for t in (t2, t3):
        got = received(provider, t.eid)
        assert xproxy.records.cg(t.eid)["expand"]["injected"] is True
        raw = member(got.body, "tools")
        client = member(t.request.content, "tools")
        assert raw is not None and client is not None
        assert raw == client[:-1] + b"," + TOOL_JSON[dialect].encode() + b"]"
        tools.append(raw)
    assert tools[0] == tools[1]


# -- SSE still streams when the tool was not injected -------------------------------------------------


def test_sse_of_a_rewritten_flow_without_the_tool_still_streams(xproxy, provider):
    with Agent(xproxy, provider, "anthropic") as agent:
        agent.prime()
        msgs = anthropic_messages(agent.session, FIRST_LEN["anthropic"] + 2)
        session = agent.session
    body = json.dumps(
        {"model": "claude-test", "max_tokens": 64, "stream": True, "messages": msgs}
    ).encode()
    gate = threading.Event()
    reply = Reply(gate=gate)
    provider.script(reply)
    eid = new_id()
    headers = {
        "x-e2e-id": eid,
        "x-context-guru-session": session,
        "content-type": "application/json",
        **CREDENTIAL["anthropic"],
    }
    with (
        xproxy.client() as c,
        c.stream("POST", "/v1/messages", content=body, headers=headers) as r,
    ):
        for line in r.iter_lines():
            if "Hello" in line:  # the first text delta, while the provider holds the rest
                gate.set()
    assert gate.is_set(), "no text delta reached the client"
    assert not reply.gate_timed_out, "the proxy buffered an SSE answer it did not need to"
    cg = xproxy.records.cg(eid)
    assert cg["outcome"] == "rewritten"  # the vacuity guard: a rewritten flow, not a pass-through
    assert cg["expand"]["injected"] is False


# -- SSE streams when the tool was injected: held only from our call on ------------------------------


PATHS = {"anthropic": "/v1/messages", "openai": "/v1/chat/completions"}


def stream_turn(
    proxy: Proxy, dialect: str, session: str, n: int, on_line: Callable[[str], None]
) -> tuple[str, str]:
    """One streamed turn (tools declared) as raw SSE lines; (its e2e id, the whole text)."""
    body: dict[str, Any] = {
        "model": "claude-test" if dialect == "anthropic" else "gpt-test",
        "stream": True,
        "messages": messages(dialect, session, n),
        "tools": ANTHROPIC_TOOLS if dialect == "anthropic" else OPENAI_TOOLS,
    }
    if dialect == "anthropic":
        body["max_tokens"] = 64
    else:
        body["stream_options"] = {"include_usage": True}
    eid = new_id()
    headers = {"x-e2e-id": eid, "x-context-guru-session": session, **CREDENTIAL[dialect]}
    seen = []
    with (
        proxy.client() as c,
        c.stream("POST", PATHS[dialect], json=body, headers=headers) as r,
    ):
        assert r.status_code == 200
        for line in r.iter_lines():
            seen.append(line)
            on_line(line)
    return eid, "\n".join(seen)


@pytest.mark.parametrize("dialect", ["anthropic", "openai"])
def test_sse_of_an_injected_turn_streams(xproxy, provider, dialect):
    """The tool is offered, the model answers without it: every event reaches the client as
    it comes (the provider holds the rest of its answer until the client saw the first text
    delta)."""
    with Agent(xproxy, provider, dialect) as agent:
        agent.prime()
        session = agent.session
    gate = threading.Event()
    reply = Reply(gate=gate)
    provider.script(reply)

    def on_line(line: str) -> None:
        if "Hello" in line:  # the first text delta, while the provider holds the rest
            gate.set()

    eid, text = stream_turn(xproxy, dialect, session, FIRST_LEN[dialect] + 2, on_line)
    assert gate.is_set(), "no text delta reached the client"
    assert not reply.gate_timed_out, "the proxy buffered an answer it did not need to"
    cg = xproxy.records.cg(eid)
    assert cg["outcome"] == "rewritten"
    assert cg["expand"]["injected"] is True  # the vacuity guard: the tool was offered
    assert cg["expand"]["relayed"] is True
    assert TOOL_NAME.encode() in received(provider, eid).body
    assert TOOL_NAME not in text
    assert cg["ledger"]["rounds"] == 1
    # The relay hop carried no body (the job held it); the finished flow holds the request as it
    # went upstream again: the provider's URL, its headers without the relay's, the sent bytes.
    line = xproxy.records.wait(eid)
    assert line["url"] == provider.url + PATHS[dialect]
    assert not line["relay_header"]
    assert line["request_sha256"] == hashlib.sha256(received(provider, eid).body).hexdigest()


@pytest.mark.parametrize("status", [200, 429])
def test_a_relayed_answer_that_says_its_length_passes_framed_by_it(xproxy, provider, status):
    """A streamed turn offered the tool, answered not in SSE but with a JSON body of a known
    length (an error, or a provider that did not stream): it goes through the relay and
    reaches the agent byte for byte with its own content-length, not re-framed in chunks."""
    with Agent(xproxy, provider, "anthropic") as agent:
        agent.prime()
        session = agent.session
    sent = (
        b'{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}'
        if status != 200
        else json.dumps(provider_message("anthropic", 5, "Plain JSON.", [], (10, 2))).encode()
    )
    provider.script(Reply(status=status, body=sent, headers={"content-type": "application/json"}))
    body = {
        "model": "claude-test",
        "max_tokens": 64,
        "stream": True,
        "messages": messages("anthropic", session, FIRST_LEN["anthropic"] + 2),
        "tools": ANTHROPIC_TOOLS,
    }
    eid = new_id()
    with xproxy.client() as c:
        r = c.post(
            PATHS["anthropic"],
            json=body,
            headers={"x-e2e-id": eid, "x-context-guru-session": session, **CREDENTIAL["anthropic"]},
        )
    assert r.status_code == status and r.content == sent
    assert r.headers.get("content-length") == str(len(sent))
    assert "transfer-encoding" not in r.headers
    cg = xproxy.records.cg(eid)
    assert cg["expand"]["injected"] is True and cg["expand"]["relayed"] is True  # vacuity


@pytest.mark.parametrize("dialect", ["anthropic", "openai"])
def test_an_expanding_answer_streams_up_to_its_call(xproxy, provider, dialect):
    """The model's text before its `context_guru_expand` call reaches the client while the
    provider still holds the call (so before the answer ends); the call never does; the
    continuation's answer completes the same stream."""
    gate = threading.Event()
    first: list[Reply] = []

    def respond(rec: Recorded) -> Reply | None:
        body = rec.json()
        if TOOL_NAME not in tool_names(dialect, body):
            return None
        if our_results(dialect, body):
            return answer(rec, provider_message(dialect, 99, FINAL, [], (2000, 11)), dialect)
        m = MARKER.search(json.dumps(body["messages"], ensure_ascii=False))
        assert m is not None
        msg = provider_message(
            dialect,
            1,
            "Looking closer, round 1.",
            [("toolu_x1", TOOL_NAME, {"id": m.group(1)})],
            (1000, 7),
            thinking=False,
        )
        sse = answer(rec, msg, dialect).body or b""
        frames = [f + b"\n\n" for f in sse.split(b"\n\n") if f]
        # Hold the answer right after its first text delta.
        at = next(i for i, f in enumerate(frames) if b"Looking" in f) + 1
        first.append(Reply(frames=frames, gate=gate, gate_after=at))
        return first[-1]

    with Agent(xproxy, provider, dialect) as agent:
        agent.prime()
        session = agent.session
        provider.responder = respond
        try:

            def on_line(line: str) -> None:
                if "Looking" in line:
                    gate.set()

            eid, text = stream_turn(xproxy, dialect, session, FIRST_LEN[dialect] + 2, on_line)
        finally:
            provider.responder = None
    assert gate.is_set(), "the text before the call never reached the client"
    assert first and not first[0].gate_timed_out, "the answer was held before our call began"
    assert TOOL_NAME not in text
    assert "Looking closer" in text and "Final answer" in text
    assert text.index("Looking closer") < text.index("Final answer")
    cg = xproxy.records.cg(eid)
    assert cg["expand"]["relayed"] is True
    assert cg["expand"]["rounds"] == 1
    assert cg["ledger"]["rounds"] == 2


# -- GET /_cg/expand ---------------------------------------------------------------------------------


def test_the_expand_endpoint(xproxy, provider):
    with Agent(xproxy, provider, "anthropic") as agent:
        t1 = agent.prime()
        (key,) = stash_keys(xproxy, agent.session)
    head, cut = SPAN["anthropic"]
    _, sent, _ = message_sources(t1.request.content)
    with xproxy.client() as c:
        r = c.get("/_cg/expand", params={"id": key})
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/json"
        doc = r.json()
        assert doc["id"] == key and doc["session"] == agent.session
        assert doc["count"] == cut - head and doc["dialect"] == "anthropic"
        assert doc["messages"] == [json.loads(s) for s in sent[head:cut]]
        # One message: `KEY#N`, the `#` percent-encoded by the client (a raw one would end the
        # URL's query), its exact bytes as the client sent them.
        r = c.get("/_cg/expand", params={"id": f"{key}#2"})
        assert b"%23" in r.request.url.raw_path and r.status_code == 200
        assert r.json()["source"] == sent[head + 1].decode()
        r = c.get("/_cg/expand", params={"id": f"{key}#{cut - head + 1}"})
        assert r.status_code == 404 and f"holds {cut - head} messages" in r.json()["error"]

        r = c.get("/_cg/expand", params={"id": "f" * 24})
        assert r.status_code == 404
        assert "no longer available" in r.json()["error"]
        for bad in ("xyz", "", key.upper(), key + "0", key + "#", key + "#1234567"):
            r = c.get("/_cg/expand", params={"id": bad})
            assert r.status_code == 400, bad
            assert "not a context-guru id" in r.json()["error"]
        assert c.get("/_cg/expand").status_code == 400


def test_the_cli_asks_a_running_proxy_for_its_store(
    xproxy, provider, capsys, monkeypatch, tmp_path
):
    """`expand` and `sessions` with `--proxy`: the proxy's own store (its `cg_db`, not the
    default) answers; without it the CLI names the default store it could not read."""
    from cg.cli import main

    monkeypatch.setenv("HOME", str(tmp_path))  # the default store: absent
    with Agent(xproxy, provider, "anthropic") as agent:
        t1 = agent.prime()
        (key,) = stash_keys(xproxy, agent.session)
    head, _ = SPAN["anthropic"]
    _, sent, _ = message_sources(t1.request.content)

    assert main(["expand", f"{key}#2"]) == 2
    err = capsys.readouterr().err
    assert f"no context-guru store at {tmp_path}/.context-guru/cg.sqlite3" in err
    assert "--proxy URL" in err

    assert main(["expand", f"{key}#2", "--proxy", xproxy.url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["source"] == sent[head + 1].decode()
    assert main(["expand", key, "--proxy", xproxy.url]) == 0
    out = capsys.readouterr().out
    assert (
        out.startswith(f"# {key}: ") and f"from session {agent.session} (via {xproxy.url})" in out
    )
    assert f"[{key}#1]" in out
    assert main(["expand", "f" * 24, "--proxy", xproxy.url]) == 1
    assert "answered 404" in capsys.readouterr().err

    assert main(["sessions", "--proxy", xproxy.url]) == 0
    out = capsys.readouterr().out
    assert f"from the proxy at {xproxy.url}" in out.splitlines()[0]
    assert any(line.startswith(f"{agent.session}  last seen ") for line in out.splitlines())
    assert main(["sessions", "--proxy", xproxy.url, "--json"]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows[agent.session]["checkpoint"] is not None


async def test_the_expand_endpoint_refuses_a_non_loopback_client(tmp_path):
    """Simulated in process (the e2e proxy listens on 127.0.0.1 only): a peer address that is
    not loopback gets 403 before the id is even read."""
    from cg.proxy.addon import ContextGuru
    from cg.state.records import stash_key
    from cg.state.sqlite import SqliteStore

    db = tmp_path / "cg.sqlite3"
    sources = ['{"role":"user","content":"x"}']
    key = stash_key(sources)
    with SqliteStore(db) as st:
        st.put_stash(key, "s", sources, "anthropic")

    def flow(peer: tuple[str, int]) -> Any:
        req = tutils.treq(method=b"GET", path=f"/_cg/expand?id={key}".encode(), content=b"")
        f = tflow.tflow(req=req)
        f.client_conn.peername = peer
        return f

    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        tctx.configure(cg, cg_preset="summarize", cg_db=str(db))
        remote = flow(("203.0.113.7", 4000))
        cg.request(remote)
        assert remote.response is not None and remote.response.status_code == 403
        local = flow(("127.0.0.1", 4000))
        cg.request(local)
        assert local.response is not None and local.response.status_code == 200
        assert json.loads(local.response.content or b"")["messages"] == [
            {"role": "user", "content": "x"}
        ]
        cg.done()
