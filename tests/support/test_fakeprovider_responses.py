"""The fake provider speaks the Responses API as the official `openai` SDK expects it — JSON and the
event stream, usage from its prompt-cache model (OpenAI-style automatic caching) — and answers
400, in the API's words, to an input whose calls, outputs or reasoning items do not pair."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.support.fakeprovider import DEFAULT_TEXT, FakeProvider, Reply, responses_problem
from tests.support.promptcache import MIN_TOKENS, Clock, responses_units

BIG = " ".join(f"word{i}" for i in range(1500))  # well past the 1,024-token cache floor


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with FakeProvider(clock=Clock()) as p:
        yield p


def client(fake: FakeProvider) -> openai.OpenAI:
    http = httpx.Client(trust_env=False)
    return openai.OpenAI(api_key="sk-x", base_url=f"{fake.url}/v1", http_client=http, max_retries=0)


def post(fake: FakeProvider, body: Any) -> httpx.Response:
    with httpx.Client(trust_env=False, timeout=10) as http:
        return http.post(f"{fake.url}/v1/responses", json=body)


def test_create_and_stream_through_the_sdk(fake: FakeProvider) -> None:
    with client(fake) as c:
        created_and_streamed(c, fake)


def created_and_streamed(c: openai.OpenAI, fake: FakeProvider) -> None:
    items: list[Any] = [{"role": "developer", "content": BIG}, {"role": "user", "content": "hi"}]
    done = c.responses.create(model="gpt-test", input=items, store=False)
    assert done.output_text == DEFAULT_TEXT and done.status == "completed"
    assert done.usage is not None and done.usage.input_tokens_details.cached_tokens == 0
    with c.responses.stream(model="gpt-test", input=items, store=False) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert "".join(deltas) == DEFAULT_TEXT == final.output_text
    assert final.usage is not None
    # The second request repeats the first's prefix: read back from the cache, in 128-token steps.
    cached = final.usage.input_tokens_details.cached_tokens
    assert cached >= MIN_TOKENS and (cached - MIN_TOKENS) % 128 == 0
    assert final.usage.input_tokens == done.usage.input_tokens
    assert [b.bill.read for b in fake.billed] == [0, cached]


def test_the_event_stream_is_numbered_and_ends_in_response_completed(fake: FakeProvider) -> None:
    body = {"model": "m", "input": "hi", "stream": True}
    r = post(fake, body)
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    names = [line[7:] for line in r.text.splitlines() if line.startswith("event: ")]
    assert names == [e["type"] for e in events]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert names[0] == "response.created" and names[-1] == "response.completed"
    assert events[-1]["response"]["usage"]["total_tokens"] > 0


def test_a_scripted_usage_replaces_the_billed_one(fake: FakeProvider) -> None:
    usage = {"input_tokens": 7, "output_tokens": 1, "total_tokens": 8}
    fake.script(Reply(usage=usage), Reply(usage=usage))
    for stream in (False, True):
        r = post(fake, {"model": "m", "input": "x", "stream": stream})
        text = r.text
        last = json.loads(text) if not stream else json.loads(text.splitlines()[-2][6:])
        got = last["usage"] if not stream else last["response"]["usage"]
        assert got == usage


CALL = {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c1"}
OUT = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
RS = {"type": "reasoning", "id": "rs_9", "summary": [], "encrypted_content": "x"}
USER = {"role": "user", "content": "go"}


@pytest.mark.parametrize(
    "items,message",
    [
        ([USER, CALL], "No tool output found for function call c1."),
        ([USER, OUT], "No tool call found for function call output with call_id c1."),
        (
            [USER, {**CALL, "type": "custom_tool_call", "input": "x"}],
            "No tool output found for custom tool call c1.",
        ),
        (
            [USER, RS, USER],
            "Item 'rs_9' of type 'reasoning' was provided without its required following item.",
        ),
        (
            [USER, RS],
            "Item 'rs_9' of type 'reasoning' was provided without its required following item.",
        ),
        ([USER, RS, CALL, OUT], None),
        ([USER, RS, {"type": "message", "role": "assistant", "content": "x"}], None),
    ],
)
def test_the_api_s_400s_for_broken_pairs(
    fake: FakeProvider, items: list[Any], message: str | None
) -> None:
    assert responses_problem({"input": items}) == message
    r = post(fake, {"model": "m", "input": items})
    if message is None:
        assert r.status_code == 200
        return
    assert r.status_code == 400
    assert r.json() == {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": "input",
            "code": None,
        }
    }
    with client(fake) as c, pytest.raises(openai.BadRequestError, match=r"No tool|reasoning"):
        c.responses.create(model="m", input=items)


def test_units_render_tools_instructions_then_items() -> None:
    body = {
        "model": "m",
        "tools": [{"type": "function", "name": "f"}],
        "instructions": "be brief",
        "input": [USER, CALL, OUT],
    }
    r = responses_units(body)
    assert [next(iter(u.value)) for u in r.units] == [
        "tool",
        "instructions",
        "item",
        "item",
        "item",
    ]
    longer = responses_units({**body, "input": [USER, CALL, OUT, USER]})
    assert longer.keys[:5] == r.keys  # a grown input repeats the prefix
    moved = responses_units({**body, "prompt_cache_key": "other"})
    assert moved.keys[0] != r.keys[0]  # the key scopes the cache
