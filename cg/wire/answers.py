"""Provider responses as data: parse, inspect, edit and re-render one assistant reply.

The expand continuation loop (SPEC §6) has to read what the model answered, run the calls it
made to our injected tool (`context_guru_expand`), send the conversation again, and finally hand
the client one response in the form it asked for — JSON or SSE — that never mentions a tool the
client did not declare. A streamed response cannot be patched event by event for that: a call to
our tool may sit between two of the client's, and the usage must cover every round. So the
whole response is buffered, rebuilt here as the message the provider would have returned
without streaming (`Reply`), edited as data, and rendered back in the provider's own wire format.

    parse_json / parse_sse   body bytes  -> Reply      (ResponseParseError when malformed)
    tool_calls / strip_calls                           what the model called / a copy without
    assistant_message / tool_results                   the turns to append for a continuation
    sum_usage / client_usage / with_usage              usage over all rounds
    render_json / render_sse Reply       -> bytes      what the official SDKs accept

Functions never mutate their arguments: each returns new objects (deep-copied JSON), so a
`Reply` can be kept while another is derived from it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, cast

DialectName = Literal["anthropic", "openai"]
Json = Any
JsonObject = dict[str, Any]

__all__ = [
    "Call",
    "DialectName",
    "ProviderError",
    "Reply",
    "ResponseParseError",
    "assistant_message",
    "client_usage",
    "parse_json",
    "parse_sse",
    "render_json",
    "render_sse",
    "strip_calls",
    "sum_usage",
    "tool_calls",
    "tool_results",
    "with_usage",
]


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

    dialect: DialectName
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


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------


def _dumps(value: Json) -> str:
    """Compact JSON with raw UTF-8, as both providers write it."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _utf8(text: str) -> bytes:
    """UTF-8 bytes of rendered JSON text.

    A lone surrogate (a provider may send `"\\ud83d"` alone inside a string, e.g. a tool
    input cut mid-emoji) cannot be UTF-8 encoded; written back as the `\\uXXXX` escape it
    came in as, it parses to the same string. Surrogates only ever occur inside JSON strings,
    so the escape is always in a valid position.
    """
    return text.encode("utf-8", "backslashreplace")


def _clone(value: Json) -> Json:
    """A deep copy of parsed JSON (several times faster than `copy.deepcopy` on it)."""
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clone(v) for v in value]
    return value


def _check_dialect(dialect: str) -> DialectName:
    if dialect not in ("anthropic", "openai"):
        raise ValueError(f"unknown dialect {dialect!r} (expected 'anthropic' or 'openai')")
    return cast(DialectName, dialect)


def _loads(text: str | bytes, where: str) -> Json:
    try:
        return json.loads(text)
    except ValueError as e:
        shown = text[:120] if isinstance(text, str) else text[:120].decode("utf-8", "replace")
        raise ResponseParseError(f"{where}: invalid JSON ({e}): {shown!r}") from None


def _obj(value: Json, where: str) -> JsonObject:
    if not isinstance(value, dict):
        raise ResponseParseError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _index(value: Json, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ResponseParseError(f"{where}: 'index' must be a non-negative integer, got {value!r}")
    return value


def _str(value: Json, where: str) -> str:
    if not isinstance(value, str):
        raise ResponseParseError(f"{where}: expected a string, got {type(value).__name__}")
    return value


def _pieces(text: str, size: int = 24) -> list[str]:
    """Split text into a few deltas, the way a model streams it (never zero pieces)."""
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _json_pieces(text: str, size: int = 24) -> list[str]:
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


# --------------------------------------------------------------------------------------------
# SSE framing
# --------------------------------------------------------------------------------------------


def _sse_events(body: bytes) -> Iterator[tuple[str | None, str]]:
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


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------


def parse_json(dialect: str, body: bytes) -> Reply:
    """A non-streaming response body as a Reply; ProviderError for the provider's error JSON."""
    d = _check_dialect(dialect)
    doc = _obj(_loads(body, "response body"), "response body")
    err = doc.get("error")
    if (d == "anthropic" and doc.get("type") == "error") or (d == "openai" and err):
        raise ProviderError(f"provider error: {_dumps(err)[:300]}", doc)
    if d == "anthropic":
        if doc.get("type") != "message":
            raise ResponseParseError(f"response body: 'type' is {doc.get('type')!r}, not 'message'")
        content = doc.get("content")
        if not isinstance(content, list):
            raise ResponseParseError("response body: 'content' is not a list")
        for i, block in enumerate(content):
            _str(_obj(block, f"content[{i}]").get("type"), f"content[{i}].type")
    else:
        choices = doc.get("choices")
        if not isinstance(choices, list) or not choices:
            raise ResponseParseError("response body: 'choices' is not a non-empty list")
        for i, choice in enumerate(choices):
            _obj(_obj(choice, f"choices[{i}]").get("message"), f"choices[{i}].message")
    return Reply(d, doc)


def parse_sse(dialect: str, body: bytes) -> Reply:
    """A whole buffered SSE body as the Reply the same request would have got without `stream`.

    Raises ResponseParseError when the stream is malformed or truncated (no `message_stop`,
    no `data: [DONE]`), and ProviderError when the provider sent an error event.
    """
    d = _check_dialect(dialect)
    return Reply(d, _anthropic_sse(body) if d == "anthropic" else _openai_sse(body))


def _anthropic_sse(body: bytes) -> JsonObject:
    msg: JsonObject | None = None
    blocks: list[JsonObject] = []
    open_: set[int] = set()
    partial: dict[int, list[str]] = {}  # block index -> input_json_delta pieces
    stopped = False
    for n, (name, data) in enumerate(_sse_events(body), 1):
        where = f"SSE event {n} ({name or 'unnamed'})"
        obj = _obj(_loads(data, where), where)
        kind = name or obj.get("type")
        if name and "type" in obj and obj["type"] != name:
            raise ResponseParseError(f"{where}: data has type {obj['type']!r}")
        if stopped or kind == "ping":
            continue  # anything after message_stop is not part of the message
        if kind == "error":
            raise ProviderError(f"provider error event: {_dumps(obj.get('error'))[:300]}", obj)
        if kind == "message_start":
            if msg is not None:
                raise ResponseParseError(f"{where}: a second message_start")
            msg = _obj(obj.get("message"), f"{where}.message")
            content = msg.get("content", [])
            if not isinstance(content, list):
                raise ResponseParseError(f"{where}: message.content is not a list")
            blocks = [_obj(b, f"{where}.message.content[]") for b in content]
            continue
        if kind not in (
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ):
            continue  # new event types may appear; the API asks clients to ignore them
        if msg is None:
            raise ResponseParseError(f"{where}: {kind} before message_start")
        if kind == "content_block_start":
            i = _index(obj.get("index"), where)
            if i != len(blocks):
                raise ResponseParseError(
                    f"{where}: content_block_start index {i}, expected {len(blocks)}"
                )
            block = _obj(obj.get("content_block"), f"{where}.content_block")
            _str(block.get("type"), f"{where}.content_block.type")
            blocks.append(block)
            open_.add(i)
        elif kind == "content_block_delta":
            i = _index(obj.get("index"), where)
            if i not in open_:
                raise ResponseParseError(f"{where}: delta for block {i}, which is not open")
            _apply_delta(blocks[i], _obj(obj.get("delta"), f"{where}.delta"), partial, i, where)
        elif kind == "content_block_stop":
            i = _index(obj.get("index"), where)
            if i not in open_:
                raise ResponseParseError(f"{where}: stop for block {i}, which is not open")
            open_.discard(i)
            if i in partial:
                text = "".join(partial.pop(i))
                blocks[i]["input"] = _loads(text, f"block {i} tool input") if text else {}
        elif kind == "message_delta":
            msg.update(_obj(obj.get("delta", {}), f"{where}.delta"))
            usage = obj.get("usage")
            if usage is not None:
                have = msg.get("usage")
                if not isinstance(have, dict):
                    have = msg["usage"] = {}
                # Counts here are cumulative totals: they replace, and an omitted (null)
                # optional count leaves message_start's value standing.
                for k, v in _obj(usage, f"{where}.usage").items():
                    if v is not None or k not in have:
                        have[k] = v
        else:  # message_stop
            if open_:
                raise ResponseParseError(
                    f"{where}: message_stop with block(s) {sorted(open_)} open"
                )
            stopped = True
    if msg is None:
        raise ResponseParseError("no message_start event: not an Anthropic message stream")
    if not stopped:
        raise ResponseParseError("the stream ended before message_stop (truncated)")
    msg["content"] = blocks
    return msg


def _apply_delta(
    block: JsonObject, delta: JsonObject, partial: dict[int, list[str]], i: int, where: str
) -> None:
    kind = delta.get("type")
    btype = block.get("type")

    def need(*types: str) -> None:
        if btype not in types:
            raise ResponseParseError(f"{where}: {kind} for a {btype} block")

    if kind == "text_delta":
        need("text")
        block["text"] = block.get("text", "") + _str(delta.get("text"), f"{where}.text")
    elif kind == "citations_delta":
        need("text")
        citation = _obj(delta.get("citation"), f"{where}.citation")
        if isinstance(block.get("citations"), list):
            block["citations"].append(citation)
        else:
            block["citations"] = [citation]
    elif kind == "thinking_delta":
        need("thinking")
        block["thinking"] = block.get("thinking", "") + _str(
            delta.get("thinking"), f"{where}.thinking"
        )
    elif kind == "signature_delta":
        need("thinking")
        # One delta carries the whole signature; the SDKs assign rather than append.
        block["signature"] = _str(delta.get("signature"), f"{where}.signature")
    elif kind == "input_json_delta":
        if "input" not in block and not str(btype).endswith("tool_use"):
            raise ResponseParseError(f"{where}: input_json_delta for a {btype} block")
        partial.setdefault(i, []).append(_str(delta.get("partial_json"), f"{where}.partial_json"))
    else:
        # Ignoring it would hand the client a message with a piece silently missing.
        raise ResponseParseError(f"{where}: unknown delta type {kind!r}")


# OpenAI deltas: these keys are set by the first chunk that carries them (some servers repeat
# them in every chunk; concatenating would double a tool call's id or name).
_ONCE = frozenset({"role", "id", "type", "name"})


def _merge(acc: JsonObject, delta: JsonObject) -> None:
    """Fold one OpenAI delta object into the accumulated one: strings concatenate, objects
    merge, lists extend, `_ONCE` keys keep their first value, nulls change nothing."""
    for k, v in delta.items():
        cur = acc.get(k)
        if v is None:
            acc.setdefault(k, None)
        elif cur is None or (k in _ONCE and not cur):
            acc[k] = _clone(v)
        elif k in _ONCE:
            continue
        elif isinstance(cur, str) and isinstance(v, str):
            acc[k] = cur + v
        elif isinstance(cur, dict) and isinstance(v, dict):
            _merge(cur, v)
        elif isinstance(cur, list) and isinstance(v, list):
            cur.extend(_clone(v))
        else:
            acc[k] = _clone(v)


_CHUNK_KEYS = frozenset({"object", "choices", "usage", "obfuscation"})
_CHOICE_KEYS = frozenset({"index", "delta", "logprobs", "finish_reason"})


@dataclass
class _Choice:
    message: JsonObject
    calls: dict[int, JsonObject]
    logprobs: JsonObject | None = None
    finish_reason: str | None = None
    extra: JsonObject = field(default_factory=dict)  # choice keys beyond the standard four


def _openai_sse(body: bytes) -> JsonObject:
    top: JsonObject = {}
    usage: Json = None
    has_usage = False
    choices: dict[int, _Choice] = {}
    done = False
    for n, (_name, data) in enumerate(_sse_events(body), 1):
        where = f"SSE chunk {n}"
        if data.strip() == "[DONE]":
            done = True
            break
        chunk = _obj(_loads(data, where), where)
        if chunk.get("error"):
            raise ProviderError(f"provider error chunk: {_dumps(chunk['error'])[:300]}", chunk)
        for k, v in chunk.items():
            # First non-empty value: Azure's opening chunk has an empty id and model.
            if k not in _CHUNK_KEYS and (k not in top or (v and not top[k])):
                top[k] = _clone(v)
        if "usage" in chunk:
            has_usage = True
            if chunk["usage"] is not None:
                usage = _clone(chunk["usage"])
        raw = chunk.get("choices") or []
        if not isinstance(raw, list):
            raise ResponseParseError(f"{where}: 'choices' is not a list")
        for c in raw:
            _openai_choice(choices, _obj(c, f"{where}.choices[]"), where)
    if not done:
        raise ResponseParseError("the stream ended without 'data: [DONE]' (truncated)")
    if not choices:
        raise ResponseParseError("the stream carried no choices")
    unfinished = sorted(i for i, c in choices.items() if c.finish_reason is None)
    if unfinished:
        raise ResponseParseError(f"choice(s) {unfinished} never got a finish_reason")
    out: JsonObject = {
        "id": top.pop("id", None),
        "object": "chat.completion",
        "created": top.pop("created", None),
        "model": top.pop("model", None),
        "choices": [],
    }
    for i in sorted(choices):
        c = choices[i]
        message: JsonObject = {"role": "assistant", "content": None, "refusal": None}
        message.update(c.message)
        if c.calls:
            message["tool_calls"] = [c.calls[j] for j in sorted(c.calls)]
        choice = {"index": i, "message": message, "logprobs": c.logprobs}
        choice["finish_reason"] = c.finish_reason
        choice.update(c.extra)
        out["choices"].append(choice)
    if has_usage:
        out["usage"] = usage
    out.update(top)
    return out


def _openai_choice(choices: dict[int, _Choice], c: JsonObject, where: str) -> None:
    i = _index(c.get("index"), f"{where}.choices[]")
    st = choices.get(i)
    if st is None:
        st = choices[i] = _Choice(message={}, calls={})
    delta = c.get("delta")
    if delta is not None:
        delta = dict(_obj(delta, f"{where}.choices[{i}].delta"))
        calls = delta.pop("tool_calls", None)
        _merge(st.message, delta)
        if calls is not None:
            if not isinstance(calls, list):
                raise ResponseParseError(f"{where}.choices[{i}].delta.tool_calls is not a list")
            for tc in calls:
                tc = dict(_obj(tc, f"{where}.tool_calls[]"))
                j = _index(tc.pop("index", None), f"{where}.tool_calls[]")
                _merge(st.calls.setdefault(j, {}), tc)
    lp = c.get("logprobs")
    if lp is not None:
        lp = _obj(lp, f"{where}.choices[{i}].logprobs")
        if st.logprobs is None:
            st.logprobs = _clone(lp)
        else:
            for key in ("content", "refusal"):
                if isinstance(lp.get(key), list):
                    have = st.logprobs.get(key)
                    st.logprobs[key] = (have if isinstance(have, list) else []) + lp[key]
    if c.get("finish_reason") is not None:
        st.finish_reason = _str(c["finish_reason"], f"{where}.choices[{i}].finish_reason")
    for k, v in c.items():
        if k not in _CHOICE_KEYS and (v is not None or k not in st.extra):
            st.extra[k] = _clone(v)


# --------------------------------------------------------------------------------------------
# Inspecting and editing
# --------------------------------------------------------------------------------------------


def _first_message(reply: Reply) -> JsonObject | None:
    """choices[0].message: the continuation loop follows the first choice only."""
    choices = reply.message.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        m = choices[0].get("message")
        return m if isinstance(m, dict) else None
    return None


def _openai_call_name(tc: JsonObject) -> tuple[str, Json]:
    """(name, raw arguments) of an OpenAI tool call: `function` calls, or `custom` ones."""
    for key, arg in (("function", "arguments"), ("custom", "input")):
        body = tc.get(key)
        if isinstance(body, dict):
            return str(body.get("name", "")), body.get(arg, "")
    return "", ""


def tool_calls(reply: Reply) -> list[Call]:
    """Every client-side tool call in the reply, in order (server tools run at the provider
    and are not calls the proxy or the client answers)."""
    out: list[Call] = []
    if reply.dialect == "anthropic":
        for b in reply.message.get("content") or []:
            if isinstance(b, dict) and b.get("type") == "tool_use":
                inp = b.get("input")
                out.append(
                    Call(
                        str(b.get("id", "")),
                        str(b.get("name", "")),
                        _clone(inp) if isinstance(inp, dict) else _dumps(inp),
                    )
                )
        return out
    m = _first_message(reply)
    for tc in (m or {}).get("tool_calls") or []:
        if not isinstance(tc, dict):
            continue
        name, args = _openai_call_name(tc)
        value: JsonObject | str = args if isinstance(args, str) else _dumps(args)
        if isinstance(args, str):
            try:
                parsed = json.loads(args) if args.strip() else {}
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                value = parsed
        out.append(Call(str(tc.get("id", "")), name, value))
    return out


def strip_calls(reply: Reply, name: str) -> Reply:
    """A copy of the reply without its calls to tool `name`, for a client that never declared it.

    The stop reason follows: with no call left, anthropic `tool_use` becomes `end_turn` and
    openai `tool_calls` becomes `stop` — a client told to run tools would look for some. An
    openai message left with neither calls nor content gets `content: ""`, since clients read
    a `stop` message's content as a string.
    """
    m = _clone(reply.message)
    if reply.dialect == "anthropic":
        content = m.get("content")
        if isinstance(content, list):
            m["content"] = [
                b
                for b in content
                if not (
                    isinstance(b, dict) and b.get("type") == "tool_use" and b.get("name") == name
                )
            ]
            if m.get("stop_reason") == "tool_use" and not any(
                isinstance(b, dict) and b.get("type") == "tool_use" for b in m["content"]
            ):
                m["stop_reason"] = "end_turn"
        return Reply(reply.dialect, m)
    for choice in m.get("choices") or []:
        msg = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(msg, dict) or not isinstance(msg.get("tool_calls"), list):
            continue
        kept = [
            tc
            for tc in msg["tool_calls"]
            if not (isinstance(tc, dict) and _openai_call_name(tc)[0] == name)
        ]
        if kept:
            msg["tool_calls"] = kept
            continue
        del msg["tool_calls"]
        if choice.get("finish_reason") == "tool_calls":
            choice["finish_reason"] = "stop"
        if msg.get("content") is None:
            msg["content"] = ""
    return Reply(reply.dialect, m)


def assistant_message(reply: Reply) -> JsonObject:
    """The assistant turn to append to the request's `messages` for a continuation round.

    anthropic: the content blocks as returned — thinking blocks must go back with their
    signatures untouched — except blank text blocks, which the API refuses in a request
    ("text content blocks must contain non-whitespace text") though it may stream them.
    openai: content, with null for empty content beside tool calls, and the tool calls.
    """
    if reply.dialect == "anthropic":
        blocks = [
            _clone(b)
            for b in reply.message.get("content") or []
            if not (
                isinstance(b, dict)
                and b.get("type") == "text"
                and (not isinstance(b.get("text"), str) or not b["text"].strip())
            )
        ]
        return {"role": "assistant", "content": blocks}
    m = _first_message(reply) or {}
    calls = [
        {k: _clone(v) for k, v in tc.items() if k != "index"}
        for tc in m.get("tool_calls") or []
        if isinstance(tc, dict)
    ]
    content = m.get("content")
    out: JsonObject = {"role": "assistant", "content": _clone(content)}
    if calls:
        if not content:
            out["content"] = None
        out["tool_calls"] = calls
    elif content is None:
        out["content"] = ""
    return out


def tool_results(dialect: str, results: list[tuple[str, str]]) -> list[JsonObject]:
    """The messages answering tool calls, `(call id, text)` each, to follow `assistant_message`.

    anthropic answers every call of a turn in the one user message that follows it; openai
    wants one `tool` message per call, in a run.
    """
    d = _check_dialect(dialect)
    if not results:
        return []
    if d == "anthropic":
        return [
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": i, "content": text}
                    for i, text in results
                ],
            }
        ]
    return [{"role": "tool", "tool_call_id": i, "content": text} for i, text in results]


def _is_number(x: Json) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _add(a: Json, b: Json) -> Json:
    """Usage addition: numbers sum, objects sum key by key, anything else (a tier name) is
    taken from the later round, and a null or missing count adds nothing."""
    if a is None:
        return _clone(b)
    if b is None:
        return a
    if _is_number(a) and _is_number(b):
        return a + b
    if isinstance(a, dict) and isinstance(b, dict):
        out = dict(a)
        for k, v in b.items():
            out[k] = _add(out.get(k), v)
        return out
    return _clone(b)


def sum_usage(replies: list[Reply]) -> JsonObject:
    """The usage of all continuation rounds together: what the client's one answer cost.

    Only keys some round reported appear; nested detail objects
    (`prompt_tokens_details`, `cache_creation`, `server_tool_use`, …) are summed too.
    """
    total: Json = None
    for r in replies:
        usage = r.message.get("usage")
        if isinstance(usage, dict):
            total = _add(total, usage)
    return cast(JsonObject, total) if isinstance(total, dict) else {}


# The keys that describe a request's input: after a continuation they come from the final round.
_INPUT_SIDE = {
    "anthropic": (
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
        "cache_creation",
    ),
    "openai": ("prompt_tokens", "prompt_tokens_details"),
}


def client_usage(replies: list[Reply]) -> JsonObject:
    """The usage the client is told after a continuation: the final round's input side (what
    the context now is: an agent sizes its own compaction from it, so a sum over rounds would
    make it compact early), with the output and everything else summed over the rounds (what
    was generated). OpenAI's `total_tokens` is then prompt + completion. The ledger keeps every
    round's full usage apart; this is only what the client reads."""
    with_usage_ = [r for r in replies if isinstance(r.message.get("usage"), dict)]
    if not with_usage_:
        return {}
    out = sum_usage(with_usage_)
    last = with_usage_[-1]
    final = last.message["usage"]
    for k in _INPUT_SIDE.get(last.dialect, ()):
        if k in final:
            out[k] = _clone(final[k])
        else:
            out.pop(k, None)
    if last.dialect == "openai" and "total_tokens" in out:
        prompt: Any = out.get("prompt_tokens")
        completion: Any = out.get("completion_tokens")
        if _is_number(prompt) and _is_number(completion):
            out["total_tokens"] = prompt + completion
    return out


def with_usage(reply: Reply, usage: JsonObject) -> Reply:
    """A copy of the reply reporting `usage` (`client_usage` over every round)."""
    m = _clone(reply.message)
    m["usage"] = _clone(usage)
    return Reply(reply.dialect, m)


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------


def render_json(reply: Reply) -> bytes:
    """The reply as a non-streaming response body (compact JSON, raw UTF-8)."""
    return _utf8(_dumps(reply.message))


def render_sse(reply: Reply) -> bytes:
    """The reply as an SSE body in the provider's own wire format.

    Parsed by `parse_sse` it gives back an equal Reply; fed to the official SDKs' stream
    helpers it accumulates to the same message.
    """
    if reply.dialect == "anthropic":
        return _utf8("".join(_anthropic_frames(reply.message)))
    return _utf8("".join(_openai_frames(reply.message)))


# message_delta carries these message keys; message_start announces them as null.
_DELTA_KEYS = ("stop_reason", "stop_sequence")
_DELTA_OPTIONAL = ("stop_details", "container")


def _event(name: str, data: JsonObject) -> str:
    return f"event: {name}\ndata: {_dumps(data)}\n\n"


def _anthropic_frames(m: JsonObject) -> Iterator[str]:
    start = {k: _clone(v) for k, v in m.items()}
    start["content"] = []
    for k in (*_DELTA_KEYS, *(k for k in _DELTA_OPTIONAL if k in m)):
        start[k] = None
    usage = m.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("output_tokens"), int):
        # message_start reports the input side; the output count so far is the first token.
        start["usage"]["output_tokens"] = min(1, usage["output_tokens"])
    yield _event("message_start", {"type": "message_start", "message": start})
    for i, block in enumerate(m.get("content") or []):
        yield from _anthropic_block(i, block)
    delta = {k: m.get(k) for k in _DELTA_KEYS}
    delta.update({k: m[k] for k in _DELTA_OPTIONAL if k in m})
    end: JsonObject = {"type": "message_delta", "delta": delta}
    if isinstance(usage, dict):
        # Cumulative totals, as the API sends them now; older SDKs read only output_tokens
        # here and keep message_start's input side, which carries the same numbers.
        end["usage"] = _clone(usage)
    yield _event("message_delta", end)
    yield _event("message_stop", {"type": "message_stop"})


def _anthropic_block(i: int, block: Json) -> Iterator[str]:
    def delta(d: JsonObject) -> str:
        return _event(
            "content_block_delta", {"type": "content_block_delta", "index": i, "delta": d}
        )

    deltas: list[str] = []
    start = _clone(block)
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text" and isinstance(block.get("text"), str):
        start["text"] = ""
        cites = block.get("citations")
        if isinstance(cites, list) and cites:
            start["citations"] = []
            deltas += [delta({"type": "citations_delta", "citation": c}) for c in cites]
        if block["text"]:
            deltas += [delta({"type": "text_delta", "text": p}) for p in _pieces(block["text"])]
    elif kind == "thinking" and isinstance(block.get("thinking"), str):
        start["thinking"] = ""
        if block["thinking"]:
            deltas += [
                delta({"type": "thinking_delta", "thinking": p}) for p in _pieces(block["thinking"])
            ]
        if "signature" in block:
            start["signature"] = ""
            if isinstance(block["signature"], str) and block["signature"]:
                deltas.append(delta({"type": "signature_delta", "signature": block["signature"]}))
    elif kind in ("tool_use", "server_tool_use") and isinstance(block.get("input"), dict):
        # The SDKs track input_json_delta for these two block types only; others (mcp_tool_use,
        # tool results, redacted_thinking) go out whole in content_block_start.
        start["input"] = {}
        deltas += [
            delta({"type": "input_json_delta", "partial_json": p})
            for p in _json_pieces(_dumps(block["input"]))
        ]
    yield _event(
        "content_block_start", {"type": "content_block_start", "index": i, "content_block": start}
    )
    yield from deltas
    yield _event("content_block_stop", {"type": "content_block_stop", "index": i})


def _openai_frames(m: JsonObject) -> Iterator[str]:
    base: JsonObject = {
        "id": m.get("id"),
        "object": "chat.completion.chunk",
        "created": m.get("created"),
        "model": m.get("model"),
    }
    base.update(
        {
            k: _clone(v)
            for k, v in m.items()
            if k not in ("id", "object", "created", "model", "choices", "usage")
        }
    )
    if "usage" in m:
        base["usage"] = None  # as with stream_options.include_usage: null until the last chunk

    def chunk(choice: JsonObject) -> str:
        return f"data: {_dumps({**base, 'choices': [choice]})}\n\n"

    for n, choice in enumerate(m.get("choices") or []):
        if not isinstance(choice, dict):
            continue
        idx = choice.get("index", n)
        raw = choice.get("message")
        msg: JsonObject = raw if isinstance(raw, dict) else {}

        def part(d: JsonObject, idx: Json = idx) -> str:
            return chunk({"index": idx, "delta": d, "logprobs": None, "finish_reason": None})

        first: JsonObject = {"role": msg.get("role", "assistant")}
        later: list[JsonObject] = []
        for key, value in msg.items():
            if key in ("role", "tool_calls"):
                continue
            if key in ("content", "refusal") and isinstance(value, str):
                first[key] = ""
                later += [{key: p} for p in _pieces(value)] if value else []
            else:
                first[key] = _clone(value)
        yield chunk(
            {
                "index": idx,
                "delta": first,
                "logprobs": _clone(choice.get("logprobs")),
                "finish_reason": None,
            }
        )
        for d in later:
            yield part(d)
        for j, tc in enumerate(msg.get("tool_calls") or []):
            if not isinstance(tc, dict):
                continue
            head: JsonObject = {"index": j}
            head.update({k: _clone(v) for k, v in tc.items() if k != "index"})
            fn = tc.get("function")
            args = fn.get("arguments") if isinstance(fn, dict) else None
            if isinstance(fn, dict) and isinstance(args, str):
                head["function"] = {**_clone(fn), "arguments": ""}
                yield part({"tool_calls": [head]})
                for p in _json_pieces(args) if args else []:
                    yield part({"tool_calls": [{"index": j, "function": {"arguments": p}}]})
            else:
                yield part({"tool_calls": [head]})
        end: JsonObject = {"index": idx, "delta": {}, "logprobs": None}
        end["finish_reason"] = choice.get("finish_reason")
        end.update({k: _clone(v) for k, v in choice.items() if k not in _CHOICE_KEYS | {"message"}})
        yield chunk(end)
    if m.get("usage") is not None:
        yield f"data: {_dumps({**base, 'choices': [], 'usage': m['usage']})}\n\n"
    yield "data: [DONE]\n\n"
