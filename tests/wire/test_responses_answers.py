"""The `responses` dialect, answer side: a `response` parsed from JSON and from the event stream
as the API sends it, its calls read, the expand call stripped (with its reasoning), the items a
continuation appends, and the answer streamed back so the official SDK accumulates it whole."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai import omit
from openai._models import construct_type
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent

from cg.expand.continuation import append_messages, expand_ids
from cg.wire.answers import (
    ProviderError,
    Reply,
    ResponseParseError,
    assistant_messages,
    client_usage,
    parse_json,
    parse_sse,
    render_json,
    render_sse,
    strip_calls,
    tool_calls,
    tool_results,
)
from cg.wire.body import index_body
from cg.wire.dialects import RESPONSES
from cg.wire.reply import sse_events
from tests.support.strategies import SETTINGS, text

USAGE = {
    "input_tokens": 1200,
    "input_tokens_details": {"cached_tokens": 1024, "cache_write_tokens": 0},
    "output_tokens": 40,
    "output_tokens_details": {"reasoning_tokens": 12},
    "total_tokens": 1240,
}


def response(output: list[Any], usage: Any = USAGE, status: str = "completed") -> dict[str, Any]:
    """A `response` object with every top-level key the API sends."""
    return {
        "id": "resp_0a1b",
        "object": "response",
        "created_at": 1796040048,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "max_output_tokens": None,
        "model": "gpt-5.1-codex",
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage,
        "metadata": {},
    }


REASONING: dict[str, Any] = {
    "id": "rs_1",
    "type": "reasoning",
    "summary": [{"type": "summary_text", "text": "**Looking up** the stash."}],
    "encrypted_content": "gAAAAAbc",
}
EXPAND: dict[str, Any] = {
    "id": "fc_1",
    "type": "function_call",
    "status": "completed",
    "arguments": '{"id":"0123456789abcdef"}',
    "call_id": "call_X1",
    "name": "context_guru_expand",
}
EXEC: dict[str, Any] = {
    "id": "fc_2",
    "type": "function_call",
    "status": "completed",
    "arguments": '{"cmd": "ls ü"}',
    "call_id": "call_X2",
    "name": "exec_command",
}
CUSTOM: dict[str, Any] = {
    "id": "ctc_1",
    "type": "custom_tool_call",
    "status": "completed",
    "call_id": "call_C1",
    "name": "exec",
    "input": 'text("hi")',
}
MESSAGE: dict[str, Any] = {
    "id": "msg_1",
    "type": "message",
    "status": "completed",
    "role": "assistant",
    "content": [
        {"type": "output_text", "annotations": [], "logprobs": [], "text": "Done — 2 files ✓."}
    ],
}


def api_stream(resp: dict[str, Any]) -> bytes:
    """An event stream written the way the API writes one (obfuscation fields, sequence numbers,
    `response.in_progress`, a terminal event carrying the whole response), independently of
    the dialect's own renderer."""
    seq = iter(range(10_000))
    out: list[str] = []

    def ev(kind: str, **data: Any) -> None:
        out.append(
            f"event: {kind}\ndata: "
            + json.dumps({"type": kind, "sequence_number": next(seq), **data})
            + "\n\n"
        )

    start = {**resp, "status": "in_progress", "output": [], "usage": None}
    ev("response.created", response=start)
    ev("response.in_progress", response=start)
    for i, item in enumerate(resp["output"]):
        added = dict(item)
        if item["type"] == "message":
            added["content"] = []
        if item["type"] == "function_call":
            added["arguments"] = ""
        ev("response.output_item.added", output_index=i, item=added)
        if item["type"] == "function_call":
            for k in range(0, len(item["arguments"]), 5):
                ev(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=i,
                    delta=item["arguments"][k : k + 5],
                    obfuscation="xY",
                )
        if item["type"] == "message":
            part = item["content"][0]
            ev(
                "response.content_part.added",
                item_id=item["id"],
                output_index=i,
                content_index=0,
                part={**part, "text": ""},
            )
            ev(
                "response.output_text.delta",
                item_id=item["id"],
                output_index=i,
                content_index=0,
                delta=part["text"],
                logprobs=[],
                obfuscation="ab",
            )
        ev("response.output_item.done", output_index=i, item=item)
    ev("response.completed", response=resp)
    return "".join(out).encode()


def sdk_output(final: Response) -> list[Any]:
    """The SDK's output items as JSON, without the keys its parsing helpers add."""
    items: list[Any] = json.loads(final.to_json(exclude_unset=True))["output"]
    for item in items:
        item.pop("parsed_arguments", None)
        for part in item.get("content") or []:
            part.pop("parsed", None)
    return items


def sdk_final(body: bytes) -> Response:
    """What `client.responses.stream(...)`'s `get_final_response()` would give."""
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=omit, text_format=omit)
    for _name, data in sse_events(body):
        state.handle_event(construct_type(type_=ResponseStreamEvent, value=json.loads(data)))  # type: ignore[arg-type]
    final = state._completed_response
    assert final is not None
    return final


# -- parsing --------------------------------------------------------------------------------------


def test_a_json_answer_parses_to_itself() -> None:
    doc = response([REASONING, EXEC])
    reply = parse_json("responses", json.dumps(doc).encode())
    assert reply == Reply("responses", doc)


def test_an_api_stream_parses_to_the_json_answer() -> None:
    doc = response([REASONING, EXPAND, MESSAGE])
    assert parse_sse("responses", api_stream(doc)).message == doc


def test_a_terminal_event_without_output_takes_the_items_from_output_item_done() -> None:
    doc = response([REASONING, EXEC])
    raw = api_stream(doc).replace(
        json.dumps({"type": "response.completed", "sequence_number": 999}).encode(), b""
    )
    events = [json.loads(d) for _, d in sse_events(raw)]
    events[-1]["response"]["output"] = []
    raw = b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)
    assert parse_sse("responses", raw).message == doc


def test_a_truncated_stream_is_refused() -> None:
    raw = api_stream(response([MESSAGE]))
    cut = raw[: raw.index(b"event: response.completed")]
    with pytest.raises(ResponseParseError, match="truncated"):
        parse_sse("responses", cut)


@pytest.mark.parametrize(
    "raw",
    [
        b'event: error\ndata: {"type":"error","code":"server_error","message":"boom",'
        b'"param":null,"sequence_number":1}\n\n',
    ],
)
def test_an_error_event_is_the_providers_error(raw: bytes) -> None:
    with pytest.raises(ProviderError) as e:
        parse_sse("responses", raw)
    assert e.value.payload["message"] == "boom"


def test_a_failed_response_is_the_providers_error_and_an_incomplete_one_is_an_answer() -> None:
    failed = response([], status="failed")
    failed["error"] = {"code": "server_error", "message": "The model failed."}
    with pytest.raises(ProviderError):
        parse_sse("responses", api_stream(failed))
    with pytest.raises(ProviderError):
        parse_json("responses", json.dumps(failed).encode())
    with pytest.raises(ProviderError):
        parse_json("responses", b'{"error":{"message":"bad","type":"invalid_request_error"}}')
    inc = response([MESSAGE], status="incomplete")
    inc["incomplete_details"] = {"reason": "max_output_tokens"}
    raw = api_stream(inc).replace(b"response.completed", b"response.incomplete")
    assert parse_sse("responses", raw).message["status"] == "incomplete"


def test_not_a_responses_stream_or_body() -> None:
    with pytest.raises(ResponseParseError, match=r"no response\.created"):
        parse_sse("responses", b"data: {}\n\n")
    with pytest.raises(ResponseParseError, match=r"'object' is 'chat\.completion'"):
        parse_json("responses", b'{"object":"chat.completion","choices":[]}')


# -- calls, stripping, continuation items ---------------------------------------------------------


def test_tool_calls_reads_function_and_custom_calls() -> None:
    calls = tool_calls(Reply("responses", response([REASONING, EXPAND, EXEC, CUSTOM, MESSAGE])))
    assert [(c.id, c.name) for c in calls] == [
        ("call_X1", "context_guru_expand"),
        ("call_X2", "exec_command"),
        ("call_C1", "exec"),
    ]
    assert calls[0].input == {"id": "0123456789abcdef"}
    assert calls[2].input == 'text("hi")'


def test_expand_ids_only_when_every_call_is_ours() -> None:
    assert expand_ids(Reply("responses", response([REASONING, EXPAND]))) == [
        ("call_X1", "0123456789abcdef")
    ]
    assert expand_ids(Reply("responses", response([EXPAND, EXEC]))) is None


def test_stripping_the_expand_call_takes_its_reasoning_item_with_it() -> None:
    reply = Reply("responses", response([REASONING, EXPAND, REASONING | {"id": "rs_2"}, EXEC]))
    kept = strip_calls(reply, "context_guru_expand").message["output"]
    assert [i["id"] for i in kept] == ["rs_2", "fc_2"]
    assert reply.message["output"][0] is REASONING or reply.message["output"][0] == REASONING


def test_a_continuation_appends_every_output_item_then_the_outputs() -> None:
    reply = Reply("responses", response([REASONING, EXPAND]))
    items = [*assistant_messages(reply), *tool_results("responses", [("call_X1", "the span")])]
    assert items == [
        REASONING,
        EXPAND,
        {"type": "function_call_output", "call_id": "call_X1", "output": "the span"},
    ]
    sent = json.dumps({"model": "m", "input": [{"role": "user", "content": "go"}], "stream": True})
    body = append_messages("responses", sent, items)
    assert body.startswith(sent[: sent.index("]")])
    idx = index_body(body.encode(), RESPONSES)
    assert [v.kind for v in idx.views] == [
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
    ]
    assert body.endswith(', "stream": true}')


def test_the_client_is_told_the_final_rounds_input_and_the_summed_output() -> None:
    first = Reply("responses", response([EXPAND]))
    second_usage = {**USAGE, "input_tokens": 1500, "output_tokens": 10, "total_tokens": 1510}
    second = Reply("responses", response([MESSAGE], usage=second_usage))
    got = client_usage([first, second])
    assert got["input_tokens"] == 1500
    assert got["input_tokens_details"] == {"cached_tokens": 1024, "cache_write_tokens": 0}
    assert got["output_tokens"] == 50
    assert got["total_tokens"] == 1550
    assert got["output_tokens_details"] == {"reasoning_tokens": 24}


# -- rendering ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "output",
    [[MESSAGE], [REASONING, EXEC], [REASONING, CUSTOM], [REASONING, MESSAGE, EXEC], []],
    ids=["text", "reasoning+call", "custom", "mixed", "empty"],
)
def test_the_rendered_stream_round_trips_and_the_sdk_accumulates_it_whole(
    output: list[Any],
) -> None:
    doc = response(output)
    raw = render_sse(Reply("responses", doc))
    assert parse_sse("responses", raw).message == doc
    final = sdk_final(raw)
    assert sdk_output(final) == doc["output"]
    assert final.usage is not None and final.usage.input_tokens == 1200
    kinds = [json.loads(d)["type"] for _, d in sse_events(raw)]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    seqs = [json.loads(d)["sequence_number"] for _, d in sse_events(raw)]
    assert seqs == list(range(len(seqs)))


def test_the_rendered_stream_announces_each_item_empty_then_done() -> None:
    raw = render_sse(Reply("responses", response([MESSAGE, EXEC])))
    events = [json.loads(d) for _, d in sse_events(raw)]
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    assert added[0]["content"] == [] and added[0]["status"] == "in_progress"
    assert added[1]["arguments"] == ""
    deltas = "".join(
        e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"
    )
    assert deltas == EXEC["arguments"]
    text_ = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text_ == MESSAGE["content"][0]["text"]
    assert events[0]["response"]["usage"] is None and events[0]["response"]["output"] == []


def test_an_incomplete_response_renders_as_response_incomplete() -> None:
    inc = response([MESSAGE], status="incomplete")
    raw = render_sse(Reply("responses", inc))
    assert json.loads(list(sse_events(raw))[-1][1])["type"] == "response.incomplete"


def test_render_json_is_the_response_object() -> None:
    doc = response([MESSAGE])
    assert json.loads(render_json(Reply("responses", doc))) == doc
    assert Response.model_validate(json.loads(render_json(Reply("responses", doc)))).output_text


@SETTINGS
@given(st.lists(text, min_size=1, max_size=3), st.lists(text, max_size=3))
def test_any_text_and_arguments_survive_rendering(texts: list[str], args: list[str]) -> None:
    output: list[Any] = [
        {**MESSAGE, "id": f"msg_{n}", "content": [{**MESSAGE["content"][0], "text": t}]}
        for n, t in enumerate(texts)
    ]
    output += [
        {**EXEC, "id": f"fc_{n}", "call_id": f"c{n}", "arguments": json.dumps({"x": a})}
        for n, a in enumerate(args)
    ]
    doc = response(output)
    raw = render_sse(Reply("responses", doc))
    assert parse_sse("responses", raw).message == doc
    assert sdk_output(sdk_final(raw)) == output
