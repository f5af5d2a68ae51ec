"""The official SDKs through a real `mitmdump -s cg_addon.py` with the `off` preset.

Each test captures the exact request the SDK's httpx client put on the wire and asserts the fake
provider received the same method, path, headers (but `host`) and body bytes, that the answer —
JSON or SSE — reaches the SDK intact, and that the decision record says `passed_through`.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.e2e.harness import (
    Capture,
    Proxy,
    assert_forwarded_unchanged,
    new_id,
    received,
)
from tests.e2e.sdk_sessions import sdk_client
from tests.support.fakeprovider import (
    DEFAULT_TEXT,
    FakeProvider,
    Reply,
    anthropic_error,
    openai_error,
)

pytestmark = pytest.mark.e2e

SYSTEM = 'You are terse. Ünïcödé, "quotes", </script> and emoji 🚀 survive byte-for-byte.'

ANTHROPIC_MESSAGES: list[Any] = [
    {"role": "user", "content": "List the files, please."},
    {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Running ls."},
            {"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {"command": "ls"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": "a.py\nb.py"},
            {"type": "text", "text": "Now summarize — briefly. ✓"},
        ],
    },
]

OPENAI_MESSAGES: list[Any] = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "List the files, please."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_01",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"command": "ls"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_01", "content": "a.py\nb.py"},
    {"role": "user", "content": "Now summarize — briefly. ✓"},
]


def _check(
    proxy: Proxy, provider: FakeProvider, capture: Capture, eid: str, dialect: str
) -> dict[str, Any]:
    assert_forwarded_unchanged(capture.only(), received(provider, eid))
    cg = proxy.records.cg(eid)
    assert cg["dialect"] == dialect
    assert cg["outcome"] == "passed_through"
    assert cg["reason"] == "no components in the pipeline"
    return cg


# -- anthropic -------------------------------------------------------------------------------


def test_anthropic_sync_create_reaches_provider_byte_identical(proxy, provider):
    capture, eid = Capture(), new_id()
    with httpx.Client(trust_env=False, event_hooks=capture.hooks()) as http:
        client = sdk_client("anthropic", proxy, http, key="sk-test")
        msg = client.messages.create(
            model="claude-test",
            max_tokens=64,
            system=SYSTEM,
            messages=ANTHROPIC_MESSAGES,
            extra_headers={"x-e2e-id": eid},
        )
    assert msg.content[0].type == "text"
    assert msg.content[0].text == DEFAULT_TEXT
    assert msg.stop_reason == "end_turn"
    cg = _check(proxy, provider, capture, eid, "anthropic")
    assert cg["messages_in"] == 3


def test_anthropic_sync_stream_arrives_whole_and_request_is_byte_identical(proxy, provider):
    capture, eid = Capture(), new_id()
    with httpx.Client(trust_env=False, event_hooks=capture.hooks()) as http:
        client = sdk_client("anthropic", proxy, http, key="sk-test")
        with client.messages.stream(
            model="claude-test",
            max_tokens=64,
            system=SYSTEM,
            messages=ANTHROPIC_MESSAGES,
            extra_headers={"x-e2e-id": eid},
        ) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
    assert text == DEFAULT_TEXT
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens > 0
    assert json.loads(capture.only().content)["stream"] is True
    _check(proxy, provider, capture, eid, "anthropic")


async def test_anthropic_async_create_and_stream_byte_identical(proxy, provider):
    for stream in (False, True):
        capture, eid = Capture(), new_id()
        async with httpx.AsyncClient(trust_env=False, event_hooks=capture.async_hooks()) as http:
            client = sdk_client("anthropic", proxy, http, key="sk-test")
            if stream:
                events = await client.messages.create(
                    model="claude-test",
                    max_tokens=64,
                    messages=ANTHROPIC_MESSAGES,
                    stream=True,
                    extra_headers={"x-e2e-id": eid},
                )
                kinds: list[str] = []
                parts: list[str] = []
                async for ev in events:
                    kinds.append(ev.type)
                    if ev.type == "content_block_delta" and ev.delta.type == "text_delta":
                        parts.append(ev.delta.text)
                text = "".join(parts)
                assert kinds[0] == "message_start"
                assert kinds[-1] == "message_stop"
            else:
                msg = await client.messages.create(
                    model="claude-test",
                    max_tokens=64,
                    messages=ANTHROPIC_MESSAGES,
                    extra_headers={"x-e2e-id": eid},
                )
                assert msg.content[0].type == "text"
                text = msg.content[0].text
        assert text == DEFAULT_TEXT
        _check(proxy, provider, capture, eid, "anthropic")


def test_anthropic_provider_error_reaches_sdk_unchanged(proxy, provider):
    provider.script(anthropic_error(400, "invalid_request_error", "messages.1: fake refusal"))
    capture, eid = Capture(), new_id()
    with httpx.Client(trust_env=False, event_hooks=capture.hooks()) as http:
        client = sdk_client("anthropic", proxy, http, key="sk-test")
        with pytest.raises(anthropic.BadRequestError, match=r"messages\.1: fake refusal"):
            client.messages.create(
                model="claude-test",
                max_tokens=64,
                messages=ANTHROPIC_MESSAGES,
                extra_headers={"x-e2e-id": eid},
            )
    _check(proxy, provider, capture, eid, "anthropic")
    assert proxy.records.wait(eid)["status"] == 400


# -- openai ----------------------------------------------------------------------------------


def test_openai_sync_create_reaches_provider_byte_identical(proxy, provider):
    capture, eid = Capture(), new_id()
    with httpx.Client(trust_env=False, event_hooks=capture.hooks()) as http:
        client = sdk_client("openai", proxy, http, key="sk-test")
        done = client.chat.completions.create(
            model="gpt-test", messages=OPENAI_MESSAGES, extra_headers={"x-e2e-id": eid}
        )
    assert done.choices[0].message.content == DEFAULT_TEXT
    assert done.choices[0].finish_reason == "stop"
    cg = _check(proxy, provider, capture, eid, "openai")
    assert cg["messages_in"] == 5


def test_openai_sync_stream_with_usage_arrives_whole(proxy, provider):
    capture, eid = Capture(), new_id()
    with httpx.Client(trust_env=False, event_hooks=capture.hooks()) as http:
        client = sdk_client("openai", proxy, http, key="sk-test")
        chunks = list(
            client.chat.completions.create(
                model="gpt-test",
                messages=OPENAI_MESSAGES,
                stream=True,
                stream_options={"include_usage": True},
                extra_headers={"x-e2e-id": eid},
            )
        )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == DEFAULT_TEXT
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    _check(proxy, provider, capture, eid, "openai")


async def test_openai_async_create_and_stream_byte_identical(proxy, provider):
    for stream in (False, True):
        capture, eid = Capture(), new_id()
        async with httpx.AsyncClient(trust_env=False, event_hooks=capture.async_hooks()) as http:
            client = sdk_client("openai", proxy, http, key="sk-test")
            if stream:
                chunks = await client.chat.completions.create(
                    model="gpt-test",
                    messages=OPENAI_MESSAGES,
                    stream=True,
                    extra_headers={"x-e2e-id": eid},
                )
                parts: list[str] = []
                async for c in chunks:
                    assert c.usage is None  # include_usage not asked for: no usage chunk
                    parts.extend(ch.delta.content or "" for ch in c.choices)
                text = "".join(parts)
            else:
                done = await client.chat.completions.create(
                    model="gpt-test", messages=OPENAI_MESSAGES, extra_headers={"x-e2e-id": eid}
                )
                text = done.choices[0].message.content or ""
        assert text == DEFAULT_TEXT
        _check(proxy, provider, capture, eid, "openai")


def test_openai_provider_500_reaches_sdk_unchanged(proxy, provider):
    provider.script(openai_error(500, "server_error", "fake overload"))
    capture, eid = Capture(), new_id()
    with httpx.Client(trust_env=False, event_hooks=capture.hooks()) as http:
        client = sdk_client("openai", proxy, http, key="sk-test")
        with pytest.raises(openai.InternalServerError, match="fake overload"):
            client.chat.completions.create(
                model="gpt-test", messages=OPENAI_MESSAGES, extra_headers={"x-e2e-id": eid}
            )
    _check(proxy, provider, capture, eid, "openai")


# -- SSE is streamed, not buffered -----------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/messages",
            b'{"model":"m","max_tokens":9,"stream":true,"messages":[{"role":"user","content":"hi"}]}',
        ),
        (
            "/v1/chat/completions",
            b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}',
        ),
    ],
    ids=["anthropic", "openai"],
)
def test_sse_reaches_client_before_provider_finishes(proxy, provider, path, body):
    """The provider holds the stream after its first text delta until the client has seen it."""
    gate = threading.Event()
    reply = Reply(gate=gate)
    provider.script(reply)
    eid = new_id()
    lines = []
    with (
        proxy.client() as c,
        c.stream("POST", path, content=body, headers={"x-e2e-id": eid}) as r,
    ):
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            lines.append(line)
            if "Hello" in line:  # the first text delta
                gate.set()
    assert gate.is_set(), "no text delta reached the client"
    assert not reply.gate_timed_out, "the proxy buffered the SSE stream until the provider finished"
    assert received(provider, eid).body == body
    assert proxy.records.cg(eid)["outcome"] == "passed_through"
    lines = [x for x in lines if x]
    assert lines[-1] in ("data: [DONE]", 'data: {"type":"message_stop"}')
