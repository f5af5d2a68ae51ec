"""cg.state.facts: per-message facts outlive a restart in the store, so the first turn of a
restarted proxy reads its history's token counts instead of tokenising them again."""

from __future__ import annotations

import json
from pathlib import Path

from cg.state.facts import FactsCache
from cg.state.store import Store
from cg.state.tokens import TokenCounter
from cg.wire.body import index_body
from cg.wire.dialects import ANTHROPIC


class CountingTokens(TokenCounter):
    """A real counter that counts how often it is asked."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def count(self, text: str) -> int:
        self.calls += 1
        return super().count(text)


def body(n: int) -> bytes:
    msgs: list[dict[str, object]] = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} ✓ " * 20}
        for i in range(n)
    ]
    msgs[-1]["content"] = [
        {"type": "text", "text": "last", "cache_control": {"type": "ephemeral", "ttl": "1h"}}
    ]
    return json.dumps({"model": "m", "messages": msgs}, ensure_ascii=False).encode()


def test_a_restarted_cache_reads_the_counts_it_flushed(tmp_path: Path) -> None:
    db = tmp_path / "cg.sqlite3"
    index = index_body(body(41), ANTHROPIC)
    with Store(db) as store:
        before = FactsCache(CountingTokens(), backing=store)
        first = before.all(index)
        before.flush()
    # The restart: a new process, new memos, the same file; one more message this turn.
    index2 = index_body(body(42), ANTHROPIC)
    with Store(db) as store:
        tokens = CountingTokens()
        after = FactsCache(tokens, backing=store)
        again = after.all(index2)
    # Only the last two messages (changed, and new) were counted; the rest came from the store.
    assert tokens.calls == 2
    assert again[:40] == first[:40]
    assert again[41].long_ttl and again[41].breakpoint


def test_without_a_store_or_with_a_broken_one_it_counts(tmp_path: Path) -> None:
    index = index_body(body(5), ANTHROPIC)
    store = Store(tmp_path / "cg.sqlite3")
    store.close()  # every call now raises StoreError
    tokens = CountingTokens()
    facts = FactsCache(tokens, backing=store)
    assert len(facts.all(index)) == 5
    facts.flush()  # best effort: no error
    assert tokens.calls == 5
