"""Asking one probe (cg/eval/ask.py): the request each dialect gets in each condition, and the
answer read back from the fake model (tests/support/prober.py), expand rounds included."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cg.eval.ask import Answer, Budget, Condition, Endpoint, ask, client, endpoint, probe_body
from cg.eval.probes import correct
from cg.wire.body import index_body
from cg.wire.dialects import DIALECTS
from cg.wire.shape import validate_index
from tests.support.fakeprovider import FakeProvider
from tests.support.prober import Prober
from tests.support.strategies import DIALECT_NAMES, messages
from tests.support.strategies import Dialect as StDialect

Q = "Which file did the 1st call of the `Read` tool (counting …) touch? Answer with the path only."
KEY = "sk-test-ask-key"


def _anthropic(last_user: Any) -> bytes:
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 100,
        "stream": True,
        "tools": [{"name": "Read", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any"},
        "messages": [
            {"role": "user", "content": "Read the parser file, please, and then fix it"},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "t1",
                        "name": "Read",
                        "input": {"file_path": "/p.py"},
                    }
                ],
            },
            last_user,
        ],
    }
    return json.dumps(body).encode()


RESULT = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}]}


def test_anthropic_the_question_follows_the_last_user_turn_as_its_own() -> None:
    """The question is the dialect's new user message after the transcript (the API combines
    it with a user turn before it, as it does any consecutive turns of one role)."""
    doc = json.loads(probe_body("anthropic", _anthropic(RESULT), Q, "original"))
    assert len(doc["messages"]) == 4
    assert doc["messages"][-2] == RESULT
    last = doc["messages"][-1]
    assert last["role"] == "user" and Q in last["content"]
    assert doc["stream"] is False and doc["tool_choice"] == {"type": "none"}
    assert [t["name"] for t in doc["tools"]] == ["Read"]  # not offered: no expand
    after = json.loads(
        probe_body("anthropic", _anthropic({"role": "assistant", "content": "ok"}), Q, "rewritten")
    )
    assert after["messages"][-1]["role"] == "user" and len(after["messages"]) == 4


def test_expand_allowed_declares_the_tool_once_and_lets_the_model_choose() -> None:
    doc = json.loads(probe_body("anthropic", _anthropic(RESULT), Q, "rewritten+expand", "m2"))
    assert doc["tool_choice"] == {"type": "auto"} and doc["model"] == "m2"
    names = [t["name"] for t in doc["tools"]]
    assert names == ["Read", "context_guru_expand"]
    again = probe_body("anthropic", json.dumps(doc).encode(), Q, "rewritten+expand")
    assert [t["name"] for t in json.loads(again)["tools"]] == names


def test_openai_and_responses_append_a_user_turn_of_their_own() -> None:
    chat = {
        "model": "gpt-5",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hello there, what is up"}],
    }
    doc = json.loads(probe_body("openai", json.dumps(chat).encode(), Q, "original"))
    assert doc["messages"][-1] == {"role": "user", "content": doc["messages"][-1]["content"]}
    assert Q in doc["messages"][-1]["content"] and len(doc["messages"]) == 2
    assert "stream_options" not in doc and "tool_choice" not in doc  # no tools: no choice
    resp = {
        "model": "gpt-5",
        "input": [{"type": "message", "role": "user", "content": "hi"}],
        "tools": [{"type": "function", "name": "shell", "parameters": {}}],
    }
    doc = json.loads(probe_body("responses", json.dumps(resp).encode(), Q, "rewritten+expand"))
    last = doc["input"][-1]
    assert last["type"] == "message" and last["content"][0]["type"] == "input_text"
    assert doc["tool_choice"] == "auto"
    assert [t["name"] for t in doc["tools"]] == ["shell", "context_guru_expand"]


def test_the_endpoint_takes_the_key_from_the_dialect_s_variable() -> None:
    ep = endpoint("openai", "http://h/v1", {"OPENAI_API_KEY": KEY})
    assert ep.url == "http://h/v1/chat/completions"
    assert ep.headers({"x-api-key": "agent's", "OpenAI-Project": "p"}) == {
        "openai-project": "p",
        "content-type": "application/json",
        "x-context-guru-bypass": "1",
        "authorization": f"Bearer {KEY}",
    }
    a = endpoint("anthropic", None, {"ANTHROPIC_API_KEY": KEY})
    assert a.url == "https://api.anthropic.com/v1/messages"
    assert a.headers({"anthropic-version": "2099-01-01"})["anthropic-version"] == "2099-01-01"
    assert a.headers({})["x-api-key"] == KEY
    betas = a.headers({"anthropic-beta": "oauth-2025-04-20,context-1m-2025-08-07"})
    assert betas["anthropic-beta"] == "context-1m-2025-08-07"
    assert "anthropic-beta" not in a.headers({"anthropic-beta": "oauth-2025-04-20"})
    with pytest.raises(ValueError, match="ANTHROPIC_API_KEY"):
        endpoint("anthropic", None, {"OPENAI_API_KEY": KEY})
    assert a.redact(f"bad key {KEY}!") == "bad key [key]!"


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with FakeProvider() as p:
        p.responder = Prober()
        yield p


def _summarized(dialect: str) -> tuple[bytes, str]:
    """A request whose call of Read a summary (marker <<cg:abc>>) replaced, and the expand
    tool's answer for it: the replaced messages, `[KEY#N] {json}` each."""
    summary = (
        "=== History Summary ===\n<summary>Read a file.</summary> <<cg:0123456789abcdef01234567>>"
    )
    if dialect == "anthropic":
        call = {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "/p.py"}}
            ],
        }
        body: dict[str, Any] = {
            "model": "m",
            "max_tokens": 10,
            "messages": [{"role": "user", "content": summary}],
            "tools": [{"name": "Read", "input_schema": {}}],
        }
    elif dialect == "openai":
        call = {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "Read", "arguments": json.dumps({"file_path": "/p.py"})},
                }
            ],
        }
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": summary}],
            "tools": [{"type": "function", "function": {"name": "Read"}}],
        }
    else:
        call = {
            "type": "function_call",
            "call_id": "t1",
            "name": "Read",
            "arguments": json.dumps({"file_path": "/p.py"}),
        }
        body = {
            "model": "m",
            "input": [
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": summary}],
                }
            ],
            "tools": [{"type": "function", "name": "Read", "parameters": {}}],
        }
    key = "0123456789abcdef01234567"
    stash = f"The 1 messages that the summary replaced, verbatim:\n\n[{key}#1] {json.dumps(call)}"
    return json.dumps(body).encode(), stash


def _ask(fake: FakeProvider, dialect: str, body: bytes, condition: Condition, stash: str) -> Answer:
    ep = endpoint(dialect, fake.url, {"ANTHROPIC_API_KEY": KEY, "OPENAI_API_KEY": KEY})
    req = probe_body(dialect, body, Q, condition)

    async def go() -> Answer:
        async with client(Budget(None)) as http:
            return await ask(http, ep, {}, req, condition, lambda key: stash, asyncio.Semaphore(1))

    return asyncio.run(go())


@pytest.mark.parametrize("dialect", ["anthropic", "openai", "responses"])
def test_expand_allowed_recovers_what_the_summary_replaced(
    fake: FakeProvider, dialect: str
) -> None:
    body, stash = _summarized(dialect)
    lost = _ask(fake, dialect, body, "rewritten", stash)
    assert lost.error is None and not correct("/p.py", lost.text)
    assert lost.calls == 1 and lost.usage.requests == 1 and lost.usage.input_tokens > 0
    back = _ask(fake, dialect, body, "rewritten+expand", stash)
    assert back.error is None and correct("/p.py", back.text), back
    assert back.expanded == ["0123456789abcdef01234567"] and back.calls == 2
    assert back.usage.requests == 2 and back.usage.input_tokens > lost.usage.input_tokens
    assert all(r.json()["stream"] is False for r in fake.requests)


def test_an_endpoint_that_does_not_answer_is_an_error() -> None:
    body, stash = _summarized("anthropic")
    with FakeProvider() as gone:
        url = gone.url
    ep = Endpoint("anthropic", url + "/v1/messages", KEY)

    async def go() -> Answer:
        async with client(Budget(None)) as http:
            req = probe_body("anthropic", body, Q, "original")
            return await ask(http, ep, {}, req, "original", lambda k: stash, asyncio.Semaphore(1))

    got = asyncio.run(go())
    assert got.error is not None and "ConnectError" in got.error and KEY not in got.error
    assert got.calls == 1 and got.text == ""


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(DIALECT_NAMES), st.data())
def test_the_question_breaks_no_shape_rule_and_leaves_every_other_message(
    dialect: StDialect, data: st.DataObject
) -> None:
    msgs = data.draw(messages(dialect, 0, 4))
    body = json.dumps({"model": "m", "max_tokens": 5, "messages": msgs}).encode()
    before = {v.rule for v in validate_index(index_body(body, DIALECTS[dialect]))}
    new = probe_body(dialect, body, Q, "rewritten")
    after = {v.rule for v in validate_index(index_body(new, DIALECTS[dialect]))}
    assert after <= before
    sent = json.loads(new)["messages"]
    end = len(msgs)
    while dialect == "anthropic" and end and msgs[end - 1]["role"] == "system":
        end -= 1  # system messages that end the array stay at the end
    tail = msgs[end:]
    if end and msgs[end - 1]["role"] == "assistant" and msgs[end - 1]["content"] in ("", []):
        end -= 1  # an empty prefill, legal only at the end, is left out
    head = msgs[:end]
    assert sent[len(sent) - len(tail) :] == tail
    sent = sent[: len(sent) - len(tail)]
    joined = len(sent) == len(head)  # the question joined the last user turn (Anthropic)
    assert sent[: len(head) - joined] == head[: len(head) - joined]
    last = sent[-1]
    assert last["role"] == "user"
    text = last["content"] if isinstance(last["content"], str) else last["content"][-1]["text"]
    assert Q in text
    if joined:
        old = head[-1]["content"]
        blocks = old if isinstance(old, list) else [{"type": "text", "text": old}] if old else []
        assert last["content"][:-1] == blocks
