"""A small synthetic agent session in each dialect, written as a JSONL trace: tool rounds (Read,
Bash, Edit in turn, every Bash output failing with a line of its own) and a human prompt after
every other round, so that a low summarize trigger (`CONFIG`) gives one checkpoint whose span
holds facts of every kind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cg.simulate.trace import dumps_line

TOOL_NAMES = ("Read", "Bash", "Edit")
PROMPTS = [
    "Please make the parser accept trailing commas in lists",
    "Now check that the config loader keeps unknown keys",
    "Do not touch the public API while you refactor this",
    "Run the slow tests too before you call it finished",
    "Also write a changelog entry naming the parser change",
    "Keep the old flag working for one more release cycle",
]
PAD = "\n".join(f"{n:4} the quick brown fox jumps over the lazy dog" for n in range(30))
TASK = "Fix the parser and keep the tests green."
# Summarize from 2,500 tokens, never roll forward: one checkpoint.
CONFIG = (
    "components:\n  summarize:\n    min_tokens: 200\n    resummarize_tokens: 1000000\n"
    "    trigger: {min_request_tokens: 2500}\n"
)
MODELS = {"anthropic": "claude-sonnet-4-5", "openai": "gpt-5", "responses": "gpt-5"}


def _call(r: int) -> tuple[str, dict[str, Any], str, str | None]:
    """Round r's tool, input, output and human prompt (None: none)."""
    tool = TOOL_NAMES[r % 3]
    args: dict[str, Any] = (
        {"file_path": f"/work/app/module_{r}.py"}
        if tool == "Read"
        else {"command": f"pytest tests/test_{r}.py -x\necho done"}
        if tool == "Bash"
        else {"file_path": f"/work/app/edit_{r}.py", "old_string": "a", "new_string": "b"}
    )
    fail = f"\nFAILED tests/test_{r}.py::test_case - AssertionError: {r}" if tool == "Bash" else ""
    prompt = PROMPTS[r // 2] if r % 2 == 1 and r // 2 < len(PROMPTS) else None
    return tool, args, PAD + fail, prompt


def _anthropic(r: int) -> list[Any]:
    tool, args, out, prompt = _call(r)
    content: list[Any] = [{"type": "tool_result", "tool_use_id": f"toolu_{r:02}", "content": out}]
    if prompt:
        content.append({"type": "text", "text": prompt})
    return [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": f"Step {r}."},
                {"type": "tool_use", "id": f"toolu_{r:02}", "name": tool, "input": args},
            ],
        },
        {"role": "user", "content": content},
    ]


def _openai(r: int) -> list[Any]:
    import json

    tool, args, out, prompt = _call(r)
    call = {
        "id": f"call_{r:02}",
        "type": "function",
        "function": {"name": tool, "arguments": json.dumps(args)},
    }
    msgs: list[Any] = [
        {"role": "assistant", "content": f"Step {r}.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"call_{r:02}", "content": out},
    ]
    if prompt:
        msgs.append({"role": "user", "content": prompt})
    return msgs


def _responses(r: int) -> list[Any]:
    import json

    tool, args, out, prompt = _call(r)
    items: list[Any] = [
        {
            "type": "function_call",
            "call_id": f"call_{r:02}",
            "name": tool,
            "arguments": json.dumps(args),
        },
        {"type": "function_call_output", "call_id": f"call_{r:02}", "output": out},
    ]
    if prompt:
        items.append(
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": prompt}]}
        )
    return items


def _tools(dialect: str) -> list[Any]:
    schema = {"type": "object"}
    if dialect == "anthropic":
        return [{"name": n, "description": n, "input_schema": schema} for n in TOOL_NAMES]
    if dialect == "openai":
        return [
            {"type": "function", "function": {"name": n, "description": n, "parameters": schema}}
            for n in TOOL_NAMES
        ]
    return [
        {"type": "function", "name": n, "description": n, "parameters": schema} for n in TOOL_NAMES
    ]


def synthetic(path: Path, dialect: str = "anthropic", rounds: int = 16) -> Path:
    """The session, one request per round (each ending with the round's output or prompt)."""
    rounder = {"anthropic": _anthropic, "openai": _openai, "responses": _responses}[dialect]
    first: Any = (
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": TASK}]}
        if dialect == "responses"
        else {"role": "user", "content": TASK}
    )
    items = [first]
    headers = (
        {"x-claude-code-session-id": "synthetic", "anthropic-version": "2023-06-01"}
        if dialect == "anthropic"
        else {"session_id": "synthetic"}
    )
    key = "input" if dialect == "responses" else "messages"
    with path.open("w", encoding="utf-8") as f:
        for r in range(rounds):
            items += rounder(r)
            body: dict[str, Any] = {"model": MODELS[dialect], "tools": _tools(dialect), key: items}
            if dialect == "anthropic":
                body.update(max_tokens=1024, system="You code.")
            f.write(dumps_line(1_764_500_000.0 + 10 * r, headers, body) + "\n")
    return path
