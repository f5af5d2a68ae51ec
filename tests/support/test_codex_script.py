"""The Responses oracle (tests/support/responses_api.py) and the scripted Codex model
(tests/support/codex_script.py): what they send is what the API sends, and they refuse what it refuses.

The stream and the JSON are read back with the official `openai` SDK's own types, and the rules
are checked against real Codex 0.169.0 requests (tests/fixtures/codex-0.169.0/): a valid
history breaks none of them.
"""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel

from tests.support import responses_api as api
from tests.support.codex_script import CodexScript, Step, is_compaction, request_kind, session
from tests.support.fakeprovider import Recorded

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "codex-0.169.0"
# The SDK's model of each event, by its `type`.
EVENTS: dict[str, type[BaseModel]] = {
    typing.get_args(m.model_fields["type"].annotation)[0]: m
    for m in typing.get_args(typing.get_args(ResponseStreamEvent)[0])
}


def fixture(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    return doc


def recorded(doc: dict[str, Any]) -> Recorded:
    return Recorded(
        doc["method"], doc["path"], [tuple(h) for h in doc["headers"]], doc["body"].encode()
    )


def sample() -> dict[str, Any]:
    items = [
        api.reasoning_item("rs_1", "**Plan**\n\nRun it.", "gAAAAAenc"),
        api.message_item("msg_1", "Running the command now."),
        api.function_call_item("fc_1", "call_1", "exec_command", '{"cmd":"echo hi"}'),
    ]
    response: dict[str, Any] = api.response_object(
        "resp_1", "my-local-model", items, api.usage(1200, 40), {}
    )
    return response


def parse_sse(frames: list[str]) -> list[dict[str, Any]]:
    out = []
    for frame in frames:
        lines = frame.rstrip("\n").split("\n")
        assert lines[0].startswith("event: ") and lines[1].startswith("data: "), frame
        data = json.loads(lines[1][len("data: ") :])
        assert data["type"] == lines[0][len("event: ") :]
        out.append(data)
    return out


# -- the wire format ------------------------------------------------------------------------------


def test_the_response_json_is_a_response_as_the_sdk_reads_it():
    response = Response.model_validate(sample())
    assert [item.type for item in response.output] == ["reasoning", "message", "function_call"]
    assert response.usage is not None and response.usage.total_tokens == 1240


def test_the_stream_is_the_apis_event_sequence_and_rebuilds_the_response():
    events = parse_sse(list(api.stream_frames(sample())))
    for e in events:
        EVENTS[e["type"]].model_validate(e)  # every event is one the SDK knows, with its fields
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["response"]["usage"] is None and events[0]["response"]["output"] == []
    for needed in (
        "response.reasoning_summary_text.delta",
        "response.output_text.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
    ):
        assert needed in kinds
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert done == sample()["output"] and len(added) == 3
    args = "".join(e["delta"] for e in events if e["type"].endswith("arguments.delta"))
    assert args == '{"cmd":"echo hi"}'
    final = events[-1]["response"]
    assert final["output"] == done and final["usage"]["input_tokens"] == 1200


# -- what the API refuses -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "first.json",
        "middle.json",
        "resumed_last.json",
        "default_model_additional_tools.json",
        "own_compaction_call.json",
        "after_own_compaction.json",
    ],
)
def test_real_codex_requests_break_no_rule(name):
    assert api.input_problems(json.loads(fixture(name)["body"])["input"]) == []


def test_the_rules_in_the_apis_words():
    items = json.loads(fixture("middle.json")["body"])["input"]
    calls = [i for i, x in enumerate(items) if x["type"] == "function_call"]
    outs = [i for i, x in enumerate(items) if x["type"] == "function_call_output"]
    rs = [i for i, x in enumerate(items) if x["type"] == "reasoning"]
    unanswered = items[: outs[0]]
    cid = items[calls[0]]["call_id"]
    assert api.input_problems(unanswered) == [f"No tool output found for function call {cid}."]
    orphan = items[: calls[0]] + items[calls[0] + 1 :]
    assert api.input_problems(orphan) == [
        f"No tool call found for function call output with call_id {cid}."
    ]
    alone = items[: rs[1] + 1]  # a reasoning item with nothing after it
    assert api.input_problems(alone) == [
        f"Item '{items[rs[1]]['id']}' of type 'reasoning' was provided without its required "
        "following item."
    ]
    summary = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "s"}]}
    cut = [*items[: rs[1] + 1], summary, *items[rs[1] + 1 :]]  # a message between them
    assert len(api.input_problems(cut)) == 1


# -- the script ----------------------------------------------------------------------------------


def request(items: list[Any], *, stream: bool = True, tools: list[Any] | None = None) -> Recorded:
    body = {"model": "m", "input": items, "stream": stream, "tools": tools or [], "store": False}
    return Recorded("POST", "/v1/responses", [], json.dumps(body).encode())


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def answer_items(script: CodexScript, items: list[Any], stream: bool = False) -> list[Any]:
    reply = script(request(items, stream=stream))
    assert reply is not None and reply.status == 200, reply
    if stream:
        assert reply.frames is not None
        events = parse_sse([f.decode() for f in reply.frames])
        return list(events[-1]["response"]["output"])
    assert reply.body is not None
    out: list[Any] = json.loads(reply.body)["output"]
    return out


def run_outputs(calls: list[Any]) -> list[Any]:
    return [
        {"type": "function_call_output", "call_id": c["call_id"], "output": "ok"} for c in calls
    ]


def test_the_script_plays_its_steps_from_the_transcript_and_ends_with_its_answer():
    script = CodexScript("T1", session(3, parallel_at=(2,), preamble_at=(3,)))
    items: list[Any] = [user("T1: go")]
    for k in range(3):
        out = answer_items(script, items, stream=k % 2 == 0)
        assert out[0]["type"] == "reasoning" and out[0]["encrypted_content"].startswith("gAAAAA")
        calls = [x for x in out if x["type"] == "function_call"]
        assert len(calls) == (2 if k == 1 else 1)
        assert (out[1]["type"] == "message") is (k == 2)
        items += [*out, *run_outputs(calls)]
    final = answer_items(script, items)
    assert [x["type"] for x in final] == ["reasoning", "message"]
    assert final[1]["content"][0]["text"] == script.final_text
    assert [a.step for a in script.answers] == [0, 1, 2, 3]
    assert script.refusals == []


def test_the_script_refuses_a_tampered_or_separated_reasoning_item_and_an_unanswered_call():
    script = CodexScript("T2", [Step(("echo a",), "plan")])
    first = answer_items(script, [user("T2: go")])
    rs, fc = first
    ok = [user("T2: go"), rs, fc, *run_outputs([fc])]
    assert script(request(ok)).status == 200  # type: ignore[union-attr]
    tampered = [user("T2: go"), {**rs, "encrypted_content": "gAAAAAother"}, fc, *run_outputs([fc])]
    separated = [user("T2: go"), rs, user("between"), fc, *run_outputs([fc])]
    unanswered = [user("T2: go"), rs, fc]
    for bad in (tampered, separated, unanswered):
        reply = script(request(bad))
        assert reply is not None and reply.status == 400
        assert reply.body is not None
        error = json.loads(reply.body)["error"]
        assert error["type"] == "invalid_request_error"
    assert any("could not be verified" in r for r in script.refusals)
    assert any("without its required following item" in r for r in script.refusals)
    assert f"No tool output found for function call {fc['call_id']}." in script.refusals


def test_the_script_pauses_then_goes_on_after_a_new_prompt():
    script = CodexScript("T3", session(2), pause_at=(1,))
    items: list[Any] = [user("T3: go")]
    out = answer_items(script, items)
    items += [*out, *run_outputs(out[1:])]
    paused = answer_items(script, items)
    assert paused[-1]["content"][0]["text"] == script.pause_text
    items += [*paused, user("go on")]
    resumed = answer_items(script, items)
    assert resumed[-1]["type"] == "function_call" and "step 2" in resumed[-1]["arguments"]
    assert [a.step for a in script.answers] == [0, -1, 1]


def test_codex_compaction_is_recognised_by_its_header_and_answered_with_the_steps_done():
    doc = fixture("own_compaction_call.json")
    rec = recorded(doc)
    assert request_kind(rec) == "compaction"
    assert is_compaction(rec, rec.json())
    assert request_kind(recorded(fixture("middle.json"))) == "turn"
    script = CodexScript("T4", session(3))
    items: list[Any] = [user("T4: go")]
    out = answer_items(script, items)
    items += [*out, *run_outputs(out[1:])]
    compact = [*items, user("You are performing a CONTEXT CHECKPOINT COMPACTION. Summarise.")]
    summary = answer_items(script, compact)
    (text,) = [x["content"][0]["text"] for x in summary]
    assert "CG-SCRIPT: 1 steps done" in text
    assert [c.done for c in script.compactions] == [1]
    after = [user("T4: go"), user("Another language model ... summary:\n" + text)]
    nxt = answer_items(script, after)
    assert "step 2" in nxt[-1]["arguments"]
