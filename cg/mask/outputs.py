"""Where each message's tool calls and tool outputs lie: what the `mask` component may replace.

An output is the value the dialect keeps a tool's answer in (`Dialect.tool_outputs`: an
Anthropic `tool_result` block's `content`, an OpenAI `role: tool` message's `content`, a
Responses output item's `output`), and the stub names its call (`Dialect.tool_calls`). Its span
is found in the message's own source (`cg.wire.jsonspan`), so a masked message is that
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cg.retention.facts import first_error, output_text
from cg.wire.body import BodyIndex
from cg.wire.dialects import ToolOutput
from cg.wire.jsonspan import Member, walk_object
from cg.wire.reply import dumps
from cg.wire.splice import Edit

INPUT_CHARS = 160  # a call's input, abbreviated to this many characters in a stub
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
    `why_not` None when it may be masked, else why not; `breakpoint`: the value carries a
    `cache_control` breakpoint (the client's cache marks it: not replaced while it does)."""

    call: str
    start: int
    end: int
    chars: int
    lines: int
    error: str | None
    why_not: str | None = None
    breakpoint: bool = False


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
    d = index.dialect
    for i in range(len(have), len(index.messages)):
        m = index.messages[i]
        view = m.view
        if not view.tool_call_ids and not view.tool_result_ids:
            have.append(EMPTY)
            continue
        calls = (
            tuple(Call(c.id, c.name, abbreviate(c.input)) for c in d.tool_calls(m.value))
            if view.tool_call_ids
            else ()
        )
        outputs = (
            tuple(_output(index.source(i), o) for o in d.tool_outputs(m.value))
            if view.tool_result_ids
            else ()
        )
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


def locate(source: str, path: Sequence[str | int]) -> Member | None:
    """The member a path of keys and array indices names in a message's source (spans in it),
    or None where the path does not lead."""
    at = 0
    k = 0
    while k < len(path):
        key = path[k]
        if not isinstance(key, str):
            return None
        step = path[k + 1] if k + 1 < len(path) else None
        members, _ = walk_object(source, at, arrays=(key,) if isinstance(step, int) else ())
        found = next((x for x in members if x.key == key), None)
        if found is None or step is None:
            return found
        if isinstance(step, int):
            if found.array is None or not 0 <= step < len(found.array.elements):
                return None
            at = found.array.elements[step].start
            k += 2
        else:
            at = found.start
            k += 1
        if source[at : at + 1] != "{":
            return None
    return None


def _output(source: str, where: ToolOutput) -> Output:
    """The output `where` points at in a message's `source`."""
    value = locate(source, where.path) if where.text != "none" else None
    if where.text == "none":
        return Output(where.call, 0, 0, 0, 0, None, "its output is not text")
    if value is None:
        return Output(where.call, 0, 0, 0, 0, None, "no output value")
    v = value.value
    why: str | None = None
    if isinstance(v, list):
        if where.text == "string":
            why = "an array where only a string is accepted"
        elif not v or not all(isinstance(p, dict) and p.get("type") in TEXT_PARTS for p in v):
            why = "not text only (an image, a file, or a part of no known type)"
        elif not all(isinstance(p.get("text"), str) for p in v):
            why = "a text part without a string text"
    elif not isinstance(v, str):
        why = f"a {type(v).__name__}, neither a string nor an array of text parts"
    text = output_text(v) if why is None else ""
    lines = text.count("\n") + 1 if text else 0
    marked = isinstance(v, list) and any(isinstance(p, dict) and "cache_control" in p for p in v)
    return Output(
        where.call, value.start, value.end, len(text), lines, first_error(text), why, marked
    )
