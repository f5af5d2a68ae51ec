"""`BodyIndex.memo`: typed slots, each declared per message (cut to the prefix a next turn's
index shares) or whole body (carried as it is), checked on the declaration and through a real
`MessageCache` next turn."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from cg.wire.body import MessageCache, index_body
from cg.wire.dialects import ANTHROPIC, OPENAI
from cg.wire.memo import EMPTY, PER_MESSAGE, WHOLE_BODY, Memo


def test_every_slot_is_declared_once_with_its_rule() -> None:
    names = [f.name for f in fields(Memo)]
    assert PER_MESSAGE and WHOLE_BODY  # vacuity guard: both rules are in use
    assert sorted(PER_MESSAGE + WHOLE_BODY) == sorted(names)
    assert not set(PER_MESSAGE) & set(WHOLE_BODY)
    assert all(getattr(Memo(), n) is EMPTY for n in names)


def test_a_slot_nobody_declared_cannot_be_written() -> None:
    memo = Memo()
    with pytest.raises(AttributeError):
        setattr(memo, "undeclared", (None, 1))  # noqa: B010 - the write under test


@pytest.mark.parametrize("k", [0, 2, 5])
def test_carried_cuts_per_message_slots_and_keeps_whole_body_ones(k: int) -> None:
    owner = object()
    memo = Memo()
    values = {n: [f"{n}{i}" for i in range(4)] for n in PER_MESSAGE}
    for n, v in values.items():
        setattr(memo, n, (owner, v))
    whole = {n: (owner, {"table": n}) for n in WHOLE_BODY}
    for n, w in whole.items():
        setattr(memo, n, w)
    out = memo.carried(k)
    for n, v in values.items():
        got_owner, got = getattr(out, n)
        assert got_owner is owner and got == v[:k] and got is not v  # a copy: the next turn's
    for n, w in whole.items():
        assert getattr(out, n) is w
    assert getattr(memo, PER_MESSAGE[0])[1] == values[PER_MESSAGE[0]]  # the first turn's intact


def test_a_next_turn_inherits_the_memo_by_declaration() -> None:
    """Through `index_body` with a cache, on a non-ASCII body (so `byte_offset` memoises)."""
    msgs = [{"role": "user", "content": "é" * 40}, {"role": "assistant", "content": "b"}]
    cache = MessageCache()
    body = {"model": "m", "max_tokens": 9, "messages": msgs}
    first = index_body(json.dumps(body, ensure_ascii=False).encode(), ANTHROPIC, cache)
    first.byte_offset(first.members["model"].start)
    table = first.memo.byte_offsets[1]
    assert table  # vacuity guard: the whole-body slot was written
    first.memo.wire_ok = (ANTHROPIC, [True, True])
    first.memo.violations = (ANTHROPIC, (2, ()))
    more = {**body, "messages": [*msgs, {"role": "user", "content": "c"}]}
    warm = index_body(json.dumps(more, ensure_ascii=False).encode(), ANTHROPIC, cache)
    assert warm.shared == 2
    assert warm.memo.byte_offsets[1] is table
    assert warm.memo.violations == (ANTHROPIC, (2, ()))
    assert warm.memo.wire_ok == (ANTHROPIC, [True, True])
    other = {**body, "messages": [msgs[0], {"role": "assistant", "content": "B"}]}
    cut = index_body(json.dumps(other, ensure_ascii=False).encode(), ANTHROPIC, cache)
    assert cut.shared == 1  # one message shared: per-message slots cut to one entry
    assert cut.memo.wire_ok == (ANTHROPIC, [True])
    assert cut.memo.byte_offsets[1] is table
    cold = index_body(json.dumps(more).encode(), OPENAI)
    assert cold.memo.wire_ok is EMPTY  # no cache: a cold index starts empty
