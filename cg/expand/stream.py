"""Streaming an answer that may call the injected expand tool: pass it on event by event, and
hold it only from the point a `context_guru_expand` call begins.

The buffered alternative (read the whole answer, then decide) makes every answer of an
injected turn arrive at once at its end: the agent's time to first byte becomes the whole
generation time, though almost no answer calls our tool. So:

    feed(chunk)  -> the bytes of every complete SSE event before our call's first event (the
                    client gets them now); from that event on, nothing (held)
    finish()     -> what is left when no call of ours began (an unterminated last event)
    rest(...)    -> once the continuation produced its final reply: the events that complete
                    the stream the client already holds the start of (same message, blocks,
                    items and sequence numbers carrying on), never naming our tool

Only events whose bytes contain the tool's name are parsed, so an answer that never calls it
costs one substring search per chunk.

A format whose stream says nowhere where a part sits (Gemini: each event holds new parts, no
index; `Dialect.buffers_expand`) cannot be resumed part way: there the whole answer is held, and
goes out at its end, as it came or as the continuation made it.
"""

from __future__ import annotations

import json
from typing import Any

from cg.expand.tool import TOOL_NAME, names_tool
from cg.wire.answers import render_sse
from cg.wire.dialects import DIALECTS
from cg.wire.reply import Reply, clone, dumps, event_json, sse_events, utf8

_ENDS = (b"\n\n", b"\r\n\r\n", b"\r\r")


def _event_end(buf: bytes | bytearray, start: int) -> int:
    """The end (exclusive) of the first complete event at or after `start`, or -1."""
    best = -1
    for sep in _ENDS:
        i = buf.find(sep, start)
        if i != -1 and (best == -1 or i + len(sep) < best):
            best = i + len(sep)
    return best


def _last_end(buf: bytes | bytearray) -> int:
    """The end (exclusive) of the last complete event in `buf`, or 0."""
    best = 0
    for sep in _ENDS:
        i = buf.rfind(sep)
        if i != -1:
            best = max(best, i + len(sep))
    return best


def call_begins(dialect: str, event: bytes) -> tuple[int, int | None] | None:
    """(the position our call takes in the answer, the event's sequence number) when this
    event starts a call to our tool (`Dialect.call_begins`: an Anthropic block index, an OpenAI
    `tool_calls` index, a Responses output index); else None."""
    if not names_tool(event):
        return None
    obj = event_json(event)
    if not isinstance(obj, dict):
        return None
    return DIALECTS[dialect].call_begins(obj, TOOL_NAME)


class ExpandGate:
    """The SSE answer of a turn offered our tool, passed on up to our call (see the module).

    A dialect whose reasoning items bind the next item (`Dialect.held_reasoning`: the
    Responses API): a reasoning item is held until the next item begins, since a call to our
    tool takes the reasoning item right before it along when it is stripped (the client would
    otherwise re-send that reasoning without its successor, which the API refuses). When the
    next item is not our call, the reasoning item's events go out then.
    """

    def __init__(self, dialect: str) -> None:
        self.dialect = dialect
        self._dialect = DIALECTS[dialect]
        self.whole = bytearray()  # every byte of the answer, for the continuation to read
        self.sent = 0  # bytes of `whole` passed on
        self.scanned = 0  # bytes of `whole` read as complete events
        self.at: int | None = None  # where our call sits (block, call or output index)
        self.seq: int | None = None  # its event's sequence number (Responses)
        self.held = 0  # the offset in `whole` from which nothing was passed on
        # (offset in `whole`, output index, sequence number) of a reasoning item held back
        self._reasoning: tuple[int, int, int | None] | None = None
        if self._dialect.buffers_expand:
            # No position on the wire to resume from (Gemini): all of it is held, and the
            # continuation's answer (or the answer as it came) goes out whole at its end.
            self.at = 0

    @property
    def holding(self) -> bool:
        return self.at is not None

    def _release(self, limit: int) -> bytes:
        if limit <= self.sent:
            return b""
        out = bytes(self.whole[self.sent : limit])
        self.sent = limit
        return out

    def feed(self, chunk: bytes) -> bytes:
        """The bytes to pass on now (possibly empty)."""
        self.whole += chunk
        if self.at is not None:
            return b""
        end = _last_end(self.whole)
        if end <= self.scanned:
            return b""
        region = self.whole[self.scanned : end]
        held = self._dialect.held_reasoning
        if not names_tool(region) and not (
            held and (self._reasoning is not None or b"reasoning" in region)
        ):
            self.scanned = end
            return self._release(end)
        pos = self.scanned
        while pos < end:
            stop = _event_end(self.whole, pos)
            if stop == -1 or stop > end:  # cannot happen: `end` ends a complete event
                break
            event = bytes(self.whole[pos:stop])
            found = call_begins(self.dialect, event)
            if found is not None:
                if self._reasoning is not None:  # the reasoning item goes with the call
                    self.held, at, seq = self._reasoning
                    self.at, self.seq = at, seq
                else:
                    self.at, self.seq = found
                    self.held = pos
                self.scanned = end
                return self._release(self.held)
            if held:
                reasoning = self._dialect.reasoning_begins(event)
                if reasoning is not None:
                    self._reasoning = (pos, *reasoning)
                elif self._reasoning is not None and b"response.output_item.added" in event:
                    self._reasoning = None  # another item followed it: it goes out
            pos = stop
        self.scanned = end
        return self._release(self._reasoning[0] if self._reasoning is not None else end)

    def finish(self) -> bytes:
        """The end of an answer that never called our tool: whatever is still unsent."""
        if self.at is not None:
            return b""
        return self._release(len(self.whole))

    def held_bytes(self) -> bytes:
        """Everything from our call on, as the provider sent it (for when the continuation
        cannot run: the client then gets the answer as it was, as a buffered one would)."""
        return bytes(self.whole[self.held :])


def _frame(name: str | None, data: Any) -> str:
    body = dumps(data)
    return f"event: {name}\ndata: {body}\n\n" if name else f"data: {body}\n\n"


def rest(first: Reply, final: Reply, rounds: int, at: int, seq: int | None) -> bytes:
    """The events completing a stream whose client already got `first` up to position `at`.

    `final` is the continuation's answer, our calls stripped: after `rounds` >= 1 a new round,
    whose whole content follows what was sent; with 0 (mixed calls, or the loop failed) it is
    `first` itself, stripped, whose entries from `at` on follow. The message's identity (id,
    start event) stays the first answer's; Responses sequence numbers carry on from `seq`.
    """
    d = first.dialect
    dialect = DIALECTS[d]
    m = clone(final.message)
    dialect.continued(first.message, m, at, rounds)
    out: list[str] = []
    n = seq
    for name, data in sse_events(render_sse(Reply(d, m))):
        try:
            obj = json.loads(data)
        except ValueError:
            out.append(f"data: {data}\n\n")  # [DONE]
            continue
        if not isinstance(obj, dict):
            continue
        if not dialect.resumed_event(obj, at):
            continue
        if n is not None:  # only Responses events carry sequence numbers
            obj["sequence_number"] = n
            n += 1
        out.append(_frame(name, obj))
    return utf8("".join(out))
