"""cg.state.facts: per-message facts outlive a restart in the store, so the first turn of a
restarted proxy reads its history's token counts instead of tokenising them again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cg.state import Store
from cg.state.facts import FactsCache
from cg.state.sqlite import SqliteStore
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


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """An SQLite file, or a fresh database on the suite's PostgreSQL server (tests/conftest.py;
    skipped without one unless CG_REQUIRE_POSTGRES=1)."""
    if request.param == "sqlite":
        return tmp_path / "cg.sqlite3"
    url: str = request.getfixturevalue("pg_url")
    return url


def make(target: Path | str, **kw: Any) -> Store:
    if isinstance(target, str):
        from cg.state.pgstore import PgStore

        return PgStore(target, **kw)
    return SqliteStore(target, **kw)


def test_a_restarted_cache_reads_the_counts_it_flushed(target: Path | str) -> None:
    index = index_body(body(41), ANTHROPIC)
    with make(target) as store:
        before = FactsCache(CountingTokens(), backing=store)
        first = before.all(index)
        before.flush()
        if hasattr(store, "flush"):
            store.flush()  # PostgreSQL: the writer has committed them
    # The restart: a new process, new memos, the same store; one more message this turn.
    index2 = index_body(body(42), ANTHROPIC)
    with make(target) as store:
        tokens = CountingTokens()
        after = FactsCache(tokens, backing=store)
        again = after.all(index2)
    # Only the last two messages (changed, and new) were counted; the rest came from the store.
    assert tokens.calls == 2
    assert again[:40] == first[:40]
    assert again[41].long_ttl and again[41].breakpoint


def test_without_a_store_or_with_a_broken_one_it_counts(tmp_path: Path) -> None:
    index = index_body(body(5), ANTHROPIC)
    store = SqliteStore(tmp_path / "cg.sqlite3")
    store.close()  # every call now raises StoreError
    tokens = CountingTokens()
    facts = FactsCache(tokens, backing=store)
    assert len(facts.all(index)) == 5
    facts.flush()  # best effort: no error
    assert tokens.calls == 5


def test_facts_expire_with_the_store_ttl(target: Path | str) -> None:
    """Facts are a cache: gone once the TTL passed since they were first seen, on either
    engine."""
    clock = [1000.0]
    row = (b"r" * 16, b"d" * 16, 42, (7, 8), 1)
    with make(target, ttl_hours=1, now=lambda: clock[0]) as store:
        store.put_facts([row])
        if hasattr(store, "flush"):
            store.flush()
        assert store.get_facts([row[0]]) == {row[0]: row}  # vacuity: it was there
        clock[0] += 2 * 3600
        store.evict()
        assert store.get_facts([row[0]]) == {}


ROUNDS = 100


def test_the_memos_are_shared_safely_with_the_worker_thread() -> None:
    """The event loop and the thread that reads large bodies use one FactsCache: with memos
    smaller than what two threads churn through, and the interpreter switching threads every
    microsecond, no read or eviction of one trips over the other's. (A race of the GIL-atomic
    steps is rare enough that this seldom failed without the allowances; what it guards is a
    memo operation that is not one C call, an iteration say, added later.)"""
    import sys
    import threading

    facts = FactsCache(TokenCounter(), size=64)  # (120 messages churn through it)
    bodies = []
    for k in range(2):
        msgs = [
            {"role": "user", "content": f"thread {k} message {i} " * (k + 1)} for i in range(60)
        ]
        bodies.append(json.dumps({"model": "m", "messages": msgs}).encode())
    errors: list[BaseException] = []
    counts: list[int] = []

    def work(raw: bytes) -> None:
        try:
            for _ in range(ROUNDS):
                index = index_body(raw, ANTHROPIC)  # fresh views: every fact looked up anew
                counts.append(sum(f.tokens for f in facts.all(index)))
                facts.of(index, 0)
        except BaseException as e:  # noqa: BLE001 - what the test is about
            errors.append(e)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work, args=(b,)) for b in bodies]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[:3]
    assert len(counts) == 2 * ROUNDS and len(set(counts)) == 2  # each body always counted the same
