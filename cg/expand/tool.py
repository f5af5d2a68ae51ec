"""Reversibility (docs/behaviour.md#expand): the `context_guru_expand` tool, markers, and what an id
resolves to.

The tool definition is a constant string per dialect, appended after the client's own tools, so
the bytes are identical on every turn (the provider's prompt cache keeps its prefix). In `auto`
mode it is injected only when the request already declares tools, carries a marker that resolves
in a store that persists, and does not force a tool choice.

What an id resolves to is the request's own: a stash of its session that its tenant (the keyed
fingerprint of its credential, `cg.state.tenant`) wrote, or one from before tenancy. A marker
copied into another user's request, under another credential, resolves to nothing there: the
tool is not offered for it, and a call with its id is answered "no longer available".

Markers are matched in the raw bytes in both spellings a JSON encoder may produce: `<<cg:KEY>>`
and `\\u003c\\u003ccg:KEY\\u003e\\u003e` (mixed case, or mixed spellings, too).

An id (`parse_id`, the one grammar of the tool, `/_cg/expand` and `context-guru expand`) is `KEY`,
the whole stashed span, or `KEY#N`, its N-th message alone (1-based; on the Responses API its
N-th input item), so one tool output can be fetched without the rest. A marker is always the bare
`KEY`: `<<cg:KEY#N>>` is not one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from cg.state import KEY_PATTERN, Stash, Store
from cg.wire.body import BodyIndex
from cg.wire.dialects import DIALECTS

TOOL_NAME = "context_guru_expand"
_NAME = TOOL_NAME.encode()
InjectMode = Literal["auto", "always", "never"]
MAX_EXPANSION_CHARS = 200_000

# The first line of every summary message (cg.summarize.prompt writes it; the tool names it).
SUMMARY_HEADER = "=== History Summary ==="

_DESCRIPTION = (
    f"Restore, verbatim, the earlier conversation messages that a '{SUMMARY_HEADER}' "
    "replaced. Call it with the id from the summary's <<cg:ID>> marker when you need an exact "
    "detail (a path, a command, an output, a number) that the summary does not give. ID alone "
    "restores all of them, each labelled ID#1, ID#2, ...; ID#N restores only the N-th (a single "
    "tool output, for example)."
)
_ID = {
    "type": "string",
    "description": (
        "The id inside the <<cg:ID>> marker of a History Summary, or ID#N for its N-th message."
    ),
}
_SCHEMA = {"type": "object", "properties": {"id": _ID}, "required": ["id"]}

# Each dialect's declaration (`Dialect.function_tool`), as the bytes spliced into `tools`.
TOOL_JSON = {
    name: json.dumps(d.function_tool(TOOL_NAME, _DESCRIPTION, _SCHEMA), separators=(",", ":"))
    for name, d in DIALECTS.items()
}


# An expand id: a stash's key, then optionally `#` and the message's 1-based number (ASCII digits
# only, at most six: no span holds a million messages, and no number is parsed at any length).
_ID_RE = re.compile(rf"\A({KEY_PATTERN})(?:#([0-9]{{1,6}}))?\Z")
# An id that names a stash, whatever follows its `#` (`KEY#0`, `KEY#-1`, `KEY#x`): answered with
# how many messages that stash holds.
_NAMES_RE = re.compile(rf"\A({KEY_PATTERN})(?:#|\Z)")


def parse_id(ident: object) -> tuple[str, int | None] | None:
    """(KEY, None) for the id `KEY`, (KEY, N) for `KEY#N` (N as written, range unchecked: 0 is
    parsed, and answered as out of range); None for anything else."""
    m = _ID_RE.match(ident) if isinstance(ident, str) else None
    if m is None:
        return None
    n = m.group(2)
    return m.group(1), None if n is None else int(n)


def named_key(ident: object) -> str | None:
    """The stash an id names: the KEY of `KEY` or `KEY#…`, well-formed after its `#` or not (the
    tool answers a malformed N with the stash's size); None when it names none."""
    m = _NAMES_RE.match(ident) if isinstance(ident, str) else None
    return None if m is None else m.group(1)


# The search starts at the literal `cg:` (fast), then checks the brackets around it; a pattern
# that begins with the brackets' alternation is tried at every position of a 1 MB body.
_KEY_AT = re.compile(rf"cg:({KEY_PATTERN})")
_OPEN = re.compile(r"(?:<|\\u003[cC]){2}\Z")
_CLOSE = re.compile(r"(?:>|\\u003[eE]){2}")


# The same, on the body's bytes (a marker is ASCII): a pass-through turn is searched as it came,
# never decoded (a warm turn's text is not built whole: `cg.wire.chars`).
_BYTES = tuple(re.compile(p.pattern.encode()) for p in (_KEY_AT, _OPEN, _CLOSE))


# The tool's name as a JSON string may spell it: each character as itself or as a `\u00XX`
# escape in either case (an encoder may escape any character; markers are matched the same way).
def _spelled(name: str) -> re.Pattern[bytes]:
    def one(c: str) -> str:
        hexed = "".join(f"[{h.lower()}{h.upper()}]" if h.isalpha() else h for h in f"{ord(c):02x}")
        return f"(?:{re.escape(c)}|\\\\u00{hexed})"

    return re.compile("".join(map(one, name)).encode())


_NAME_SPELLED = _spelled(TOOL_NAME)


def names_tool(data: bytes | bytearray) -> bool:
    """Whether `data` (an answer, or part of one) may name our tool: its name, or the name in
    JSON escapes. What cannot name it cannot call it, and need not be parsed to find out."""
    if _NAME in data:
        return True
    return b"\\u00" in data and _NAME_SPELLED.search(data) is not None


def markers(raw: bytes | memoryview | str) -> Iterator[str]:
    """Every marker key in `raw` (bytes or decoded text), in order of appearance."""
    found: tuple[re.Pattern[Any], ...] = (
        (_KEY_AT, _OPEN, _CLOSE) if isinstance(raw, str) else _BYTES
    )
    key_at, opener, closer = found
    for m in key_at.finditer(raw):
        start = m.start()
        if opener.search(raw, max(0, start - 12), start) and closer.match(raw, m.end()):
            key = m.group(1)
            yield key.decode("ascii") if isinstance(key, bytes) else key


def forces_tool_choice(dialect: str, tool_choice: Any) -> bool:
    """A tool_choice we must not widen: the model is told exactly what it may (not) call."""
    return tool_choice is not None and DIALECTS[dialect].fixed_tool_choice(tool_choice)


def declares(dialect: str, tools: Any, name: str = TOOL_NAME) -> bool:
    if not isinstance(tools, list):
        return False
    d = DIALECTS[dialect]
    return any(isinstance(t, dict) and d.tool_name(t) == name for t in tools)


def inject_reason(
    mode: InjectMode,
    dialect: str,
    tools: Any,
    tool_choice: Any,
    sent: bytes | str | Sequence[bytes | memoryview],
    store: Store | None,
    session: str,
    tenant: str = "",
) -> tuple[bool, str]:
    """Whether to append the expand tool to the request about to be sent, and why (not).
    `sent` is its body, or the body's parts in order (a marker lies within one message); a
    marker counts when it resolves for `session` and `tenant`."""
    if mode == "never":
        return False, "cg_expand_inject: never"
    if declares(dialect, tools):
        return False, "the request already declares the tool"
    if forces_tool_choice(dialect, tool_choice):
        return False, "tool_choice forces a choice"
    if mode == "always":
        return True, "cg_expand_inject: always"
    if not isinstance(tools, list) or not tools:
        return False, "the request declares no tools"
    if store is None or not store.persistent:
        return False, "the store does not persist"
    for part in (sent,) if isinstance(sent, (bytes, str)) else sent:
        for key in markers(part):
            if store.has_stash(key, session, tenant):
                return True, f"marker {key} resolves"
    return False, "no resolvable marker"


def tool_insertion(index: BodyIndex) -> tuple[int, bytes]:
    """Where in the body's bytes the expand tool goes, and what goes there: after the last of
    the request's `tools` (any whitespace before the `]` stays after it), or a new `tools`
    member before the object's closing brace. Everything else keeps its bytes. Raises
    ValueError if that place is not what the index says it is."""
    tool = TOOL_JSON[index.dialect.name].encode()
    raw = index.raw
    tools = index.members.get("tools")
    if tools is not None:
        start, end = tools.start, tools.end
        inner = end - 1
        while inner > start + 1 and index.slice(inner - 1, inner) in " \t\r\n":
            inner -= 1
        close = index.byte_offset(end - 1)
        if raw[close : close + 1] != b"]":
            raise ValueError("the request's tools array does not end where it was read")
        return index.byte_offset(inner), (b"" if inner == start + 1 else b",") + tool
    end = len(raw)
    while end and raw[end - 1] in b" \t\r\n":
        end -= 1
    if raw[end - 1 : end] != b"}":
        raise ValueError("the body does not end with its object's closing brace")
    return end - 1, b',"tools":[' + tool + b"]"


def render_stash(stash: Stash, cap: int = MAX_EXPANSION_CHARS) -> str:
    """The stashed messages as the tool's answer: each as `[KEY#N]` (the id that fetches it
    alone) + its exact JSON, until `cap` characters."""
    key = stash.key
    parts = [
        f"The {stash.count} messages that the summary <<cg:{key}>> replaced, verbatim "
        f"(each as its original JSON; {key}#N fetches the N-th alone):"
    ]
    total = len(parts[0])
    sources = stash.sources()
    for n, src in enumerate(sources, 1):
        block = f"\n\n[{key}#{n}] {src}"
        if total + len(block) > cap:
            parts.append(
                f"\n\n[… {len(sources) - n + 1} more messages not shown: the expansion is capped "
                f"at {cap} characters; fetch one as {key}#N]"
            )
            break
        parts.append(block)
        total += len(block)
    return "".join(parts)


def render_message(stash: Stash, n: int, cap: int = MAX_EXPANSION_CHARS) -> str:
    """The tool's answer to `KEY#n`: that message's exact JSON (its first `cap` characters, and
    a note, when it is longer). ValueError when the stash has no n-th message."""
    sources = stash.sources()
    if not 1 <= n <= len(sources):
        raise ValueError(f"stash {stash.key} holds {len(sources)} messages, not a {n}-th")
    src = sources[n - 1]
    head = (
        f"Message {n} of {len(sources)} that the summary <<cg:{stash.key}>> replaced, verbatim "
        "(its original JSON):\n\n"
    )
    if len(src) <= cap:
        return head + src
    return (
        f"{head}{src[:cap]}\n\n[… the message is {len(src)} characters: only its first {cap} "
        "are shown]"
    )


def _out_of_range(ident: str, key: str, count: int) -> str:
    """The answer to an id that names a stash but no message of it (`KEY#0`, `KEY#x`, …)."""
    held = f"1 message, {key}#1" if count == 1 else f"{count} messages, {key}#1 to {key}#{count}"
    return (
        f"context_guru_expand: {ident[:64]!r} is not a message of that stash: it holds {held}. "
        f"Call with {key} for all of them."
    )


def not_an_id(ident: object) -> str:
    """The answer to a call whose id names no stash (it never reaches the store)."""
    shown = ident[:64] if isinstance(ident, str) else ident
    return (
        f"context_guru_expand: {shown!r} is not a context-guru id (ids look like <<cg:ID>>; "
        "ID#N is its N-th message)."
    )


def resolve(store: Store, ident: str, session: str | None, tenant: str | None = None) -> str:
    """What a call with `ident` answers: the span (`KEY`), one message of it (`KEY#N`), or an
    explicit 'no longer available' (also when the stash is another tenant's: that it exists,
    and its size, are not told). Never raises for an id, only for a store that fails."""
    key = named_key(ident)
    if key is None:
        return not_an_id(ident)
    stash = store.get_stash(key, session, tenant) if store.persistent else None
    if stash is None:
        return (
            f"context_guru_expand: id {ident[:64]!r} is no longer available (it expired from the "
            "store, or never existed in this session). Continue from the summary."
        )
    parsed = parse_id(ident)
    n = parsed[1] if parsed is not None else 0  # `KEY#` and not 1 to 6 digits: no message
    if n is None:
        return render_stash(stash)
    count = len(stash.sources())
    if not 1 <= n <= count:
        return _out_of_range(ident, key, count)
    return render_message(stash, n)
