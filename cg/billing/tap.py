"""Reading the provider's `usage` from an answer as its bytes pass
(docs/behaviour.md#usage-cost-and-savings).

A streamed (SSE) answer is never held back: `UsageTap` is a mitmproxy stream callable
(`flow.response.stream = tap`) that returns every chunk unchanged and, on the side, keeps only the
bytes of the one event not finished yet. Only an event whose data names a non-null `"usage"` is
parsed at all (found with `bytes.count`, at C speed): a 1 MB answer of text deltas costs a scan,
not a JSON parse per delta. A JSON answer is read whole in the `response` hook (`usage_of_json`).

Which events carry usage is the dialect's business, behind a small `Reader` per wire format
(`Dialect.usage_reader`):

    anthropic   `message_start.message.usage`, then `message_delta.usage`: cumulative totals,
                a non-null value replaces the one before
    openai      the chunk with a non-null `usage` (present only when the client asked
                `stream_options.include_usage`; the request is never changed to ask for it)
    responses   `response.completed` / `.incomplete` / `.failed`: `response.usage`

The tap never raises: any internal error disables it (`state` says so, `error` says why) and the
chunks keep flowing. A content-encoded stream is decoded incrementally (gzip, deflate, br, zstd)
on a copy; an encoding it cannot decode is skipped (`state` UNDECODABLE), never an error.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from typing import Any

import brotli
import zstandard

from cg.wire.dialects import DIALECTS
from cg.wire.dialects.base import UsageReader as Reader
from cg.wire.jsonspan import loads

READING = "reading"
DISABLED = "disabled"
UNDECODABLE = "undecodable"
MAX_EVENT = 4 * 1024 * 1024  # an unfinished event longer than this is dropped, not buffered
_ZLIB_OUT = 1024 * 1024  # decompressed bytes per step: a compression bomb is sliced, not swallowed


# Which events carry usage is the dialect's (`Dialect.usage_reader`).
READERS: dict[str, Callable[[], Reader]] = {name: d.usage_reader for name, d in DIALECTS.items()}


def mentions_usage(data: bytes, key: bytes = b'"usage"') -> bool:
    """Whether an event's bytes name the usage `key` (quoted: the dialect's `usage_key`) other
    than as `"usage": null` (OpenAI puts a null usage on every chunk when the client asked for
    usage; only the last one counts)."""
    n = data.count(key)
    return n > 0 and n > data.count(key + b":null") + data.count(key + b": null")


def usage_of_json(body: bytes, dialect: str = "anthropic") -> tuple[Any, str | None]:
    """(the usage member, the model) of a JSON answer — every dialect puts both at the top,
    under its `usage_key` and `model_key` — or (None, None) when the body is not a JSON
    object. Raises ValueError for a body that is not JSON."""
    doc = loads(body)
    if not isinstance(doc, dict):
        return None, None
    d = DIALECTS[dialect]
    doc = d.answer_body(doc)
    if not isinstance(doc, dict):
        return None, None
    return doc.get(d.usage_key), d.answer_model(doc)


# -- content-encoding -------------------------------------------------------------------------


class UndecodableError(ValueError):
    """A content-encoding the tap cannot undo incrementally."""


class _Zlib:
    def __init__(self, wbits: int) -> None:
        self.wbits = wbits
        self.d = zlib.decompressobj(wbits)
        self.started = False

    def __call__(self, data: bytes) -> bytes:
        if not self.started and self.wbits == zlib.MAX_WBITS:
            # `deflate` is zlib-wrapped by the standard, raw by some servers: look once.
            self.started = True
            if data and (data[0] & 0x0F) != 8:
                self.wbits = -zlib.MAX_WBITS
                self.d = zlib.decompressobj(self.wbits)
        self.started = True
        out = [self.d.decompress(data, _ZLIB_OUT)]
        while self.d.unconsumed_tail:
            out.append(self.d.decompress(self.d.unconsumed_tail, _ZLIB_OUT))
        return b"".join(out)


def _one(encoding: str) -> Callable[[bytes], bytes]:
    if encoding in ("gzip", "x-gzip"):
        return _Zlib(16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        return _Zlib(zlib.MAX_WBITS)
    if encoding == "br":
        d = brotli.Decompressor()
        return lambda data: bytes(d.process(data))
    if encoding == "zstd":
        z = zstandard.ZstdDecompressor().decompressobj(read_across_frames=True)
        return lambda data: bytes(z.decompress(data))
    raise UndecodableError(f"content-encoding {encoding!r}")


def decoder(content_encoding: str) -> Callable[[bytes], bytes] | None:
    """An incremental decoder for a `content-encoding` header value (None: nothing to undo).
    Several codings are undone in the reverse of the order they were applied."""
    codings = [c.strip().lower() for c in content_encoding.split(",") if c.strip()]
    steps = [_one(c) for c in reversed(codings) if c != "identity"]
    if not steps:
        return None
    if len(steps) == 1:
        return steps[0]

    def chain(data: bytes) -> bytes:
        for step in steps:
            data = step(data)
        return data

    return chain


# -- the stream callable ----------------------------------------------------------------------


class UsageTap:
    """`flow.response.stream = UsageTap(dialect, encoding)`: every chunk goes through as it
    came; the usage the answer reports ends up in `result()` once `finish()` has been called.

    Framing follows the WHATWG rules the providers' SDKs follow: lines end in LF, CRLF or CR, an
    empty line ends an event, `data:` lines join with LF, `event:` names it. Lines are
    normalised to LF on the copy; a CR at the end of a chunk is held back until the next byte
    says whether it began a CRLF.
    """

    def __init__(self, dialect: str, content_encoding: str = "", max_event: int = MAX_EVENT):
        self.reader = READERS[dialect]()
        self._key = f'"{DIALECTS[dialect].usage_key}"'.encode()
        self.state = READING
        self.error = ""
        self.malformed = 0  # events that named usage but were not JSON
        self.truncated = False  # the stream ended inside an event
        self.dropped = 0  # events longer than max_event, skipped
        self.max_event = max_event
        self._buf = bytearray()  # the unfinished event, LF-normalised
        self._cr = False  # the last chunk ended in CR
        self._skipping = False  # inside an over-long event: wait for its end
        self._started = False
        try:
            self._decode = decoder(content_encoding)
        except UndecodableError as e:
            self._decode = None
            self.state = UNDECODABLE
            self.error = str(e)

    def __call__(self, chunk: bytes) -> bytes:
        if self.state == READING and chunk:
            try:
                self._feed(self._decode(chunk) if self._decode is not None else chunk)
            except Exception as e:  # noqa: BLE001 - the tap must never break the stream
                self._disable(e)
        return chunk

    def finish(self, cut: bool = False) -> None:
        """The stream ended (`cut`: by an error). An event left without its blank line is
        read if its data is whole (some servers omit the last one), else counted truncated."""
        if self.state != READING:
            return
        try:
            if self._cr:
                self._cr = False
                self._feed(b"")
            rest = bytes(self._buf).strip()
            self._buf.clear()
            unread = bool(rest) and not self._event(rest, final=True)
            if self._skipping or unread or cut:
                self.truncated = True
        except Exception as e:  # noqa: BLE001
            self._disable(e)

    def result(self) -> Any:
        """The raw usage object the answer reported (None if none): for `from_provider`."""
        return self.reader.raw

    @property
    def model(self) -> str | None:
        return self.reader.model

    def _disable(self, e: Exception) -> None:
        self.state = DISABLED
        self.error = f"{type(e).__name__}: {e}"
        self._buf = bytearray()

    def _feed(self, data: bytes) -> None:
        if not self._started and data:
            self._started = True
            data = data.removeprefix(b"\xef\xbb\xbf")
        if self._cr:
            data = b"\r" + data
            self._cr = False
        if data.endswith(b"\r"):
            data = data[:-1]
            self._cr = True
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        start = len(self._buf)
        self._buf += data
        # Every event finished by now at once: one search from the end, one count for "usage"
        # (from one byte back: a boundary may straddle the chunks).
        end = self._buf.rfind(b"\n\n", max(0, start - 1))
        if end >= 0:
            done = bytes(self._buf[:end])
            del self._buf[: end + 2]
            if self._skipping:
                cut = done.find(b"\n\n")
                self._skipping = False
                done = done[cut + 2 :] if cut >= 0 else b""
            if mentions_usage(done, self._key):
                for event in done.split(b"\n\n"):
                    if mentions_usage(event, self._key):
                        self._event(event)
        if len(self._buf) > self.max_event:
            self._buf.clear()
            if not self._skipping:
                self._skipping = True
                self.dropped += 1

    def _event(self, event: bytes, final: bool = False) -> bool:
        """Parse one event; False when its data is not whole JSON. Before the end only events
        naming usage get here; at the end (`final`) the leftover event is checked whatever it
        names, since data cut short means the stream was."""
        name: str | None = None
        data: list[bytes] = []
        for line in event.split(b"\n"):
            field, _, value = line.partition(b":")
            if value.startswith(b" "):
                value = value[1:]
            if field == b"data":
                data.append(value)
            elif field == b"event":
                name = value.decode("utf-8", "replace")
        text = b"\n".join(data)
        if final and (not data or text.strip() == b"[DONE]"):
            return True
        try:
            obj = json.loads(text)
        except ValueError:
            if not final:
                self.malformed += 1
            return False
        if mentions_usage(event, self._key):
            self.reader.event(name, obj)
        return True
