"""The expand loop on the Responses API, against an `httpx.MockTransport` upstream: the model's
output items (reasoning with its encrypted content included) and a `function_call_output` per
call appended to `input`, re-sent, and the final answer given back as JSON or as the event
stream the API sends; the client never sees a call to `context_guru_expand` nor the reasoning
item that came with it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from cg.expand import continuation
from cg.expand.tool import TOOL_NAME, resolve
from cg.state.records import stash_key
from cg.state.sqlite import SqliteStore
from cg.wire.answers import Reply, parse_json, parse_sse, tool_calls
from cg.wire.body import index_body
from cg.wire.dialects import RESPONSES
from tests.expand.test_continuation import HEADERS, KEY, Upstream, client
from tests.wire.test_responses_answers import EXEC, MESSAGE, REASONING, response

__all__ = ["client"]  # the fixture, imported for pytest
URL = "https://api.example.test/v1/responses"
SENT = (
    '{"model":"gpt-5.1-codex","input":[{"type":"message","role":"developer","content":'
    '[{"type":"input_text","text":"sys"}]},\n  {"type":"message","role":"user","content":'
    '[{"type":"input_text","text":"=== History Summary === <<cg:' + KEY + '>>"}]} ,'
    '{"type":"message","role":"user","content":[{"type":"input_text","text":"go ✓"}]}],'
    '"tools":[{"type":"function","name":"exec_command","parameters":{}}],'
    '"store":false,"include":["reasoning.encrypted_content"],"stream":STREAM}'
)


def expand_item(cid: str = "call_E1", key: str = KEY) -> dict[str, Any]:
    return {
        "id": f"fc_{cid}",
        "type": "function_call",
        "status": "completed",
        "arguments": json.dumps({"id": key}),
        "call_id": cid,
        "name": TOOL_NAME,
    }


def usage(n: int) -> dict[str, Any]:
    return {
        "input_tokens": 100 * n,
        "input_tokens_details": {"cached_tokens": 10 * n, "cache_write_tokens": 0},
        "output_tokens": n,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 101 * n,
    }


async def run(client: Any, up: Upstream, first: dict[str, Any], stream: bool) -> Any:
    body = SENT.replace("STREAM", "true" if stream else "false")
    return await continuation.run(
        client(up),
        URL,
        HEADERS,
        "responses",
        body,
        Reply("responses", first),
        stream,
        lambda key: f"EXPANDED[{key}]",
    )


def final(out: continuation.ContinuationResult) -> Reply:
    if out.content_type.startswith("text/event-stream"):
        return parse_sse("responses", out.body)
    return parse_json("responses", out.body)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_an_expand_only_answer_is_resolved_and_resent(client: Any, stream: bool) -> None:
    first = response([REASONING, expand_item()], usage=usage(1))
    up = Upstream("responses", response([MESSAGE], usage=usage(2)))
    out = await run(client, up, first, stream)

    (req,) = up.requests
    assert str(req.url) == URL
    sent = SENT.replace("STREAM", "true" if stream else "false").encode()
    # Every byte of the sent body up to its last input item is kept; the new items follow it.
    idx = index_body(req.content, RESPONSES)
    last = sent.rindex(b"]}],") + 2  # the end of the last item
    assert req.content[:last] == sent[:last]
    new = [json.loads(idx.source(i)) for i in range(3, len(idx.messages))]
    assert new == [
        REASONING,  # with its encrypted_content, as returned
        expand_item(),
        {"type": "function_call_output", "call_id": "call_E1", "output": f"EXPANDED[{KEY}]"},
    ]
    assert req.content.endswith(sent[sent.rindex(b"],") + 1 :])  # tools, store, … unchanged

    got = final(out)
    assert out.content_type.startswith("text/event-stream" if stream else "application/json")
    assert got.message["output"] == [MESSAGE]
    assert got.message["usage"]["input_tokens"] == 200  # the final round's input side
    assert got.message["usage"]["output_tokens"] == 3  # both rounds' output
    assert got.message["usage"]["total_tokens"] == 203
    assert [r.message["usage"]["input_tokens"] for r in out.replies] == [100, 200]
    assert out.rounds == 1 and out.log == [{"round": 1, "ids": [KEY]}]


async def test_a_granular_id_answers_one_input_item(client: Any, tmp_path: Path) -> None:
    """On the Responses API `KEY#N` is the N-th stashed input item: here a `function_call_output`
    (one tool output), not the call before it."""
    items = [
        '{"type":"message","role":"user","content":[{"type":"input_text","text":"list it"}]}',
        '{"type":"function_call","call_id":"c7","name":"exec_command","arguments":"{\\"cmd\\":\\"ls\\"}"}',
        '{"type":"function_call_output","call_id":"c7","output":"a.py\\nb.py"}',
    ]
    with SqliteStore(tmp_path / "cg.sqlite3") as st:
        key = stash_key(items)
        st.put_stash(key, "s1", items, "responses")
        up = Upstream("responses", response([MESSAGE], usage=usage(2)))
        out = await continuation.run(
            client(up),
            URL,
            HEADERS,
            "responses",
            SENT.replace("STREAM", "true"),
            Reply("responses", response([expand_item(key=f"{key}#3")], usage=usage(1))),
            True,
            lambda ident: resolve(st, ident, "s1"),
        )
    (req,) = up.requests
    idx = index_body(req.content, RESPONSES)
    result = json.loads(idx.source(len(idx.messages) - 1))
    assert result["type"] == "function_call_output" and result["call_id"] == "call_E1"
    assert result["output"] == (
        f"Message 3 of 3 that the summary <<cg:{key}>> replaced, verbatim (its original JSON):"
        f"\n\n{items[2]}"
    )
    assert items[1] not in result["output"]  # the call itself is not the third item
    assert out.rounds == 1 and out.log == [{"round": 1, "ids": [f"{key}#3"]}]


async def test_mixed_calls_go_back_without_ours_and_without_its_reasoning(client: Any) -> None:
    first = response([REASONING, expand_item(), {**REASONING, "id": "rs_2"}, EXEC])
    up = Upstream("responses")
    out = await run(client, up, first, True)
    assert up.requests == []  # the client must answer its own call: nothing re-sent
    got = final(out)
    assert [i["id"] for i in got.message["output"]] == ["rs_2", "fc_2"]
    assert [c.name for c in tool_calls(got)] == ["exec_command"]


async def test_the_loop_stops_after_three_resends_and_strips_the_last_call(client: Any) -> None:
    up = Upstream(
        "responses",
        *(response([REASONING, expand_item(f"call_{n}")], usage=usage(n)) for n in (2, 3, 4)),
    )
    out = await run(client, up, response([expand_item("call_1")], usage=usage(1)), False)
    assert len(up.requests) == 3 and out.rounds == 3
    got = final(out)
    assert got.message["output"] == []  # the expand call and its reasoning item, both gone
    assert not any(c.name == TOOL_NAME for c in tool_calls(got))


async def test_a_failed_round_returns_the_first_answer_stripped(client: Any) -> None:
    failed = response([], status="failed")
    failed["error"] = {"code": "server_error", "message": "boom"}
    bad = httpx.Response(200, json=failed)
    up = Upstream("responses", bad)
    out = await run(client, up, response([REASONING, expand_item()], usage=usage(1)), True)
    assert len(up.requests) == 1
    assert out.log[0]["error"].startswith("ProviderError")
    assert final(out).message["output"] == []


async def test_a_truncated_round_ends_the_loop(client: Any) -> None:
    from cg.wire.answers import render_sse

    whole = render_sse(Reply("responses", response([MESSAGE])))
    cut = whole[: whole.index(b"event: response.completed")]
    up = Upstream(
        "responses",
        httpx.Response(200, content=cut, headers={"content-type": "text/event-stream"}),
    )
    out = await run(client, up, response([expand_item()], usage=usage(1)), True)
    assert "truncated" in out.log[0]["error"]
    assert final(out).message["output"] == []
