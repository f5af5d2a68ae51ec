"""The raw message index: one request body, decoded once, with the span of every message.

An agent's next turn is indexed on its previous one (`MessageCache`): the bytes it repeats are
compared, never decoded or parsed again, and only its new messages are read.

The transcript array is the dialect's `array_key`: `messages`, or the Responses API's `input`
(whose items are indexed as messages: a view each, calls and outputs included).

`index_body` is the only place a provider body is parsed on the hot path. Anything it cannot read
with certainty raises `BodyRejected`, whose reason goes into the decision record while the body
passes through untouched.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cg.frozen import frozen
from cg.wire.chars import Chars
from cg.wire.dialects import Dialect, MessageShapeError, MessageView
from cg.wire.jsonspan import (
    ArraySpan,
    Element,
    JsonSpanError,
    Member,
    TooManyElements,
    extend_array,
    shift_array,
    walk_document,
    walk_object,
)
from cg.wire.memo import Memo

_OBJECT_START = re.compile(rb"[ \t\r\n]*\{")


class BodyRejected(ValueError):
    """This body is not one we rewrite; `str(self)` says why, for the decision record."""


class OverBound(BodyRejected):
    """The body is past a bound on the work it may cost
    (docs/behaviour.md#bounded-work-and-shared-use); `bound` names it (the option or limit, for the
    decision record), and the body passes through untouched."""

    def __init__(self, bound: str, why: str) -> None:
        super().__init__(why)
        self.bound = bound


MAX_MESSAGES = 20_000  # option cg_max_messages: the transcript array's elements, at most
# The largest body a MessageCache keeps for its session's next turn: ~4 MB is a 1M-token
# window's whole transcript, and a kept index costs about seven times its body.
REMEMBERED_MAX = 8 * 1024 * 1024


class Deferred(Exception):
    """The body's new part (what no remembered previous turn repeats) is over the `inline`
    limits the caller gave: it is to be read where a long read stalls no one (the caller's
    worker thread), not here. Nothing was decoded or walked past the prefix comparison."""


# (new bytes, new `{`): what a body's unread part may hold to be read on the event loop.
Inline = tuple[int, int]


def _check_inline(raw: bytes, start: int, end: int, inline: Inline | None) -> None:
    """Raise Deferred when `raw[start:end]`, the part to read, is over `inline`'s limits (its
    length, or its objects counted by their opening brace: a C scan, no decoding)."""
    if inline is None:
        return
    if end - start > inline[0]:
        raise Deferred(f"{end - start} new bytes")
    objects = raw.count(b"{", start, end)
    if objects > inline[1]:
        raise Deferred(f"{objects} new objects")


def _too_many(key: str, limit: int) -> OverBound:
    return OverBound(
        "cg_max_messages", f"{key!r} holds more than {limit} elements (cg_max_messages)"
    )


@frozen
class RawMessage:
    """A message's exact source `text[start:end]`, its parsed value and its view."""

    start: int
    end: int
    value: dict[str, object]
    view: MessageView


@dataclass(slots=True)
class BodyIndex:
    """Spans are character positions in the decoded body, `chars`: one string for a body read
    whole, or segments shared with the previous turn's (`cg.wire.chars`). Read it through
    `slice` and `source`; `text` builds the whole string (for the rare reader that needs it)."""

    raw: bytes
    chars: Chars
    dialect: Dialect
    members: dict[str, Member]
    array: ArraySpan
    messages: list[RawMessage]
    _blocks: dict[int, ArraySpan | None] = field(default_factory=dict)
    # Byte offsets (in `raw`) of each message's end, then of the array's end: computed when a
    # later turn compares its bytes with this one's; a warm index inherits its shared prefix's.
    _byte_ends: list[int] = field(default_factory=list)
    # What readers computed about this body, in the slots `cg.wire.memo` declares: carried
    # to the next turn's index (`MessageCache.extend`), per message or whole by declaration.
    memo: Memo = field(default_factory=Memo)
    shared: int = 0  # leading messages shared byte for byte with the previous turn's body
    # `views`, built once (a reuse turn asks for them three times) and, like `_byte_ends`,
    # inherited over the shared prefix by a next turn's index.
    _views: list[MessageView] = field(default_factory=list)
    # The model the request's path names (`Dialect.url_model`: Gemini's), set by the caller
    # that knows the path; a body's own `model` member comes first.
    url_model: str | None = None
    # The envelope the transcript's object was found in (`Dialect.envelope`), or None.
    wrapped: str | None = None

    @property
    def model(self) -> Any:
        """The request's model: its `model` member's value, else the one its path names."""
        m = self.members.get("model")
        return m.value if m is not None else self.url_model

    def byte_ends(self) -> list[int]:
        """Where each message ends in `raw`, and (last) where the array ends. A warm turn's
        index inherits its shared prefix's; only the rest is found. Whether characters are
        bytes is asked of the text's strings (`Chars.ascii`, constant time a segment), never
        of `raw`: `bytes.isascii` reads up to the first non-ASCII byte, all of an ASCII body,
        and the previous turn's were asked again every warm turn."""
        n = len(self.messages)
        ends = self._byte_ends
        if len(ends) == n + 1:
            return ends
        del ends[n:]
        known = len(ends)
        points = [m.end for m in self.messages[known:]]
        points.append(self.array.end)
        if self.chars.ascii:  # one byte per character
            ends += points
            return ends
        pos = self.messages[known - 1].end if known else 0
        at = ends[-1] if known else 0
        for p in points:
            at += len(self.chars.slice(pos, p).encode("utf-8"))
            pos = p
            ends.append(at)
        return ends

    def byte_offset(self, p: int) -> int:
        """Where character `p` lies in `raw`, for a `p` outside the transcript array's brackets
        (at or before its `[`, at or after its end). Memoised by position relative to the array,
        in a table a warm next turn's index inherits whole: its bytes outside the array are
        this body's, so the same relative position is the same relative byte."""
        arr = self.array
        if arr.start < p < arr.end:
            raise ValueError(f"character {p} is inside the transcript array")
        if self.chars.ascii:
            return p
        known = self.memo.byte_offsets[1]
        if known is None:
            known = {}
            self.memo.byte_offsets = (None, known)
        key = p if p <= arr.start else -1 - (p - arr.end)  # before: >= 0; after: < 0
        delta = known.get(key)
        if delta is None:
            delta = len(
                (self.chars.slice(0, p) if key >= 0 else self.chars.slice(arr.end, p)).encode()
            )
            known[key] = delta
        return delta if key >= 0 else self.byte_ends()[-1] + delta

    @property
    def text(self) -> str:
        """The whole decoded body as one string (joined once for a segmented text)."""
        return self.chars.whole()

    def slice(self, a: int, b: int) -> str:
        """`text[a:b]`, without building `text`."""
        return self.chars.slice(a, b)

    @property
    def views(self) -> list[MessageView]:
        """Every message's view, in order: one list shared by every reader (read only)."""
        v = self._views
        if len(v) != len(self.messages):
            v[len(v) :] = [m.view for m in self.messages[len(v) :]]
        return v

    def source(self, i: int) -> str:
        m = self.messages[i]
        return self.chars.slice(m.start, m.end)

    def content_array(self, i: int) -> ArraySpan | None:
        """The span of message `i`'s content block array (walked lazily, then cached)."""
        if i not in self._blocks:
            m = self.messages[i]
            key = self.dialect.content_blocks_key()
            s, shift, _ = self.chars.locate(m.start)  # a message lies within one segment
            members, _ = walk_object(s, m.start - shift, arrays=(key,))
            arr = next((x.array for x in members if x.key == key), None)
            self._blocks[i] = shift_array(arr, shift) if arr is not None else None
        return self._blocks[i]


class MessageCache:
    """The message lists of recent requests, so a turn that repeats the previous turn's
    messages (every agent turn does) parses and views only what is new.

    Lists are keyed by dialect and first message: an agent session keeps its first message, so
    its next turn finds its previous one. Parsed values and views are shared read-only.
    """

    def __init__(self, max_lists: int = 16, max_bytes: int = REMEMBERED_MAX) -> None:
        self.max_lists = max_lists
        self.max_bytes = max_bytes  # a larger body is read, never kept for its next turn
        self._lists: OrderedDict[tuple[str, str], BodyIndex] = OrderedDict()
        self.hits = 0
        self.prefix_hits = 0  # turns indexed from a previous body's shared bytes

    def offer(self, dialect: Dialect) -> Callable[[str, int], list[tuple[str, Any, MessageView]]]:
        def known(text: str, first: int) -> list[tuple[str, Any, MessageView]]:
            for (name, src), prev in reversed(self._lists.items()):
                if name == dialect.name and text.startswith(src, first):
                    self._lists.move_to_end((name, src))
                    return [(prev.source(i), m.value, m.view) for i, m in enumerate(prev.messages)]
            return []

        return known

    def remember(self, index: BodyIndex) -> None:
        if not index.messages or len(index.raw) > self.max_bytes:
            return
        key = (index.dialect.name, index.source(0))
        self._lists[key] = index
        self._lists.move_to_end(key)
        self._trim()

    def resize(self, max_lists: int) -> None:
        """Keep at most `max_lists` bodies from now on (the least recently used go first)."""
        self.max_lists = max_lists
        self._trim()

    def _trim(self) -> None:
        while len(self._lists) > self.max_lists:
            self._lists.popitem(last=False)

    def extend(
        self,
        raw: bytes,
        dialect: Dialect,
        max_messages: int | None = None,
        inline: Inline | None = None,
    ) -> BodyIndex | None:
        """The index of `raw` built on a previous body it shares whole messages with, byte for
        byte from its first byte (an agent's next turn): everything before the first differing
        message is reused as it is (members, spans, values, views), and only the rest of the
        array and what follows it is read; the index is remembered in its predecessor's place.
        None when no previous body shares its first message, or anything is unusual (the full
        walk then decides)."""
        found = self._match(raw, dialect)
        if found is not None:
            key, prev, k = found
            self._lists.move_to_end(key)
            try:
                index = _extend(prev, k, raw, dialect, max_messages, inline)
            except (OverBound, Deferred):
                raise  # the full walk would stop at the same bound, later
            except (JsonSpanError, BodyRejected, RecursionError, UnicodeDecodeError):
                return None
            if index is not None:
                self.hits += k
                self.prefix_hits += 1
                # Remembered under the key it was found by: its first message is prev's, byte
                # for byte, so `remember` would slice that message out again and hash the copy
                # (the key's string keeps its hash; ~6 KB of a Codex or OpenAI first message).
                if len(raw) > self.max_bytes:
                    del self._lists[key]  # past what is kept: its next turn is read whole
                else:
                    self._lists[key] = index
            return index
        return None

    def shared(self, raw: bytes, dialect: Dialect) -> int:
        """How many leading bytes of `raw` (whole messages, from its first byte) a remembered
        body repeats: what `extend` would not read again (0: none). Reads, moves nothing."""
        found = self._match(raw, dialect)
        if found is None:
            return 0
        _, prev, k = found
        return prev.byte_ends()[k - 1]

    def _match(self, raw: bytes, dialect: Dialect) -> tuple[tuple[str, str], BodyIndex, int] | None:
        """The newest remembered body of the dialect whose first message `raw` repeats byte
        for byte, its key, and how many of its whole messages `raw` repeats from the start."""
        for key, prev in reversed(self._lists.items()):
            if key[0] != dialect.name:
                continue
            ends = prev.byte_ends()
            # A view of the previous body: a prefix is compared where it lies, never copied
            # (a copy of a ~1 MB prefix, up to ~9 per turn in the search).
            was = memoryview(prev.raw)
            if not raw.startswith(was[: ends[0]]):
                continue
            n = len(prev.messages)
            if raw.startswith(was[: ends[n - 1]]):
                return key, prev, n
            lo, hi = 1, n - 1  # the longest run of whole messages shared: ends[lo - 1] matches
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if raw.startswith(was[: ends[mid - 1]]):
                    lo = mid
                else:
                    hi = mid - 1
            return key, prev, lo
        return None


def _extend(
    prev: BodyIndex,
    k: int,
    raw: bytes,
    dialect: Dialect,
    max_messages: int | None = None,
    inline: Inline | None = None,
) -> BodyIndex | None:
    """`MessageCache.extend`'s index: prev's first `k` messages and what precedes them, the
    new messages read from `raw`, and prev's members after the array. Only the new messages'
    bytes are decoded. None when the bytes after the array differ from prev's, or the array
    does not end where they begin."""
    key = dialect.array_key
    ends = prev.byte_ends()
    # Where the array ends in bytes, if everything after it is prev's: checked before any of
    # the middle is read (a view of prev's bytes, compared where they lie).
    arr_end_b = len(raw) - (len(prev.raw) - ends[-1])
    if arr_end_b <= ends[k - 1] or not raw.endswith(memoryview(prev.raw)[ends[-1] :]):
        return None  # something after the array changed: walk it all
    _check_inline(raw, ends[k - 1], arr_end_b, inline)
    middle = raw[ends[k - 1] : arr_end_b].decode("utf-8")
    last = prev.messages[k - 1].end
    try:
        arr = extend_array(
            middle, prev.array.start, list(prev.array.elements[:k]), last, last, max_messages
        )
    except TooManyElements as e:
        raise _too_many(key, e.limit) from None
    if arr.end != last + len(middle):
        return None
    shift = arr.end - prev.array.end
    by_key: dict[str, Member] = {}
    after = False
    for name, m in prev.members.items():
        if name == key:
            # The first k values are prev's own objects (its elements are shared): a C copy.
            values = m.value[:k] + [e.value for e in arr.elements[k:]]
            by_key[name] = Member(name, m.start, arr.end, values, arr)
            after = True
        elif after:
            by_key[name] = Member(name, m.start + shift, m.end + shift, m.value, m.array)
        else:
            by_key[name] = m
    refused = dialect.refuse(by_key)
    if refused:
        raise BodyRejected(refused)
    out = prev.messages[:k]
    for n in range(k, len(arr.elements)):
        out.append(_message(dialect, n, arr.elements[n]))
    chars = prev.chars.spliced(last, middle, prev.array.end)
    index = BodyIndex(raw, chars, dialect, by_key, arr, out, shared=k, wrapped=prev.wrapped)
    index._byte_ends = ends[:k]
    index._views = prev.views[:k]
    index.memo = prev.memo.carried(k)
    return index


def index_body(
    raw: bytes,
    dialect: Dialect,
    cache: MessageCache | None = None,
    max_messages: int | None = None,
    inline: Inline | None = None,
) -> BodyIndex:
    """The body indexed (on the previous turn's index in `cache` where it repeats one), or
    BodyRejected: `OverBound` when its transcript holds more than `max_messages` elements
    (found as soon as the walk passes the bound). With `inline`, a body whose part to read is
    over those limits raises `Deferred` before any of it is read."""
    if not raw:
        raise BodyRejected("empty body")
    # A warm turn decodes only its new messages; its bytes before and after them are a body
    # already read whole (UTF-8, no byte-order mark, an object), so only the start is checked.
    if cache is not None and _OBJECT_START.match(raw):
        warm = cache.extend(raw, dialect, max_messages, inline)
        if warm is not None:
            return warm  # (remembered by `extend`, in its predecessor's place)
    _check_inline(raw, 0, len(raw), inline)
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
        members = walk_document(text, arrays=(key,), known=known, limit=max_messages)
    except TooManyElements as e:
        raise _too_many(key, e.limit) from None
    except (JsonSpanError, RecursionError) as e:
        raise BodyRejected(f"malformed JSON: {e}") from None
    by_key: dict[str, Member] = {}
    for m in members:
        if m.key in by_key:
            raise BodyRejected(f"duplicate top-level key {m.key!r}")
        by_key[m.key] = m
    wrap = dialect.envelope
    if wrap is not None and key not in by_key and isinstance(by_key.get(wrap, _NO).value, dict):
        by_key = _unwrapped(text, by_key, wrap, key, known, max_messages)
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
    index = BodyIndex(raw, Chars.of(text), dialect, by_key, msgs.array, out)
    if wrap is not None and wrap not in by_key and key not in {m.key for m in members}:
        index.wrapped = wrap
    if cache is not None:
        cache.remember(index)
    return index


_NO = Member("", 0, 0, None)


def _unwrapped(
    text: str,
    outer: dict[str, Member],
    wrap: str,
    key: str,
    known: Any,
    limit: int | None,
) -> dict[str, Member]:
    """The members of a request wrapped in `wrap` (Code Assist's `{"model", "project",
    "request": {…}}`): the wrapped object's, then the envelope's own beside them (its `model`
    says the model), all by their place in the text, so a splice in either lands where it lies."""
    try:
        inner, _ = walk_object(text, outer[wrap].start, arrays=(key,), known=known, limit=limit)
    except TooManyElements as e:
        raise _too_many(key, e.limit) from None
    except (JsonSpanError, RecursionError) as e:
        raise BodyRejected(f"malformed JSON: {e}") from None
    merged = [m for m in outer.values() if m.key != wrap]
    names = {m.key for m in merged}
    for m in inner:
        if m.key in names:
            raise BodyRejected(f"{wrap}.{m.key} beside the envelope's own {m.key!r}")
        names.add(m.key)
        merged.append(m)
    return {m.key: m for m in sorted(merged, key=lambda m: m.start)}


def _message(dialect: Dialect, n: int, el: Element) -> RawMessage:
    key = dialect.array_key
    if not isinstance(el.value, dict):
        raise BodyRejected(f"{key}[{n}] is not an object (got {type(el.value).__name__})")
    try:
        view = dialect.view(el.value)
    except MessageShapeError as e:
        raise BodyRejected(f"{key}[{n}]: {e}") from None
    if view.kind == "message" and view.role not in dialect.view_roles:
        raise BodyRejected(f"{key}[{n}] has unknown role {view.role!r}")
    return RawMessage(el.start, el.end, el.value, view)
