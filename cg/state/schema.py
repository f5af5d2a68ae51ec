"""Both engines' schemas, version by version, side by side: the DDL that takes a store from the
version before to each one, run one version per transaction by the engine that owns it (so a
killed migration leaves the store as it was, and two processes migrating at once do it once).

SQLite (version in `PRAGMA user_version`): v1 stashes, checkpoints, sessions; v2 the usage
ledger (`usage`, `ledger`); v3 `facts`; v4 tenancy (the stashes rebuilt with the tenant in their
key, old rows `*`; the checkpoints' tenant; `meta`, the fingerprint key's table) and the session
list's indexes (`ledger_page`, `checkpoints_owner`); v5 the ledger's `plan` and `plan_limits`
(a subscription session's label and its rate-limit readings, `cg.billing.plan`).

PostgreSQL (version in `cg_meta`, tables prefixed `cg_`): v1 every table SQLite's v2 has, and
`cg_claims`; v2 `cg_facts`; v3 tenancy and the session list's indexes, as SQLite's v4; v4 the
ledger's `plan` and `plan_limits`, as SQLite's v5.

Tables:

    stashes      (key, session, tenant) -> the original span: `[` + the messages' exact source
                 text joined by `,` + `]`, UTF-8. `key` is `stash_key(span)`, a content hash, so
                 the same span stashed by two sessions (a resumed conversation), or by two
                 tenants in one session, is one key, two rows.
    checkpoints  conversation -> the summary that replaced a covered prefix, and the exact
                 serialised summary message, so reuse re-emits byte-identical bytes; and the
                 tenant that wrote it.
    sessions     session -> when its last request was seen and the cache TTL it asked for.
    usage        (session, kind, model, tier) -> summed token buckets of the provider's own
                 `usage` (kind `agent`, `summarizer`, or `estimate`: what the agent's turns would
                 have been billed unrewritten); the usage ledger
    ledger       session -> its turn counters (turns, rewritten, tokens not sent, estimates
                 skipped) and the few live entries of its estimate's prompt-cache model; its
                 plan when a subscription pays for it (`claude-subscription`, `chatgpt`; NULL:
                 billed by the token) and the plan's rate-limit readings (JSON, no credential)
    facts        a message's raw-bytes digest -> what `cg.state.facts` knows of it (canonical
                 digest, tokens, tool output tokens, breakpoint flags), so the first turn after a
                 restart reads its token counts instead of tokenising the transcript again
    meta/cg_keys k -> v: the tenant fingerprint key (`cg.state.tenant`), made once
    cg_claims    (PostgreSQL) conversation -> which instance may summarize it, until when
"""

from __future__ import annotations

# A checkpoint is keyed by conversation, `session#first-message`; its owner is the session.
SQLITE_OWNER = (
    "(CASE WHEN instr(session, '#') > 0 THEN substr(session, 1, instr(session, '#') - 1) "
    "ELSE session END)"
)
PG_OWNER = "split_part(session, '#', 1)"

# -- SQLite ----------------------------------------------------------------------------------

SQLITE_VERSION = 5

SQLITE_V1 = """
CREATE TABLE IF NOT EXISTS stashes (
    key TEXT NOT NULL,
    session TEXT NOT NULL,
    created REAL NOT NULL,
    last_used REAL NOT NULL,
    size INTEGER NOT NULL,
    dialect TEXT NOT NULL,
    count INTEGER NOT NULL,
    span BLOB NOT NULL,
    PRIMARY KEY (key, session)
);
CREATE INDEX IF NOT EXISTS stashes_lru ON stashes (last_used, size);
CREATE INDEX IF NOT EXISTS stashes_session ON stashes (session);
CREATE TABLE IF NOT EXISTS checkpoints (
    session TEXT PRIMARY KEY,
    summary TEXT NOT NULL,
    head_count INTEGER NOT NULL,
    covered_count INTEGER NOT NULL,
    covered_hash TEXT NOT NULL,
    key TEXT,
    message TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    meta TEXT
);
CREATE TABLE IF NOT EXISTS sessions (
    session TEXT PRIMARY KEY,
    last_request REAL NOT NULL,
    cache_ttl REAL
);
"""

SQLITE_V2 = """
CREATE TABLE IF NOT EXISTS usage (
    session TEXT NOT NULL,
    kind TEXT NOT NULL,
    model TEXT NOT NULL,
    tier TEXT NOT NULL,
    input_tokens INTEGER NOT NULL,
    cache_write_tokens INTEGER NOT NULL,
    cache_write_1h_tokens INTEGER NOT NULL,
    cache_read_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    requests INTEGER NOT NULL,
    updated REAL NOT NULL,
    PRIMARY KEY (session, kind, model, tier)
);
CREATE TABLE IF NOT EXISTS ledger (
    session TEXT PRIMARY KEY,
    turns INTEGER NOT NULL,
    rewritten INTEGER NOT NULL,
    tokens_not_sent INTEGER NOT NULL,
    estimate_skipped INTEGER NOT NULL,
    cache_state TEXT,
    last_seen REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS ledger_seen ON ledger (last_seen);
"""
SQLITE_V3 = """
CREATE TABLE IF NOT EXISTS facts (
    raw BLOB PRIMARY KEY,
    digest BLOB NOT NULL,
    tokens INTEGER NOT NULL,
    outputs TEXT NOT NULL,
    flags INTEGER NOT NULL,
    seen REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS facts_seen ON facts (seen);
"""
# v4, the session list's indexes: a page of the ledger in (last_seen, session) order (which
# also serves what `ledger_seen` did: its expiry), and a session's checkpoints by their owner,
# the key's part before `#` (`checkpoints_of`, a page's newest checkpoint and count).
SQLITE_V4_INDEXES = f"""
DROP INDEX IF EXISTS ledger_seen;
CREATE INDEX IF NOT EXISTS ledger_page ON ledger (last_seen, session);
CREATE INDEX IF NOT EXISTS checkpoints_owner ON checkpoints ({SQLITE_OWNER}, updated);
"""
# v4, tenancy: the stashes rebuilt with the tenant in their key (SQLite cannot change a primary
# key in place), rows from before it unbound (`*`); the checkpoints' tenant, the same for old
# rows (the default stays in SQLite's schema; every write names the tenant); the index the
# quota eviction reads (per session and tenant, by last use, with the size: summed without a
# row read), the one that tells a stash a checkpoint names; and the fingerprint key's table.
SQLITE_V4 = (
    """
CREATE TABLE stashes_v4 (
    key TEXT NOT NULL,
    session TEXT NOT NULL,
    tenant TEXT NOT NULL,
    created REAL NOT NULL,
    last_used REAL NOT NULL,
    size INTEGER NOT NULL,
    dialect TEXT NOT NULL,
    count INTEGER NOT NULL,
    span BLOB NOT NULL,
    PRIMARY KEY (key, session, tenant)
);
INSERT INTO stashes_v4 (key, session, tenant, created, last_used, size, dialect, count, span)
    SELECT key, session, '*', created, last_used, size, dialect, count, span FROM stashes;
DROP TABLE stashes;
ALTER TABLE stashes_v4 RENAME TO stashes;
CREATE INDEX stashes_lru ON stashes (last_used, size);
CREATE INDEX stashes_session ON stashes (session, tenant, last_used, size);
ALTER TABLE checkpoints ADD COLUMN tenant TEXT NOT NULL DEFAULT '*';
CREATE INDEX checkpoints_key ON checkpoints (key);
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v BLOB NOT NULL);
"""
    + SQLITE_V4_INDEXES
)
# v5: a subscription session's plan and its rate-limit readings (`cg.billing.plan`); NULL on the
# rows from before, as on every session billed by the token.
SQLITE_V5 = """
ALTER TABLE ledger ADD COLUMN plan TEXT;
ALTER TABLE ledger ADD COLUMN plan_limits TEXT
"""
# schema version reached -> the DDL that takes the file from the one before to it
SQLITE_MIGRATIONS = {1: SQLITE_V1, 2: SQLITE_V2, 3: SQLITE_V3, 4: SQLITE_V4, 5: SQLITE_V5}

# -- PostgreSQL ------------------------------------------------------------------------------

PG_VERSION = 4

PG_V1 = """
CREATE TABLE IF NOT EXISTS cg_stashes (
    key TEXT NOT NULL,
    session TEXT NOT NULL,
    created DOUBLE PRECISION NOT NULL,
    last_used DOUBLE PRECISION NOT NULL,
    size BIGINT NOT NULL,
    dialect TEXT NOT NULL,
    count INTEGER NOT NULL,
    span BYTEA NOT NULL,
    PRIMARY KEY (key, session)
);
CREATE INDEX IF NOT EXISTS cg_stashes_lru ON cg_stashes (last_used, size);
CREATE INDEX IF NOT EXISTS cg_stashes_session ON cg_stashes (session);
CREATE TABLE IF NOT EXISTS cg_checkpoints (
    session TEXT PRIMARY KEY,
    summary TEXT NOT NULL,
    head_count INTEGER NOT NULL,
    covered_count INTEGER NOT NULL,
    covered_hash TEXT NOT NULL,
    key TEXT,
    message TEXT NOT NULL,
    created DOUBLE PRECISION NOT NULL,
    updated DOUBLE PRECISION NOT NULL,
    meta TEXT,
    version BIGINT NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS cg_sessions (
    session TEXT PRIMARY KEY,
    last_request DOUBLE PRECISION NOT NULL,
    cache_ttl DOUBLE PRECISION
);
CREATE TABLE IF NOT EXISTS cg_usage (
    session TEXT NOT NULL,
    kind TEXT NOT NULL,
    model TEXT NOT NULL,
    tier TEXT NOT NULL,
    input_tokens BIGINT NOT NULL,
    cache_write_tokens BIGINT NOT NULL,
    cache_write_1h_tokens BIGINT NOT NULL,
    cache_read_tokens BIGINT NOT NULL,
    output_tokens BIGINT NOT NULL,
    requests BIGINT NOT NULL,
    updated DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (session, kind, model, tier)
);
CREATE TABLE IF NOT EXISTS cg_ledger (
    session TEXT PRIMARY KEY,
    turns BIGINT NOT NULL,
    rewritten BIGINT NOT NULL,
    tokens_not_sent BIGINT NOT NULL,
    estimate_skipped BIGINT NOT NULL,
    cache_state TEXT,
    last_seen DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS cg_ledger_seen ON cg_ledger (last_seen);
CREATE TABLE IF NOT EXISTS cg_claims (
    conversation TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    claimed DOUBLE PRECISION NOT NULL,
    lease_until DOUBLE PRECISION NOT NULL
)
"""
# v2: what `cg.state.facts` knows of a message (its token counts), by the digest of its raw
# bytes, so the first turn after a restart (or on an instance new to the session) reads them
# instead of tokenising ~1 MB; a cache: expired by the TTL, capped at a quarter of `max_mb`.
PG_V2 = """
CREATE TABLE IF NOT EXISTS cg_facts (
    raw BYTEA PRIMARY KEY,
    digest BYTEA NOT NULL,
    tokens BIGINT NOT NULL,
    outputs TEXT NOT NULL,
    flags INTEGER NOT NULL,
    seen DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS cg_facts_seen ON cg_facts (seen)
"""
# v3, the session list's indexes (as SQLite's v4): a page of the ledger in (last_seen, session)
# order, which also serves the ledger's expiry (`cg_ledger_seen` did), and a session's
# checkpoints by their owner. On exactly the owner expression: a range on the key (`'A#'` to
# `'A$'`) is not index-served under a collation other than C.
PG_V3_INDEXES = f"""
DROP INDEX IF EXISTS cg_ledger_seen;
CREATE INDEX IF NOT EXISTS cg_ledger_page ON cg_ledger (last_seen, session);
CREATE INDEX IF NOT EXISTS cg_checkpoints_owner ON cg_checkpoints (({PG_OWNER}), updated)
"""
# v3, tenancy (`cg.state.tenant`): the tenant that wrote each stash and checkpoint, `*`
# (unbound) on the rows from before; the stashes keyed by it too (two tenants stashing one span
# in one session get a row each); the quota eviction's index (per session and tenant, by last
# use), the one that tells a stash a checkpoint names, and the fingerprint key every instance
# shares. The defaults fill the old rows and go: every write names its tenant.
PG_V3 = (
    """
ALTER TABLE cg_stashes ADD COLUMN tenant TEXT NOT NULL DEFAULT '*';
ALTER TABLE cg_stashes ALTER COLUMN tenant DROP DEFAULT;
ALTER TABLE cg_stashes DROP CONSTRAINT cg_stashes_pkey;
ALTER TABLE cg_stashes ADD PRIMARY KEY (key, session, tenant);
DROP INDEX IF EXISTS cg_stashes_session;
CREATE INDEX cg_stashes_session ON cg_stashes (session, tenant, last_used, size);
ALTER TABLE cg_checkpoints ADD COLUMN tenant TEXT NOT NULL DEFAULT '*';
ALTER TABLE cg_checkpoints ALTER COLUMN tenant DROP DEFAULT;
CREATE INDEX cg_checkpoints_key ON cg_checkpoints (key);
CREATE TABLE cg_keys (k TEXT PRIMARY KEY, v BYTEA NOT NULL);
"""
    + PG_V3_INDEXES
)
# v4, as SQLite's v5: a subscription session's plan and its rate-limit readings.
PG_V4 = """
ALTER TABLE cg_ledger ADD COLUMN plan TEXT;
ALTER TABLE cg_ledger ADD COLUMN plan_limits TEXT
"""
# schema version reached -> the DDL that takes the database from the one before to it
PG_MIGRATIONS = {1: PG_V1, 2: PG_V2, 3: PG_V3, 4: PG_V4}
