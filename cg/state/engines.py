"""Which engine serves a configuration: `open_store` and `memory`, above both engines (the
interface below them names neither). A `postgresql://` URL opens the shared PostgreSQL store,
imported only then, so the SQLite default never loads psycopg."""

from __future__ import annotations

import time
from collections.abc import Callable

from cg.settings import StoreConfig
from cg.state.interface import DEFAULT_BUSY_TIMEOUT_MS, Store
from cg.state.records import MEMORY, is_url
from cg.state.sqlite import SqliteStore


def open_store(
    cfg: StoreConfig,
    target: str | None = None,
    now: Callable[[], float] = time.time,
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
    claim: bool = False,
) -> Store:
    """The configured store: `target` (option `cg_db`), else `store.url`, else `store.path`.
    An SQLite file is held against another proxy with `claim` (PostgreSQL is shared by design:
    its claims are per conversation)."""
    where = target or cfg.url or cfg.path
    if is_url(where):
        from cg.state.pgstore import PgStore

        return PgStore(
            where, ttl_hours=cfg.ttl_hours, max_mb=cfg.max_mb, now=now,
            lease_seconds=cfg.lease_seconds,
        )  # fmt: skip
    return SqliteStore(
        where,
        ttl_hours=cfg.ttl_hours,
        max_mb=cfg.max_mb,
        now=now,
        busy_timeout_ms=busy_timeout_ms,
        claim=claim,
    )


def open_reader(target: str) -> Store:
    """A store opened as a reader would (the CLI): nothing is evicted by it, nothing claimed."""
    if is_url(target):
        from cg.state.pgstore import PgStore

        return PgStore(target, evict=False)
    return SqliteStore(target, evict=False)


def memory(now: Callable[[], float] = time.time) -> Store:
    """A store that does not persist (`persistent` is False): for tests and degraded runs."""
    return SqliteStore(MEMORY, now=now)
