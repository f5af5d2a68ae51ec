"""The per-turn bookkeeping held back for one transaction (`Store.batch_delay`): the usage
ledger's rows and the sessions' clocks.

Why: each was one SQLite transaction of its own per turn, `BEGIN IMMEDIATE` to `COMMIT`, and
together the largest cost of a small turn's response hook (the figures:
docs/benchmarks.md#the-per-turn-bookkeeping-batched-cg_store_batch_ms). The ledger's writes are sums (usage rows and turn counters are added to, the cache state is
replaced) and a clock is replaced, so the turns within one window fold into one row per key
and go in as one transaction. Each turn is whole in a batch: a turn's rows are never split
between two commits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from cg.wire.usage import Usage

UsageKey = tuple[str, str, str, str]  # session, kind, model, tier
# A session's prompt-cache state as JSON, or what writes it: only the newest of a batch is
# committed, so the ledger hands over a callable and the JSON is made once per commit, not
# once per answer.
CacheState = str | Callable[[], str]


def cache_state_json(state: CacheState | None) -> str | None:
    """The state as JSON: made now when it was handed over as what makes it."""
    return state() if callable(state) else state


class HeldWrites:
    """Sums of `(kind, model, tier, usage)` rows per session and of each session's turn
    counters, with the newest cache state and the time each key was last written; and each
    session's newest clock."""

    __slots__ = ("clocks", "ledger", "usage")

    def __init__(self) -> None:
        self.usage: dict[UsageKey, tuple[Usage, float]] = {}
        # session -> [turns, rewritten, tokens_not_sent, estimate_skipped, cache_state, t]
        self.ledger: dict[str, list[Any]] = {}
        self.clocks: dict[str, tuple[float, float | None]] = {}  # (last_request, cache_ttl)

    def __bool__(self) -> bool:
        return bool(self.ledger or self.clocks)  # every booking writes its session's row

    def __len__(self) -> int:
        """Rows the batch would write."""
        return len(self.usage) + len(self.ledger) + len(self.clocks)

    def clock(self, session: str, last_request: float, cache_ttl: float | None) -> None:
        self.clocks[session] = (last_request, cache_ttl)

    def add(
        self,
        session: str,
        rows: Sequence[tuple[str, str, str, Usage]],
        counts: tuple[int, int, int, int],
        cache_state: CacheState | None,
        t: float,
    ) -> None:
        for kind, model, tier, u in rows:
            self._add_usage((session, kind, model, tier), u, t)
        self._add_counts(session, counts, cache_state, t)

    def absorb(self, newer: HeldWrites) -> None:
        """Fold in a batch recorded after this one (a failed commit's batch is put back in
        front of what arrived meanwhile)."""
        for key, (u, t) in newer.usage.items():
            self._add_usage(key, u, t)
        for session, (a, b, c, d, state, t) in newer.ledger.items():
            self._add_counts(session, (a, b, c, d), state, t)
        self.clocks.update(newer.clocks)

    def _add_usage(self, key: UsageKey, u: Usage, t: float) -> None:
        had = self.usage.get(key)
        self.usage[key] = (had[0] + u if had is not None else u, t)

    def _add_counts(
        self,
        session: str,
        counts: tuple[int, int, int, int],
        state: CacheState | None,
        t: float,
    ) -> None:
        row = self.ledger.get(session)
        if row is None:
            self.ledger[session] = [*counts, state, t]
            return
        row[0] += counts[0]
        row[1] += counts[1]
        row[2] += counts[2]
        row[3] += counts[3]
        if state is not None:
            row[4] = state
        row[5] = t

    def cache_state(self, session: str) -> str | None:
        """The newest cache state held for `session`, or None (then the stored one stands)."""
        row = self.ledger.get(session)
        return _state_of(row) if row is not None else None

    def usage_params(self) -> list[tuple[Any, ...]]:
        return [(*key, *_counts(u), t) for key, (u, t) in self.usage.items()]

    def ledger_params(self) -> list[tuple[Any, ...]]:
        return [(s, *row[:4], _state_of(row), row[5]) for s, row in self.ledger.items()]

    def clock_params(self) -> list[tuple[Any, ...]]:
        return [(s, t, ttl) for s, (t, ttl) in self.clocks.items()]


def _state_of(row: list[Any]) -> str | None:
    """A held ledger row's cache state as JSON, made once (kept in the row)."""
    row[4] = cache_state_json(row[4])
    state: str | None = row[4]
    return state


def _counts(u: Usage) -> tuple[int, ...]:
    """A usage's counts in `_USAGE_COLS` order."""
    return (
        u.input_tokens, u.cache_write_tokens, u.cache_write_1h_tokens, u.cache_read_tokens,
        u.output_tokens, u.requests,
    )  # fmt: skip
