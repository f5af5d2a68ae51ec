"""Original body + a plan of pieces -> the new body, leaving every untouched byte identical.

A plan lists the output messages in order:

    Keep(i)          message i, its original bytes
    Cut(i, blocks)   message i with some content blocks cut out of its raw bytes
    Insert(json)     a new message (the summary), serialised once, byte-stable across turns
    Edit(i, json)    message i as its own source with values replaced in place (a masked tool
                     output: only that value's bytes differ), `json` the message as sent

Only the `messages` array is rebuilt; `model`, `system`, `tools`, whitespace, key order and
escapes outside it stay exactly as the client sent them. The identity plan returns the original
`bytes` object itself.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cg.wire.body import BodyIndex
from cg.wire.dialects import Dialect, MessageView
from cg.wire.jsonspan import ArraySpan, punctuation, shift_array, walk_object
from cg.wire.reply import dumps


@dataclass(frozen=True, slots=True)
class Keep:
    index: int


@dataclass(frozen=True, slots=True)
class Cut:
    index: int
    drop: frozenset[int]


@dataclass(frozen=True, slots=True)
class Insert:
    json: str
    view: MessageView

    @classmethod
    def message(cls, obj: dict[str, Any], dialect: Dialect) -> Insert:
        """Serialise a new message deterministically: the same object gives the same bytes."""
        text = dumps(obj)
        return cls(text, dialect.view(obj))


@dataclass(frozen=True, slots=True)
class Edit:
    """Message `index` re-emitted as its original source with some values replaced where they
    lie (`edited`): every other byte of the message is the client's. It stays message `index`
    (`plan_sources` names it `m{index}`; it is not dropped), and `view` is its view as sent."""

    index: int
    json: str
    view: MessageView

    @classmethod
    def of(cls, index: BodyIndex, i: int, values: Sequence[tuple[int, int, str]]) -> Edit:
        """Message i with each `(start, end, text)` of `values` (positions in its source)
        replaced by `text`, viewed by its dialect."""
        text = edited(index.source(i), values)
        return cls(i, text, index.dialect.view(json.loads(text)))


def edited(source: str, values: Sequence[tuple[int, int, str]]) -> str:
    """`source` with each `[start, end)` (not overlapping, any order) replaced by its text."""
    out: list[str] = []
    at = 0
    for start, end, text in sorted(values):
        if start < at or end < start or end > len(source):
            raise ValueError(f"edit [{start}, {end}) overlaps or lies outside the message")
        out += (source[at:start], text)
        at = end
    out.append(source[at:])
    return "".join(out)


Piece = Keep | Cut | Insert | Edit
Plan = list[Piece]


@dataclass(frozen=True, slots=True)
class SentShape:
    """What a rewritten body is made of, for a reader after the hot path that would otherwise
    index the body again (the ledger's token count of what went upstream): the plan over the
    client's messages, and the expand tool put in (where, as a byte offset in the client's
    body, and its bytes), if it was."""

    plan: Plan
    tool: tuple[int, bytes] | None = None


# Shared `Keep`s (frozen): an identity plan is a slice of these, and recognised by identity.
_KEEPS: list[Piece] = []


def identity(n: int) -> Plan:
    if len(_KEEPS) < n:
        _KEEPS.extend(Keep(i) for i in range(len(_KEEPS), n))
    return _KEEPS[:n]


def is_identity(plan: Sequence[Piece], n: int) -> bool:
    if len(plan) != n:
        return False
    if len(_KEEPS) >= n and all(map(operator.is_, plan, _KEEPS)):
        return True  # every request's plan until a component acts: C speed
    return all(isinstance(p, Keep) and p.index == i for i, p in enumerate(plan))


def cut_source(index: BodyIndex, i: int, drop: frozenset[int]) -> str:
    """Message i's source with the blocks in `drop` cut out; the rest of its bytes unchanged."""
    arr = index.content_array(i)
    if arr is None:
        raise ValueError(f"messages[{i}] has no content block array to cut from")
    m = index.messages[i]
    return cut_blocks(index.source(i), shift_array(arr, -m.start), drop)


def cut_edit(edit: Edit, drop: frozenset[int], dialect: Dialect) -> Edit:
    """An edited message with the blocks in `drop` cut out of its text, as `cut_source` cuts a
    client's message: what is left of a masked message whose tool results lost their call."""
    key = dialect.content_blocks_key()
    members, _ = walk_object(edit.json, 0, arrays=(key,))
    arr = next((x.array for x in members if x.key == key), None)
    if arr is None:
        raise ValueError(f"messages[{edit.index}] has no content block array to cut from")
    text = cut_blocks(edit.json, arr, drop)
    return Edit(edit.index, text, dialect.view(json.loads(text)))


def cut_blocks(src: str, arr: ArraySpan, drop: frozenset[int]) -> str:
    """`src` (one message's text) with the elements in `drop` of its block array `arr` (spans
    in `src`) cut out."""
    els = arr.elements
    keep = [n for n in range(len(els)) if n not in drop]
    if not keep:
        return src[: arr.start] + "[]" + src[arr.end :]
    # Each dropped block goes with one separator next to it; every other byte (including the
    # whitespace between kept blocks, uniform or not) stays exactly as the client sent it.
    parts = [src[: els[0].start]]
    for a, n in enumerate(keep):
        parts.append(src[els[n].start : els[n].end])
        if a + 1 < len(keep):
            parts.append(src[els[n].end : els[n + 1].start])
    parts.append(src[els[-1].end :])
    return "".join(parts)


def cut_value(index: BodyIndex, i: int, drop: frozenset[int]) -> dict[str, Any]:
    value = dict(index.messages[i].value)
    key = index.dialect.content_blocks_key()
    blocks = value.get(key)
    if isinstance(blocks, list):
        value[key] = [b for n, b in enumerate(blocks) if n not in drop]
    return value


def splice(index: BodyIndex, plan: Sequence[Piece]) -> bytes:
    if is_identity(plan, len(index.messages)):
        return index.raw
    start, end, parts = splice_array_bytes(index, plan)
    return apply_edits(index.raw, [(start, end, parts)])


Bytes = bytes | memoryview


def splice_array_bytes(index: BodyIndex, plan: Sequence[Piece]) -> tuple[int, int, list[Bytes]]:
    """The rebuilt array in the original's punctuation (`rebuild_array`), in parts, and the
    span `[start, end)` of `raw` it replaces: a kept message is its own bytes, sliced where
    they lie in `raw` (its end is known, and the punctuation before it is ASCII), and two
    messages that were neighbours keep the separator that lay between them.

    The parts are `[`, lead, message, sep, message, ..., trail, `]` (`b"[]"` alone for no
    messages): `array_messages` reads the messages back out of them, so the role check reads
    each message where it lies, and the body is joined once (`apply_edits`), not the array
    first. Built as text and encoded, the new body was a copy of every kept byte per step,
    ~4 bytes a character once one emoji was in the body."""
    arr = index.array
    msgs = index.messages
    ends = index.byte_ends()
    start = index.byte_offset(arr.start)
    if not plan:
        return start, ends[-1], [b"[]"]
    lead, sep, trail = (p.encode() for p in punctuation(index.chars, arr))
    raw = memoryview(index.raw)
    parts: list[Bytes] = [b"[", lead]
    last = -2  # the client's message the previous piece came from (-2: none)
    for n, p in enumerate(plan):
        at = -2 if isinstance(p, Insert) else p.index
        if n and at == last + 1:
            # Two of the client's messages that were neighbours still are: the bytes between
            # them as they came (an edited body whose separators vary keeps them).
            parts.append(raw[ends[last] : msgs[at].start + ends[last] - msgs[last].end])
        elif n:
            parts.append(sep)
        last = at
        if isinstance(p, Keep):
            i = p.index
            m = msgs[i]
            before = ends[i - 1] - msgs[i - 1].end if i else start - arr.start
            parts.append(raw[m.start + before : ends[i]])
        elif isinstance(p, Cut):
            parts.append(cut_source(index, p.index, p.drop).encode("utf-8"))
        else:  # an Insert or an Edit: its text as made
            parts.append(p.json.encode("utf-8"))
    parts += (trail, b"]")
    return start, ends[-1], parts


def array_messages(parts: Sequence[Bytes]) -> Sequence[Bytes]:
    """The messages of a `splice_array_bytes` array, in order (every other part)."""
    return parts[2:-2:2]


def array_punctuation(parts: Sequence[Bytes]) -> list[Bytes]:
    """What lies around and between its messages: `[`, lead, the separators, trail, `]`."""
    if len(parts) < 3:
        return list(parts)
    return [parts[0], parts[1], *parts[3:-2:2], parts[-2], parts[-1]]


def apply_edits(raw: bytes, edits: Sequence[tuple[int, int, Sequence[Bytes]]]) -> bytes:
    """`raw` with each `[start, end)` replaced by its parts (in any order, not overlapping):
    one copy of the body, the untouched stretches read where they lie."""
    view = memoryview(raw)
    out: list[Bytes] = []
    at = 0
    for start, end, parts in sorted(edits, key=operator.itemgetter(0)):
        if start < at or end < start:
            raise ValueError(f"edit [{start}, {end}) overlaps or precedes byte {at}")
        out.append(view[at:start])
        out += parts
        at = end
    out.append(view[at:])
    return b"".join(out)


def plan_views(index: BodyIndex, plan: Sequence[Piece]) -> list[MessageView]:
    """The views of the output messages, without re-reading the new body."""
    views: list[MessageView] = []
    for p in plan:
        if isinstance(p, Keep):
            views.append(index.messages[p.index].view)
        elif isinstance(p, Cut):
            views.append(index.dialect.view(cut_value(index, p.index, p.drop)))
        else:  # an Insert or an Edit carries its view
            views.append(p.view)
    return views


def plan_sources(plan: Sequence[Piece]) -> list[str]:
    """A stable name per output message: which input message it came from (kept, cut or
    edited), or `new#k`."""
    out: list[str] = []
    k = 0
    for p in plan:
        if isinstance(p, Insert):
            out.append(f"new#{k}")
            k += 1
        else:
            out.append(f"m{p.index}")
    return out
