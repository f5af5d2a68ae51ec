"""cg.expand.continuation: the expand loop against an `httpx.MockTransport` upstream.

The upstream is scripted per request; every request it receives is kept (URL, headers, exact body
bytes, the timeout httpx was told to use). Replies are built as provider messages and sent in the
form the request asked for (JSON, or SSE when the body says `"stream": true`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from cg.expand import continuation
from cg.expand.tool import TOOL_NAME, resolve
from cg.state.records import StoreError, stash_key
from cg.state.sqlite import SqliteStore
from cg.wire.answers import (
    Reply,
    parse_json,
    parse_sse,
    render_json,
    render_sse,
    tool_calls,
)
from tests.e2e.harness import message_sources

URL = "https://api.example.test/v1/messages"
OPENAI_URL = "https://api.example.test/v1/chat/completions"
KEY = "0123456789abcdef01234567"
HEADERS = [
    ("Host", "api.example.test"),
    ("content-length", "999"),
    ("x-api-key", "sk-test"),
    ("anthropic-version", "2023-06-01"),
    ("content-type", "application/json"),
    ("x-custom", "caf\xe9"),  # latin-1, as mitmproxy hands header bytes over
    ("connection", "keep-alive"),
    ("transfer-encoding", "chunked"),
]
# Irregular whitespace between messages, non-ASCII, escapes: every byte must survive a re-send.
ANTHROPIC_SENT = (
    '{"model":"claude-x","max_tokens":64,\n "messages": [ '
    '{"role":"user","content":"Task: fix it. caf\\u00e9 ✓"} ,\n'
    '  {"role":"user","content":"=== History Summary === <<cg:' + KEY + '>>"},'
    '{"role":"assistant","content":"ok"},\t{"role":"user","content":"go \\"on\\""}\n ],\n'
    ' "tools":[{"name":"Bash","input_schema":{"type":"object"}}],"stream":STREAM}'
)
OPENAI_SENT = (
    '{"model":"gpt-x", "messages":[{"role":"system","content":"sys"},\n'
    '{"role":"user","content":"=== History Summary === <<cg:' + KEY + '>>"} ,'
    '{"role":"user","content":"go ✓"}],"tools":[],"stream":STREAM'
    ',"stream_options":{"include_usage":true}}'
)


def anthropic_msg(
    n: int, *calls: tuple[str, str, Any], text: str | None = None, thinking: bool = False
) -> dict[str, Any]:
    content: list[Any] = []
    if thinking:
        content.append({"type": "thinking", "thinking": f"think {n}", "signature": f"sig{n}=="})
    if text is not None:
        content.append({"type": "text", "text": text})
    for cid, name, inp in calls:
        content.append({"type": "tool_use", "id": cid, "name": name, "input": inp})
    return {
        "id": f"msg_{n}",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": content,
        "stop_reason": "tool_use" if calls else "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 100 * n,
            "output_tokens": n,
            "cache_read_input_tokens": 10 * n,
        },
    }


def openai_msg(n: int, *calls: tuple[str, str, str], text: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
            for cid, name, args in calls
        ]
    return {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "created": 1700000000 + n,
        "model": "gpt-x",
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "tool_calls" if calls else "stop",
            }
        ],
        "usage": {"prompt_tokens": 100 * n, "completion_tokens": n, "total_tokens": 101 * n},
    }


def expand_call(cid: str = "toolu_x1", key: str = KEY) -> tuple[str, str, Any]:
    return (cid, TOOL_NAME, {"id": key})


def oexpand_call(cid: str = "call_x1", key: str = KEY) -> tuple[str, str, str]:
    return (cid, TOOL_NAME, json.dumps({"id": key}))


class Upstream:
    """A scripted MockTransport: each request pops the next answer (a message dict to render in
    the requested form, an httpx.Response, or an exception to raise)."""

    def __init__(self, dialect: str, *script: Any) -> None:
        self.dialect: str = dialect
        self.script = list(script)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        assert self.script, "the loop sent more requests than scripted"
        item = self.script.pop(0)
        if isinstance(item, Exception):
            raise item
        if isinstance(item, httpx.Response):
            return item
        if json.loads(request.content).get("stream") is True:
            body = render_sse(Reply(self.dialect, item))
            return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})
        return httpx.Response(200, content=render_json(Reply(self.dialect, item)), headers=JSON)


JSON = {"content-type": "application/json"}


@pytest.fixture
async def client() -> AsyncIterator[Callable[[Upstream], httpx.AsyncClient]]:
    made: list[httpx.AsyncClient] = []

    def make(up: Upstream) -> httpx.AsyncClient:
        c = httpx.AsyncClient(transport=httpx.MockTransport(up))
        made.append(c)
        return c

    yield make
    for c in made:
        await c.aclose()


def answers(key: str) -> str:
    return f"EXPANDED[{key}]"


async def run(
    client: Callable[[Upstream], httpx.AsyncClient],
    up: Upstream,
    first: dict[str, Any],
    stream: bool,
    resolver: Callable[[str], str] = answers,
    sent: str | None = None,
) -> continuation.ContinuationResult:
    dialect = up.dialect
    base = ANTHROPIC_SENT if dialect == "anthropic" else OPENAI_SENT
    body = sent or base.replace("STREAM", "true" if stream else "false")
    return await continuation.run(
        client(up),
        URL if dialect == "anthropic" else OPENAI_URL,
        HEADERS,
        dialect,
        body,
        Reply(dialect, first),
        stream,
        resolver,
    )


def final(out: continuation.ContinuationResult, dialect: str) -> Reply:
    if out.content_type.startswith("text/event-stream"):
        return parse_sse(dialect, out.body)
    assert out.content_type == "application/json"
    return parse_json(dialect, out.body)


def appended(before: str | bytes, after: bytes) -> list[Any]:
    """The messages `after` has beyond `before`, asserting every byte of `before` outside its
    closing `]...` is kept: `after` is `before` with new elements spliced in before the `]`."""
    b = before.encode() if isinstance(before, str) else before
    bpre, bmsgs, bpost = message_sources(b)
    apre, amsgs, apost = message_sources(after)
    assert (apre, apost) == (bpre, bpost), "bytes outside `messages` changed"
    assert amsgs[: len(bmsgs)] == bmsgs
    # Stronger than element equality: the whole text up to the last old element is a prefix.
    last = b.rindex(bmsgs[-1]) + len(bmsgs[-1])
    assert after[:last] == b[:last], "an earlier byte of the sent body changed"
    return [json.loads(m) for m in amsgs[len(bmsgs) :]]


# -- the happy path ------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_an_expand_only_reply_is_resolved_and_resent(client, stream: bool) -> None:
    first = anthropic_msg(1, expand_call(), text="Let me look.", thinking=True)
    up = Upstream("anthropic", anthropic_msg(2, text="The answer is 42."))
    out = await run(client, up, first, stream)

    assert len(up.requests) == 1
    (req,) = up.requests
    assert str(req.url) == URL and req.method == "POST"
    sent = ANTHROPIC_SENT.replace("STREAM", "true" if stream else "false")
    new = appended(sent, req.content)
    assert new == [
        {"role": "assistant", "content": first["content"]},  # thinking, text and the call whole
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_x1", "content": f"EXPANDED[{KEY}]"}
            ],
        },
    ]
    assert new[0]["content"][0]["signature"] == "sig1=="

    # The client gets the final answer in the form it asked for. Its usage: the final round's
    # input side (the context as it now is), the output of both rounds.
    assert out.content_type.startswith("text/event-stream" if stream else "application/json")
    got = final(out, "anthropic")
    assert [b["type"] for b in got.message["content"]] == ["text"]
    assert got.message["content"][0]["text"] == "The answer is 42."
    assert got.message["stop_reason"] == "end_turn"
    assert got.message["usage"] == {
        "input_tokens": 200,
        "output_tokens": 3,
        "cache_read_input_tokens": 20,
    }
    # Every round's own usage is kept for the ledger, each once.
    assert [r.message["usage"]["input_tokens"] for r in out.replies] == [100, 200]
    assert out.rounds == 1
    assert out.log == [{"round": 1, "ids": [KEY]}]


async def test_the_resent_round_carries_the_agents_headers_and_no_read_timeout(client) -> None:
    up = Upstream("anthropic", anthropic_msg(2, text="done"))
    await run(client, up, anthropic_msg(1, expand_call()), False)
    (req,) = up.requests
    raw = [(k.lower(), v) for k, v in req.headers.raw]
    # The agent's own headers, the latin-1 one byte for byte; hop-by-hop ones recomputed.
    for name, value in (
        (b"x-api-key", b"sk-test"),
        (b"anthropic-version", b"2023-06-01"),
        (b"x-custom", b"caf\xe9"),
    ):
        assert (name, value) in raw
    assert dict(raw)[b"content-length"] == str(len(req.content)).encode()
    assert dict(raw)[b"host"] == b"api.example.test"
    assert b"transfer-encoding" not in dict(raw)
    # None of httpx's own defaults: the provider sees what the agent sent.
    for default in (b"user-agent", b"accept-encoding", b"accept"):
        assert default not in dict(raw), default
    # A model may take minutes to start answering: no read timeout (httpx's default is 5 s).
    timeout = req.extensions["timeout"]
    assert timeout["read"] is None and timeout["write"] is None


async def test_several_expand_calls_in_one_reply_are_answered_together(client) -> None:
    first = anthropic_msg(1, expand_call("t1"), expand_call("t2", "f" * 24))
    up = Upstream("anthropic", anthropic_msg(2, text="fine"))
    await run(client, up, first, False)
    new = appended(ANTHROPIC_SENT.replace("STREAM", "false"), up.requests[0].content)
    assert [r["tool_use_id"] for r in new[1]["content"]] == ["t1", "t2"]
    assert [r["content"] for r in new[1]["content"]] == [
        f"EXPANDED[{KEY}]",
        f"EXPANDED[{'f' * 24}]",
    ]


async def test_a_pretty_printed_body_keeps_its_punctuation(client) -> None:
    doc = {
        "model": "m",
        "max_tokens": 9,
        "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b ✓"}],
    }
    sent = json.dumps(doc, indent=2, ensure_ascii=False)
    up = Upstream("anthropic", anthropic_msg(2, text="x"))
    await run(client, up, anthropic_msg(1, expand_call()), False, sent=sent)
    body = up.requests[0].content
    assert len(appended(sent, body)) == 2
    assert body.decode().startswith(sent[: sent.rindex("}\n  ]") + 1] + ",\n    {")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_granular_id_is_answered_with_that_message_alone(
    client, tmp_path: Path, stream: bool
) -> None:
    """`KEY#N` goes through the loop as the model wrote it and resolves, against a real store,
    to the N-th message only; an N the stash lacks, beside it, is answered with its size."""
    sources = [
        '{"role":"user","content":"run the tests"}',
        '{"role":"assistant","content":[{"type":"tool_use","id":"toolu_9","name":"Bash",'
        '"input":{"cmd":"pytest"}}]}',
        '{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_9",'
        '"content":"FAILED test_parse \\u2014 caf\\u00e9"}]}',
    ]
    with SqliteStore(tmp_path / "cg.sqlite3") as st:
        key = stash_key(sources)
        st.put_stash(key, "s1", sources, "anthropic")
        seen: list[str] = []

        def resolver(ident: str) -> str:
            seen.append(ident)
            return resolve(st, ident, "s1")

        first = anthropic_msg(1, expand_call("t1", f"{key}#3"), expand_call("t2", f"{key}#9"))
        up = Upstream("anthropic", anthropic_msg(2, text="It failed in test_parse."))
        out = await run(client, up, first, stream, resolver=resolver)
    assert seen == [f"{key}#3", f"{key}#9"]  # the ids as the model passed them
    assert out.log == [{"round": 1, "ids": [f"{key}#3", f"{key}#9"]}]
    new = appended(
        ANTHROPIC_SENT.replace("STREAM", "true" if stream else "false"), up.requests[0].content
    )
    one, other = (r["content"] for r in new[1]["content"])
    assert one == (
        f"Message 3 of 3 that the summary <<cg:{key}>> replaced, verbatim (its original JSON):"
        f"\n\n{sources[2]}"
    )
    assert sources[0] not in one and sources[1] not in one
    assert f"it holds 3 messages, {key}#1 to {key}#3" in other
    assert final(out, "anthropic").message["content"][0]["text"] == "It failed in test_parse."


# -- what is never re-sent ---------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_mixed_calls_go_back_to_the_client_without_ours(client, stream: bool) -> None:
    bash = ("toolu_b", "Bash", {"cmd": "ls"})
    first = anthropic_msg(1, expand_call(), bash, text="Both.")
    up = Upstream("anthropic")
    out = await run(client, up, first, stream)
    assert up.requests == []
    got = final(out, "anthropic")
    assert [c.name for c in tool_calls(got)] == ["Bash"]
    assert got.message["stop_reason"] == "tool_use"  # the client must run its own tool
    assert got.message["content"][0] == {"type": "text", "text": "Both."}
    assert got.message["usage"] == first["usage"]
    assert out.rounds == 0


async def test_a_reply_without_our_call_is_returned_as_it_came(client) -> None:
    first = anthropic_msg(1, ("toolu_b", "Bash", {"cmd": "ls"}), text="Mine.")
    up = Upstream("anthropic")
    out = await run(client, up, first, False)
    assert up.requests == []
    assert final(out, "anthropic").message == first


# -- the loop cap ------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_the_loop_stops_after_three_resends(client, stream: bool) -> None:
    script = [anthropic_msg(n, expand_call(f"t{n}"), text=f"again {n}") for n in (2, 3, 4, 5)]
    up = Upstream("anthropic", *script)
    out = await run(client, up, anthropic_msg(1, expand_call("t1"), text="again 1"), stream)
    assert len(up.requests) == 3  # exactly: three re-sends, then the last answer
    assert len(up.script) == 1
    got = final(out, "anthropic")
    assert tool_calls(got) == []
    assert got.message["content"] == [{"type": "text", "text": "again 4"}]
    assert got.message["stop_reason"] == "end_turn"
    assert got.message["usage"]["input_tokens"] == 100 * 4  # the final round's context
    assert got.message["usage"]["output_tokens"] == 1 + 2 + 3 + 4
    assert out.rounds == 3
    assert len(out.replies) == 4
    # Each round re-sent everything before it, plus its own turn.
    for i in range(1, 3):
        assert len(appended(up.requests[i - 1].content, up.requests[i].content)) == 2


# -- failing rounds -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "failure",
    [
        httpx.Response(500, json={"type": "error", "error": {"type": "api_error"}}),
        httpx.Response(200, content=b"garbage", headers=JSON),
        httpx.Response(
            200,
            content=b"event: message_start\ndata: {",
            headers={"content-type": "text/event-stream"},
        ),
        httpx.Response(529, json={"type": "error", "error": {"type": "overloaded_error"}}),
        httpx.ConnectError("refused"),
        httpx.ReadTimeout("slow"),
    ],
    ids=["500", "garbage", "truncated-sse", "529", "connect", "timeout"],
)
async def test_a_failing_round_returns_the_last_good_answer_stripped(client, failure) -> None:
    first = anthropic_msg(1, expand_call(), text="Looking it up.")
    up = Upstream("anthropic", failure)
    out = await run(client, up, first, True)
    assert len(up.requests) == 1
    got = final(out, "anthropic")
    assert got.message["content"] == [{"type": "text", "text": "Looking it up."}]
    assert got.message["stop_reason"] == "end_turn"
    assert got.message["usage"] == first["usage"]
    assert out.rounds == 0
    assert "error" in out.log[0]


async def test_a_second_round_failing_returns_the_first_rounds_answer(client) -> None:
    second = anthropic_msg(2, expand_call("t2"), text="More.")
    up = Upstream("anthropic", second, httpx.Response(500))
    out = await run(client, up, anthropic_msg(1, expand_call("t1")), False)
    assert len(up.requests) == 2
    got = final(out, "anthropic")
    assert got.message["content"] == [{"type": "text", "text": "More."}]
    assert got.message["usage"]["input_tokens"] == 200
    assert got.message["usage"]["output_tokens"] == 3
    assert out.log[1]["error"] == "HTTP 500"


async def test_a_resolver_that_raises_ends_the_loop_not_the_answer(client) -> None:
    """Found by this suite: only HTTP and parse errors were caught, so a store error (or any
    other) escaped the response hook and the client got our tool call."""

    def broken(key: str) -> str:
        raise StoreError("get_stash on /x.sqlite3: database is locked")

    first = anthropic_msg(1, expand_call(), text="Hm.")
    up = Upstream("anthropic")
    out = await run(client, up, first, False, resolver=broken)
    assert up.requests == []
    got = final(out, "anthropic")
    assert got.message["content"] == [{"type": "text", "text": "Hm."}]
    assert "StoreError" in out.log[0]["error"]


# -- ids that do not resolve ---------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["../etc", "ABCDEF0123456789ABCDEF01", "", None, 7])
async def test_a_malformed_id_is_answered_explicitly(client, bad: Any) -> None:
    seen: list[str] = []

    def resolver(key: str) -> str:
        seen.append(key)
        return "never"

    inp = {} if bad is None else {"id": bad}
    up = Upstream("anthropic", anthropic_msg(2, text="ok"))
    await run(client, up, anthropic_msg(1, ("t1", TOOL_NAME, inp)), False, resolver=resolver)
    new = appended(ANTHROPIC_SENT.replace("STREAM", "false"), up.requests[0].content)
    result = new[1]["content"][0]
    assert result["tool_use_id"] == "t1"
    assert "is not a context-guru id" in result["content"]
    assert seen == []  # a malformed id never reaches the store


async def test_an_expired_id_is_answered_no_longer_available(client, tmp_path: Path) -> None:
    t = [1_000_000.0]
    sources = ['{"role":"user","content":"the original"}']
    with SqliteStore(tmp_path / "cg.sqlite3", ttl_hours=1, now=lambda: t[0]) as st:
        key = stash_key(sources)
        st.put_stash(key, "s1", sources, "anthropic")
        live = Upstream("anthropic", anthropic_msg(2, text="ok"))
        await run(
            client,
            live,
            anthropic_msg(1, expand_call(key=key)),
            False,
            resolver=lambda k: resolve(st, k, "s1"),
        )
        live_result = appended(ANTHROPIC_SENT.replace("STREAM", "false"), live.requests[0].content)[
            1
        ]["content"][0]["content"]
        assert sources[0] in live_result  # the vacuity guard: this id did resolve

        t[0] += 2 * 3600
        st.evict()
        up = Upstream("anthropic", anthropic_msg(2, text="ok"))
        await run(
            client,
            up,
            anthropic_msg(1, expand_call(key=key)),
            False,
            resolver=lambda k: resolve(st, k, "s1"),
        )
    result = appended(ANTHROPIC_SENT.replace("STREAM", "false"), up.requests[0].content)[1]
    text = result["content"][0]["content"]
    assert f"id '{key}' is no longer available" in text
    assert sources[0] not in text


# -- openai ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_openai_tool_messages_are_appended(client, stream: bool) -> None:
    first = openai_msg(1, oexpand_call("c1"), oexpand_call("c2", "e" * 24))
    up = Upstream("openai", openai_msg(2, text="Answer ✓"))
    out = await run(client, up, first, stream)
    (req,) = up.requests
    sent = OPENAI_SENT.replace("STREAM", "true" if stream else "false")
    new = appended(sent, req.content)
    assert new == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": first["choices"][0]["message"]["tool_calls"],
        },
        {"role": "tool", "tool_call_id": "c1", "content": f"EXPANDED[{KEY}]"},
        {"role": "tool", "tool_call_id": "c2", "content": f"EXPANDED[{'e' * 24}]"},
    ]
    got = final(out, "openai")
    msg = got.message["choices"][0]["message"]
    assert msg["content"] == "Answer ✓"
    assert "tool_calls" not in msg
    assert got.message["choices"][0]["finish_reason"] == "stop"
    assert got.message["usage"] == {
        "prompt_tokens": 200,
        "completion_tokens": 3,
        "total_tokens": 203,
    }


async def test_openai_mixed_calls_keep_the_clients_call(client) -> None:
    first = openai_msg(1, oexpand_call("c1"), ("c2", "bash", '{"cmd":"ls"}'))
    up = Upstream("openai")
    out = await run(client, up, first, False)
    assert up.requests == []
    got = final(out, "openai")
    assert [c.name for c in tool_calls(got)] == ["bash"]
    assert got.message["choices"][0]["finish_reason"] == "tool_calls"


async def test_openai_stream_without_usage_gets_no_usage_chunk(client) -> None:
    """Found by this suite: when no round reported usage (a stream without
    `stream_options.include_usage`), the client got `"usage": null` on every chunk and a final
    chunk with `"choices": []` and `"usage": {}` — which `chunk.choices[0]` clients crash on."""
    sent = OPENAI_SENT.replace("STREAM", "true").replace(
        ',"stream_options":{"include_usage":true}', ""
    )
    first = openai_msg(1, oexpand_call())
    del first["usage"]
    second = openai_msg(2, text="no usage here")
    del second["usage"]
    up = Upstream("openai", second)
    out = await run(client, up, first, True, sent=sent)
    assert len(up.requests) == 1
    chunks = [
        json.loads(line[6:])
        for line in out.body.decode().splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    assert chunks and all(c["choices"] for c in chunks)
    assert all("usage" not in c for c in chunks)
    assert final(out, "openai").message["choices"][0]["message"]["content"] == "no usage here"
