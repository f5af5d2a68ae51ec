"""What is known about each message of a request, computed once per distinct message.

Two readers need the same per-message facts every turn: the `summarize` component (a digest to
recognise a covered prefix, token counts for its gates) and the usage ledger (the prompt-cache
shape of the request the agent sent, to estimate what it would have cost unrewritten). An agent
re-sends every earlier message each turn, so the facts are memoised: first by the message's view
object (a `MessageCache` hit hands back last turn's view for a verbatim-equal message, so nothing
is even hashed), then by a digest of its raw bytes.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from cg.state.tokens import TokenCounter
from cg.wire.body import BodyIndex
from cg.wire.dialects import MessageView

MEMO_SIZE = 50_000
PRELUDE_MEMO_SIZE = 256
# Request members that shape the provider's prompt cache besides `messages` (or a Responses
# request's `input`): changing any of them invalidates the cached prefix (Anthropic renders
# tools, then system, then messages; a change of `tool_choice` or `thinking` invalidates cached
# messages; the Responses API renders tools and `instructions` before the input items).
# `max_tokens`, `stream`, `metadata` and the like do not.
PRELUDE_MEMBERS = (
    "model",
    "tools",
    "system",
    "instructions",
    "tool_choice",
    "thinking",
    "response_format",
)


@dataclass(frozen=True, slots=True)
class MessageFacts:
    """One message: `digest` (blind to `cache_control`), its tokens, the tokens of each tool
    output it carries, and whether it carries a `cache_control` breakpoint (`long_ttl`: one
    that asks `ttl: "1h"`)."""

    digest: bytes
    tokens: int
    outputs: tuple[int, ...]
    breakpoint: bool
    long_ttl: bool


@dataclass(frozen=True, slots=True)
class Prelude:
    """Everything before `messages` that the prompt cache keys on, as one unit."""

    digest: bytes
    tokens: int
    breakpoint: bool
    long_ttl: bool


def strip_cache_control(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: strip_cache_control(x) for k, x in v.items() if k != "cache_control"}
    if isinstance(v, list):
        return [strip_cache_control(x) for x in v]
    return v


def canonical_digest(value: Any) -> bytes:
    """A digest of a JSON value, blind to key order, whitespace and `cache_control`.

    Claude Code moves its `cache_control` breakpoint to the last message every turn (other
    clients mark the last two user turns), so one message arrives with a breakpoint on one turn
    and without it on the next; both must hash the same.
    """
    canon = json.dumps(strip_cache_control(value), sort_keys=True)
    return hashlib.blake2b(canon.encode("utf-8"), digest_size=16).digest()


def breakpoints_in(value: Any) -> tuple[bool, bool]:
    """(any `cache_control` in value, any asking `ttl: "1h"`), searched at any depth."""
    found = long = False
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            cc = v.get("cache_control")
            if isinstance(cc, dict):
                found = True
                long = long or cc.get("ttl") == "1h"
            stack.extend(x for k, x in v.items() if k != "cache_control")
        elif isinstance(v, list):
            stack.extend(v)
    return found, long


class FactsCache:
    """Memoised `MessageFacts` per message; one per addon, shared by every reader."""

    def __init__(self, tokens: TokenCounter, size: int = MEMO_SIZE) -> None:
        self.tokens = tokens
        self.size = size
        self._by_view: OrderedDict[int, tuple[MessageView, MessageFacts]] = OrderedDict()
        self._by_raw: OrderedDict[bytes, MessageFacts] = OrderedDict()
        self._preludes: OrderedDict[bytes, Prelude] = OrderedDict()

    def of(self, index: BodyIndex, i: int) -> MessageFacts:
        view = index.messages[i].view
        seen = self._by_view.get(id(view))
        if seen is not None and seen[0] is view:
            self._by_view.move_to_end(id(view))
            return seen[1]
        facts = self._raw(index, i)
        self._by_view[id(view)] = (view, facts)  # holding the view keeps its id from reuse
        if len(self._by_view) > self.size:
            self._by_view.popitem(last=False)
        return facts

    def all(self, index: BodyIndex) -> list[MessageFacts]:
        return [self.of(index, i) for i in range(len(index.messages))]

    def _raw(self, index: BodyIndex, i: int) -> MessageFacts:
        raw = hashlib.blake2b(index.source(i).encode("utf-8"), digest_size=16).digest()
        facts = self._by_raw.get(raw)
        if facts is not None:
            self._by_raw.move_to_end(raw)
            return facts
        value = index.messages[i].value
        view = index.messages[i].view
        total = self.tokens.count(view.text)
        if view.role == "tool":
            outputs: tuple[int, ...] = (total,)
        else:
            outputs = tuple(
                self.tokens.count(b.text) for b in view.blocks if b.type == "tool_result"
            )
        bp, long = breakpoints_in(value)
        facts = MessageFacts(canonical_digest(value), total, outputs, bp, long)
        self._by_raw[raw] = facts
        if len(self._by_raw) > self.size:
            self._by_raw.popitem(last=False)
        return facts

    def prelude(self, index: BodyIndex) -> Prelude:
        """The members before `messages` that the cache keys on; tokens of system and tools.

        Memoised on the members' raw text: an agent sends the same system and tools every turn.
        """
        h = hashlib.blake2b(digest_size=16)
        for k, m in index.members.items():
            if k in PRELUDE_MEMBERS:
                h.update(k.encode())
                h.update(index.text[m.start : m.end].encode("utf-8", "surrogatepass"))
        raw = h.digest()
        prelude = self._preludes.get(raw)
        if prelude is not None:
            self._preludes.move_to_end(raw)
            return prelude
        parts = {k: m.value for k, m in index.members.items() if k in PRELUDE_MEMBERS}
        tokens = sum(
            self.tokens.count_text(index.text[m.start : m.end])
            for k, m in index.members.items()
            if k in ("system", "tools", "instructions")
        )
        bp, long = breakpoints_in([parts.get("tools"), parts.get("system")])
        prelude = Prelude(canonical_digest(parts), tokens, bp, long)
        self._preludes[raw] = prelude
        if len(self._preludes) > PRELUDE_MEMO_SIZE:
            self._preludes.popitem(last=False)
        return prelude
