"""Each dialect says where a request message's tool outputs lie and what its tool calls are
(`Dialect.tool_outputs`, `Dialect.tool_calls`): what the mask component replaces and names."""

from __future__ import annotations

from typing import Any

import pytest

from cg.wire.dialects import DIALECTS, ToolCall, ToolOutput

CASES: list[tuple[str, dict[str, Any], tuple[ToolOutput, ...], tuple[ToolCall, ...]]] = [
    (
        "anthropic",
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "see"},
                {"type": "tool_result", "tool_use_id": "t1", "content": "a"},
                {"type": "tool_result", "tool_use_id": "t2", "content": [{"type": "text"}]},
            ],
        },
        (ToolOutput("t1", ("content", 1, "content")), ToolOutput("t2", ("content", 2, "content"))),
        (),
    ),
    (
        "anthropic",
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}
            ],
        },
        (),
        (ToolCall("t1", "Bash", {"command": "ls"}),),
    ),
    (
        "openai",
        {"role": "tool", "tool_call_id": "c1", "content": "x"},
        (ToolOutput("c1", ("content",)),),
        (),
    ),
    (
        "openai",
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "sh", "arguments": "{}"}}
            ],
        },
        (),
        (ToolCall("c1", "sh", "{}"),),
    ),
    (
        "responses",
        {"type": "function_call_output", "call_id": "c1", "output": "x"},
        (ToolOutput("c1", ("output",)),),
        (),
    ),
    (
        "responses",
        {"type": "local_shell_call_output", "id": "c2", "output": "x"},
        (ToolOutput("c2", ("output",), "string"),),
        (),
    ),
    (
        "responses",
        {"type": "computer_call_output", "call_id": "c3", "output": {}},
        (ToolOutput("c3", ("output",), "none"),),
        (),
    ),
    (
        "responses",
        {"type": "custom_tool_call", "call_id": "c4", "name": "exec", "input": "run"},
        (),
        (ToolCall("c4", "exec", "run"),),
    ),
    (
        "responses",
        {"type": "local_shell_call", "call_id": "c5", "action": {"command": ["ls"]}},
        (),
        (ToolCall("c5", "local_shell", {"action": {"command": ["ls"]}}),),
    ),
    ("responses", {"type": "message", "role": "user", "content": "hi"}, (), ()),
]


@pytest.mark.parametrize(("dialect", "message", "outputs", "calls"), CASES)
def test_where_outputs_lie_and_what_calls_are(
    dialect: str,
    message: dict[str, Any],
    outputs: tuple[ToolOutput, ...],
    calls: tuple[ToolCall, ...],
) -> None:
    d = DIALECTS[dialect]
    assert d.tool_outputs(message) == outputs
    assert d.tool_calls(message) == calls
    # The outputs are the view's results, in its order.
    assert tuple(o.call for o in outputs) == d.view(message).tool_result_ids
