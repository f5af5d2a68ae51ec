"""Transcripts with tool outputs worth masking, in each dialect, and an independent reader of
what the `mask` component replaced.

`replaced(original, sent)` walks the body sent and the client's body side by side with
`json.JSONDecoder` alone (not the code under test): every byte is the client's except where a
stub string stands in the sent body, and there the client's body holds exactly one JSON value
(the output it replaced). It returns those (original value, stub) pairs in order.
"""

from __future__ import annotations

import json
from typing import Any

from cg.expand.tool import TOOL_JSON
from cg.mask.stub import PREFIX

Json = Any
STUB_OPEN = '"' + PREFIX


def replaced(original: bytes, sent: bytes) -> list[tuple[Json, str]]:
    """(the client's value, the stub) for each stub in `sent`, after checking that every other
    byte of `sent` is `original`'s, in order (the expand tool appended to `tools` aside)."""
    o, s = original.decode("utf-8"), sent.decode("utf-8")
    for tool in TOOL_JSON.values():
        if tool not in o and ("," + tool) in s:
            s = s.replace("," + tool, "", 1)
        elif tool not in o and tool in s:
            s = s.replace(tool, "", 1)
    dec = json.JSONDecoder()
    out: list[tuple[Json, str]] = []
    i = j = 0
    while True:
        k = s.find(STUB_OPEN, j)
        if k < 0:
            assert o[i:] == s[j:], "bytes after the last stub differ"
            return out
        assert o[i : i + (k - j)] == s[j:k], f"bytes before the stub at {k} differ"
        i += k - j
        value, end = dec.raw_decode(o, i)
        stub, stop = dec.raw_decode(s, k)
        out.append((value, stub))
        i, j = end, stop


def array_sources(body: bytes, key: str) -> list[bytes]:
    """Each element's bytes of the body's top-level array `key` (`messages`, `input`), read with
    `json.JSONDecoder` alone."""
    s = body.decode("utf-8")
    dec = json.JSONDecoder()
    i = s.index("{") + 1
    while True:
        while s[i] in " \t\r\n,":
            i += 1
        k, i = dec.raw_decode(s, i)
        while s[i] in " \t\r\n:":
            i += 1
        if k != key:
            _, i = dec.raw_decode(s, i)
            continue
        assert s[i] == "["
        i += 1
        out: list[bytes] = []
        while True:
            while s[i] in " \t\r\n,":
                i += 1
            if s[i] == "]":
                return out
            _, j = dec.raw_decode(s, i)
            out.append(s[i:j].encode("utf-8"))
            i = j


def words(n: int, tag: str) -> str:
    """An output of `n` words after `tag` (about as many tokens), distinct per `tag`."""
    return f"{tag}: " + " ".join(["data"] * n)


def anthropic_body(outputs: list[str], *, error_at: int | None = None) -> dict[str, Json]:
    """A Claude Code-shaped request: a task, then one Bash exchange per output, then a user
    turn. `error_at`: that output begins with an error line."""
    msgs: list[Json] = [{"role": "user", "content": "TASK: make the build green again, please."}]
    for n, out in enumerate(outputs):
        tid = f"toolu_{n:04d}"
        text = f"Error: step {n} failed with exit code 2\n{out}" if n == error_at else out
        msgs.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"Step {n}."},
                    {
                        "type": "tool_use",
                        "id": tid,
                        "name": "Bash",
                        "input": {"command": f"make step{n}"},
                    },
                ],
            }
        )
        msgs.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": tid, "content": text, "is_error": False}
                ],
            }
        )
    msgs.append({"role": "assistant", "content": [{"type": "text", "text": "Working on it."}]})
    msgs.append({"role": "user", "content": "Carry on, and tell me when it passes."})
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 1024,
        "system": "You are a coding agent.",
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
        "messages": msgs,
    }


def openai_body(outputs: list[str], *, error_at: int | None = None) -> dict[str, Json]:
    msgs: list[Json] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "TASK: make the build green again, please."},
    ]
    for n, out in enumerate(outputs):
        cid = f"call_{n:03d}"
        text = f"Error: step {n} failed with exit code 2\n{out}" if n == error_at else out
        msgs.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": cid,
                        "type": "function",
                        "function": {
                            "name": "shell",
                            "arguments": json.dumps({"cmd": f"make {n}"}),
                        },
                    }
                ],
            }
        )
        msgs.append({"role": "tool", "tool_call_id": cid, "content": text})
    msgs.append({"role": "assistant", "content": "Working on it."})
    msgs.append({"role": "user", "content": "Carry on, and tell me when it passes."})
    tools = [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]
    return {"model": "gpt-4.1", "messages": msgs, "tools": tools}


def responses_body(outputs: list[str], *, error_at: int | None = None) -> dict[str, Json]:
    """A Codex-shaped request: developer and user items, then per output a reasoning item, a
    function call and its output (every other one a custom tool's, its output text parts)."""
    items: list[Json] = [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "sys"}],
        },
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "TASK: make the build green again."}],
        },
    ]
    for n, out in enumerate(outputs):
        cid = f"call_{n:03d}"
        text = f"Error: step {n} failed with exit code 2\n{out}" if n == error_at else out
        items.append(
            {"type": "reasoning", "id": f"rs_{n:03d}", "summary": [], "encrypted_content": "ZW5j"}
        )
        if n % 2:
            items.append(
                {"type": "custom_tool_call", "call_id": cid, "name": "exec", "input": f"run {n}"}
            )
            items.append(
                {
                    "type": "custom_tool_call_output",
                    "call_id": cid,
                    "output": [{"type": "input_text", "text": text}],
                }
            )
        else:
            items.append(
                {
                    "type": "function_call",
                    "call_id": cid,
                    "name": "exec_command",
                    "arguments": json.dumps({"cmd": f"make {n}"}),
                }
            )
            items.append({"type": "function_call_output", "call_id": cid, "output": text})
    items.append(
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Carry on, please."}],
        }
    )
    tools = [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}]
    return {
        "model": "gpt-5.1-codex",
        "input": items,
        "tools": tools,
        "stream": True,
        "store": False,
    }


BODIES = {"anthropic": anthropic_body, "openai": openai_body, "responses": responses_body}
# Where output n's message lies in each dialect's body (its index in the transcript array).
FIRST_OUTPUT = {"anthropic": 2, "openai": 3, "responses": 4}
STRIDE = {"anthropic": 2, "openai": 2, "responses": 3}


def output_at(dialect: str, n: int) -> int:
    return FIRST_OUTPUT[dialect] + STRIDE[dialect] * n


def dumps(body: dict[str, Json]) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def mask_config(**over: Any) -> dict[str, Any]:
    """A mask block on the acting path for small transcripts: the trigger's gates open."""
    raw: dict[str, Any] = {
        "keep_last_rounds": 2,
        "min_output_tokens": 50,
        "remask_tokens": 100,
        "trigger": {"min_request_tokens": 0},
    }
    raw.update(over)
    return raw
