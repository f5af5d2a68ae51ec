"""One provider reply as data, and the JSON and SSE primitives every dialect reads and writes it
with.

A `Reply` is the message the API returns without streaming (Anthropic's `message`, OpenAI's
`chat.completion`, the Responses API's `response`), whether it came as JSON or was rebuilt from
an event stream; `Call` is one
tool call in it. The dialect modules (`cg.wire.dialects.*`) parse, edit and render their own
replies with the helpers here; `cg.wire.answers` is the dialect-blind face the rest of the code
calls. Errors:

    ResponseParseError      the body is not a well-formed reply in its dialect
     └─ ProviderError       the body is the provider's own error (`payload` relays it unchanged)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

Json = Any
JsonObject = dict[str, Any]


class ResponseParseError(ValueError):
    """A response body is not a well-formed reply in its dialect; the message says what is wrong.

    The caller cannot rebuild the reply, so it must fall back (pass the original bytes through)
    rather than invent a response.
    """


class ProviderError(ResponseParseError):
    """The body is the provider's own error (an SSE `error` event, or an error JSON body).

    `payload` is the error object as sent, so the caller can relay it unchanged.
    """

    def __init__(self, message: str, payload: JsonObject) -> None:
        super().__init__(message)
        self.payload = payload


@dataclass(frozen=True, slots=True)
class Reply:
    """One provider response, as the message the API returns without streaming.

    anthropic: the `message` object (`id, type, role, model, content, stop_reason,
    stop_sequence, usage`), content blocks whole (thinking with its signature, tool_use with
    its parsed `input`). openai: the `chat.completion` object. Keys the provider sent that this
    module does not know are kept, so a re-rendered reply loses nothing.
    """

    dialect: str
    message: JsonObject


@dataclass(frozen=True, slots=True)
class Call:
    """One tool call the model made: anthropic `tool_use`, openai `tool_calls[]`.

    `input` is the parsed arguments object; for openai arguments that are not a JSON object
    (models do emit broken JSON) it is the raw string, so the caller can still answer the call.
    """

    id: str
    name: str
    input: JsonObject | str


def call_input(args: Json) -> JsonObject | str:
    """A call's raw `arguments` as `Call.input`: the parsed object (`{}` for blank text), or
    the text itself when it is not a JSON object (models do emit broken JSON); a non-string
    value as its JSON text."""
    if not isinstance(args, str):
        return dumps(args)
    try:
        parsed = json.loads(args) if args.strip() else {}
    except ValueError:
        return args
    return parsed if isinstance(parsed, dict) else args


def dumps(value: Json) -> str:
    """Compact JSON with raw UTF-8, as both providers write it."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def utf8(text: str) -> bytes:
    """UTF-8 bytes of rendered JSON text.

    A lone surrogate (a provider may send `"\\ud83d"` alone inside a string, e.g. a tool
    input cut mid-emoji) cannot be UTF-8 encoded; written back as the `\\uXXXX` escape it
    came in as, it parses to the same string. Surrogates only ever occur inside JSON strings,
    so the escape is always in a valid position.
    """
    return text.encode("utf-8", "backslashreplace")


def clone(value: Json) -> Json:
    """A deep copy of parsed JSON (several times faster than `copy.deepcopy` on it)."""
    if isinstance(value, dict):
        return {k: clone(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clone(v) for v in value]
    return value


def loads_json(text: str | bytes, where: str) -> Json:
    try:
        return json.loads(text)
    except ValueError as e:
        shown = text[:120] if isinstance(text, str) else text[:120].decode("utf-8", "replace")
        raise ResponseParseError(f"{where}: invalid JSON ({e}): {shown!r}") from None


def as_object(value: Json, where: str) -> JsonObject:
    if not isinstance(value, dict):
        raise ResponseParseError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def as_index(value: Json, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ResponseParseError(f"{where}: 'index' must be a non-negative integer, got {value!r}")
    return value


def as_text(value: Json, where: str) -> str:
    if not isinstance(value, str):
        raise ResponseParseError(f"{where}: expected a string, got {type(value).__name__}")
    return value


def pieces(text: str, size: int = 24) -> list[str]:
    """Split text into a few deltas, the way a model streams it (never zero pieces)."""
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def json_pieces(text: str, size: int = 24) -> list[str]:
    """Split JSON text into deltas, never inside an escape sequence.

    The Anthropic SDK re-parses the accumulated partial JSON after every `input_json_delta`;
    a piece ending between `\\` and the character it escapes is harder on such partial parsers
    than anything the API sends, so cuts only fall between whole characters of the JSON text.
    """
    out: list[str] = []
    start = i = 0
    n = len(text)
    while i < n:
        i += 6 if text.startswith("\\u", i) else 2 if text[i] == "\\" else 1
        if i - start >= size:
            out.append(text[start:i])
            start = i
    if start < n:
        out.append(text[start:])
    return out or [""]


def sse_events(body: bytes) -> Iterator[tuple[str | None, str]]:
    """(event name, data) for every event of a whole SSE body, per the WHATWG framing rules.

    Lines end in LF, CRLF or a lone CR; `:` lines are comments; several `data:` lines join with
    LF; a field's single leading space is dropped; an event without data is not dispatched. An
    event the body ends in without its blank line is still dispatched: a truncated body is
    caught by the dialect's own end-of-message check, not by this framing.
    """
    if body.startswith(b"\xef\xbb\xbf"):
        body = body[3:]
    event: str | None = None
    data: list[str] = []
    # bytes.splitlines breaks on \n, \r and \r\n only (str.splitlines would also break on
    # U+2028 and friends inside JSON strings); UTF-8 never hides those bytes in a character.
    for n, raw in enumerate(body.splitlines(), 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ResponseParseError(f"SSE line {n} is not UTF-8: {e}") from None
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = None, []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "event":
            event = value
        elif field == "data":
            data.append(value)
        # id / retry / unknown fields carry nothing a message is built from
    if data:
        yield event, "\n".join(data)


def event_json(event: bytes) -> Any:
    """The data of one SSE event as JSON, or None (a comment, `[DONE]`, anything unreadable)."""
    for _, data in sse_events(event):
        try:
            return json.loads(data)
        except ValueError:
            return None
    return None


def is_count(x: Json) -> bool:
    """A JSON number that is not a boolean (usage counts)."""
    return isinstance(x, int | float) and not isinstance(x, bool)


def sse_event(name: str, data: JsonObject) -> str:
    """One named SSE event, as Anthropic writes them."""
    return f"event: {name}\ndata: {dumps(data)}\n\n"
