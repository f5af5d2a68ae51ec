"""What readers computed about one indexed body, in slots declared here, each with its carry-over
rule (`BodyIndex.memo`).

A next turn's index (`MessageCache.extend`) shares the previous body's first `k` messages byte
for byte and every byte outside the transcript array, so it inherits the memo:

    per message   a list aligned with the body's messages (or a prefix of them): cut to the
                  first `k` entries, so a reader extends it by the new messages only
    whole body    a fact about the bytes outside the array, or kept by its reader against
                  `BodyIndex.shared`: carried as it is

Each slot holds `(owner, value)`: the reader that computed the value (a cache, a component, a
dialect), which a reader checks with `is` before trusting it, since an index may be inherited
by another pipeline's turn. `EMPTY` is a slot nothing wrote. The owners and most values are
types of the layers above (`cg.state.facts`, `cg.billing`, `cg.summarize`), so they are typed
here as what this layer can name.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cg.wire.shape import Violation

EMPTY: tuple[None, None] = (None, None)


def _per_message() -> Any:
    return field(default=EMPTY, metadata={"per_message": True})


def _whole_body() -> Any:
    return field(default=EMPTY, metadata={"per_message": False})


@dataclass(slots=True)
class Memo:
    # -- per message (cut to the shared prefix) -------------------------------------------
    # cg.state.facts.FactsCache.all: every message's MessageFacts.
    facts: tuple[object, list[Any] | None] = _per_message()
    # cg.billing.cache.prompt_of: the hash chain, one (key, tokens, breakpoint, 1 h) a message.
    chain: tuple[object, list[tuple[bytes, int, bool, bool]] | None] = _per_message()
    # cg.summarize.component: running totals over the messages.
    totals: tuple[object, list[Any] | None] = _per_message()
    # cg.summarize.component: the covered span's hash, last of `ce` entries.
    covered_hash: tuple[object, list[str | None] | None] = _per_message()
    # cg.state.session: the conversation's head hash, last of the messages up to the first
    # user message.
    head: tuple[object, list[str | None] | None] = _per_message()
    # cg.wire.shape.check_wire_array: a kept message read clean as sent, one flag a message.
    wire_ok: tuple[object, list[bool] | None] = _per_message()
    # cg.retention.measure.message_found: each message's facts.
    retained: tuple[object, list[Any] | None] = _per_message()
    # cg.retention.measure.of_plan: which lost facts the kept messages' text holds, last of the
    # messages searched.
    searched: tuple[object, list[Any] | None] = _per_message()
    # cg.mask.outputs.scans: each message's tool calls and tool outputs, where they lie.
    masks: tuple[object, list[Any] | None] = _per_message()

    # -- whole body (carried as it is) -------------------------------------------------------
    # cg.state.facts.FactsCache.prelude: the members before the array the cache keys on.
    prelude: tuple[object, Any] = _whole_body()
    # cg.billing.cache.prompt_of: the prompt-cache shape, for a turn repeating every message.
    prompt: tuple[object, Any] = _whole_body()
    # cg.summarize.component: `cache_ttl` of the text outside the array.
    outside_ttl: tuple[object, float | None] = _whole_body()
    # cg.billing.ledger: the injected tool's tokens, by (its bytes, its place in `tools`).
    tool_tokens: tuple[object, tuple[tuple[bytes, int], int] | None] = _whole_body()
    # cg.wire.shape.list_violations: (messages read, their violations); read again from the
    # messages before `BodyIndex.shared` on.
    violations: tuple[object, tuple[int, tuple[Violation, ...]] | None] = _whole_body()
    # BodyIndex.byte_offset: byte offsets by position relative to the array (one table, shared
    # by every index inheriting it: the bytes outside the array are the same).
    byte_offsets: tuple[object, dict[int, int] | None] = _whole_body()

    def carried(self, k: int) -> Memo:
        """The memo of a next turn's index that shares this body's first `k` messages."""
        out = Memo()
        for name in PER_MESSAGE:
            owner, value = getattr(self, name)
            setattr(out, name, (owner, value[:k]) if isinstance(value, list) else (owner, value))
        for name in WHOLE_BODY:
            setattr(out, name, getattr(self, name))
        return out


PER_MESSAGE = tuple(f.name for f in fields(Memo) if f.metadata["per_message"])
WHOLE_BODY = tuple(f.name for f in fields(Memo) if not f.metadata["per_message"])
