"""cg.wire.answers: provider responses parsed from the real wire formats, edited, and rendered back.

Ground truth comes from three places: the fake provider's SSE and JSON (served over HTTP),
hand-written streams in the shapes the providers document (thinking, tool_use with
input_json_delta pieces, parallel OpenAI tool calls, a usage chunk), and the official SDKs,
whose own stream accumulators must read `render_sse` output back to the same message.
"""

from __future__ import annotations

import json
import string
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai.lib.streaming.chat import ChatCompletionStreamState

from cg.wire.answers import (
    Call,
    ProviderError,
    Reply,
    ResponseParseError,
    assistant_message,
    parse_json,
    parse_sse,
    render_json,
    render_sse,
    strip_calls,
    sum_usage,
    tool_calls,
    tool_results,
    with_usage,
)
from cg.wire.shape import validate_shape
from tests.support.fakeprovider import DEFAULT_TEXT, FakeProvider
from tests.support.strategies import SETTINGS

EXPAND = "context_guru_expand"


def sse(*events: tuple[str | None, Any]) -> bytes:
    """Frames as the providers write them: `event:` (anthropic) or bare `data:` (openai)."""
    out = []
    for name, data in events:
        text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
        out.append((f"event: {name}\n" if name else "") + f"data: {text}\n\n")
    return "".join(out).encode()


# --------------------------------------------------------------------------------------------
# Hand-written streams in the documented shapes
# --------------------------------------------------------------------------------------------


def _cbd(i: int, delta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return "content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta}


ANTHROPIC_TOOL_STREAM = sse(
    (
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": "msg_014p7gG3wDgGV9EUtLvnow3U",
                "type": "message",
                "role": "assistant",
                "model": "claude-sonnet-4-5",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {
                    "input_tokens": 472,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 100,
                    "output_tokens": 2,
                },
            },
        },
    ),
    (
        "content_block_start",
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {
                "type": "thinking",
                "thinking": "",
            },  # no signature key, as documented
        },
    ),
    ("ping", {"type": "ping"}),
    _cbd(0, {"type": "thinking_delta", "thinking": "The user wants "}),
    _cbd(0, {"type": "thinking_delta", "thinking": "the weather."}),
    _cbd(0, {"type": "signature_delta", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrk"}),
    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    (
        "content_block_start",
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
    ),
    _cbd(1, {"type": "text_delta", "text": "Okay, let me "}),
    _cbd(1, {"type": "text_delta", "text": "check ☀."}),
    ("content_block_stop", {"type": "content_block_stop", "index": 1}),
    (
        "content_block_start",
        {
            "type": "content_block_start",
            "index": 2,
            "content_block": {
                "type": "tool_use",
                "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
                "name": "get_weather",
                "input": {},
            },
        },
    ),
    _cbd(2, {"type": "input_json_delta", "partial_json": ""}),
    _cbd(2, {"type": "input_json_delta", "partial_json": '{"location":'}),
    _cbd(2, {"type": "input_json_delta", "partial_json": ' "San Fra'}),
    _cbd(2, {"type": "input_json_delta", "partial_json": 'ncisco, CA", "unit": "°F"}'}),
    ("content_block_stop", {"type": "content_block_stop", "index": 2}),
    (
        "content_block_start",
        {
            "type": "content_block_start",
            "index": 3,
            "content_block": {"type": "tool_use", "id": "toolu_02", "name": EXPAND, "input": {}},
        },
    ),
    _cbd(3, {"type": "input_json_delta", "partial_json": '{"id": "k1"}'}),
    ("content_block_stop", {"type": "content_block_stop", "index": 3}),
    (
        "content_block_start",
        {
            "type": "content_block_start",
            "index": 4,
            "content_block": {"type": "tool_use", "id": "toolu_03", "name": "now", "input": {}},
        },
    ),
    ("content_block_stop", {"type": "content_block_stop", "index": 4}),  # no deltas: input {}
    (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
            "usage": {"output_tokens": 89, "cache_creation_input_tokens": None},
        },
    ),
    ("message_stop", {"type": "message_stop"}),
)

ANTHROPIC_TOOL_MESSAGE = {
    "id": "msg_014p7gG3wDgGV9EUtLvnow3U",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5",
    "content": [
        {
            "type": "thinking",
            "thinking": "The user wants the weather.",
            "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrk",
        },
        {"type": "text", "text": "Okay, let me check ☀."},
        {
            "type": "tool_use",
            "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
            "name": "get_weather",
            "input": {"location": "San Francisco, CA", "unit": "°F"},
        },
        {"type": "tool_use", "id": "toolu_02", "name": EXPAND, "input": {"id": "k1"}},
        {"type": "tool_use", "id": "toolu_03", "name": "now", "input": {}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 472,
        "cache_creation_input_tokens": 0,  # a null in message_delta leaves it standing
        "cache_read_input_tokens": 100,
        "output_tokens": 89,
    },
}


def _oai_chunk(choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-123",
        "object": "chat.completion.chunk",
        "created": 1694268190,
        "model": "gpt-4o-mini",
        "system_fingerprint": "fp_44709d6fcb",
        "choices": choices,
        "usage": None,
        **extra,
    }


def _oai_delta(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return _oai_chunk(
        [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        obfuscation="Xy1",  # per-chunk padding: never part of the message
    )


def _oai_args(i: int, args: str) -> dict[str, Any]:
    return _oai_delta({"tool_calls": [{"index": i, "function": {"arguments": args}}]})


OPENAI_USAGE = {
    "prompt_tokens": 82,
    "completion_tokens": 17,
    "total_tokens": 99,
    "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
}

OPENAI_TOOL_STREAM = sse(
    (None, _oai_delta({"role": "assistant", "content": None, "refusal": None})),
    (
        None,
        _oai_delta(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_abc",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            }
        ),
    ),
    (None, _oai_args(0, '{"loc')),
    (None, _oai_args(0, 'ation": "Paris ü"}')),
    (
        None,
        _oai_delta(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "call_def",
                        "type": "function",
                        "function": {"name": EXPAND, "arguments": ""},
                    }
                ]
            }
        ),
    ),
    (None, _oai_args(1, '{"id":')),
    (None, _oai_args(1, ' "k1"}')),
    (None, _oai_delta({}, "tool_calls")),
    (None, _oai_chunk([], usage=OPENAI_USAGE)),
    (None, "[DONE]"),
)

OPENAI_TOOL_COMPLETION = {
    "id": "chatcmpl-123",
    "object": "chat.completion",
    "created": 1694268190,
    "model": "gpt-4o-mini",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "refusal": None,
                "tool_calls": [
                    {
                        "id": "call_abc",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"location": "Paris ü"}'},
                    },
                    {
                        "id": "call_def",
                        "type": "function",
                        "function": {"name": EXPAND, "arguments": '{"id": "k1"}'},
                    },
                ],
            },
            "logprobs": None,
            "finish_reason": "tool_calls",
        }
    ],
    "usage": OPENAI_USAGE,
    "system_fingerprint": "fp_44709d6fcb",
}


def test_documented_anthropic_stream() -> None:
    reply = parse_sse("anthropic", ANTHROPIC_TOOL_STREAM)
    assert reply == Reply("anthropic", ANTHROPIC_TOOL_MESSAGE)
    assert parse_sse("anthropic", render_sse(reply)) == reply
    assert parse_json("anthropic", render_json(reply)) == reply


def test_documented_openai_stream() -> None:
    reply = parse_sse("openai", OPENAI_TOOL_STREAM)
    assert reply == Reply("openai", OPENAI_TOOL_COMPLETION)
    assert parse_sse("openai", render_sse(reply)) == reply
    assert parse_json("openai", render_json(reply)) == reply


def test_openai_repeated_ids_and_content_stream() -> None:
    """Some compatible servers repeat id and name in every chunk: they are kept once."""
    head = {"index": 0, "id": "c1", "type": "function"}
    body = sse(
        (None, _oai_delta({"role": "assistant", "content": ""})),
        (None, _oai_delta({"content": "Hel"})),
        (None, _oai_delta({"content": "lo"})),
        (None, _oai_delta({"tool_calls": [{**head, "function": {"name": "f", "arguments": "{"}}]})),
        (None, _oai_delta({"tool_calls": [{**head, "function": {"name": "f", "arguments": "}"}}]})),
        (None, _oai_delta({}, "tool_calls")),
        (None, "[DONE]"),
    )
    msg = parse_sse("openai", body).message
    assert msg["choices"][0]["message"] == {
        "role": "assistant",
        "content": "Hello",
        "refusal": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    }
    assert msg["usage"] is None  # chunks said usage: null and no usage chunk came


def test_anthropic_citations_and_opaque_blocks() -> None:
    cite = {
        "type": "char_location",
        "cited_text": "The sky is blue.",
        "document_index": 0,
        "document_title": "doc",
        "start_char_index": 0,
        "end_char_index": 16,
    }
    search = {
        "type": "web_search_tool_result",
        "tool_use_id": "srvtoolu_1",
        "content": [{"type": "web_search_result", "url": "https://x", "title": "X"}],
    }
    message = {
        "id": "msg_c",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [
            {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"},
            {
                "type": "server_tool_use",
                "id": "srvtoolu_1",
                "name": "web_search",
                "input": {"q": "x"},
            },
            search,
            {"type": "text", "text": "the sky is blue", "citations": [cite, cite]},
            {"type": "text", "text": "plain", "citations": None},
        ],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "container": {"id": "cnt_1", "expires_at": "2030-01-01T00:00:00Z"},
        "usage": {
            "input_tokens": 5,
            "output_tokens": 9,
            "server_tool_use": {"web_search_requests": 1},
            "service_tier": "standard",
        },
    }
    reply = Reply("anthropic", message)
    body = render_sse(reply)
    assert b"citations_delta" in body
    assert parse_sse("anthropic", body) == reply
    assert tool_calls(reply) == []  # a server tool is not the client's to answer


# --------------------------------------------------------------------------------------------
# The fake provider's real SSE and JSON
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeProvider]:
    with FakeProvider() as p:
        yield p


def _post(fake: FakeProvider, path: str, body: dict[str, Any]) -> httpx.Response:
    r = httpx.post(fake.url + path, json=body, timeout=10)
    assert r.status_code == 200
    return r


def test_fake_provider_anthropic(fake: FakeProvider) -> None:
    req = {"model": "claude-x", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
    streamed = parse_sse("anthropic", _post(fake, "/v1/messages", {**req, "stream": True}).content)
    whole = parse_json("anthropic", _post(fake, "/v1/messages", req).content)
    for m in (streamed.message, whole.message):
        assert m["content"] == [{"type": "text", "text": DEFAULT_TEXT}]
        assert (m["model"], m["stop_reason"], m["role"]) == ("claude-x", "end_turn", "assistant")
    drop = ("id", "usage")
    assert {k: v for k, v in streamed.message.items() if k not in drop} == {
        k: v for k, v in whole.message.items() if k not in drop
    }
    # The streamed usage is message_start's input side with message_delta's output count.
    assert streamed.message["usage"]["output_tokens"] == whole.message["usage"]["output_tokens"]
    assert parse_sse("anthropic", render_sse(streamed)) == streamed


@pytest.mark.parametrize("include_usage", [False, True])
def test_fake_provider_openai(fake: FakeProvider, include_usage: bool) -> None:
    req: dict[str, Any] = {"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]}
    stream_req: dict[str, Any] = {**req, "stream": True}
    if include_usage:
        stream_req["stream_options"] = {"include_usage": True}
    path = "/v1/chat/completions"
    streamed = parse_sse("openai", _post(fake, path, stream_req).content)
    whole = parse_json("openai", _post(fake, path, req).content)
    assert streamed.message["choices"] == whole.message["choices"]
    assert streamed.message["system_fingerprint"] == "fp_fake"
    assert streamed.message["object"] == "chat.completion"
    if include_usage:
        assert set(streamed.message["usage"]) == set(whole.message["usage"])
    else:
        assert "usage" not in streamed.message
    assert parse_sse("openai", render_sse(streamed)) == streamed


# --------------------------------------------------------------------------------------------
# Hypothesis: round trips, and the official SDKs reading render_sse
# --------------------------------------------------------------------------------------------

_ID = string.ascii_letters + string.digits + "_"
ids = st.text(_ID, min_size=1, max_size=10)
texts = st.text(max_size=60)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda kids: (
        st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3)
    ),
    max_leaves=10,
)
tool_inputs = st.dictionaries(st.text(max_size=8), json_values, max_size=4)

citations = st.builds(
    lambda t, a: {
        "type": "char_location",
        "cited_text": t,
        "document_index": 0,
        "document_title": None,
        "start_char_index": a,
        "end_char_index": a + len(t),
    },
    texts,
    st.integers(0, 1000),
)


@st.composite
def text_blocks(draw: st.DrawFn) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": draw(texts)}
    cites = draw(st.sampled_from(["absent", "null", "list"]))
    if cites == "null":
        block["citations"] = None
    elif cites == "list":
        block["citations"] = draw(st.lists(citations, max_size=2))
    return block


anthropic_blocks = st.one_of(
    text_blocks(),
    st.builds(
        lambda t, s: {"type": "thinking", "thinking": t, "signature": s},
        texts,
        st.text(string.ascii_letters + "+/=", min_size=1, max_size=40),
    ),
    st.builds(lambda d: {"type": "redacted_thinking", "data": d}, st.text(_ID, max_size=30)),
    st.builds(
        lambda i, n, inp: {"type": "tool_use", "id": "toolu_" + i, "name": n, "input": inp},
        ids,
        st.sampled_from([EXPAND, "bash", "read_file"]),
        tool_inputs,
    ),
)

anthropic_usages = st.fixed_dictionaries(
    {"input_tokens": st.integers(0, 10**6), "output_tokens": st.integers(0, 10**5)},
    optional={
        "cache_creation_input_tokens": st.integers(0, 10**6),
        "cache_read_input_tokens": st.integers(0, 10**6),
    },
)


@st.composite
def anthropic_replies(draw: st.DrawFn) -> Reply:
    content = draw(st.lists(anthropic_blocks, max_size=5))
    calls = any(b["type"] == "tool_use" for b in content)
    return Reply(
        "anthropic",
        {
            "id": "msg_" + draw(ids),
            "type": "message",
            "role": "assistant",
            "model": draw(st.sampled_from(["claude-sonnet-4-5", "claude-haiku-4-5"])),
            "content": content,
            "stop_reason": "tool_use"
            if calls
            else draw(st.sampled_from(["end_turn", "max_tokens", "stop_sequence"])),
            "stop_sequence": draw(st.none() | st.text(max_size=5)),
            "usage": draw(anthropic_usages),
        },
    )


@st.composite
def openai_tool_calls(draw: st.DrawFn, i: int) -> dict[str, Any]:
    args = draw(st.one_of(tool_inputs.map(json.dumps), st.text(max_size=20)))
    name = draw(st.sampled_from([EXPAND, "bash", "read_file"]))
    return {
        "id": f"call_{i}_" + draw(ids),
        "type": "function",
        "function": {"name": name, "arguments": args},
    }


@st.composite
def openai_replies(draw: st.DrawFn) -> Reply:
    n_calls = draw(st.integers(0, 3))
    calls = [draw(openai_tool_calls(i)) for i in range(n_calls)]
    message: dict[str, Any] = {
        "role": "assistant",
        "content": draw(st.none() | texts) if calls else draw(texts),
        "refusal": draw(st.none() | st.none() | texts),
    }
    if calls:
        message["tool_calls"] = calls
    completion: dict[str, Any] = {
        "id": "chatcmpl-" + draw(ids),
        "object": "chat.completion",
        "created": draw(st.integers(0, 2**31)),
        "model": "gpt-4o",
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "tool_calls"
                if calls
                else draw(st.sampled_from(["stop", "length", "content_filter"])),
            }
        ],
    }
    if draw(st.booleans()):
        p, c = draw(st.integers(0, 10**6)), draw(st.integers(0, 10**5))
        completion["usage"] = {
            "prompt_tokens": p,
            "completion_tokens": c,
            "total_tokens": p + c,
            "prompt_tokens_details": {"cached_tokens": draw(st.integers(0, p))},
        }
    if draw(st.booleans()):
        completion["system_fingerprint"] = "fp_" + draw(ids)
    return Reply("openai", completion)


replies = anthropic_replies() | openai_replies()


@SETTINGS
@given(replies)
def test_round_trips(reply: Reply) -> None:
    assert parse_sse(reply.dialect, render_sse(reply)) == reply
    assert parse_json(reply.dialect, render_json(reply)) == reply


def test_lone_surrogates_survive_rendering() -> None:
    """A lone surrogate (sent as a `\\ud83d` escape) cannot be UTF-8: it goes back escaped."""
    tool = {"type": "tool_use", "id": "t", "name": "n", "input": {"k\udc00": "cut \ud83d"}}
    message = {**ANTHROPIC_TOOL_MESSAGE, "content": [tool, {"type": "text", "text": "\\\ud800"}]}
    reply = Reply("anthropic", message)
    assert b"\\ud83d" in render_json(reply)
    assert parse_json("anthropic", render_json(reply)) == reply
    assert parse_sse("anthropic", render_sse(reply)) == reply


def _mock_client(box: dict[str, bytes]) -> httpx.Client:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=box["body"]
        )

    return httpx.Client(transport=httpx.MockTransport(answer))


def _prune(sdk: Any, ours: Any) -> Any:
    """The SDK's dump without the fields its models default to None that the wire never sent."""
    if isinstance(sdk, dict) and isinstance(ours, dict):
        return {k: _prune(v, ours.get(k)) for k, v in sdk.items() if k in ours or v is not None}
    if isinstance(sdk, list) and isinstance(ours, list) and len(sdk) == len(ours):
        return [_prune(a, b) for a, b in zip(sdk, ours, strict=True)]
    return sdk


_ANTHROPIC_BOX: dict[str, bytes] = {}
_ANTHROPIC = anthropic.Anthropic(
    api_key="test", base_url="http://provider.test", http_client=_mock_client(_ANTHROPIC_BOX)
)
_OPENAI_BOX: dict[str, bytes] = {}
_OPENAI = openai.OpenAI(
    api_key="test", base_url="http://provider.test/v1", http_client=_mock_client(_OPENAI_BOX)
)


def _anthropic_sdk(body: bytes) -> dict[str, Any]:
    _ANTHROPIC_BOX["body"] = body
    with _ANTHROPIC.messages.stream(
        model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        return stream.get_final_message().to_dict()


def _openai_sdk(body: bytes) -> dict[str, Any]:
    """The SDK's own SSE decoding and chunk accumulation (`stream()`'s final-completion helper
    would refuse `length` and `content_filter` finishes, which are legitimate here)."""
    _OPENAI_BOX["body"] = body
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    for chunk in _OPENAI.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=True
    ):
        state.handle_chunk(chunk)
    done: dict[str, Any] = state.current_completion_snapshot.to_dict()
    for choice in done["choices"]:
        for tc in choice["message"].get("tool_calls") or []:
            tc.pop("index")  # the snapshot keeps the delta's index; a completion has none
    return done


@SETTINGS
@given(anthropic_replies())
def test_anthropic_sdk_reads_render_sse(reply: Reply) -> None:
    got = _anthropic_sdk(render_sse(reply))
    assert _prune(got, reply.message) == reply.message


@SETTINGS
@given(openai_replies())
def test_openai_sdk_reads_render_sse(reply: Reply) -> None:
    got = _openai_sdk(render_sse(reply))
    assert _prune(got, reply.message) == reply.message


def test_sdks_read_documented_streams_like_we_do() -> None:
    """The SDKs and parse_sse agree on the hand-written streams, before and after re-rendering."""
    for body in (ANTHROPIC_TOOL_STREAM, render_sse(Reply("anthropic", ANTHROPIC_TOOL_MESSAGE))):
        assert _prune(_anthropic_sdk(body), ANTHROPIC_TOOL_MESSAGE) == ANTHROPIC_TOOL_MESSAGE
    for body in (OPENAI_TOOL_STREAM, render_sse(Reply("openai", OPENAI_TOOL_COMPLETION))):
        got = _openai_sdk(body)
        got.pop("obfuscation", None)  # the SDK keeps the first chunk's padding; it is noise
        assert _prune(got, OPENAI_TOOL_COMPLETION) == OPENAI_TOOL_COMPLETION


# --------------------------------------------------------------------------------------------
# Framing robustness: line endings, comments, multi-line data, truncation at every byte
# --------------------------------------------------------------------------------------------


def _multiline(body: bytes) -> bytes:
    """Every JSON `data:` field spread over several `data:` lines (they join with LF)."""
    out = []
    for line in body.decode().split("\n"):
        if line.startswith("data: {"):
            pretty = json.dumps(json.loads(line[6:]), indent=1, ensure_ascii=False)
            out += ["data: " + p for p in pretty.split("\n")]
        else:
            out.append(line)
    return "\n".join(out).encode()


def _variants(body: bytes) -> dict[str, bytes]:
    return {
        "crlf": body.replace(b"\n", b"\r\n"),
        "cr": body.replace(b"\n", b"\r"),
        "comments": b": hello\n\n" + body.replace(b"\n\n", b"\n: keep-alive\n\n: x\n\n"),
        "comment inside event": body.replace(b"\ndata:", b"\n: between\ndata:"),
        "bom": b"\xef\xbb\xbf" + body,
        "no space": body.replace(b"data: ", b"data:").replace(b"event: ", b"event:"),
        "extra blank lines": b"\n\n" + body.replace(b"\n\n", b"\n\n\n\n"),
        "id and retry": body.replace(b"data: ", b"id: 7\nretry: 100\ndata: "),
        "multi-line data": _multiline(body),
        "multi-line crlf": _multiline(body).replace(b"\n", b"\r\n"),
        "no final blank line": body.rstrip(b"\n"),
    }


STREAMS = [
    ("anthropic", ANTHROPIC_TOOL_STREAM),
    ("openai", OPENAI_TOOL_STREAM),
    ("anthropic", render_sse(Reply("anthropic", ANTHROPIC_TOOL_MESSAGE))),
]


@pytest.mark.parametrize(("dialect", "body"), STREAMS)
def test_framing_variants(dialect: str, body: bytes) -> None:
    want = parse_sse(dialect, body)
    for name, variant in _variants(body).items():
        assert parse_sse(dialect, variant) == want, name


@pytest.mark.parametrize(("dialect", "body"), STREAMS)
def test_every_truncation_is_refused_or_complete(dialect: str, body: bytes) -> None:
    """Cut the stream at every byte: a parse either fails, or (only once the final event is
    in) gives the whole message — never a silently shorter one."""
    want = parse_sse(dialect, body)
    for variant in (body, body.replace(b"\n", b"\r\n")):
        final = variant.rindex(b"data:")  # the final event: message_stop / [DONE]
        for k in range(len(variant) + 1):
            try:
                got = parse_sse(dialect, variant[:k])
            except ResponseParseError:
                assert k < len(variant.rstrip(b"\r\n")), k
                continue
            assert got == want, k
            assert k > final, k


def test_events_split_across_transport_chunks() -> None:
    """The SDKs read render_sse output delivered one byte per network chunk."""
    reply = Reply("anthropic", ANTHROPIC_TOOL_MESSAGE)
    body = render_sse(reply)

    class OneByte(httpx.SyncByteStream):
        def __iter__(self) -> Iterator[bytes]:
            for i in range(len(body)):
                yield body[i : i + 1]

    transport = httpx.MockTransport(
        lambda _: httpx.Response(
            200, headers={"content-type": "text/event-stream"}, stream=OneByte()
        )
    )
    client = anthropic.Anthropic(
        api_key="t", base_url="http://provider.test", http_client=httpx.Client(transport=transport)
    )
    with client.messages.stream(
        model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        got = stream.get_final_message().to_dict()
    assert _prune(got, reply.message) == reply.message


# --------------------------------------------------------------------------------------------
# Malformed input
# --------------------------------------------------------------------------------------------

_START = (
    "message_start",
    {
        "type": "message_start",
        "message": {
            "id": "m",
            "type": "message",
            "role": "assistant",
            "model": "x",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        },
    },
)
_STOP = ("message_stop", {"type": "message_stop"})


def _block_start(i: int, block: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return "content_block_start", {
        "type": "content_block_start",
        "index": i,
        "content_block": block,
    }


def _block_stop(i: int) -> tuple[str, dict[str, Any]]:
    return "content_block_stop", {"type": "content_block_stop", "index": i}


_TEXT = {"type": "text", "text": ""}
_TOOL = {"type": "tool_use", "id": "t", "name": "n", "input": {}}

ANTHROPIC_MALFORMED = {
    "empty body": b"",
    "only comments": b": ping\n\n",
    "no message_start": sse(_block_start(0, _TEXT), _block_stop(0), _STOP),
    "two message_starts": sse(_START, _START, _STOP),
    "truncated": sse(_START, _block_start(0, _TEXT), _block_stop(0)),
    "block left open": sse(_START, _block_start(0, _TEXT), _STOP),
    "index gap": sse(_START, _block_start(1, _TEXT), _block_stop(1), _STOP),
    "delta to unknown block": sse(_START, _cbd(0, {"type": "text_delta", "text": "x"}), _STOP),
    "delta after stop": sse(
        _START, _block_start(0, _TEXT), _block_stop(0), _cbd(0, {"type": "text_delta", "text": "x"})
    ),
    "text delta to tool_use": sse(
        _START, _block_start(0, _TOOL), _cbd(0, {"type": "text_delta", "text": "x"})
    ),
    "unknown delta type": sse(
        _START, _block_start(0, _TEXT), _cbd(0, {"type": "sparkle_delta", "x": 1})
    ),
    "bad tool json": sse(
        _START,
        _block_start(0, _TOOL),
        _cbd(0, {"type": "input_json_delta", "partial_json": '{"a": '}),
        _block_stop(0),
        _STOP,
    ),
    "string index": sse(_START, ("content_block_start", {"index": "0", "content_block": _TEXT})),
    "invalid json": b"event: message_start\ndata: {nope\n\n",
    "data is not an object": sse(("message_start", [1, 2])),
    "event name and type disagree": sse(("message_start", {"type": "message_stop"})),
    "not utf-8": b'event: message_start\ndata: {"a": "\xff"}\n\n',
}


@pytest.mark.parametrize("case", sorted(ANTHROPIC_MALFORMED))
def test_malformed_anthropic(case: str) -> None:
    with pytest.raises(ResponseParseError) as e:
        parse_sse("anthropic", ANTHROPIC_MALFORMED[case])
    assert str(e.value)
    assert not isinstance(e.value, ProviderError)


def _oai_finish() -> tuple[None, dict[str, Any]]:
    return None, _oai_delta({}, "stop")


OPENAI_MALFORMED = {
    "empty body": b"",
    "no [DONE]": sse((None, _oai_delta({"role": "assistant", "content": "hi"})), _oai_finish()),
    "only [DONE]": sse((None, "[DONE]")),
    "no finish_reason": sse((None, _oai_delta({"content": "hi"})), (None, "[DONE]")),
    "tool call without index": sse(
        (None, _oai_delta({"tool_calls": [{"id": "c", "function": {"name": "f"}}]})),
        _oai_finish(),
        (None, "[DONE]"),
    ),
    "choices not a list": sse((None, _oai_chunk({"index": 0})), (None, "[DONE]")),  # type: ignore[arg-type]
    "invalid json": b'data: {"id": \n\ndata: [DONE]\n\n',
    "truncated [DONE]": sse(_oai_finish()) + b"data: [DON",
}


@pytest.mark.parametrize("case", sorted(OPENAI_MALFORMED))
def test_malformed_openai(case: str) -> None:
    with pytest.raises(ResponseParseError) as e:
        parse_sse("openai", OPENAI_MALFORMED[case])
    assert str(e.value)


def test_provider_errors_carry_their_payload() -> None:
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    with pytest.raises(ProviderError) as e:
        parse_sse("anthropic", sse(_START, ("ping", {"type": "ping"}), ("error", overloaded)))
    assert e.value.payload == overloaded
    with pytest.raises(ProviderError):
        parse_json("anthropic", json.dumps(overloaded).encode())
    oai = {"error": {"message": "boom", "type": "server_error", "param": None, "code": None}}
    with pytest.raises(ProviderError) as e:
        parse_sse("openai", sse((None, oai), (None, "[DONE]")))
    assert e.value.payload == oai
    with pytest.raises(ProviderError):
        parse_json("openai", json.dumps(oai).encode())


@pytest.mark.parametrize(
    ("dialect", "body"),
    [
        ("anthropic", b"not json"),
        ("anthropic", b"[]"),
        ("anthropic", b'{"type": "message", "content": "text"}'),
        ("anthropic", b'{"type": "message", "content": [{"text": "no type"}]}'),
        ("openai", b'{"choices": []}'),
        ("openai", b'{"choices": [{"message": null}]}'),
    ],
)
def test_malformed_json(dialect: str, body: bytes) -> None:
    with pytest.raises(ResponseParseError):
        parse_json(dialect, body)


def test_unknown_dialect() -> None:
    with pytest.raises(ValueError, match="dialect"):
        parse_sse("bedrock", b"")


def test_unknown_anthropic_events_are_ignored() -> None:
    body = sse(_START, ("shiny_new_event", {"type": "shiny_new_event", "x": 1}), _STOP)
    assert parse_sse("anthropic", body).message["content"] == []


# --------------------------------------------------------------------------------------------
# Calls, stripping, continuation turns, usage
# --------------------------------------------------------------------------------------------


def test_tool_calls() -> None:
    assert tool_calls(Reply("anthropic", ANTHROPIC_TOOL_MESSAGE)) == [
        Call(
            "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
            "get_weather",
            {"location": "San Francisco, CA", "unit": "°F"},
        ),
        Call("toolu_02", EXPAND, {"id": "k1"}),
        Call("toolu_03", "now", {}),
    ]
    assert tool_calls(Reply("openai", OPENAI_TOOL_COMPLETION)) == [
        Call("call_abc", "get_weather", {"location": "Paris ü"}),
        Call("call_def", EXPAND, {"id": "k1"}),
    ]
    broken = json.loads(json.dumps(OPENAI_TOOL_COMPLETION))
    broken["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = '{"location": '
    broken["choices"][0]["message"]["tool_calls"][1]["function"]["arguments"] = ""
    assert [c.input for c in tool_calls(Reply("openai", broken))] == ['{"location": ', {}]


def test_strip_calls_anthropic() -> None:
    reply = Reply("anthropic", ANTHROPIC_TOOL_MESSAGE)
    before = render_json(reply)
    some = strip_calls(reply, EXPAND)
    assert render_json(reply) == before  # the original is untouched
    assert [b.get("name") for b in some.message["content"]] == [None, None, "get_weather", "now"]
    assert some.message["stop_reason"] == "tool_use"
    only_ours = strip_calls(strip_calls(some, "get_weather"), "now")
    assert [b["type"] for b in only_ours.message["content"]] == ["thinking", "text"]
    assert only_ours.message["stop_reason"] == "end_turn"
    assert strip_calls(reply, "absent") == reply


def test_strip_calls_openai() -> None:
    reply = Reply("openai", OPENAI_TOOL_COMPLETION)
    some = strip_calls(reply, EXPAND)
    choice = some.message["choices"][0]
    assert [tc["id"] for tc in choice["message"]["tool_calls"]] == ["call_abc"]
    assert choice["finish_reason"] == "tool_calls"
    none = strip_calls(some, "get_weather")
    choice = none.message["choices"][0]
    assert "tool_calls" not in choice["message"]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == ""  # not null: a `stop` message's content is text
    assert reply.message == OPENAI_TOOL_COMPLETION
    # The stripped reply still renders to a stream the SDK reads.
    assert _prune(_openai_sdk(render_sse(none)), none.message) == none.message


def test_continuation_turns_anthropic() -> None:
    reply = Reply("anthropic", ANTHROPIC_TOOL_MESSAGE)
    turn = assistant_message(reply)
    assert turn == {"role": "assistant", "content": ANTHROPIC_TOOL_MESSAGE["content"]}
    assert turn["content"][0]["signature"] == "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrk"
    results = tool_results(
        "anthropic", [(c.id, f"result {i}") for i, c in enumerate(tool_calls(reply))]
    )
    assert results == [
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
                    "content": "result 0",
                },
                {"type": "tool_result", "tool_use_id": "toolu_02", "content": "result 1"},
                {"type": "tool_result", "tool_use_id": "toolu_03", "content": "result 2"},
            ],
        }
    ]
    messages = [{"role": "user", "content": "weather?"}, turn, *results]
    assert validate_shape(messages, "anthropic") == []
    blank = {**ANTHROPIC_TOOL_MESSAGE, "content": [{"type": "text", "text": " \n"}, _TOOL]}
    assert assistant_message(Reply("anthropic", blank))["content"] == [_TOOL]
    assert tool_results("anthropic", []) == []


def test_continuation_turns_openai() -> None:
    reply = Reply("openai", OPENAI_TOOL_COMPLETION)
    turn = assistant_message(reply)
    assert turn == {
        "role": "assistant",
        "content": None,
        "tool_calls": OPENAI_TOOL_COMPLETION["choices"][0]["message"]["tool_calls"],  # type: ignore[index]
    }
    results = tool_results("openai", [("call_abc", "sunny"), ("call_def", "the span")])
    assert results == [
        {"role": "tool", "tool_call_id": "call_abc", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_def", "content": "the span"},
    ]
    messages = [{"role": "user", "content": "weather?"}, turn, *results]
    assert validate_shape(messages, "openai") == []
    # Empty content beside tool calls goes back as null; the stream's index key is not sent.
    streamed = json.loads(json.dumps(OPENAI_TOOL_COMPLETION))
    msg = streamed["choices"][0]["message"]
    msg["content"] = ""
    msg["tool_calls"][0]["index"] = 0
    turn = assistant_message(Reply("openai", streamed))
    assert turn["content"] is None and "index" not in turn["tool_calls"][0]
    plain = assistant_message(Reply("openai", {"choices": [{"message": {"content": "hi"}}]}))
    assert plain == {"role": "assistant", "content": "hi"}


def test_sum_usage_anthropic() -> None:
    a = Reply(
        "anthropic",
        {"usage": {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 3}},
    )
    b = Reply(
        "anthropic",
        {
            "usage": {
                "input_tokens": 12,
                "output_tokens": 7,
                "cache_creation_input_tokens": 2,
                "cache_read_input_tokens": None,
                "service_tier": "standard",
            }
        },
    )
    total = sum_usage([a, b])
    assert total == {
        "input_tokens": 22,
        "output_tokens": 12,
        "cache_read_input_tokens": 3,
        "cache_creation_input_tokens": 2,
        "service_tier": "standard",
    }
    assert a.message["usage"]["input_tokens"] == 10  # inputs untouched
    assert sum_usage([]) == {}
    final = with_usage(Reply("anthropic", ANTHROPIC_TOOL_MESSAGE), total)
    assert final.message["usage"] == total
    assert ANTHROPIC_TOOL_MESSAGE["usage"] != total
    # message_start + message_delta carry the summed usage to the SDK.
    assert _anthropic_sdk(render_sse(final))["usage"] == total


def test_sum_usage_openai() -> None:
    a = Reply("openai", {"usage": OPENAI_USAGE})
    b = Reply(
        "openai",
        {
            "usage": {
                "prompt_tokens": 100,
                "completion_tokens": 3,
                "total_tokens": 103,
                "prompt_tokens_details": {"cached_tokens": 80},
            }
        },
    )
    assert sum_usage([a, b]) == {
        "prompt_tokens": 182,
        "completion_tokens": 20,
        "total_tokens": 202,
        "prompt_tokens_details": {"cached_tokens": 80, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
    }
    assert sum_usage([Reply("openai", {"choices": []})]) == {}
