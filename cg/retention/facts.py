"""The facts of a transcript, found deterministically (docs/behaviour.md#retention).

Four kinds, each a short text the agent would be hurt to lose:

    user      a human-typed user text of 20 characters or more (not a tool result, not a block
              that is wholly an agent-injected wrapper such as `<system-reminder>…`)
    file      a path in a tool call's input (`file_path`, `path`, `notebook_path`, `filename`,
              or a Codex `apply_patch` header `*** Add|Update|Delete File: P`)
    command   the first line of a shell command in a tool call's input (`command`, `cmd`; a
              list joined by spaces), at most 200 characters
    error     the first line of a tool output that says error, exception, traceback, failed or
              fatal, at most 200 characters

A fact is the pair (kind, text): one that occurs several times counts once. What is found per
message (`Found`) also says where (the message's position), which tool (for the artifact trail)
and which call it belongs to, so a command can be given the exit status its output states.

Messages are read as parsed JSON, one dialect's shapes at a time; anything of another shape
yields no facts (it is never an error: facts are a measurement, not a gate).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, NamedTuple

from cg.expand.tool import SUMMARY_HEADER
from cg.wire.dialects import DIALECTS, Dialect, MessageView

Kind = Literal["user", "file", "command", "error"]
KINDS: tuple[Kind, ...] = ("user", "file", "command", "error")
USER_MIN_CHARS = 20
LINE_CAP = 200
FILE_KEYS = frozenset({"file_path", "path", "notebook_path", "filename"})
COMMAND_KEYS = frozenset({"command", "cmd"})
# A wrapper an agent puts around what it injects into a user turn: a block that is wholly one of
# these is the agent's, not the human's (Claude Code's reminders, Codex's context and
# instructions, the outputs of local slash commands).
WRAPPERS = frozenset(
    {
        "system-reminder",
        "environment_context",
        "user_instructions",
        "local-command-stdout",
        "local-command-stderr",
        "local-command-caveat",
    }
)
_WRAPPED = re.compile(r"\A\s*<([A-Za-z_-]+)>.*</\1>\s*\Z", re.DOTALL)
_ERROR = re.compile(r"error|exception|traceback|failed|fatal", re.IGNORECASE)
_PATCH = re.compile(r"\*\*\* (?:Add|Update|Delete) File: ([^\r\n\\\"]+)")
_EXIT = re.compile(
    r"(?:exit(?:ed)?(?: with)?[ _](?:code|status)|\"exit_code\")\"?\s*[:=]?\s*(-?\d{1,4})",
    re.IGNORECASE,
)
_DEPTH = 4  # how deep into a tool call's input paths and commands are looked for
_ARGS_MAX = 1 << 20  # a tool call's `arguments` string parsed at most this long


class Fact(NamedTuple):
    kind: Kind
    text: str


class Found(NamedTuple):
    """One fact where it was found: `at` the message's position in the transcript, `tool` the
    tool whose call or output it is in, `call` that call's id (links a command to its output),
    `status` the exit status its output states (filled by `transcript_facts`)."""

    kind: Kind
    text: str
    at: int
    tool: str | None = None
    call: str | None = None
    status: int | None = None

    @property
    def fact(self) -> Fact:
        return Fact(self.kind, self.text)


def first_line(text: str, cap: int = LINE_CAP) -> str:
    line = text.strip().split("\n", 1)[0].rstrip()
    return line[:cap]


def first_error(text: str) -> str | None:
    """The first line of a tool output that states an error, at most 200 characters; None."""
    m = _ERROR.search(text)
    if m is None:
        return None
    start = text.rfind("\n", 0, m.start()) + 1
    end = text.find("\n", m.end())
    line = text[start : end if end >= 0 else len(text)].strip()
    return line[:LINE_CAP] or None


def exit_status(text: str) -> int | None:
    """The exit status a tool output states (`Exit code: 1`, `Process exited with code 0`,
    `"exit_code": 2`), or None."""
    m = _EXIT.search(text)
    return int(m.group(1)) if m else None


def is_human(text: str) -> bool:
    """A user text the human typed: long enough, not wholly an agent's wrapper, not our own
    summary message."""
    if len(text) < USER_MIN_CHARS or text.isspace():
        return False
    if text.lstrip().startswith(SUMMARY_HEADER):
        return False
    m = _WRAPPED.match(text)
    return not (m and m.group(1) in WRAPPERS)


def _strings(value: Any, depth: int = 0) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif depth < _DEPTH and isinstance(value, dict):
        for v in value.values():
            yield from _strings(v, depth + 1)
    elif depth < _DEPTH and isinstance(value, list):
        for v in value:
            yield from _strings(v, depth + 1)


def _keyed(value: Any, depth: int = 0) -> Iterator[tuple[str, Any]]:
    if depth >= _DEPTH:
        return
    if isinstance(value, dict):
        for k, v in value.items():
            yield k, v
            yield from _keyed(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            yield from _keyed(v, depth + 1)


def call_facts(name: str | None, args: Any, at: int, call: str | None) -> list[Found]:
    """The files and commands of one tool call whose input is `args` (an object, or the raw
    string of a custom tool or of arguments that do not parse)."""
    out: list[Found] = []
    seen: set[tuple[str, str]] = set()

    def add(kind: Kind, text: str) -> None:
        if text and (kind, text) not in seen:
            seen.add((kind, text))
            out.append(Found(kind, text, at, name, call))

    for key, v in _keyed(args):
        if key in FILE_KEYS and isinstance(v, str) and v.strip():
            add("file", v.strip()[: LINE_CAP * 5])
        elif key in COMMAND_KEYS:
            if isinstance(v, list) and v and all(isinstance(x, str) for x in v):
                add("command", first_line(" ".join(v)))
            elif isinstance(v, str) and v.strip():
                add("command", first_line(v))
    for s in _strings(args):
        if "*** " in s:
            for m in _PATCH.finditer(s):
                add("file", m.group(1).strip())
    return out


def _parse_args(arguments: Any) -> Any:
    if isinstance(arguments, str) and len(arguments) <= _ARGS_MAX:
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def output_text(content: Any) -> str:
    """A tool output's text: a string, or the texts of its parts (what `first_error` reads, and
    what `cg.mask` sizes)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            t for p in content if isinstance(p, dict) and isinstance(t := p.get("text"), str)
        )
    return ""


def _value_at(message: Any, path: Sequence[str | int]) -> Any:
    v = message
    for step in path:
        if isinstance(step, int) and isinstance(v, list) and 0 <= step < len(v):
            v = v[step]
        elif isinstance(step, str) and isinstance(v, dict):
            v = v.get(step)
        else:
            return None
    return v


def _user_texts(view: MessageView) -> Iterator[str]:
    """The texts a user message's view shows as its own (not tool results)."""
    if view.role != "user" or view.kind != "message":
        return
    if view.form == "string" and view.shown is not None:
        yield view.shown
        return
    for b in view.blocks:
        if b.type in ("text", "input_text") and b.call is None:
            yield b.shown


def _read(dialect: Dialect, m: Mapping[str, Any], at: int) -> list[Found]:
    out: list[Found] = []
    try:
        view = dialect.view(m)
    except ValueError:
        return out
    out += [Found("user", t, at) for t in _user_texts(view) if is_human(t)]
    for c in dialect.tool_calls(m):
        out += call_facts(c.name or None, _parse_args(c.input), at, c.id or None)
    for o in dialect.tool_outputs(m):
        text = output_text(_value_at(m, o.path))
        call = o.call or None
        line = first_error(text)
        if line:
            out.append(Found("error", line, at, None, call))
        status = exit_status(text)
        if status is not None:
            out.append(Found("error", "", at, None, call, status))
    return out


def message_facts(dialect: str, message: Any, at: int = 0) -> tuple[Found, ...]:
    """What one parsed message holds (exit statuses unlinked: see `transcript_facts`)."""
    d = DIALECTS.get(dialect)
    if d is None or not isinstance(message, dict):
        return ()
    try:
        return tuple(_read(d, message, at))
    except (RecursionError, ValueError, TypeError):
        return ()


def link(found: Iterable[Found]) -> list[Found]:
    """The facts in order, each command given the exit status its output states and each error
    the tool whose output it is in; the bare statuses dropped."""
    items = list(found)
    status: dict[str, int] = {}
    tools: dict[str, str] = {}
    for f in items:
        if f.call is None:
            continue
        if f.kind == "error" and f.status is not None:
            status.setdefault(f.call, f.status)
        elif f.tool is not None:
            tools.setdefault(f.call, f.tool)
    out: list[Found] = []
    for f in items:
        if f.kind == "error" and not f.text:
            continue
        if f.kind == "command" and f.call in status:
            f = f._replace(status=status[f.call])
        elif f.kind == "error" and f.tool is None and f.call in tools:
            f = f._replace(tool=tools[f.call])
        out.append(f)
    return out


def transcript_facts(dialect: str, messages: Sequence[Any], start: int = 0) -> list[Found]:
    """Every fact of parsed `messages` in order (positions from `start`), linked."""
    return link(f for i, m in enumerate(messages) for f in message_facts(dialect, m, start + i))


def distinct(found: Iterable[Found]) -> dict[Fact, Found]:
    """Each fact once, where it was first found."""
    out: dict[Fact, Found] = {}
    for f in found:
        if f.kind == "error" and not f.text:
            continue
        out.setdefault(Fact(f.kind, f.text), f)
    return out
