"""Provider answers as data, whatever the dialect: parse, inspect, edit and re-render one reply.

The expand continuation loop (docs/behaviour.md#expand) has to read what the model answered, run the
calls it made to our injected tool (`context_guru_expand`), send the conversation again, and finally
hand the client one response in the form it asked for — JSON or SSE — that never mentions a tool the
client did not declare. A streamed response cannot be patched event by event for that: a call to our
tool may sit between two of the client's, and the usage must cover every round. So the whole
response is buffered, rebuilt as the message the provider would have returned without streaming
(`Reply`), edited as data, and rendered back in the provider's own wire format. Each dialect module
(`cg.wire.dialects.*`) knows its own format; this module dispatches to it.

    parse_json / parse_sse   body bytes  -> Reply      (ResponseParseError when malformed)
    tool_calls / strip_calls                           what the model called / a copy without
    assistant_message(s) / tool_results                the turns to append for a continuation
    sum_usage / client_usage / with_usage              usage over all rounds
    render_json / render_sse Reply       -> bytes      what the official SDKs accept

Functions never mutate their arguments: each returns new objects (deep-copied JSON), so a
`Reply` can be kept while another is derived from it.
"""

from __future__ import annotations

from typing import cast

from cg.wire.dialects import DIALECTS, Dialect
from cg.wire.reply import (
    Call,
    Json,
    JsonObject,
    ProviderError,
    Reply,
    ResponseParseError,
    as_object,
    clone,
    dumps,
    is_count,
    loads_json,
    utf8,
)

__all__ = [
    "Call",
    "ProviderError",
    "Reply",
    "ResponseParseError",
    "assistant_message",
    "assistant_messages",
    "client_usage",
    "model_of",
    "parse_json",
    "parse_sse",
    "render_json",
    "render_sse",
    "strip_calls",
    "sum_usage",
    "tool_calls",
    "tool_results",
    "usage_of",
    "with_usage",
]


def _dialect(name: str) -> Dialect:
    d = DIALECTS.get(name)
    if d is None:
        known = ", ".join(repr(k) for k in DIALECTS)
        raise ValueError(f"unknown dialect {name!r} (expected one of {known})")
    return d


# -- parsing --------------------------------------------------------------------------------------


def parse_json(dialect: str, body: bytes) -> Reply:
    """A non-streaming response body as a Reply; ProviderError for the provider's error JSON."""
    d = _dialect(dialect)
    doc = as_object(d.answer_body(loads_json(body, "response body")), "response body")
    if d.answer_error(doc):
        raise ProviderError(f"provider error: {dumps(doc.get('error'))[:300]}", doc)
    d.check_answer(doc)
    return Reply(d.name, doc)


def parse_sse(dialect: str, body: bytes) -> Reply:
    """A whole buffered SSE body as the Reply the same request would have got without `stream`.

    Raises ResponseParseError when the stream is malformed or truncated (no end-of-message
    event), and ProviderError when the provider sent an error event.
    """
    d = _dialect(dialect)
    return Reply(d.name, d.parse_stream(body))


# -- inspecting and editing -----------------------------------------------------------------------


def tool_calls(reply: Reply) -> list[Call]:
    """Every client-side tool call in the reply, in order (server tools run at the provider
    and are not calls the proxy or the client answers)."""
    return _dialect(reply.dialect).calls(reply.message)


def strip_calls(reply: Reply, name: str) -> Reply:
    """A copy of the reply without its calls to tool `name`, for a client that never declared it.

    The stop reason follows (a client told to run tools would look for some), as the dialect
    says."""
    m = clone(reply.message)
    _dialect(reply.dialect).strip_calls(m, name)
    return Reply(reply.dialect, m)


def assistant_message(reply: Reply) -> JsonObject:
    """The assistant turn to append to the request's messages for a continuation round."""
    return _dialect(reply.dialect).assistant_turn(reply.message)


def assistant_messages(reply: Reply) -> list[JsonObject]:
    """Everything of the reply to append for a continuation round: the assistant message (chat
    dialects), or every output item, reasoning included (the Responses API)."""
    return _dialect(reply.dialect).assistant_turns(reply.message)


def tool_results(dialect: str, results: list[tuple[str, str]]) -> list[JsonObject]:
    """The messages answering tool calls, `(call id, text)` each, to follow `assistant_message`."""
    return _dialect(dialect).result_turns(results)


# -- usage over continuation rounds -----------------------------------------------------------------


def _add(a: Json, b: Json) -> Json:
    """Usage addition: numbers sum, objects sum key by key, anything else (a tier name) is
    taken from the later round, and a null or missing count adds nothing."""
    if a is None:
        return clone(b)
    if b is None:
        return a
    if is_count(a) and is_count(b):
        return a + b
    if isinstance(a, dict) and isinstance(b, dict):
        out = dict(a)
        for k, v in b.items():
            out[k] = _add(out.get(k), v)
        return out
    return clone(b)


def usage_of(reply: Reply) -> Json:
    """The usage object a reply reports (under its dialect's `usage_key`), or None."""
    return reply.message.get(_dialect(reply.dialect).usage_key)


def model_of(reply: Reply) -> str | None:
    """The model a reply names (its dialect's `model_key`), or None."""
    return _dialect(reply.dialect).answer_model(reply.message)


def sum_usage(replies: list[Reply]) -> JsonObject:
    """The usage of all continuation rounds together: what the client's one answer cost.

    Only keys some round reported appear; nested detail objects
    (`prompt_tokens_details`, `cache_creation`, `server_tool_use`, …) are summed too.
    """
    total: Json = None
    for r in replies:
        usage = r.message.get(_dialect(r.dialect).usage_key)
        if isinstance(usage, dict):
            total = _add(total, usage)
    return cast(JsonObject, total) if isinstance(total, dict) else {}


def client_usage(replies: list[Reply]) -> JsonObject:
    """The usage the client is told after a continuation: the final round's input side (what
    the context now is: an agent sizes its own compaction from it, so a sum over rounds would
    make it compact early), with the output and everything else summed over the rounds (what
    was generated). The ledger keeps every round's full usage apart; this is only what the
    client reads."""
    with_usage_ = [r for r in replies if isinstance(usage_of(r), dict)]
    if not with_usage_:
        return {}
    out = sum_usage(with_usage_)
    last = with_usage_[-1]
    final = usage_of(last)
    d = _dialect(last.dialect)
    for k in d.input_usage_keys:
        if k in final:
            out[k] = clone(final[k])
        else:
            out.pop(k, None)
    d.settle_usage(out)
    return out


def with_usage(reply: Reply, usage: JsonObject) -> Reply:
    """A copy of the reply reporting `usage` (`client_usage` over every round)."""
    m = clone(reply.message)
    m[_dialect(reply.dialect).usage_key] = clone(usage)
    return Reply(reply.dialect, m)


# -- rendering ------------------------------------------------------------------------------------


def render_json(reply: Reply) -> bytes:
    """The reply as a non-streaming response body (compact JSON, raw UTF-8)."""
    return utf8(dumps(reply.message))


def render_sse(reply: Reply) -> bytes:
    """The reply as an SSE body in the provider's own wire format.

    Parsed by `parse_sse` it gives back an equal Reply; fed to the official SDKs' stream
    helpers it accumulates to the same message.
    """
    return utf8("".join(_dialect(reply.dialect).frames(reply.message)))
