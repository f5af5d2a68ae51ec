"""The expand continuation loop (docs/behaviour.md#expand): answer the model's `context_guru_expand`
calls ourselves, re-send, and give the client only the final answer.

    response calls only context_guru_expand  ->  resolve ids, append [assistant, results] to the
                                                 body that was sent (Responses: every output
                                                 item, then a function_call_output per call),
                                                 re-send (at most 3 rounds)
    response mixes it with the client's calls ->  the expand calls are stripped; the client's
                                                 own calls go back to it (it must answer them)
    loop cap reached / a round fails          ->  the last good answer, expand calls stripped

The client never receives a call to a tool it did not declare, and gets the answer in the form
it asked for (SSE if it streamed). Its `usage` is the final round's input side (what the context
now is) with the output summed over the rounds (`client_usage`); every round's own usage is in
`ContinuationResult.replies`, for the ledger, each counted once.
Continuation rounds go straight upstream, never through the pipeline, so expanded content is
never summarized or stashed again.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from cg.expand.tool import TOOL_NAME, named_key, not_an_id
from cg.wire.answers import (
    Reply,
    assistant_messages,
    client_usage,
    parse_json,
    parse_sse,
    render_json,
    render_sse,
    strip_calls,
    tool_calls,
    tool_results,
    usage_of,
    with_usage,
)
from cg.wire.body import index_body
from cg.wire.dialects import DIALECTS
from cg.wire.jsonspan import rebuild_array
from cg.wire.reply import dumps
from cg.wire.upstream import HOP_BY_HOP, ExchangeSink, agent_request, exchange_of

MAX_ROUNDS = 3
# The re-sent body is the decoded one: its content-encoding no longer applies.
_DROP = HOP_BY_HOP | {b"content-encoding"}


def _bytes(s: str | bytes) -> bytes:
    """A header name or value as bytes: latin-1 round-trips what mitmproxy decoded."""
    if isinstance(s, bytes):
        return s
    return s.encode("latin-1") if max(s, default="\0") <= "\xff" else s.encode("utf-8")


@dataclass(slots=True)
class ContinuationResult:
    """What the client gets (`body`, `content_type`) and what happened, for the record."""

    body: bytes
    content_type: str
    rounds: int
    log: list[dict[str, Any]] = field(default_factory=list)
    replies: list[Reply] = field(default_factory=list)  # the first answer, then each round's
    final: Reply | None = None  # what `body` renders: for a stream already under way (`rest`)


def parse(dialect: str, body: bytes, content_type: str) -> Reply:
    if content_type.startswith("text/event-stream"):
        return parse_sse(dialect, body)
    return parse_json(dialect, body)


def expand_ids(reply: Reply) -> list[tuple[str, str]] | None:
    """(call id, requested id) of each expand call; None when the reply calls other tools too."""
    calls = tool_calls(reply)
    ours = [c for c in calls if c.name == TOOL_NAME]
    if not ours or len(ours) != len(calls):
        return None
    out = []
    for c in ours:
        raw = c.input.get("id") if isinstance(c.input, dict) else None
        out.append((c.id, raw if isinstance(raw, str) else ""))
    return out


def append_messages(dialect: str, body: str, messages: list[dict[str, Any]]) -> str:
    """`body` with `messages` appended to its transcript array (`messages`, or a Responses
    request's `input`); every other byte unchanged.

    The new elements go right after the last one, joined by the array's own separator, so
    whatever whitespace the body had between and around its messages stays as it was.
    """
    index = index_body(body.encode("utf-8"), DIALECTS[dialect])
    arr = index.array
    pieces = [dumps(m) for m in messages]
    els = arr.elements
    if not els or not pieces:
        old = [body[e.start : e.end] for e in els]
        return body[: arr.start] + rebuild_array(body, arr, old + pieces) + body[arr.end :]
    sep = body[els[0].end : els[1].start] if len(els) >= 2 else ","
    last = els[-1].end
    return body[:last] + sep + sep.join(pieces) + body[last:]


def answer(ident: str, resolve: Callable[[str], str]) -> str:
    """The result of one call: `resolve`'s answer to an id that names a stash (`KEY`, `KEY#N`,
    or `KEY#` and a malformed N, which it answers with the stash's size); an id that names none
    never reaches the store."""
    if named_key(ident) is None:
        return not_an_id(ident)
    return resolve(ident)


async def run(
    client: httpx.AsyncClient,
    url: str,
    headers: Mapping[str, str] | Sequence[tuple[str | bytes, str | bytes]],
    dialect: str,
    sent: str,
    first: Reply,
    streamed: bool,
    resolve: Callable[[str], str],
    max_rounds: int = MAX_ROUNDS,
    sni: str | None = None,
    on_round: ExchangeSink | None = None,
) -> ContinuationResult:
    """Drive the loop from the first reply; `sent` is the request body that produced it.
    `sni`: `url` names an address; TLS and `Host` name this provider (`sni_name`).
    `on_round` is handed each round's request and answer (a flow of its own in mitmweb)."""
    items = headers.items() if isinstance(headers, Mapping) else headers
    # The agent's headers as bytes (httpx would refuse a non-ASCII str).
    agent_headers = [(_bytes(k), _bytes(v)) for k, v in items]
    replies = [first]
    reply = first
    log: list[dict[str, Any]] = []
    body = sent
    rounds = 0
    while rounds < max_rounds:
        ids = expand_ids(reply)
        if ids is None:
            break
        log.append({"round": rounds + 1, "ids": [k for _, k in ids]})
        try:
            results = [(call_id, answer(key, resolve)) for call_id, key in ids]
            body = append_messages(
                dialect, body, [*assistant_messages(reply), *tool_results(dialect, results)]
            )
            req = agent_request(
                client, "POST", url, agent_headers, body.encode("utf-8"), drop=_DROP, sni=sni
            )
            started = time.time()
            resp = await client.send(req)
            if on_round is not None:
                with contextlib.suppress(Exception):  # showing a round never ends the loop
                    on_round(exchange_of(req, started, resp))
            ctype = resp.headers.get("content-type", "")
            if resp.status_code != 200:
                log[-1]["error"] = f"HTTP {resp.status_code}"
                break
            reply = parse(dialect, resp.content, ctype)
        except Exception as e:  # noqa: BLE001 - a store error, a garbled reply, anything:
            # it ends the loop, never the answer (the client must not see our call)
            log[-1]["error"] = f"{type(e).__name__}: {e}"
            break
        replies.append(reply)
        rounds += 1

    final = strip_calls(reply, TOOL_NAME)
    if any(isinstance(usage_of(r), dict) for r in replies):
        # Only when some round reported usage: an OpenAI stream without include_usage has none,
        # and a usage chunk (empty choices) would break clients that never asked for one.
        final = with_usage(final, client_usage(replies))
    if streamed:
        return ContinuationResult(
            render_sse(final), "text/event-stream; charset=utf-8", rounds, log, replies, final
        )
    return ContinuationResult(render_json(final), "application/json", rounds, log, replies, final)
