"""cg.expand.stream: an answer passes through event by event, byte for byte, up to the event
that begins a call to our tool; `rest` completes the stream from a continuation's answer."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cg.expand.stream import ExpandGate, rest
from cg.expand.tool import TOOL_NAME
from cg.wire.answers import Reply, parse_sse, render_sse, strip_calls, tool_calls

CALL = {"id": "0123456789abcdef01234567"}


def anthropic(text: str, calls: list[tuple[str, str]], n: int = 1) -> Reply:
    content: list[Any] = [{"type": "text", "text": text}]
    content += [{"type": "tool_use", "id": i, "name": nm, "input": CALL} for i, nm in calls]
    return Reply(
        "anthropic",
        {
            "id": f"msg_{n}",
            "type": "message",
            "role": "assistant",
            "model": "m",
            "content": content,
            "stop_reason": "tool_use" if calls else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 10 * n, "output_tokens": n},
        },
    )


def openai(text: str, calls: list[tuple[str, str]], n: int = 1) -> Reply:
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        msg["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": nm, "arguments": '{"id":"x"}'}}
            for i, nm in calls
        ]
    return Reply(
        "openai",
        {
            "id": f"chatcmpl-{n}",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": msg,
                    "finish_reason": "tool_calls" if calls else "stop",
                }
            ],
        },
    )


def feed(gate: ExpandGate, body: bytes, cuts: list[int]) -> bytes:
    out = b""
    last = 0
    for c in [*sorted({c % (len(body) + 1) for c in cuts}), len(body)]:
        out += gate.feed(body[last:c])
        last = c
    return out + gate.finish()


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["anthropic", "openai"]), st.lists(st.integers(0, 10_000), max_size=12))
def test_an_answer_without_our_call_passes_byte_for_byte(dialect, cuts):
    make = anthropic if dialect == "anthropic" else openai
    # It even mentions the tool's name, in text.
    body = render_sse(make(f"I will not call {TOOL_NAME} now.", [("c1", "Bash")]))
    gate = ExpandGate(dialect)
    assert feed(gate, body, cuts) == body
    assert not gate.holding


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["anthropic", "openai"]), st.lists(st.integers(0, 10_000), max_size=12))
def test_an_answer_is_held_from_our_call_on(dialect, cuts):
    make = anthropic if dialect == "anthropic" else openai
    first = make("Looking closer.", [("c1", TOOL_NAME)])
    body = render_sse(first)
    gate = ExpandGate(dialect)
    sent = feed(gate, body, cuts)
    assert gate.holding and gate.at == (1 if dialect == "anthropic" else 0)
    assert gate.at is not None
    assert TOOL_NAME.encode() not in sent
    assert b"Looking closer." in sent
    assert body.startswith(sent)
    assert sent + gate.held_bytes() == body
    assert bytes(gate.whole) == body

    # A continuation round answered: the stream completes as one message.
    final = make("The answer.", [], 2)
    whole = parse_sse(dialect, sent + rest(first, final, 1, gate.at, gate.seq))
    assert TOOL_NAME not in str(whole.message)
    if dialect == "anthropic":
        assert [b["text"] for b in whole.message["content"]] == ["Looking closer.", "The answer."]
        assert whole.message["stop_reason"] == "end_turn"
    else:
        choice = whole.message["choices"][0]
        assert choice["message"]["content"] == "Looking closer.The answer."
        assert choice["finish_reason"] == "stop"
        assert whole.message["id"] == "chatcmpl-1"


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["anthropic", "openai"]), st.lists(st.integers(0, 10_000), max_size=8))
def test_a_call_spelling_our_name_with_escapes_is_held_too(dialect, cuts):
    """The gate finds our call however JSON spells the name (`names_tool`, as the buffered
    path does): an escaped name must not reach the client either."""
    make = anthropic if dialect == "anthropic" else openai
    body = render_sse(make("Looking closer.", [("c1", TOOL_NAME)]))
    escaped = body.replace(TOOL_NAME.encode(), rb"context\u005Fguru_expand")
    assert escaped != body and TOOL_NAME.encode() not in escaped  # vacuity guard
    gate = ExpandGate(dialect)
    sent = feed(gate, escaped, cuts)
    assert gate.holding and b"u005F" not in sent and b"Looking closer." in sent


def test_mixed_calls_keep_the_clients_own_call():
    for dialect, make in (("anthropic", anthropic), ("openai", openai)):
        first = make("Both.", [("c1", TOOL_NAME), ("c2", "Bash")])
        body = render_sse(first)
        gate = ExpandGate(dialect)
        sent = gate.feed(body)
        assert gate.holding and gate.at is not None
        whole = parse_sse(
            dialect, sent + rest(first, strip_calls(first, TOOL_NAME), 0, gate.at, gate.seq)
        )
        assert [c.name for c in tool_calls(whole)] == ["Bash"]
        assert TOOL_NAME not in str(whole.message)


def responses(items: list[dict[str, Any]], n: int = 1) -> Reply:
    return Reply(
        "responses",
        {
            "id": f"resp_{n}",
            "object": "response",
            "created_at": 1,
            "status": "completed",
            "model": "m",
            "output": items,
            "usage": {"input_tokens": 10 * n, "output_tokens": n, "total_tokens": 11 * n},
        },
    )


REASONING = {"id": "rs_1", "type": "reasoning", "summary": [], "encrypted_content": "gAAA"}


def call(name: str, cid: str) -> dict[str, Any]:
    return {
        "id": f"fc_{cid}",
        "type": "function_call",
        "status": "completed",
        "call_id": cid,
        "name": name,
        "arguments": '{"id":"x"}',
    }


def message(text: str, mid: str = "msg_1") -> dict[str, Any]:
    return {
        "id": mid,
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 10_000), max_size=12))
def test_a_responses_reasoning_item_goes_with_our_call(cuts):
    """Held from the reasoning item right before our call: the client never holds a reasoning
    item whose successor it will not see (it would re-send it alone, and be refused)."""
    first = responses([message("Let me look."), REASONING, call(TOOL_NAME, "c1")])
    body = render_sse(first)
    gate = ExpandGate("responses")
    sent = feed(gate, body, cuts)
    assert gate.holding and gate.at == 1
    assert b"Let me look." in sent and b"rs_1" not in sent and TOOL_NAME.encode() not in sent
    final = responses([message("The answer.", "msg_2")], 2)
    whole = parse_sse("responses", sent + rest(first, final, 1, gate.at, gate.seq))
    assert [i["type"] for i in whole.message["output"]] == ["message", "message"]
    assert whole.message["id"] == "resp_1"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 10_000), max_size=12))
def test_a_responses_reasoning_item_before_anything_else_passes(cuts):
    body = render_sse(responses([REASONING, message(f"No {TOOL_NAME} call.")]))
    gate = ExpandGate("responses")
    assert feed(gate, body, cuts) == body
    assert not gate.holding
