"""What the proxy remembers: the store, session ids, token counts, per-message facts.

    interface   the `Store` protocol every caller types against
    records     what the store takes and returns (stashes, checkpoints, the ledger's rows) and
                its errors
    engines     which engine serves a configuration (`open_store`, `memory`, `open_reader`)
    session     which session a request belongs to
    tenant      whose credential sent a request, as a keyed fingerprint
    tokens      tiktoken counts with an encoding shipped in a package, cached by digest
    facts       per-message digests, token counts and cache breakpoints, memoised across turns
    pending     the ledger's writes held back for one transaction

The engines are internal (tests/test_layers.py keeps callers out of them): `sqlite` on
`sqlite_file` (one file per proxy), `pgstore` on `pgconn` (one PostgreSQL database shared by
several), both on `sql` (each statement once, per dialect), `schema` (both engines' versions side
by side) and `policy` (retention and size, as pure functions).

May import: cg.wire, cg.settings.
"""

from cg.state.engines import memory, open_reader, open_store
from cg.state.interface import Store
from cg.state.records import (
    KEY_PATTERN,
    NO_TURNS,
    PAGE_START,
    Checkpoint,
    EvictResult,
    FactRow,
    LedgerTurns,
    PageKey,
    SessionDetail,
    SessionInfo,
    SessionRecord,
    Stash,
    StoreClaimed,
    StoreError,
    StoreStats,
    UsageRow,
    is_url,
    owner,
    redact_url,
    stash_key,
    valid_key,
)

__all__ = [
    "KEY_PATTERN",
    "NO_TURNS",
    "PAGE_START",
    "Checkpoint",
    "EvictResult",
    "FactRow",
    "LedgerTurns",
    "PageKey",
    "SessionDetail",
    "SessionInfo",
    "SessionRecord",
    "Stash",
    "Store",
    "StoreClaimed",
    "StoreError",
    "StoreStats",
    "UsageRow",
    "is_url",
    "memory",
    "open_reader",
    "open_store",
    "owner",
    "redact_url",
    "stash_key",
    "valid_key",
]
