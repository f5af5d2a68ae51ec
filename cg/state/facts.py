"""What is known about each message of a request, computed once per distinct message.

Two readers need the same per-message facts every turn: the `summarize` component (a digest to
recognise a covered prefix, token counts for its gates) and the usage ledger (the prompt-cache
shape of the request the agent sent, to estimate what it would have cost unrewritten). An agent
re-sends every earlier message each turn, so the facts are memoised: first by the message's view
object (a `MessageCache` hit hands back last turn's view for a verbatim-equal message, so nothing
is even hashed), then by a digest of its raw bytes, and last in the store (`backing`): a
restarted proxy reads the token counts of a session's history instead of tokenising it again
(the slow part of a restart's first turn: docs/benchmarks.md, `bench.reuse`).
New facts are written back in batches (`flush`), off the request's path.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from cg.state.tokens import TokenCounter
from cg.wire.body import BodyIndex
from cg.wire.dialects import MessageView

if TYPE_CHECKING:  # (a type only: the store imports the session module, which imports this)
    from cg.state.store import FactRow

MEMO_SIZE = 50_000
PENDING_MAX = 20_000  # facts not yet written back are flushed at this many at the latest
FLUSH_ROWS = 500  # facts written back in one store transaction
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


class FactsBacking(Protocol):
    """Where facts outlive the process (`cg.state.store.Store`)."""

    def get_facts(self, raws: Sequence[bytes]) -> dict[bytes, FactRow]: ...

    def put_facts(self, rows: Sequence[FactRow]) -> None: ...


def _to_end(memo: OrderedDict[Any, Any], key: Any) -> None:
    """`memo.move_to_end(key)`, where another thread may have evicted `key` since it was read."""
    try:  # noqa: SIM105 - a try costs nothing here, per message; `suppress()` is an object
        memo.move_to_end(key)
    except KeyError:
        pass


def _trim(memo: OrderedDict[Any, Any], size: int) -> None:
    """The oldest entries out of `memo` until it holds `size` (another thread may trim too)."""
    while len(memo) > size:
        try:
            memo.popitem(last=False)
        except KeyError:
            return


def _row(raw: bytes, f: MessageFacts) -> FactRow:
    return (raw, f.digest, f.tokens, f.outputs, int(f.breakpoint) | (2 if f.long_ttl else 0))


def _facts(row: FactRow) -> MessageFacts:
    _, digest, tokens, outputs, flags = row
    return MessageFacts(digest, tokens, outputs, bool(flags & 1), bool(flags & 2))


def _source_key(source: str) -> bytes:
    """The key of a message's facts: a digest of its exact source."""
    return hashlib.blake2b(source.encode("utf-8"), digest_size=16).digest()


class FactsCache:
    """Memoised `MessageFacts` per message; one per addon, shared by every reader, from the
    event loop and from the thread that reads large bodies at once. No lock: each memo
    operation is one C call under the GIL, and the two-step ones (a read, then `move_to_end`;
    a size check, then `popitem`) allow for the other thread's step in between (a KeyError
    there only means the entry went meanwhile)."""

    def __init__(
        self, tokens: TokenCounter, size: int = MEMO_SIZE, backing: FactsBacking | None = None
    ) -> None:
        self.tokens = tokens
        self.size = size
        self.backing = backing
        self._by_view: OrderedDict[int, tuple[MessageView, MessageFacts]] = OrderedDict()
        self._by_raw: OrderedDict[bytes, MessageFacts] = OrderedDict()
        self._preludes: OrderedDict[bytes, Prelude] = OrderedDict()
        self._pending: list[FactRow] = []

    def _remember(self, view: MessageView, facts: MessageFacts) -> None:
        self._by_view[id(view)] = (view, facts)  # holding the view keeps its id from reuse
        _trim(self._by_view, self.size)

    def _seen(self, view: MessageView) -> MessageFacts | None:
        seen = self._by_view.get(id(view))
        if seen is not None and seen[0] is view:
            _to_end(self._by_view, id(view))
            return seen[1]
        return None

    def of(self, index: BodyIndex, i: int) -> MessageFacts:
        view = index.messages[i].view
        facts = self._seen(view)
        if facts is None:
            facts = self._raw(index, i)
            self._remember(view, facts)
        return facts

    def all(self, index: BodyIndex) -> list[MessageFacts]:
        """Every message's facts. Those no memo knows are asked of the store in one query
        before any is computed: after a restart, that is the whole history but the new turn."""
        n = len(index.messages)
        owner, known = index.memo.facts
        if owner is not self or known is None:
            known = []
        if len(known) == n:
            return list(known)
        out: list[MessageFacts | None] = [None] * n
        out[: len(known)] = known  # the previous turn's, for the messages it shares
        missing: list[tuple[int, bytes]] = []
        for i in range(len(known), n):
            facts = self._seen(index.messages[i].view)
            if facts is None:
                raw = self._raw_key(index, i)
                facts = self._by_raw.get(raw)
                if facts is None:
                    missing.append((i, raw))
                    continue
                _to_end(self._by_raw, raw)
                self._remember(index.messages[i].view, facts)
            out[i] = facts
        if missing:
            stored = self._load([raw for _, raw in missing])
            for i, raw in missing:
                row = stored.get(raw)
                facts = _facts(row) if row is not None else self._compute(index, i, raw)
                if row is not None:
                    self._memo_raw(raw, facts)
                self._remember(index.messages[i].view, facts)
                out[i] = facts
        result = [f for f in out if f is not None]
        index.memo.facts = (self, result)
        return list(result)

    def _load(self, raws: list[bytes]) -> dict[bytes, FactRow]:
        if self.backing is None:
            return {}
        try:
            return self.backing.get_facts(raws)
        except Exception:  # noqa: BLE001 - the store is a speed-up here: count instead
            return {}

    def pending(self) -> int:
        """Facts computed and not yet written back (`flush`)."""
        return len(self._pending)

    def flush(self) -> None:
        """Write the facts computed since the last flush to the store (best effort), at most
        FLUSH_ROWS a transaction: a large body's 20,000 in one held the store's lock (and every
        turn's store call on the event loop) too long."""
        pending, self._pending = self._pending, []
        if not pending or self.backing is None:
            return
        try:
            for at in range(0, len(pending), FLUSH_ROWS):
                self.backing.put_facts(pending[at : at + FLUSH_ROWS])
        except Exception:  # noqa: BLE001 - lost facts are only counted again after a restart
            return

    @staticmethod
    def _raw_key(index: BodyIndex, i: int) -> bytes:
        """`_source_key` of message i's source. In an ASCII body a character position is a
        byte offset, so the source's bytes are hashed where they lie in `raw` (no copy of a
        long message, twice, and the hash runs without the GIL)."""
        m = index.messages[i]
        if index.chars.ascii:
            return hashlib.blake2b(memoryview(index.raw)[m.start : m.end], digest_size=16).digest()
        return _source_key(index.source(i))

    def _memo_raw(self, raw: bytes, facts: MessageFacts) -> None:
        self._by_raw[raw] = facts
        _trim(self._by_raw, self.size)

    def _raw(self, index: BodyIndex, i: int) -> MessageFacts:
        m = index.messages[i]
        return self._keyed(self._raw_key(index, i), m.view, lambda: m.value)

    def _keyed(self, raw: bytes, view: MessageView, value: Callable[[], Any]) -> MessageFacts:
        """A message's facts by its source's key: the memo's, else counted (`value` read only
        then)."""
        facts = self._by_raw.get(raw)
        if facts is not None:
            _to_end(self._by_raw, raw)
            return facts
        return self._computed(value(), view, raw)

    def written(self, source: str, view: MessageView) -> MessageFacts:
        """The facts of a message this proxy wrote (the summary), from its exact JSON `source`
        and its view: what `all` finds for it in a body that carries it (the same key, the
        same count), without indexing that body. As `of`, keyed by the source given."""
        facts = self._seen(view)
        if facts is None:
            facts = self._keyed(_source_key(source), view, lambda: json.loads(source))
            self._remember(view, facts)
        return facts

    def _compute(self, index: BodyIndex, i: int, raw: bytes) -> MessageFacts:
        return self._computed(index.messages[i].value, index.messages[i].view, raw)

    def _computed(self, value: Any, view: MessageView, raw: bytes) -> MessageFacts:
        total = self.tokens.count(view.text)
        if view.role == "tool":
            outputs: tuple[int, ...] = (total,)
        else:
            outputs = tuple(
                self.tokens.count(b.text) for b in view.blocks if b.type == "tool_result"
            )
        bp, long = breakpoints_in(value)
        facts = MessageFacts(canonical_digest(value), total, outputs, bp, long)
        self._memo_raw(raw, facts)
        if self.backing is not None:
            self._pending.append(_row(raw, facts))
            if len(self._pending) >= PENDING_MAX:
                self.flush()
        return facts

    def prelude(self, index: BodyIndex) -> Prelude:
        """The members before `messages` that the cache keys on; tokens of system and tools.

        Memoised on the members' raw text: an agent sends the same system and tools every turn
        (and on the index, which a next turn sharing every byte outside the array inherits).
        """
        owner, known = index.memo.prelude
        if owner is self and isinstance(known, Prelude):
            return known
        prelude = self._prelude(index)
        index.memo.prelude = (self, prelude)
        return prelude

    def _prelude(self, index: BodyIndex) -> Prelude:
        h = hashlib.blake2b(digest_size=16)
        for k, m in index.members.items():
            if k in PRELUDE_MEMBERS:
                h.update(k.encode())
                h.update(index.slice(m.start, m.end).encode("utf-8", "surrogatepass"))
        raw = h.digest()
        prelude = self._preludes.get(raw)
        if prelude is not None:
            _to_end(self._preludes, raw)
            return prelude
        row = self._load([raw]).get(raw)  # a restarted proxy: system and tools, counted
        if row is not None:
            prelude = Prelude(row[1], row[2], bool(row[4] & 1), bool(row[4] & 2))
            self._preludes[raw] = prelude
            return prelude
        parts = {k: m.value for k, m in index.members.items() if k in PRELUDE_MEMBERS}
        tokens = sum(
            self.tokens.count_text(index.slice(m.start, m.end))
            for k, m in index.members.items()
            if k in ("system", "tools", "instructions")
        )
        bp, long = breakpoints_in([parts.get("tools"), parts.get("system")])
        prelude = Prelude(canonical_digest(parts), tokens, bp, long)
        self._preludes[raw] = prelude
        _trim(self._preludes, PRELUDE_MEMO_SIZE)
        if self.backing is not None:
            self._pending.append((raw, prelude.digest, tokens, (), int(bp) | (2 if long else 0)))
        return prelude
