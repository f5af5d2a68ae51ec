"""Where each message's tool calls and tool outputs lie: what the `mask` component may replace.

An output is the value the dialect keeps a tool's answer in: an Anthropic `tool_result` block's
`content`, an OpenAI `role: tool` message's `content`, a Responses output item's `output`. Its
span is found in the message's own source (`cg.wire.jsonspan`), so a masked message is that
source with only this value's bytes replaced. An output is maskable when its value is text (a
string, or an array of text parts only): an image, a screenshot object or a value of no known
shape is left as it came (`why_not` says why), and a stub never stands for what it cannot
describe.

A message's scan depends on its bytes alone, so it is memoised on the body's index
(`Memo.masks`) and inherited by a next turn that repeats the message.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cg.retention.facts import first_error
from cg.wire.body import BodyIndex
from cg.wire.jsonspan import Member, walk_object
from cg.wire.reply import dumps
from cg.wire.splice import Edit

INPUT_CHARS = 160  # a call's input, abbreviated to this many characters in a stub
# Responses output items whose `output` a string may replace (the API takes a string there),
# and those of them whose `output` may also be an array of text parts.
STRING_OUTPUTS = frozenset(
    {
        "function_call_output",
        "custom_tool_call_output",
        "local_shell_call_output",
        "apply_patch_call_output",
    }
)
PART_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output"})
TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
_OWNER = object()  # the memo slot's owner: this module


@dataclass(frozen=True, slots=True)
class Call:
    """A tool call: its id, the tool's name and its input as one abbreviated line."""

    id: str
    name: str
    input: str


@dataclass(frozen=True, slots=True)
class Output:
    """A tool output of a message: `[start, end)` its value's span in the message's source,
    `call` the call it answers, its text's size and first error line (`cg.retention.facts`),
    `why_not` None when it may be masked, else why not."""

    call: str
    start: int
    end: int
    chars: int
    lines: int
    error: str | None
    why_not: str | None = None


@dataclass(slots=True)
class Scan:
    """One message's calls and outputs (in order: an output's place is its position here,
    the order `cg.state.facts` counts their tokens in), and the edited messages made of it
    (by the stubs put in), remembered while the message is."""

    calls: tuple[Call, ...] = ()
    outputs: tuple[Output, ...] = ()
    edits: dict[tuple[tuple[int, str], ...], Edit] = field(default_factory=dict)


EMPTY = Scan()


def scans(index: BodyIndex) -> list[Scan]:
    """Every message's scan, memoised on the index (a next turn reads its new messages only)."""
    owner, known = index.memo.masks
    have: list[Scan] = list(known) if owner is _OWNER and known is not None else []
    name = index.dialect.name
    for i in range(len(have), len(index.messages)):
        m = index.messages[i]
        view = m.view
        if not view.tool_call_ids and not view.tool_result_ids:
            have.append(EMPTY)
            continue
        calls = _calls(name, m.value) if view.tool_call_ids else ()
        outputs = _outputs(name, m.value, index.source(i)) if view.tool_result_ids else ()
        have.append(Scan(calls, outputs))
    index.memo.masks = (_OWNER, have)
    return have


def abbreviate(value: Any) -> str:
    """A call's input as one line of at most INPUT_CHARS characters (compact JSON; a string
    input, a custom tool's, JSON-quoted so its line breaks stay escapes)."""
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = json.loads(value)  # a function call's arguments are JSON text
    text = dumps(value)
    return text if len(text) <= INPUT_CHARS else text[: INPUT_CHARS - 1] + "…"


def output_text(value: Any) -> str:
    """An output's text as `cg.retention.facts` reads it: a string, or its parts' texts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(
            t for p in value if isinstance(p, dict) and isinstance(t := p.get("text"), str)
        )
    return ""


def _calls(dialect: str, m: Mapping[str, Any]) -> tuple[Call, ...]:
    out: list[Call] = []
    if dialect == "anthropic":
        for b in m.get("content") or ():
            if isinstance(b, dict) and b.get("type") == "tool_use":
                out.append(Call(_s(b.get("id")), _s(b.get("name")), abbreviate(b.get("input"))))
    elif dialect == "openai":
        for c in m.get("tool_calls") or ():
            if isinstance(c, dict):
                fn = c.get("function")
                fn = fn if isinstance(fn, dict) else {}
                out.append(
                    Call(_s(c.get("id")), _s(fn.get("name")), abbreviate(fn.get("arguments")))
                )
    else:
        kind = _s(m.get("type"))
        cid = _s(m.get("call_id"))
        if kind == "function_call":
            out.append(Call(cid, _s(m.get("name")), abbreviate(m.get("arguments"))))
        elif kind == "custom_tool_call":
            out.append(Call(cid, _s(m.get("name")), abbreviate(m.get("input"))))
        elif kind == "local_shell_call":
            out.append(Call(cid, "local_shell", abbreviate(m.get("action"))))
        else:
            detail = {k: v for k, v in m.items() if k in ("action", "operation", "name")}
            out.append(Call(cid, kind.removesuffix("_call"), abbreviate(detail)))
    return tuple(out)


def _outputs(dialect: str, m: Mapping[str, Any], source: str) -> tuple[Output, ...]:
    if dialect == "anthropic":
        content = m.get("content")
        if not isinstance(content, list):
            return ()
        members, _ = walk_object(source, 0, arrays=("content",))
        arr = next((x.array for x in members if x.key == "content"), None)
        if arr is None:
            return ()
        out: list[Output] = []
        for el in arr.elements:
            b = el.value
            if isinstance(b, dict) and b.get("type") == "tool_result":
                inner, _ = walk_object(source, el.start)
                out.append(_output(_s(b.get("tool_use_id")), _member(inner, "content"), False))
        return tuple(out)
    members, _ = walk_object(source, 0)
    if dialect == "openai":
        return (_output(_s(m.get("tool_call_id")), _member(members, "content"), False),)
    kind = m.get("type")
    cid = _s(m.get("call_id"))
    if kind not in STRING_OUTPUTS:
        return (Output(cid, 0, 0, 0, 0, None, f"a {kind} item's output is not text"),)
    return (_output(cid, _member(members, "output"), kind not in PART_OUTPUTS),)


def _member(members: Sequence[Member], key: str) -> Member | None:
    return next((x for x in members if x.key == key), None)


def _output(call: str, value: Member | None, string_only: bool) -> Output:
    """The output whose value is `value` (None: the message has none)."""
    if value is None:
        return Output(call, 0, 0, 0, 0, None, "no output value")
    v = value.value
    why: str | None = None
    if isinstance(v, list):
        if string_only:
            why = "an array where only a string is accepted"
        elif not v or not all(isinstance(p, dict) and p.get("type") in TEXT_PARTS for p in v):
            why = "not text only (an image, a file, or a part of no known type)"
        elif not all(isinstance(p.get("text"), str) for p in v):
            why = "a text part without a string text"
    elif not isinstance(v, str):
        why = f"a {type(v).__name__}, neither a string nor an array of text parts"
    text = output_text(v) if why is None else ""
    lines = text.count("\n") + 1 if text else 0
    return Output(call, value.start, value.end, len(text), lines, first_error(text), why)


def _s(v: Any) -> str:
    return v if isinstance(v, str) else ""
