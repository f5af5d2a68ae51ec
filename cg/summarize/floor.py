"""What every summary message carries whatever the model wrote: the floor
(docs/behaviour.md#summarize-the-floor).

After the model's `<summary>` and before the marker, two sections built from the replaced span
alone, deterministically, so a summary that forgets an instruction or a file still shows it:

    <user_messages>   the span's human-typed user texts (`cg.retention.facts`, kind `user`),
                      verbatim and oldest first, within `keep_user_tokens`: when over, the
                      oldest go first and the count left out is said, with the id that
                      expands the span
    <artifact_trail>  the span's files (with the tools that touched each), commands (with the
                      exit status their output states) and errors, each with the `KEY#N` id of
                      the message it is in, within `keep_artifact_tokens` (the oldest entries
                      out first)

The span is read whole each time a checkpoint is made (the client re-sends every message it
replaced), so a roll-forward's floor covers the earlier checkpoint's span too: it carries over
without being copied. The text is part of the checkpoint's message, so it is byte-stable for
the checkpoint's life. A budget of 0 turns its section off.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from cg.retention.facts import Found, transcript_facts

IDS_PER_FILE = 3  # a file touched many times shows its latest ids only


@dataclass(slots=True)
class _Entry:
    kind: str
    text: str
    last: int  # the latest message position it was found at (age: the oldest go first)
    tools: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    status: int | None = None


def span_facts(dialect: str, sources: Sequence[str]) -> list[Found]:
    """The facts of a stashed span's message sources, at their 0-based positions in it."""
    parsed = []
    for src in sources:
        try:
            parsed.append(json.loads(src))
        except ValueError:
            parsed.append(None)
    return transcript_facts(dialect, parsed)


def _ref(key: str | None, at: int) -> str:
    return f"{key}#{at + 1}" if key else ""


def _users(
    found: Sequence[Found], key: str | None, budget: int, count: Callable[[str], int]
) -> str:
    seen: set[str] = set()
    users: list[Found] = []
    for f in found:
        if f.kind == "user" and f.text not in seen:
            seen.add(f.text)
            users.append(f)
    if not users or budget <= 0:
        return ""
    kept: list[str] = []
    used = 0
    for f in reversed(users):  # the newest first, so the oldest are the ones left out
        ref = _ref(key, f.at)
        block = f"[{'id ' + ref if ref else 'user'}]\n{f.text}"
        cost = count(block)
        if used + cost > budget:
            break
        kept.append(block)
        used += cost
    kept.reverse()
    lines = [
        "<user_messages>",
        "The user's own messages in the replaced span, verbatim, oldest first:",
    ]
    left = len(users) - len(kept)
    if left:
        where = f' (call context_guru_expand with id "{key}" to read them)' if key else ""
        lines.append(f"[{left} earlier user messages left out for length{where}]")
    lines += kept
    lines.append("</user_messages>")
    return "\n".join(lines)


def _entries(found: Sequence[Found]) -> list[_Entry]:
    by: dict[tuple[str, str], _Entry] = {}
    for f in found:
        if f.kind == "user" or not f.text:
            continue
        e = by.get((f.kind, f.text))
        if e is None:
            e = by[(f.kind, f.text)] = _Entry(f.kind, f.text, f.at)
        e.last = max(e.last, f.at)
        if f.tool and f.tool not in e.tools:
            e.tools.append(f.tool)
        if f.at not in e.ids:
            e.ids.append(f.at)
        if f.status is not None:
            e.status = f.status
    return list(by.values())


def _line(e: _Entry, key: str | None) -> str:
    refs = ", ".join(_ref(key, at) for at in e.ids[-IDS_PER_FILE:]) if key else ""
    tail = f" [{refs}]" if refs else ""
    if e.kind == "file":
        tools = f" ({', '.join(e.tools)})" if e.tools else ""
        return f"- {e.text}{tools}{tail}"
    if e.kind == "command":
        status = f" → exit {e.status}" if e.status is not None else ""
        return f"- {e.text}{status}{tail}"
    return f"- {e.text}{tail}"


_HEADINGS = {
    "file": "Files (with the tools that touched them):",
    "command": "Commands (with the exit status where the output gave one):",
    "error": "Errors:",
}


def _trail(
    found: Sequence[Found], key: str | None, budget: int, count: Callable[[str], int]
) -> str:
    entries = _entries(found)
    if not entries or budget <= 0:
        return ""
    kept: list[tuple[_Entry, str]] = []
    used = 0
    for e in sorted(entries, key=lambda e: e.last, reverse=True):  # the newest first
        line = _line(e, key)
        cost = count(line)
        if used + cost > budget:
            break
        kept.append((e, line))
        used += cost
    if not kept:
        return ""
    left = len(entries) - len(kept)
    lines = ["<artifact_trail>"]
    if key:
        lines.append(
            "Each entry ends with the id of the message it is in: call context_guru_expand "
            f'with that id (e.g. "{_ref(key, kept[0][0].ids[-1])}") to read that one message '
            "verbatim."
        )
    if left:
        lines.append(f"[{left} older entries left out for length]")
    order = {id(e): n for n, e in enumerate(entries)}  # first seen first, within a heading
    for kind, heading in _HEADINGS.items():
        mine = sorted((x for x in kept if x[0].kind == kind), key=lambda x: order[id(x[0])])
        if mine:
            lines.append(heading)
            lines += [line for _, line in mine]
    lines.append("</artifact_trail>")
    return "\n".join(lines)


def build_floor(
    found: Sequence[Found],
    key: str | None,
    *,
    keep_user_tokens: int,
    keep_artifact_tokens: int,
    count: Callable[[str], int],
) -> str:
    """The floor's text for a span whose facts are `found` (positions within the span), its
    ids naming the stash `key` (None: no stash, no ids); "" when both sections are empty."""
    parts = [
        _users(found, key, keep_user_tokens, count),
        _trail(found, key, keep_artifact_tokens, count),
    ]
    return "\n".join(p for p in parts if p)
