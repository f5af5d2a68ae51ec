"""The `responses` dialect, request side: items viewed, requests refused with their reason, the
shape rules in the provider's wording, on the real Codex 0.169.0 requests and on generated ones."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cg.wire.body import BodyRejected, index_body
from cg.wire.dialects import RESPONSES
from cg.wire.shape import check_wire_roles, separated, validate_shape
from cg.wire.splice import Insert, Keep, Plan, plan_sources, plan_views, splice
from tests.support.strategies import SETTINGS, Sample, r_message, responses_bodies, responses_items

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "codex-0.169.0"
NAMES = [
    "first",
    "middle",
    "resumed_last",
    "default_model_additional_tools",
    "own_compaction_call",
    "after_own_compaction",
]


def fixture(name: str) -> bytes:
    doc = json.loads((FIXTURES / f"{name}.json").read_text())
    raw: bytes = doc["body"].encode()
    assert len(raw) == doc["body_len"]  # the wire bytes, as recorded
    return raw


def body(items: list[Any], **extra: Any) -> bytes:
    return json.dumps({"model": "m", "input": items, **extra}).encode()


def rules(items: list[Any]) -> list[tuple[int, str]]:
    return [(v.index, v.rule) for v in validate_shape(items, RESPONSES)]


def call(cid: str, name: str = "exec_command") -> dict[str, Any]:
    return {"type": "function_call", "name": name, "arguments": "{}", "call_id": cid}


def out(cid: str, text: str = "ok") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": cid, "output": text}


def reasoning(rid: str = "rs_1") -> dict[str, Any]:
    return {"type": "reasoning", "id": rid, "summary": [], "encrypted_content": "gAAA"}


USER = r_message("user", "task")
DEV = r_message("developer", "be brief")


# -- the real requests ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_every_codex_request_indexes_with_no_violation(name: str) -> None:
    raw = fixture(name)
    idx = index_body(raw, RESPONSES)
    doc = json.loads(raw)
    assert len(idx.messages) == len(doc["input"]) > 0
    for i, item in enumerate(doc["input"]):
        assert json.loads(idx.source(i)) == item  # each span is exactly its item
    assert validate_shape(idx.views, RESPONSES) == []
    assert check_wire_roles(raw, RESPONSES) == []


def test_codex_items_are_viewed_by_kind() -> None:
    idx = index_body(fixture("middle"), RESPONSES)
    kinds = {v.kind for v in idx.views}
    assert {"message", "reasoning", "function_call", "function_call_output"} <= kinds
    for v in idx.views:
        if v.kind == "reasoning":
            assert v.role == "assistant" and v.binds_next and (v.item_id or "").startswith("rs_")
        elif v.kind == "function_call":
            assert v.calls_tools and v.tool_call_ids[0].startswith("call_")
            assert v.text.startswith("[tool_call exec_command] ")
        elif v.kind == "function_call_output":
            assert v.role == "tool" and v.tool_result_ids[0].startswith("call_")
            assert "Process exited with code 0" in v.text
        else:
            assert not v.binds_next and not v.pinned
    assert [v.role for v in idx.views[:2]] == ["developer", "developer"]
    assert all(v.is_system for v in idx.views[:2])


def test_the_additional_tools_item_is_a_pinned_developer_item() -> None:
    idx = index_body(fixture("default_model_additional_tools"), RESPONSES)
    first = idx.views[0]
    assert first.kind == "additional_tools" and first.pinned and first.is_system
    assert first.text.startswith("[additional_tools] ")
    assert {"custom_tool_call", "custom_tool_call_output"} <= {v.kind for v in idx.views}
    assert not any(v.pinned for v in idx.views[1:])


# -- what passes through, and why ----------------------------------------------------------------


@pytest.mark.parametrize(
    "doc,why",
    [
        ({"model": "m", "input": "hello"}, "'input' is a string: a single user turn"),
        (
            {"model": "m", "input": [USER], "previous_response_id": "resp_1"},
            "previous_response_id is set: the history lives at the provider",
        ),
        (
            {"model": "m", "input": [USER], "conversation": "conv_1"},
            "conversation is set: the history lives in a provider-side conversation",
        ),
        ({"model": "m", "input": {"role": "user"}}, "'input' is a dict, not an array"),
        ({"model": "m"}, "no 'input' field"),
        (
            {"model": "m", "input": [USER, {"type": "item_reference", "id": "msg_1"}]},
            "input[1]: an item_reference (the item lives at the provider",
        ),
        (
            {"model": "m", "input": [USER, {"type": "compaction", "encrypted_content": "x"}]},
            "input[1]: a compaction item (encrypted history the addon cannot read)",
        ),
        (
            {"model": "m", "input": [USER, {"type": "mystery_item", "x": 1}]},
            "input[1]: unknown item type 'mystery_item'",
        ),
        (
            {"model": "m", "input": [{"role": "narrator", "content": "x"}]},
            "input[0]: unknown role 'narrator'",
        ),
        (
            {"model": "m", "input": [r_message("user", "x") | {"content": [{"type": "x_p"}]}]},
            "input[0]: unknown content part type 'x_p'",
        ),
        ({"model": "m", "input": [{"content": "no role, no type"}]}, "neither 'type' nor 'role'"),
        ({"model": "m", "input": [USER, "text"]}, "input[1] is not an object (got str)"),
        (
            {"model": "m", "input": [USER, {"type": "function_call", "name": "f"}]},
            "input[1]: a function_call item has no string 'call_id'",
        ),
    ],
)
def test_requests_the_addon_cannot_read_are_refused_with_the_reason(doc: Any, why: str) -> None:
    with pytest.raises(BodyRejected) as e:
        index_body(json.dumps(doc).encode(), RESPONSES)
    assert why in str(e.value)


def test_a_null_previous_response_id_is_no_reason_to_refuse() -> None:
    idx = index_body(body([USER], previous_response_id=None, conversation=None), RESPONSES)
    assert len(idx.messages) == 1


def test_items_without_type_are_easy_input_messages() -> None:
    idx = index_body(body([{"role": "user", "content": "hi"}, r_message("user", "x")]), RESPONSES)
    assert [(v.kind, v.role, v.text, v.form) for v in idx.views] == [
        ("message", "user", "hi", "string"),
        ("message", "user", "x", "blocks"),
    ]


# -- the shape rules, in the provider's wording ------------------------------------------------


def test_parallel_calls_then_outputs_are_valid() -> None:
    items = [USER, reasoning(), call("c1"), call("c2"), out("c2"), out("c1")]
    assert rules(items) == []


def test_an_unanswered_function_call() -> None:
    (v,) = validate_shape([USER, call("call_9"), USER], RESPONSES)
    assert (v.index, v.rule) == (1, "answered-tool-use")
    assert v.message == "No tool output found for function call call_9."


def test_an_unanswered_custom_tool_call() -> None:
    c = {"type": "custom_tool_call", "name": "exec", "input": "x", "call_id": "call_7"}
    (v,) = validate_shape([USER, c], RESPONSES)
    assert v.message == "No tool output found for custom tool call call_7."


def test_an_output_before_its_call_answers_nothing() -> None:
    got = validate_shape([USER, out("c1"), call("c1")], RESPONSES)
    assert [(v.index, v.rule) for v in got] == [(1, "paired-tool-result"), (2, "answered-tool-use")]
    assert got[0].message == "No tool call found for function call output with call_id c1."


def test_an_orphan_custom_output() -> None:
    o = {"type": "custom_tool_call_output", "call_id": "c3", "output": "x"}
    (v,) = validate_shape([USER, o], RESPONSES)
    assert v.message == "No tool call found for custom tool call output with call_id c3."


@pytest.mark.parametrize(
    "items,bad",
    [
        ([USER, reasoning("rs_a")], 1),  # last
        ([USER, reasoning("rs_a"), USER], 1),  # followed by a user turn
        ([USER, reasoning("rs_a"), out("c1")], 1),  # followed by an output
    ],
)
def test_a_reasoning_item_needs_its_successor(items: list[Any], bad: int) -> None:
    got = [v for v in validate_shape(items, RESPONSES) if v.rule == "reasoning-successor"]
    assert [v.index for v in got] == [bad]
    assert got[0].message == (
        "Item 'rs_a' of type 'reasoning' was provided without its required following item."
    )


def test_a_reasoning_item_before_a_model_item_is_valid() -> None:
    assert rules([USER, reasoning(), r_message("assistant", "done")]) == []
    assert rules([USER, reasoning(), call("c"), out("c")]) == []


@pytest.mark.parametrize(
    "content", ["", "  \n", [], [{"type": "input_text", "text": ""}]], ids=repr
)
def test_a_blank_message_item(content: Any) -> None:
    assert rules([USER, {"type": "message", "role": "user", "content": content}]) == [
        (1, "no-blank-content")
    ]


def test_a_message_with_an_image_and_a_blank_text_is_not_blank() -> None:
    content = [{"type": "input_text", "text": ""}, {"type": "input_image", "image_url": "x"}]
    assert rules([{"type": "message", "role": "user", "content": content}]) == []


def test_duplicate_item_ids_and_call_ids() -> None:
    dup = [USER, reasoning("rs_1"), call("c1"), out("c1"), reasoning("rs_1"), call("c1"), out("c1")]
    got = validate_shape(dup, RESPONSES)
    assert ("unique-ids", 4) in [(v.rule, v.index) for v in got]
    assert any(
        v.message == "Duplicate item found with id rs_1. Remove duplicate items from your input "
        "and try again."
        for v in got
    )
    assert {(v.rule, v.index) for v in got if v.rule == "unique-ids"} == {
        ("unique-ids", 4),
        ("unique-ids", 5),
        ("unique-ids", 6),
    }


def test_separated_names_the_item_left_without_its_reasoning() -> None:
    items = [USER, reasoning(), {**call("c1"), "id": "fc_1"}, out("c1"), USER]
    idx = index_body(body(items), RESPONSES)
    summary = Insert.message(RESPONSES.user_message("S"), RESPONSES)
    plan: Plan = [Keep(0), summary, Keep(2), Keep(3), Keep(4)]  # the reasoning cut, its call kept
    (v,) = separated(idx.views, plan_sources(plan), RESPONSES)
    assert (v.index, v.rule) == (2, "reasoning-successor")
    assert v.message == "Item 'fc_1' of type 'function_call' was provided without its required " + (
        "'reasoning' item."
    )
    assert separated(idx.views, plan_sources([Keep(i) for i in range(5)]), RESPONSES) == []


def test_check_wire_roles_reads_the_input_array_of_the_final_bytes() -> None:
    good = body([DEV, USER, reasoning(), call("c"), out("c")])
    assert check_wire_roles(good, RESPONSES) == []
    (v,) = check_wire_roles(
        body([USER, {"type": "message", "role": "tool", "content": "x"}]), RESPONSES
    )
    assert v.rule == "wire-role" and v.message.startswith("input.1.role: Input should be ")


# -- properties over generated transcripts --------------------------------------------------------


@SETTINGS
@given(responses_items())
def test_generated_transcripts_are_valid(items: list[Any]) -> None:
    assert validate_shape(items, RESPONSES) == []


@SETTINGS
@given(responses_bodies())
def test_every_item_span_of_a_generated_body_parses_to_the_item(s: Sample) -> None:
    idx = index_body(s.raw, RESPONSES)
    assert [json.loads(idx.source(i)) for i in range(len(idx.messages))] == s.messages
    assert splice(idx, [Keep(i) for i in range(len(idx.messages))]) is idx.raw


@SETTINGS
@given(responses_items(min_turns=1), st.data())
def test_dropping_an_item_of_a_pair_is_caught(items: list[Any], data: st.DataObject) -> None:
    """Breaking a valid transcript on purpose: each kind of removal reaches its rule."""
    paired = [
        i
        for i, it in enumerate(items)
        if it.get("type") in ("function_call", "function_call_output", "reasoning")
        or it.get("type", "").startswith("custom_tool_call")
    ]
    if not paired:
        return
    i = data.draw(st.sampled_from(paired))
    kind = items[i]["type"]
    broken = items[:i] + items[i + 1 :]
    got = {v.rule for v in validate_shape(broken, RESPONSES)}
    if kind.endswith("_output"):
        assert "answered-tool-use" in got
    elif kind != "reasoning":
        assert "paired-tool-result" in got
    else:
        idx = index_body(body(items), RESPONSES)
        plan = [Keep(k) for k in range(len(items)) if k != i]
        assert separated(idx.views, plan_sources(plan), RESPONSES)
        assert plan_views(idx, plan) == [idx.views[k] for k in range(len(items)) if k != i]
