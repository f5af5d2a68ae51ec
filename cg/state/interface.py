"""The store as its callers see it: one protocol, two engines (`cg.state.sqlite.SqliteStore`, one
file per proxy; `cg.state.pgstore.PgStore`, one database shared by several). Callers outside
cg/state type against `Store` and get one from `cg.state.open_store` (or `memory`), so which
engine serves them is the configuration's business, never theirs.

Semantics both engines keep (tests/state/test_store.py runs them on both): a stash is the exact
source text of a span, found by its content key, its session and the tenant that may read it; a
checkpoint is replaced whole and re-emitted byte-identical; reading a checkpoint keeps its stash
from eviction; everything expires by the TTL and is held to `max_mb` by `cg.state.policy`; every
failure is a `StoreError`, the last one kept in `error` until an operation succeeds; credentials
never reach the store (it takes session ids, tenant fingerprints, text and times).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from cg.state.pending import CacheState
from cg.state.records import (
    Checkpoint,
    EvictResult,
    FactRow,
    LedgerTurns,
    PageKey,
    SessionDetail,
    SessionInfo,
    SessionRecord,
    Stash,
    StoreError,
    StoreStats,
    UsageRow,
)
from cg.state.tenant import ANONYMOUS
from cg.wire.usage import Usage

DEFAULT_BUSY_TIMEOUT_MS = 5000
HEALTH_RETRY = 2.0  # seconds a store that failed is left alone before `health` tries it again


class Store(Protocol):
    """What every engine answers; every method is thread-safe, and raises StoreError."""

    persistent: bool  # False: in memory, gone with the process
    path: str  # what may be shown of where it lives (never a password)
    ttl: float  # seconds
    max_bytes: int
    batch_delay: float  # seconds SQLite may hold the ledger's writes (PostgreSQL queues them)
    tenant_key: bytes  # the fingerprint key (`cg.state.tenant`)
    evicted: int
    error: str | None  # the last operation's error, until one succeeds
    error_at: float  # time.monotonic() of that error
    now: Callable[[], float]

    # -- health and life ------------------------------------------------------------------

    def health(self, retry: float = HEALTH_RETRY) -> str | None:
        """Why the store is unusable now, or None. A store whose last operation failed is
        tried again (`probe`) once `retry` seconds have passed; an SQLite file deleted or
        replaced under it is written back from the open connection first."""
        ...

    def probe(self) -> None: ...
    def describe(self) -> dict[str, Any]: ...
    def stats(self) -> StoreStats: ...
    def evict(self) -> EvictResult: ...
    def close(self) -> None: ...
    def __enter__(self) -> Store: ...
    def __exit__(self, *exc: object) -> None: ...

    # -- what several instances share ---------------------------------------------------

    async def claim(self, conversation: str, based_on: str | None) -> bool: ...
    def release(self, conversation: str) -> None: ...
    async def settle(self) -> None: ...

    # -- stashes ------------------------------------------------------------------------

    @property
    def max_stash_bytes(self) -> int: ...

    def put_stash(
        self,
        key: str,
        session: str,
        span_sources: Sequence[str],
        dialect: str,
        tenant: str = ANONYMOUS,
    ) -> None: ...

    def get_stash(
        self, key: str, session: str | None = None, tenant: str | None = None
    ) -> Stash | None: ...

    def has_stash(
        self, key: str, session: str | None = None, tenant: str | None = None
    ) -> bool: ...

    def delete_stash(self, key: str, session: str | None = None) -> int: ...

    # -- checkpoints, sessions, facts ---------------------------------------------------

    def put_checkpoint(self, cp: Checkpoint) -> Checkpoint: ...
    def get_checkpoint(self, session: str, tenant: str | None = None) -> Checkpoint | None: ...
    def conversation_checkpoints(self, base: str) -> list[Checkpoint]: ...
    def checkpoints_of(self, session: str) -> list[Checkpoint]: ...
    def delete_checkpoint(self, session: str) -> bool: ...

    def touch_session(
        self, session: str, now: float | None = None, cache_ttl: float | None = None
    ) -> SessionRecord | None: ...

    def get_session(self, session: str) -> SessionRecord | None: ...
    def last_request(self, session: str) -> float | None: ...
    def sessions(self) -> list[SessionInfo]: ...
    def get_facts(self, raws: Sequence[bytes]) -> dict[bytes, FactRow]: ...
    def put_facts(self, rows: Sequence[FactRow]) -> None: ...

    # -- the usage ledger and the session list ------------------------------------------

    def record_usage(
        self,
        session: str,
        rows: Sequence[tuple[str, str, str, Usage]],
        turns: LedgerTurns | None = None,
        cache_state: CacheState | None = None,
    ) -> None: ...

    def held(self) -> bool: ...
    def flush_held(self) -> None: ...
    def usage_rows(self, session: str | None = None) -> list[UsageRow]: ...
    def ledger_turns(self, session: str | None = None) -> dict[str, LedgerTurns]: ...
    def cache_state(self, session: str) -> str | None: ...
    def session_page(self, limit: int, after: PageKey | None = None) -> list[SessionDetail]: ...
    def session_details(self, sessions: Sequence[str]) -> list[SessionDetail]: ...
    def usage_totals(self) -> list[UsageRow]: ...
    def ledger_totals(self) -> LedgerTurns: ...
    # A subscription session's plan and rate-limit readings (`cg.billing.plan`).
    def record_plan(self, session: str, plan: str, limits: str | None) -> None: ...
    def plans(self, session: str | None = None) -> dict[str, tuple[str, str | None]]: ...


class Probed(Protocol):
    """What `retried` needs of a store (either engine's plumbing)."""

    error: str | None
    error_at: float

    def probe(self) -> None: ...


def retried(store: Probed, retry: float) -> str | None:
    """What both engines' `health` does with a store whose last operation failed: reported as
    it stands for `retry` seconds after the failure, then tried with one `probe` (which sets
    `error_at` anew when it fails too)."""
    if store.error is None:
        return None
    if time.monotonic() - store.error_at < retry:
        return f"the store failed ({store.error}); retried after {retry:g}s"
    try:
        store.probe()
    except StoreError as e:
        return f"the store failed ({e}); retried after {retry:g}s"
    return None
