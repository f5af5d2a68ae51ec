"""The raw message index: one request body, decoded once, with the span of every message.

The transcript array is the dialect's `array_key`: `messages`, or the Responses API's `input`
(whose items are indexed as messages: a view each, calls and outputs included).

`index_body` is the only place a provider body is parsed on the hot path. Anything it cannot read
with certainty raises `BodyRejected`, whose reason goes into the decision record while the body
passes through untouched.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cg.wire.dialects import Dialect, MessageShapeError, MessageView
from cg.wire.jsonspan import ArraySpan, Element, JsonSpanError, Member, walk_document, walk_object


class BodyRejected(ValueError):
    """This body is not one we rewrite; `str(self)` says why, for the decision record."""


@dataclass(frozen=True, slots=True)
class RawMessage:
    """A message's exact source `text[start:end]`, its parsed value and its view."""

    start: int
    end: int
    value: dict[str, object]
    view: MessageView


@dataclass(slots=True)
class BodyIndex:
    raw: bytes
    text: str
    dialect: Dialect
    members: dict[str, Member]
    array: ArraySpan
    messages: list[RawMessage]
    _blocks: dict[int, ArraySpan | None] = field(default_factory=dict)

    @property
    def views(self) -> list[MessageView]:
        return [m.view for m in self.messages]

    def source(self, i: int) -> str:
        m = self.messages[i]
        return self.text[m.start : m.end]

    def content_array(self, i: int) -> ArraySpan | None:
        """The span of message `i`'s content block array (walked lazily, then cached)."""
        if i not in self._blocks:
            m = self.messages[i]
            key = self.dialect.content_blocks_key()
            members, _ = walk_object(self.text, m.start, arrays=(key,))
            self._blocks[i] = next((x.array for x in members if x.key == key), None)
        return self._blocks[i]


class MessageCache:
    """The message lists of recent requests, so a turn that repeats the previous turn's
    messages (every agent turn does) parses and views only what is new.

    Lists are keyed by dialect and first message: an agent session keeps its first message, so
    its next turn finds its previous one. Parsed values and views are shared read-only.
    """

    def __init__(self, max_lists: int = 16) -> None:
        self.max_lists = max_lists
        self._lists: OrderedDict[tuple[str, str], list[tuple[str, Any, MessageView]]] = (
            OrderedDict()
        )
        self.hits = 0

    def offer(self, dialect: Dialect) -> Callable[[str, int], list[tuple[str, Any, MessageView]]]:
        def known(text: str, first: int) -> list[tuple[str, Any, MessageView]]:
            for (name, src), msgs in reversed(self._lists.items()):
                if name == dialect.name and text.startswith(src, first):
                    self._lists.move_to_end((name, src))
                    return msgs
            return []

        return known

    def remember(self, index: BodyIndex) -> None:
        if not index.messages:
            return
        msgs = [(index.source(i), m.value, m.view) for i, m in enumerate(index.messages)]
        self._lists[(index.dialect.name, msgs[0][0])] = msgs
        self._lists.move_to_end((index.dialect.name, msgs[0][0]))
        while len(self._lists) > self.max_lists:
            self._lists.popitem(last=False)


def index_body(raw: bytes, dialect: Dialect, cache: MessageCache | None = None) -> BodyIndex:
    if not raw:
        raise BodyRejected("empty body")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BodyRejected(f"body is not UTF-8 ({e.reason} at byte {e.start})") from None
    if text[:1] == "\ufeff":
        raise BodyRejected("body starts with a byte-order mark")
    stripped = text.lstrip(" \t\r\n")
    if stripped[:1] != "{":
        raise BodyRejected("body is not a JSON object")
    offered: list[tuple[str, Any, MessageView]] = []

    def known(t: str, first: int) -> list[tuple[str, Any, MessageView]]:
        offered.extend(cache.offer(dialect)(t, first) if cache is not None else ())
        return offered

    key = dialect.array_key
    try:
        members = walk_document(text, arrays=(key,), known=known)
    except (JsonSpanError, RecursionError) as e:
        raise BodyRejected(f"malformed JSON: {e}") from None
    by_key: dict[str, Member] = {}
    for m in members:
        if m.key in by_key:
            raise BodyRejected(f"duplicate top-level key {m.key!r}")
        by_key[m.key] = m
    refused = dialect.refuse(by_key)
    if refused:
        raise BodyRejected(refused)
    msgs = by_key.get(key)
    if msgs is None:
        raise BodyRejected(f"no {key!r} field")
    if msgs.array is None:
        raise BodyRejected(f"{key!r} is a {type(msgs.value).__name__}, not an array")
    out: list[RawMessage] = []
    for n, el in enumerate(msgs.array.elements):
        if n < len(offered) and el.value is offered[n][1]:
            out.append(RawMessage(el.start, el.end, el.value, offered[n][2]))
            if cache is not None:
                cache.hits += 1
        else:
            out.append(_message(dialect, n, el))
    index = BodyIndex(raw, text, dialect, by_key, msgs.array, out)
    if cache is not None:
        cache.remember(index)
    return index


def _message(dialect: Dialect, n: int, el: Element) -> RawMessage:
    key = dialect.array_key
    if not isinstance(el.value, dict):
        raise BodyRejected(f"{key}[{n}] is not an object (got {type(el.value).__name__})")
    try:
        view = dialect.view(el.value)
    except MessageShapeError as e:
        raise BodyRejected(f"{key}[{n}]: {e}") from None
    if view.kind == "message" and view.role not in dialect.wire_roles:
        raise BodyRejected(f"{key}[{n}] has unknown role {view.role!r}")
    return RawMessage(el.start, el.end, el.value, view)
