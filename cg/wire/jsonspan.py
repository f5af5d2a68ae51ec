"""Locate JSON values and their exact spans in raw text, without re-serialising anything.

Every value is parsed by `json.JSONDecoder.raw_decode`, which runs at C speed and returns the
index just past the value; the only Python-level work is skipping whitespace and punctuation
between values. Spans are `str` indices into the decoded body: the caller encodes back to UTF-8,
which for text decoded strictly from UTF-8 gives back the original bytes exactly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Sequence
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any

from cg.frozen import frozen
from cg.wire.chars import Chars

_DECODER = json.JSONDecoder()
_WS = re.compile(r"[ \t\n\r]*")
# What may follow an array element: `,` and the whitespace after it (group 1 set), or `]`.
_ARRAY_SEP = re.compile(r"[ \t\n\r]*(?:(,)[ \t\n\r]*|\])")


def loads(body: bytes) -> Any:
    """`json.loads(body)`, the same value or the same kind of error, sooner on a small document:
    `json.loads` of bytes detects the encoding and matches whitespace at both ends before and
    after decoding (for a small answer, half of reading its usage).
    A UTF-8 body that starts with its value is decoded and scanned here; anything else (a
    byte-order mark, leading whitespace, another encoding, an error) is `json.loads`'s."""
    try:
        text = body.decode("utf-8")
        value, end = _DECODER.raw_decode(text)
    except ValueError:  # (UnicodeDecodeError and JSONDecodeError are both)
        return json.loads(body)
    if end != len(text) and text[end:].strip(" \t\n\r"):
        return json.loads(body)  # trailing data: json.loads says where
    return value


class JsonSpanError(ValueError):
    """The text is not the JSON shape the caller asked to walk; `pos` is where it went wrong."""

    def __init__(self, msg: str, pos: int) -> None:
        super().__init__(f"{msg} at char {pos}")
        self.pos = pos


class TooManyElements(ValueError):
    """A walked array holds more than the `limit` elements the caller allows: the walk stops
    at the first one over, so a body of a million tiny elements costs `limit` of them."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {limit} elements")
        self.limit = limit


@frozen
class Element:
    """One array element: `text[start:end]` is its exact source, `value` its parsed form."""

    start: int
    end: int
    value: Any


@frozen
class ArraySpan:
    """An array's brackets (`text[start] == "["`, `text[end - 1] == "]"`) and its elements."""

    start: int
    end: int
    elements: tuple[Element, ...]


@frozen
class Member:
    """One object member. `array` is set when the caller asked to walk this key's array."""

    key: str
    start: int
    end: int
    value: Any
    array: ArraySpan | None = None


def skip_ws(text: str, i: int) -> int:
    m = _WS.match(text, i)
    assert m is not None  # `*` always matches
    return m.end()


# Offered items begin with `(source, value)`; anything after is the caller's.
Known = Callable[[str, int], Sequence[tuple[Any, ...]]]


def walk_array(
    text: str, i: int, known: Known | None = None, limit: int | None = None
) -> ArraySpan:
    """Walk the array starting at `text[i]`, parsing each element once.

    `known(text, first)` may offer `(source, value)` pairs for the leading elements, e.g. the
    previous turn's messages: while the text repeats them verbatim, their parsed values are
    reused and nothing is parsed. Objects and arrays are self-delimiting, so a verbatim match
    of a whole object's source is that element exactly. More than `limit` elements raise
    `TooManyElements` (None: no limit).
    """
    if text[i : i + 1] != "[":
        raise JsonSpanError("expected '['", i)
    start = i
    elements: list[Element] = []
    i = skip_ws(text, i + 1)
    if text[i : i + 1] == "]":
        return ArraySpan(start, i + 1, ())
    offered = known(text, i) if known is not None else ()
    k = 0
    while True:
        if (
            k < len(offered)
            and offered[k][0][:1] in ("{", "[")
            and text.startswith(offered[k][0], i)
        ):
            value, end = offered[k][1], i + len(offered[k][0])
            k += 1
        else:
            k = len(offered)
            try:
                value, end = _DECODER.raw_decode(text, i)
            except json.JSONDecodeError as e:
                raise JsonSpanError(f"bad array element: {e.msg}", e.pos) from None
        elements.append(Element(i, end, value))
        sep = _ARRAY_SEP.match(text, end)  # one match per element: this loop is the hot path
        if sep is None:
            raise JsonSpanError("expected ',' or ']'", skip_ws(text, end))
        if sep.group(1) is None:
            return ArraySpan(start, sep.end(), tuple(elements))
        if len(elements) == limit:  # another element follows the last one allowed
            raise TooManyElements(limit)
        i = sep.end()


def extend_array(
    text: str,
    start: int,
    elements: list[Element],
    end: int,
    shift: int = 0,
    limit: int | None = None,
) -> ArraySpan:
    """The array at `start` whose leading `elements` are known (the last ends at `end`, e.g.
    the messages a previous turn shares byte for byte): walked on from there only. `text` holds
    the rest of the array with position `x` at `text[x - shift]` (a part of the whole text);
    every span returned is a position in the whole. More than `limit` elements in all raise
    `TooManyElements`."""
    while True:
        sep = _ARRAY_SEP.match(text, end - shift)
        if sep is None:
            raise JsonSpanError("expected ',' or ']'", skip_ws(text, end - shift) + shift)
        if sep.group(1) is None:
            return ArraySpan(start, sep.end() + shift, tuple(elements))
        if limit is not None and len(elements) >= limit:
            raise TooManyElements(limit)
        i = sep.end()
        try:
            value, stop = _DECODER.raw_decode(text, i)
        except json.JSONDecodeError as e:
            raise JsonSpanError(f"bad array element: {e.msg}", e.pos + shift) from None
        elements.append(Element(i + shift, stop + shift, value))
        end = stop + shift


def shift_array(arr: ArraySpan, shift: int) -> ArraySpan:
    """`arr` with every position moved by `shift` (a span found in a part of a text)."""
    if not shift:
        return arr
    els = tuple(Element(e.start + shift, e.end + shift, e.value) for e in arr.elements)
    return ArraySpan(arr.start + shift, arr.end + shift, els)


def walk_object(
    text: str,
    i: int,
    arrays: Collection[str] = (),
    known: Known | None = None,
    limit: int | None = None,
) -> tuple[list[Member], int]:
    """Walk the object starting at `text[i]`; return its members in order and its end index.

    Values under keys in `arrays` that are arrays are walked element by element (each element
    parsed once, at most `limit` of them); every other value is parsed whole by `raw_decode`.
    """
    if text[i : i + 1] != "{":
        raise JsonSpanError("expected '{'", i)
    members: list[Member] = []
    i = skip_ws(text, i + 1)
    if text[i : i + 1] == "}":
        return members, i + 1
    while True:
        if text[i : i + 1] != '"':
            raise JsonSpanError("expected a key", i)
        try:
            key, i = scanstring(text, i + 1, True)
        except json.JSONDecodeError as e:
            raise JsonSpanError(f"bad key: {e.msg}", e.pos) from None
        i = skip_ws(text, i)
        if text[i : i + 1] != ":":
            raise JsonSpanError("expected ':'", i)
        i = skip_ws(text, i + 1)
        if key in arrays and text[i : i + 1] == "[":
            arr = walk_array(text, i, known, limit)
            value = [e.value for e in arr.elements]
            members.append(Member(key, i, arr.end, value, arr))
            end = arr.end
        else:
            try:
                value, end = _DECODER.raw_decode(text, i)
            except json.JSONDecodeError as e:
                raise JsonSpanError(f"bad value for {key!r}: {e.msg}", e.pos) from None
            members.append(Member(key, i, end, value))
        i = skip_ws(text, end)
        c = text[i : i + 1]
        if c == ",":
            i = skip_ws(text, i + 1)
        elif c == "}":
            return members, i + 1
        else:
            raise JsonSpanError("expected ',' or '}'", i)


def walk_document(
    text: str,
    arrays: Collection[str] = (),
    known: Known | None = None,
    limit: int | None = None,
) -> list[Member]:
    """Walk a whole document that must be one JSON object, with only whitespace around it
    (the arrays under `arrays` of at most `limit` elements each)."""
    i = skip_ws(text, 0)
    members, end = walk_object(text, i, arrays, known, limit)
    if skip_ws(text, end) != len(text):
        raise JsonSpanError("trailing data after the object", end)
    return members


def punctuation(text: str | Chars, arr: ArraySpan) -> tuple[str, str, str]:
    """The array's own whitespace after `[`, between its first two elements (with the comma)
    and before `]`: what a rebuilt array reuses, so a pretty-printed array stays pretty and a
    compact one compact. JSON whitespace and commas: a character here is a byte."""

    def cut(a: int, b: int) -> str:
        return text.slice(a, b) if isinstance(text, Chars) else text[a:b]

    els = arr.elements
    if els:
        lead = cut(arr.start + 1, els[0].start)
        trail = cut(els[-1].end, arr.end - 1)
    else:
        lead = trail = ""
    sep = cut(els[0].end, els[1].start) if len(els) >= 2 else ","
    return lead, sep, trail


def rebuild_array(text: str | Chars, arr: ArraySpan, pieces: list[str]) -> str:
    """The array `arr` with `pieces` as its elements, in the original's own punctuation.
    `text` is the whole text, or its `Chars` (read in the few places needed, never joined)."""
    if not pieces:
        return "[]"
    lead, sep, trail = punctuation(text, arr)
    return "[" + lead + sep.join(pieces) + trail + "]"
