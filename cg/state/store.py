"""SQLite stashes, checkpoints and session clocks (SPEC §6, §7): one file, WAL, bounded.

Tables (schema version in `PRAGMA user_version`):

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
                 have been billed unrewritten); the usage ledger of SPEC §11 (v2)
    ledger       session -> its turn counters (turns, rewritten, tokens not sent, estimates
                 skipped) and the few live entries of its estimate's prompt-cache model (v2)
    facts        a message's raw-bytes digest -> what `cg.state.facts` knows of it (canonical
                 digest, tokens, tool output tokens, breakpoint flags), so the first turn after a
                 restart reads its token counts instead of tokenising ~1 MB again (v3); ~100
                 bytes a message, expired by the store TTL after it was first seen and capped
                 at a quarter of `max_mb` (oldest first)
    meta         k -> v: the tenant fingerprint key (`cg.state.tenant`), made once (v4)

Tenancy (v4, `cg.state.tenant`): a stash or checkpoint records the tenant (the keyed fingerprint
of the credential) that wrote it, and a read that names a tenant gets only that tenant's rows
and those written before v4 (tenant `*`, unbound: readable by their session as before).

Migrations: v1 (stashes, checkpoints, sessions) -> v2 adds `usage` and `ledger` -> v3 adds
`facts` -> v4 rebuilds `stashes` with the tenant in its key (old rows `*`), adds the tenant to
`checkpoints` (old rows `*`) and `meta`, and the session list's indexes (`ledger_page`,
`checkpoints_owner`); each step runs in one transaction, so a killed migration leaves the file
as it was.

The session list (`/_cg/sessions`, the dashboard) is read a page at a time, by key: the page
from `ledger_page` (a session is listed once an answer or a summarizer call of it was booked,
most recently booked first), then each listed session's newest checkpoint and count, its usage
rows and ledger row by index. Those reads, and the ledger's totals, run in the addon's worker
thread on a connection of their own (`_view`), so they never hold the lock every turn takes.

Safe under concurrent processes (WAL, `busy_timeout`, every write one `BEGIN IMMEDIATE`
transaction) and a killed process (a transaction is all or nothing). Bounded by a TTL on
`last_used` and a total stash size, evicted by quota (`_quotas`: the tenants over their fair share
of it first, and within a tenant the sessions over theirs, each session's least recently used
stashes first and those a checkpoint names last); eviction runs on open and
opportunistically after writes, at most once per `evict_interval` seconds. Session clocks expire by
the same TTL, and a checkpoint with its session (reading a checkpoint marks its stash used).
The file is held to `max_mb` (see `STASH_SHARE`; a day-long soak with a 32 MB cap peaked at
28.3 MB, docs/benchmarks.md): stashes get half of it, evicted as soon as a write takes them past
it (and kept to less between evictions when the rest of the file needs the room), the facts
cache a quarter (trimmed as it fills), and the WAL is checkpointed at half its eighth and cut
back after each eviction, which deletes its stashes half a WAL share at a time. What is not
evicted by size (checkpoints, session clocks, the ledger: bounded by the TTL and 30 days) is the
one thing that can still outgrow a cap too small for the sessions it serves.
Ledger rows are a few hundred bytes per session and what `/_cg/sessions` reports, so they live
`LEDGER_TTL_DAYS` (30) days after their session's last answer, or the store TTL if that is longer;
the prompt-cache state a row keeps while its session is live (~2 KB) is cleared two hours after
its last answer, when every entry in it has expired.

Credentials never reach this module: its API takes only session ids (allow-listed, `cg.state.session`),
tenants (fingerprints, `cg.state.tenant`), message text, summaries and times, never headers, API
keys or model settings.

Errors: every failure is a `StoreError` (a `RuntimeError`) saying what failed and on which file.
The last one is kept in `error` (`error_at`, monotonic) until an operation succeeds, so the caller
can tell a store that is failing now (locked, read-only, full) from one that failed once.
`file_problem()` notices a file deleted or replaced under the open connection, and
`restore_file()` writes the open database back to its path (nothing stashed is lost with it).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVarTuple

from cg.settings import StoreConfig
from cg.state.pending import CacheState, HeldWrites
from cg.state.tenant import ANONYMOUS, UNBOUND, new_key, readable
from cg.wire.jsonspan import JsonSpanError, walk_array
from cg.wire.usage import Usage

Ts = TypeVarTuple("Ts")  # a held write's arguments, typed against its method

SCHEMA_VERSION = 4
LEDGER_TTL_DAYS = 30.0
# A ledger row's prompt-cache state outlives its last turn by twice the longest cache TTL (1 h):
# by then every entry has expired. Cleared at most this many rows per eviction.
CACHE_STATE_LIFE = 2 * 3600.0
CACHE_STATE_CLEARED = 256
USAGE_KINDS = ("agent", "summarizer", "estimate")
TOUCH_INTERVAL = 60.0  # seconds between `last_used` updates of a live checkpoint's stash
TOUCHED_MAX = 20_000  # stashes whose last refresh a process remembers (then it forgets all)
READS_MAX = 4096  # checkpoints and stash presences remembered between writes (then all go)
# How long a `PRAGMA data_version` answer stands: a reuse turn reads its checkpoint and its
# stash's presence (twice) within a millisecond, and each asked it again (~17 us each under
# load). Another process's commit is then seen at most this late, as if it came that much later.
READS_FRESH_S = 0.002
_UNREAD = object()
# A checkpoint is keyed by conversation, `session#first-message`; its owner is the session.
_OWNER_SQL = (
    "(CASE WHEN instr(session, '#') > 0 THEN substr(session, 1, instr(session, '#') - 1) "
    "ELSE session END)"
)


def owner(checkpoint_key: str) -> str:
    """The session that owns a checkpoint key (`session#conversation` or a plain session)."""
    return checkpoint_key.split("#", 1)[0]


def is_url(target: str) -> bool:
    """Whether `target` (option `cg_db`, `store.url`) names a PostgreSQL database."""
    return target.startswith(("postgresql://", "postgres://"))


MEMORY = ":memory:"
KEY_PATTERN = r"[0-9a-f]{24}"
KEY_RE = re.compile(rf"\A{KEY_PATTERN}\Z")
DEFAULT_BUSY_TIMEOUT_MS = 5000
DEFAULT_EVICT_INTERVAL = 60.0
_DEFAULTS = StoreConfig()

_SCHEMA = """
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

_SCHEMA_V2 = """
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
_SCHEMA_V3 = """
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
_SCHEMA_V4_INDEXES = f"""
DROP INDEX IF EXISTS ledger_seen;
CREATE INDEX IF NOT EXISTS ledger_page ON ledger (last_seen, session);
CREATE INDEX IF NOT EXISTS checkpoints_owner ON checkpoints ({_OWNER_SQL}, updated);
"""
# v4, tenancy: the stashes rebuilt with the tenant in their key (SQLite cannot change a primary
# key in place), rows from before it unbound (`*`); the checkpoints' tenant, the same for old
# rows (the default stays in SQLite's schema; every write names the tenant); the index the
# quota eviction reads (per session and tenant, by last use, with the size: summed without a
# row read), the one that tells a stash a checkpoint names; and the fingerprint key's table.
_SCHEMA_V4 = (
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
    + _SCHEMA_V4_INDEXES
)
# schema version reached -> the DDL that takes the file from the one before to it
_MIGRATIONS = {1: _SCHEMA, 2: _SCHEMA_V2, 3: _SCHEMA_V3, 4: _SCHEMA_V4}
TENANT_KEY = "tenant_key"  # its row in `meta`
FACTS_BATCH = 500  # raw digests per SELECT (well under SQLite's bound on parameters)
# (raw digest, canonical digest, tokens, tool output tokens, flags: 1 breakpoint, 2 ttl 1h)
FactRow = tuple[bytes, bytes, int, tuple[int, ...], int]
_USAGE_COLS = (
    "input_tokens, cache_write_tokens, cache_write_1h_tokens, cache_read_tokens, "
    "output_tokens, requests"
)
_USAGE_UPSERT = (
    f"INSERT INTO usage (session, kind, model, tier, {_USAGE_COLS}, updated) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (session, kind, model, tier) DO UPDATE SET "
    "input_tokens = input_tokens + excluded.input_tokens, "
    "cache_write_tokens = cache_write_tokens + excluded.cache_write_tokens, "
    "cache_write_1h_tokens = cache_write_1h_tokens + excluded.cache_write_1h_tokens, "
    "cache_read_tokens = cache_read_tokens + excluded.cache_read_tokens, "
    "output_tokens = output_tokens + excluded.output_tokens, "
    "requests = requests + excluded.requests, updated = excluded.updated"
)
_LEDGER_UPSERT = (
    "INSERT INTO ledger (session, turns, rewritten, tokens_not_sent, estimate_skipped, "
    "cache_state, last_seen) VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (session) DO UPDATE SET turns = turns + excluded.turns, "
    "rewritten = rewritten + excluded.rewritten, "
    "tokens_not_sent = tokens_not_sent + excluded.tokens_not_sent, "
    "estimate_skipped = estimate_skipped + excluded.estimate_skipped, "
    "cache_state = COALESCE(excluded.cache_state, cache_state), "
    "last_seen = excluded.last_seen"
)
_CLOCK_UPSERT = (
    "INSERT OR REPLACE INTO sessions (session, last_request, cache_ttl) VALUES (?, ?, ?)"
)
HELD_ROWS_MAX = 50_000  # rows held while the store refuses writes (then they are dropped)


def _fact_params(rows: Sequence[FactRow], seen: float) -> list[tuple[Any, ...]]:
    """`put_facts` rows as stored (tool output tokens joined by `,`), first seen at `seen`."""
    return [(r, d, n, ",".join(map(str, o)), f, seen) for r, d, n, o, f in rows]


def _fact_row(raw: Any, digest: Any, tokens: Any, outputs: str, flags: Any) -> FactRow:
    """A stored facts row as `get_facts` returns it (either engine's column types)."""
    key = bytes(raw)
    outs = tuple(int(x) for x in outputs.split(",") if x)
    return (key, bytes(digest), int(tokens), outs, int(flags))


# `put_facts` trims the facts cache once it is this many rows over its cap (a delete of that
# many random keys writes about as many pages to the WAL: 256 KiB).
FACTS_TRIM = 64


def _facts_cap(max_bytes: int) -> int:
    """Rows the facts cache keeps: a quarter of `max_bytes` at ~100 bytes a row with its index
    (facts are a cache: a lost row is a recount), at least 1000."""
    return max(1000, max_bytes // 400)


# How `max_mb` is shared, so that the file holds to it (not only the stashes): the stashes get
# half, the facts cache a quarter (`_facts_cap`), and the rest is for checkpoints, sessions, the
# ledger, pages freed by eviction and not yet reused, and the WAL (`journal_size_limit`, an
# eighth). Stashes over their half are evicted least recently used first, down to 90% of it, so
# that one eviction makes room for several stashes rather than one; and further when the rest
# of the file leaves them less room (`evict`).
STASH_SHARE = 0.5
STASH_MAX = 8 * 1024 * 1024  # bytes of one stash, at most (`max_stash_bytes`)
EVICT_TO = 0.9
ROOM_SHARE = 0.9  # of what the database may take: what is live in it, at most
WAL_SHARE = 0.125
SHM_BYTES = 32 * 1024  # the WAL's index file
ROOM_MIN_BYTES = 1024 * 1024  # below it the schema alone is a tenth of the cap: not held on disk


def _stash_limits(max_bytes: int) -> tuple[int, int]:
    """(budget, target): stashes over `budget` bytes are evicted down to `target`."""
    budget = int(max_bytes * STASH_SHARE)
    return budget, int(budget * EVICT_TO)


StashRow = tuple[str, str, str, int]  # key, session, tenant, size
Group = tuple[str, str]  # (tenant, session): the stashes one quota holds


def _fair_level(sizes: Iterable[int], room: int) -> int:
    """The max-min fair share of `room` among holders of `sizes` bytes: the largest level L
    with sum(min(size, L)) <= room. A holder under L keeps everything, and what it leaves
    unused is shared by the others (an equal split would cut a large session that nobody else
    crowds)."""
    ordered = sorted(sizes)
    left = room
    for i, size in enumerate(ordered):
        share = left // (len(ordered) - i)
        if size > share:
            return share
        left -= size
    return ordered[-1] if ordered else room


def _quotas(usage: dict[Group, int], target: int) -> dict[Group, int]:
    """The cap of each (tenant, session) over its quota when `usage` must come down to
    `target` bytes: the tenants share `target` fairly (`_fair_level`), then each tenant over
    its share shares that among its sessions the same way. The caps sum to at most `target`,
    so cutting every group to its cap is enough, and a group within its cap loses nothing:
    one session's flood (or one credential's flood of sessions) evicts only its own stashes."""
    sessions: dict[str, dict[str, int]] = {}
    for (tenant, session), n in usage.items():
        sessions.setdefault(tenant, {})[session] = n
    totals = {t: sum(by.values()) for t, by in sessions.items()}
    level = _fair_level(totals.values(), target)
    caps: dict[Group, int] = {}
    for tenant, by in sessions.items():
        if totals[tenant] <= level:
            continue
        inner = _fair_level(by.values(), level)
        caps.update({(tenant, s): inner for s, n in by.items() if n > inner})
    return caps


# A stash that may go: (whether a checkpoint names it, last used, key, session, tenant, size).
Candidate = tuple[bool, float, str, str, str, int]


def _excess(
    rows: Iterable[tuple[str, Any, Any, Any]], over: int
) -> list[tuple[bool, float, str, int]]:
    """The stashes of one group over its quota that take it back within it, from `rows` (key,
    size, whether a checkpoint names it, last used) least recently used first: the unnamed ones
    first, then the named (a checkpoint's stash goes last: its marker is live). `rows` is read
    no further than that (a cursor stops there). As (named, last used, key, size)."""
    out: list[tuple[bool, float, str, int]] = []
    named: list[tuple[bool, float, str, int]] = []
    for key, size, is_named, used in rows:
        if over <= 0:
            break
        if is_named:
            named.append((True, float(used), key, int(size)))
            continue
        out.append((False, float(used), key, int(size)))
        over -= int(size)
    for c in named:
        if over <= 0:
            break
        out.append(c)
        over -= c[3]
    return out


def _take(candidates: list[Candidate], total: int, target: int) -> tuple[list[StashRow], int]:
    """The candidates that go, unnamed before named and least recently used first across the
    groups, until `total` bytes are within `target`; and the total left. Every group's excess
    together always gets there; a stash is whole, so cutting each group all the way to its
    share could drop more than the bound needs (two sessions of one stash each, over a budget
    that holds one, would lose both)."""
    victims: list[StashRow] = []
    for _, _, key, session, tenant, size in sorted(candidates):
        if total <= target:
            break
        victims.append((key, session, tenant, size))
        total -= size
    return victims, total


def _chunks(victims: list[StashRow], limit: int) -> list[list[tuple[str, str, str]]]:
    """The `(key, session, tenant)` of `victims` in runs of at most `limit` bytes of stash
    each (one victim at least)."""
    out: list[list[tuple[str, str, str]]] = []
    acc = 0
    for key, session, tenant, n in victims:
        if not out or acc + n > limit:
            out.append([])
            acc = 0
        out[-1].append((key, session, tenant))
        acc += n
    return out


def _stash_filter(
    key: str, session: str | None, tenant: str | None, mark: str = "?"
) -> tuple[str, tuple[str, ...]]:
    """The WHERE clause (and its arguments) of the stashes `key` resolves to: every row of it,
    its session's (`session`), and of those the ones `tenant` may read (its own, and unbound
    ones: `cg.state.tenant.readable`). `mark` is the engine's placeholder."""
    sql = f"key = {mark}"
    args: tuple[str, ...] = (key,)
    if session is not None:
        sql += f" AND session = {mark}"
        args += (session,)
    if tenant is not None:
        sql += f" AND tenant IN ({mark}, '{UNBOUND}')"
        args += (tenant,)
    return sql, args


class StoreError(RuntimeError):
    """The store cannot be opened or an operation on it failed."""


class StoreClaimed(StoreError):
    """Another process holds this SQLite file (`claim_file`): one file serves one proxy."""


def claim_file(path: str) -> int | None:
    """Hold `path` + `.lock` exclusively while this process lives (the kernel lets go when it
    ends, `kill -9` included): two proxies on one SQLite file would each summarize the same
    conversations and splice different summaries into one session. Returns the descriptor
    that holds it (None where `fcntl` does not exist). Raises StoreClaimed naming the holder."""
    try:
        import fcntl
    except ImportError:  # (not POSIX: no claim)
        return None
    lock = path + ".lock"
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise StoreError(f"cannot claim the store {path}: {lock}: {e.strerror or e}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise StoreClaimed(
            f"the store {path} is in use by another context-guru process (pid {holder}): one "
            "SQLite file serves one proxy, or both would summarize the same sessions; give "
            "this one its own cg_db, or share a PostgreSQL store (store.url) between them"
        ) from None
    except OSError as e:
        os.close(fd)
        raise StoreError(f"cannot claim the store {path}: {e.strerror or e}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode("ascii"), 0)
    return fd


def stash_key(span_sources: Sequence[str]) -> str:
    """A content hash of a span's message sources: 24 lowercase hex digits (`KEY_RE`)."""
    h = hashlib.blake2b(b"cg-stash-v1", digest_size=12)
    for s in span_sources:
        b = s.encode("utf-8", "surrogatepass")
        h.update(len(b).to_bytes(8, "big"))
        h.update(b)
    return h.hexdigest()


def valid_key(s: object) -> bool:
    return isinstance(s, str) and KEY_RE.match(s) is not None


def span_bytes(span_sources: Sequence[str]) -> bytes:
    """The stored form of a span: a JSON array of the messages' exact source text."""
    return ("[" + ",".join(span_sources) + "]").encode("utf-8")


def checked_span(key: str, span_sources: Sequence[str], bound: int) -> bytes:
    """`span_bytes` of a span about to be stashed under `key` (either engine): ValueError for
    a malformed key, or a span over `bound` bytes."""
    if not valid_key(key):
        raise ValueError(f"put_stash: malformed key {key!r}")
    span = span_bytes(span_sources)
    if len(span) > bound:
        raise ValueError(
            f"put_stash: a span of {len(span)} bytes is over the stash bound ({bound})"
        )
    return span


@dataclass(frozen=True, slots=True)
class Stash:
    key: str
    session: str
    created: float
    last_used: float
    size: int
    dialect: str
    count: int
    span: bytes
    tenant: str = ANONYMOUS  # who stashed it (`cg.state.tenant`; `*`: before tenancy)

    @property
    def text(self) -> str:
        return self.span.decode("utf-8")

    def sources(self) -> list[str]:
        """Each stashed message's exact source text, as it was put."""
        text = self.text
        try:
            arr = walk_array(text, 0)
        except JsonSpanError as e:
            raise StoreError(f"stash {self.key}: stored span is not a JSON array: {e}") from None
        return [text[el.start : el.end] for el in arr.elements]

    def messages(self) -> list[Any]:
        """The stashed messages, parsed."""
        value: list[Any] = json.loads(self.span)
        return value


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A session's summary of `messages[head_count:head_count + covered_count]`.

    `covered_hash` identifies the covered prefix, `key` the stash of the replaced span (None when
    nothing was stashed), `message` the exact serialised summary message. `created`/`updated` are
    stamped by `Store.put_checkpoint`; `meta` is free JSON for the caller; `tenant` the tenant
    that wrote it (`cg.state.tenant`; `*`: before tenancy), who alone reads it back.
    """

    session: str
    summary: str
    head_count: int
    covered_count: int
    covered_hash: str
    key: str | None
    message: str
    created: float = 0.0
    updated: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict, hash=False)
    tenant: str = ANONYMOUS


@dataclass(frozen=True, slots=True)
class SessionRecord:
    session: str
    last_request: float
    cache_ttl: float | None


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """One line of the CLI's session listing; `last_seen` is the latest of its request clock,
    checkpoint, stashes and ledger."""

    session: str
    last_request: float | None
    cache_ttl: float | None
    checkpoint_updated: float | None
    covered_count: int | None
    stashes: int
    stash_bytes: int
    last_seen: float | None = None


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One ledger row: what `session` was billed (or, kind `estimate`, would have been) by
    `model`, in price tier `tier` (`""` or `long`)."""

    session: str
    kind: str
    model: str
    tier: str
    usage: Usage


@dataclass(frozen=True, slots=True)
class LedgerTurns:
    """A session's turn counters: answers recorded, turns sent rewritten, our token count of
    what the rewrites left out, and rewritten turns whose estimate could not be made."""

    turns: int = 0
    rewritten: int = 0
    tokens_not_sent: int = 0
    estimate_skipped: int = 0
    last_seen: float = 0.0


# A page of the session list starts after this key: above every (last_seen, session).
PAGE_START = (float("inf"), "")
PageKey = tuple[float, str]  # (last_seen, session): where a page of the session list ends


@dataclass(frozen=True, slots=True)
class SessionDetail:
    """What the session list shows of one session, each part read by key: its ledger row
    (zeros when it has none), its newest checkpoint and how many of its conversations have one,
    and its usage rows."""

    session: str
    turns: LedgerTurns
    checkpoint: Checkpoint | None
    conversations: int
    usage: tuple[UsageRow, ...]

    @property
    def key(self) -> PageKey:
        """Where a page that ends with this session ends (the next page starts after it)."""
        return (self.turns.last_seen, self.session)


@dataclass(frozen=True, slots=True)
class EvictResult:
    expired_stashes: int = 0
    lru_stashes: int = 0
    checkpoints: int = 0
    sessions: int = 0

    @property
    def total(self) -> int:
        return self.expired_stashes + self.lru_stashes + self.checkpoints + self.sessions


@dataclass(frozen=True, slots=True)
class StoreStats:
    path: str
    persistent: bool
    journal_mode: str
    stashes: int
    stash_bytes: int
    checkpoints: int
    sessions: int
    file_bytes: int
    ttl_hours: float
    max_mb: float
    evicted: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _stash(row: Sequence[Any], last_used: float | None = None) -> Stash:
    """A `_STASH_COLS` row (marked used at `last_used`, when given)."""
    key, session, created, used, size, dialect, count, span, tenant = row
    used = used if last_used is None else last_used
    return Stash(key, session, created, used, size, dialect, count, bytes(span), tenant)


_STASH_COLS = "key, session, created, last_used, size, dialect, count, span, tenant"
_CP_COLS = (
    "session, summary, head_count, covered_count, covered_hash, key, message, created, "
    "updated, meta, tenant"
)

# The session list's reads (`Store.session_page`): each is served by an index (tests/state/
# test_session_page.py holds every query behind a page to its plan).
_LEDGER_SELECT = (
    "SELECT session, turns, rewritten, tokens_not_sent, estimate_skipped, last_seen FROM ledger"
)
_PAGE_SQL = (
    f"{_LEDGER_SELECT} WHERE (last_seen, session) < (?, ?) "
    "ORDER BY last_seen DESC, session DESC LIMIT ?"
)
_USAGE_SELECT = f"SELECT session, kind, model, tier, {_USAGE_COLS} FROM usage"
_NEWEST_CP_SQL = (
    f"SELECT {_CP_COLS} FROM checkpoints WHERE {_OWNER_SQL} = ? ORDER BY updated DESC LIMIT 1"
)
_COUNT_CP_SQL = f"SELECT COUNT(*) FROM checkpoints WHERE {_OWNER_SQL} = ?"
_SUMS = ", ".join(f"COALESCE(SUM({c.strip()}), 0)" for c in _USAGE_COLS.split(","))
_USAGE_TOTALS_SQL = f"SELECT kind, model, tier, {_SUMS} FROM usage GROUP BY kind, model, tier"
_LEDGER_TOTALS_SQL = (
    "SELECT COALESCE(SUM(turns), 0), COALESCE(SUM(rewritten), 0), "
    "COALESCE(SUM(tokens_not_sent), 0), COALESCE(SUM(estimate_skipped), 0), "
    "COALESCE(MAX(last_seen), 0) FROM ledger"
)
PAGE_BATCH = 500  # ids per `IN (…)` of a page's lookups (far under SQLite's bound on parameters)


def _batches(ids: Sequence[str]) -> Iterator[list[str]]:
    for i in range(0, len(ids), PAGE_BATCH):
        yield list(ids[i : i + PAGE_BATCH])


def _checkpoint(row: Sequence[Any]) -> Checkpoint:
    session, summary, head, covered, chash, key, message, created, updated, meta, tenant = row
    return Checkpoint(
        session, summary, head, covered, chash, key, message, created, updated,
        json.loads(meta) if meta else {}, tenant,
    )  # fmt: skip


def _meta_json(cp: Checkpoint) -> str | None:
    """A checkpoint's `meta` as stored (None when empty)."""
    return json.dumps(cp.meta, ensure_ascii=False, sort_keys=True) if cp.meta else None


def _stamped(cp: Checkpoint, created: float, updated: float) -> Checkpoint:
    """`cp` as `put_checkpoint` returns it: its times stamped, its `meta` a copy."""
    return replace(cp, created=created, updated=updated, meta=dict(cp.meta))


NO_TURNS = LedgerTurns()  # a call that records no turn (made once: `record_usage` is per answer)


def _check_kinds(rows: Sequence[tuple[str, str, str, Usage]]) -> None:
    """`record_usage` refuses a row of a kind the ledger does not know (before writing any)."""
    for row in rows:  # (not `kind, *_`: that builds a list per row)
        if row[0] not in USAGE_KINDS:
            raise ValueError(f"record_usage: unknown kind {row[0]!r}")


def _usage_row(r: Sequence[Any]) -> UsageRow:
    """A `session, kind, model, tier, {_USAGE_COLS}` row (either engine's integer types)."""
    return UsageRow(r[0], r[1], r[2], r[3], Usage(*(int(x) for x in r[4:])))


def _ledger_turns(r: Sequence[Any]) -> LedgerTurns:
    """A `turns, rewritten, tokens_not_sent, estimate_skipped, last_seen` row."""
    return LedgerTurns(int(r[0]), int(r[1]), int(r[2]), int(r[3]), float(r[4]))


class Store:
    """One SQLite file; every method is thread-safe. Use as a context manager or `close()`."""

    def __init__(
        self,
        path: str | os.PathLike[str] = _DEFAULTS.path,
        *,
        ttl_hours: float = _DEFAULTS.ttl_hours,
        max_mb: float = _DEFAULTS.max_mb,
        now: Callable[[], float] = time.time,
        evict_interval: float = DEFAULT_EVICT_INTERVAL,
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        evict: bool = True,
        batch_delay: float = 0.0,
        claim: bool = False,
    ) -> None:
        """`evict=False` opens the file as a reader would: nothing is ever evicted by this
        object (the CLI must not apply its default TTL to a store configured longer).
        `batch_delay`: seconds `record_usage` and `touch_session` may hold their rows to commit
        them together (0: each call commits). `claim`: the proxy's own store, held against a
        second proxy (`claim_file`: StoreClaimed); readers (the CLI) claim nothing."""
        if ttl_hours <= 0 or max_mb <= 0:
            raise ValueError("ttl_hours and max_mb must be positive")
        raw = os.fspath(path)
        self.persistent = raw != MEMORY
        self.path = str(Path(raw).expanduser()) if self.persistent else MEMORY
        self.ttl = ttl_hours * 3600.0
        self.max_bytes = int(max_mb * 1024 * 1024)
        self.now = now
        self.evict_interval = evict_interval if evict else float("inf")
        self.evicted = 0
        self._last_evict = float("-inf")
        self._evicts = evict
        # Stash bytes as the last eviction left them, plus what this process stashed since: past
        # the budget, the next write evicts without waiting for `evict_interval` (other processes
        # on the file count their own, and each evicts on its interval anyway).
        self._stash_bytes = 0
        self._stashed = 0
        self._db_at_evict = 0  # the database file's bytes when the last eviction ended
        self._facts_rows: int | None = None  # rows in `facts`, as this process counts them
        # What the stashes may hold until the next eviction: their share of `max_bytes`, or
        # less when the rest of the file needs the room (`evict`).
        self._stash_budget = _stash_limits(self.max_bytes)[0]
        # (stash key, owner, tenant) -> when this process last refreshed its `last_used`
        self._touched: dict[tuple[str, str, str], float] = {}
        # What a reuse turn reads every time (its checkpoint, whether its stash is there), as
        # last read: valid while no other connection has committed (`PRAGMA data_version`)
        # and this store has not written a checkpoint or a stash since (`_forget_reads`).
        self._reads: dict[tuple[str | None, ...], Any] = {}
        self._reads_version: int | None = None
        self.reads_fresh_s = READS_FRESH_S
        self._reads_asked = float("-inf")  # `_reads_clock()` when data_version was last read
        self._reads_clock: Callable[[], float] = time.monotonic
        self._lock = threading.Lock()
        self.batch_delay = batch_delay
        self._batch = HeldWrites()  # bookings and clocks not yet committed (`batch_delay`)
        self._batch_since = 0.0  # `_clock()` when the first of them was booked
        self._clock: Callable[[], float] = time.monotonic  # the window's clock (tests set it)
        self.error: str | None = None  # the last operation's error, until one succeeds
        self.error_at = 0.0  # time.monotonic() of that error
        self._conn: sqlite3.Connection | None = None
        self.tenant_key = b""  # the fingerprint key (`cg.state.tenant`), read by `_open`
        # The control answers' own connection (`_view`): a file's is opened with the store.
        self._view_conn: sqlite3.Connection | None = None
        self._view_lock = threading.Lock()
        self._claim: int | None = None
        if claim and self.persistent:
            Path(self.path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._claim = claim_file(self.path)
        try:
            self._conn = self._open(busy_timeout_ms)
        except BaseException:
            self._unclaim()
            raise
        self._busy_ms = busy_timeout_ms
        self._inode = self._stat()
        self.journal_mode: str = self._conn.execute("PRAGMA journal_mode").fetchone()[0]
        if self.persistent:
            # Opened with the store, not by the first control answer: no request opens a file.
            try:
                self._view_conn = self._open_view()
            except sqlite3.Error as e:
                self.close()
                raise StoreError(f"cannot open the store {self.path}: {e}") from None
        if evict:
            try:
                self.evict()
            except StoreError:
                self.close()
                raise

    @classmethod
    def from_config(
        cls,
        cfg: StoreConfig,
        path: str | None = None,
        now: Callable[[], float] = time.time,
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
    ) -> Store:
        """The store of a config's `store:` block; `path` (option `cg_db`) overrides its path."""
        return cls(
            path or cfg.path,
            ttl_hours=cfg.ttl_hours,
            max_mb=cfg.max_mb,
            now=now,
            busy_timeout_ms=busy_timeout_ms,
        )

    @classmethod
    def open(
        cls,
        cfg: StoreConfig,
        target: str | None = None,
        now: Callable[[], float] = time.time,
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        claim: bool = False,
    ) -> Store:
        """The configured store, whichever the engine: `target` (option `cg_db`), else
        `store.url`, else `store.path`. A `postgresql://` URL opens the shared PostgreSQL store
        (`cg.state.pgstore`, imported only then, so the SQLite default never loads psycopg);
        anything else is an SQLite file, held against another proxy with `claim` (PostgreSQL
        is shared by design: its claims are per conversation)."""
        where = target or cfg.url or cfg.path
        if is_url(where):
            from cg.state.pgstore import PgStore

            return PgStore(
                where, ttl_hours=cfg.ttl_hours, max_mb=cfg.max_mb, now=now,
                lease_seconds=cfg.lease_seconds,
            )  # fmt: skip
        return cls(
            where,
            ttl_hours=cfg.ttl_hours,
            max_mb=cfg.max_mb,
            now=now,
            busy_timeout_ms=busy_timeout_ms,
            claim=claim,
        )

    @classmethod
    def memory(cls, now: Callable[[], float] = time.time) -> Store:
        """A store that does not persist (`persistent` is False): for tests and degraded runs."""
        return cls(MEMORY, now=now)

    # -- opening ----------------------------------------------------------------------------

    def _open(self, busy_timeout_ms: int) -> sqlite3.Connection:
        where = self.path
        if self.persistent:
            p = Path(self.path)
            try:
                p.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                if not p.exists():
                    # The store holds transcripts: readable by its owner only.
                    os.close(os.open(p, os.O_RDWR | os.O_CREAT, 0o600))
            except OSError as e:
                raise StoreError(
                    f"cannot create the store {where}: {e.strerror or e}; set cg_db to a "
                    "writable path"
                ) from None
        try:
            conn = sqlite3.connect(
                self.path, timeout=busy_timeout_ms / 1000, isolation_level=None,
                check_same_thread=False,
            )  # fmt: skip
        except sqlite3.Error as e:
            raise StoreError(f"cannot open the store {where}: {e}") from None
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            if self.persistent:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise StoreError(f"cannot open the store {where}: WAL mode refused ({mode})")
                conn.execute("PRAGMA synchronous = NORMAL")
                self._wal_pragmas(conn)
            conn.execute("PRAGMA foreign_keys = OFF")
            self._migrate(conn)
            self.tenant_key = self._load_tenant_key(conn)
        except sqlite3.Error as e:
            conn.close()
            raise StoreError(f"cannot open the store {where}: {e}") from None
        except StoreError:
            conn.close()
            raise
        return conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        """Bring the file to SCHEMA_VERSION, one version per transaction (so two processes
        opening an old file at once migrate it once: the second sees the new version)."""
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"the store {self.path} has schema version {version}, newer than this "
                f"context-guru understands ({SCHEMA_VERSION}); use a newer context-guru or "
                "another cg_db"
            )
        while version < SCHEMA_VERSION:
            conn.execute("BEGIN IMMEDIATE")
            try:
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                if version < SCHEMA_VERSION:
                    version += 1
                    for stmt in _MIGRATIONS[version].split(";"):
                        if stmt.strip():
                            conn.execute(stmt)
                    conn.execute(f"PRAGMA user_version = {version}")
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def _load_tenant_key(self, conn: sqlite3.Connection) -> bytes:
        """The file's fingerprint key, made the first time (`INSERT OR IGNORE`: two processes
        opening a new file at once keep the first one's). Read without a write when it is
        there: a read-only file with one opens."""
        row = conn.execute("SELECT v FROM meta WHERE k = ?", (TENANT_KEY,)).fetchone()
        if row is None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(
                    "INSERT OR IGNORE INTO meta (k, v) VALUES (?, ?)", (TENANT_KEY, new_key())
                )
                row = conn.execute("SELECT v FROM meta WHERE k = ?", (TENANT_KEY,)).fetchone()
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        return bytes(row[0])

    # -- plumbing ---------------------------------------------------------------------------

    @contextmanager
    def _op(self, what: str) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._conn is None:
                raise StoreError(f"{what}: the store {self.path} is closed")
            try:
                yield self._conn
            except sqlite3.Error as e:
                self.error = f"{what} on {self.path}: {e}"
                self.error_at = time.monotonic()
                raise StoreError(self.error) from None

    @contextmanager
    def _view(self, what: str) -> Iterator[sqlite3.Connection]:
        """The connection the control answers read on (the session list, the ledger's
        totals): its own, used from the addon's worker thread, so a page read never holds the
        lock every turn's store call takes; WAL lets it read while the other one writes. It
        only reads (`query_only`), and never creates the file (`mode=rw`). What this process
        holds back (`batch_delay`) is committed first. An in-memory store, or a file no longer
        the one opened, is read on the main connection."""
        self._flushed()
        if not self.persistent or self.file_problem() is not None:
            with self._op(what) as conn:
                yield conn
            return
        with self._view_lock:
            if self._conn is None:
                raise StoreError(f"{what}: the store {self.path} is closed")
            try:
                if self._view_conn is None:
                    self._view_conn = self._open_view()
                yield self._view_conn
            except sqlite3.Error as e:
                self.error = f"{what} on {self.path}: {e}"
                self.error_at = time.monotonic()
                raise StoreError(self.error) from None

    def _open_view(self) -> sqlite3.Connection:
        uri = "file:" + urllib.parse.quote(self.path) + "?mode=rw"
        conn = sqlite3.connect(
            uri, uri=True, timeout=self._busy_ms / 1000, isolation_level=None,
            check_same_thread=False,
        )  # fmt: skip
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_ms)}")
            conn.execute("PRAGMA query_only = ON")
        except sqlite3.Error:
            conn.close()
            raise
        return conn

    def _close_view(self) -> None:
        """Close the control answers' connection (reopened on their next read: after a
        restore, the file written back)."""
        with self._view_lock:
            if self._view_conn is not None:
                with suppress(sqlite3.Error):
                    self._view_conn.close()
                self._view_conn = None

    # -- the file under the connection --------------------------------------------------------

    def _stat(self) -> tuple[int, int] | None:
        if not self.persistent:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_dev, st.st_ino)

    def file_problem(self) -> str | None:
        """Why the open file is no longer the one at `path` (deleted, replaced), or None."""
        if not self.persistent or self._conn is None:
            return None
        now = self._stat()
        if now is None:
            return f"the store {self.path} was deleted while open"
        if now != self._inode:
            return f"the store {self.path} was replaced by another file while open"
        return None

    def restore_file(self) -> None:
        """Write the open database back to `path` (it was deleted or replaced: the open
        connection still holds everything) and carry on there. Raises StoreError."""
        where = self.path
        with self._lock:
            if self._conn is None:
                raise StoreError(f"restore: the store {where} is closed")
            tmp = f"{where}.restore-{os.getpid()}"
            try:
                Path(where).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                for suffix in ("", "-wal", "-shm"):
                    with suppress(FileNotFoundError):
                        os.unlink(tmp + suffix)
                os.close(os.open(tmp, os.O_RDWR | os.O_CREAT, 0o600))
                dst = sqlite3.connect(tmp, isolation_level=None)
                try:
                    self._conn.backup(dst)
                    dst.execute("PRAGMA journal_mode = WAL")
                finally:
                    dst.close()
                if self._stat() is not None and self._stat() != self._inode:
                    # Another file took the path: leave it, keep ours beside it.
                    raise StoreError(
                        f"the store {where} was replaced by another file; the open store was "
                        f"saved as {tmp}"
                    )
                os.replace(tmp, where)
                conn = sqlite3.connect(
                    where, timeout=self._busy_ms / 1000, isolation_level=None,
                    check_same_thread=False,
                )  # fmt: skip
                conn.execute(f"PRAGMA busy_timeout = {int(self._busy_ms)}")
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = NORMAL")
                self._wal_pragmas(conn)
            except (OSError, sqlite3.Error) as e:
                self.error = f"cannot restore the store {where}: {e}"
                self.error_at = time.monotonic()
                raise StoreError(self.error) from None
            old, self._conn = self._conn, conn
            # Another connection: its data_version starts afresh, asked before the next read.
            self._forget_reads()
            self._reads_version, self._reads_asked = None, float("-inf")
            old.close()
            self._inode = self._stat()
            self.error = None
        self._close_view()  # it held the file that was replaced or deleted

    @contextmanager
    def _tx(self, what: str) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken up front so concurrent writers queue, never deadlock."""
        with self._op(what) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            self.error = None  # a write went through: whatever failed before is over

    def probe(self) -> None:
        """One small write (the schema version, rewritten as it is), to learn whether writes
        go through again after `error`. Raises StoreError."""
        with self._tx("probe") as conn:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            conn.execute(f"PRAGMA user_version = {version}")

    # -- what several instances share (the PostgreSQL store); one process needs none of it ----

    async def claim(self, conversation: str, based_on: str | None) -> bool:
        """Take the right to summarize `conversation`. One SQLite file serves one proxy, whose
        own in-flight set already keeps one summary per conversation: always True here. The
        PostgreSQL store claims it in the database (`cg.state.pgstore`)."""
        return True

    def release(self, conversation: str) -> None:
        """Give up a claim taken by `claim` (nothing to do for SQLite)."""

    async def settle(self) -> None:
        """Wait until this process's writes are committed where other instances see them
        (SQLite writes synchronously: nothing to wait for)."""

    def describe(self) -> dict[str, Any]:
        """What `/_cg/health` shows of the engine (never a credential)."""
        return {"engine": "sqlite", "path": self.path}

    def _wal_limit(self) -> int:
        """What the WAL is truncated to after a checkpoint (it otherwise keeps its high-water
        mark: 43 MB in a 115,200-request soak with `max_mb` 32)."""
        return max(64 * 1024, int(self.max_bytes * WAL_SHARE))

    def _wal_pragmas(self, conn: sqlite3.Connection) -> None:
        """The WAL within its share: checkpointed once it holds half of it (SQLite's default is
        1000 pages, 4 MB, whatever the cap; the other half is for the transaction that crosses
        the mark) and truncated back to the share afterwards."""
        limit = self._wal_limit()
        page = int(conn.execute("PRAGMA page_size").fetchone()[0]) or 4096
        conn.execute(f"PRAGMA journal_size_limit = {limit}")
        conn.execute(f"PRAGMA wal_autocheckpoint = {min(1000, max(16, limit // 2 // page))}")

    def _checkpoint(self) -> None:
        """Copy the WAL into the database and cut it back to nothing (best effort: a reader in
        another process can hold it; the next checkpoint then does it)."""
        if self.persistent:
            with suppress(StoreError), self._op("checkpoint") as conn:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def _db_bytes(self) -> int:
        """The database file on disk, now (one `stat` call; 0 when not a file). Its WAL is held
        by its own pragmas; counted here, its refilling after each truncation set off
        evictions that found nothing to do."""
        if not self.persistent:
            return 0
        try:
            return os.path.getsize(self.path)
        except OSError:
            return 0

    def _maybe_evict(self) -> None:
        if not self._evicts:
            return
        over = self._stash_bytes + self._stashed > self._stash_budget
        # The rest of the file grew (checkpoints, the ledger, facts): the stashes' room is
        # measured again once the database has grown by a fiftieth of the cap.
        grown = self._db_bytes() > self._db_at_evict + self.max_bytes // 50
        if over or grown or self.now() - self._last_evict >= self.evict_interval:
            self.evict()

    def close(self) -> None:
        if self._conn is not None:
            self._flushed()
        with self._lock:
            if self._conn is not None:
                with suppress(sqlite3.Error):
                    self._conn.execute("PRAGMA optimize")
                self._conn.close()
                self._conn = None
        self._close_view()  # after: a read under way finishes first, none starts after
        self._unclaim()

    def _unclaim(self) -> None:
        """Let go of the file (`claim_file`): another proxy may open it now."""
        fd, self._claim = getattr(self, "_claim", None), None
        if fd is not None:
            with suppress(OSError):
                os.close(fd)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- stashes ----------------------------------------------------------------------------

    @property
    def max_stash_bytes(self) -> int:
        """The largest span one stash may hold: a quarter of the stashes' share of `max_mb`,
        so that one summary never evicts most of what every other session stashed, and at
        most STASH_MAX (a 1M-token window's transcript is ~4 MB)."""
        return min(_stash_limits(self.max_bytes)[0] // 4, STASH_MAX)

    def put_stash(
        self,
        key: str,
        session: str,
        span_sources: Sequence[str],
        dialect: str,
        tenant: str = ANONYMOUS,
    ) -> None:
        """Stash a span under `key` for `session` and `tenant`; putting it again only refreshes
        `last_used`. A span over `max_stash_bytes` is refused (ValueError)."""
        span = checked_span(key, span_sources, self.max_stash_bytes)
        t = self.now()
        self._forget_reads()
        with self._tx("put_stash") as conn:
            conn.execute(
                f"INSERT INTO stashes ({_STASH_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (key, session, tenant) DO UPDATE SET last_used = excluded.last_used",
                (key, session, t, t, len(span), dialect, len(span_sources), span, tenant),
            )
        self._stashed += len(span)
        self._maybe_evict()

    def get_stash(
        self, key: str, session: str | None = None, tenant: str | None = None
    ) -> Stash | None:
        """The stash under `key` (owned by `session`, and readable by `tenant`, when given: the
        tenant's own before an unbound one), marked used; None if absent. A store that cannot
        be written (full, read-only, locked) still reads it back: marking it used is best
        effort."""
        if not valid_key(key):
            return None
        t = self.now()
        where, args = _stash_filter(key, session, tenant)
        order = "tenant = '*', last_used DESC" if tenant is not None else "last_used DESC"
        with self._op("get_stash") as conn:
            row = conn.execute(
                f"SELECT {_STASH_COLS} FROM stashes WHERE {where} ORDER BY {order} LIMIT 1", args
            ).fetchone()
        if row is None:
            return None
        with suppress(StoreError), self._tx("get_stash: mark used") as conn:
            conn.execute(
                "UPDATE stashes SET last_used = ? WHERE key = ? AND session = ? AND tenant = ?",
                (t, row[0], row[1], row[8]),
            )
        return _stash(row, t)

    def has_stash(self, key: str, session: str | None = None, tenant: str | None = None) -> bool:
        """Whether `key` resolves (for `session`, and `tenant`, when given); does not mark it
        used."""
        if not valid_key(key):
            return False
        with self._op("has_stash") as conn:
            reads = self._current_reads(conn)
            known = reads.get(("stash", key, session, tenant), _UNREAD)
            if known is _UNREAD:
                where, args = _stash_filter(key, session, tenant)
                row = conn.execute(f"SELECT 1 FROM stashes WHERE {where} LIMIT 1", args).fetchone()
                known = reads[("stash", key, session, tenant)] = row is not None
        return bool(known)

    def _current_reads(self, conn: sqlite3.Connection) -> dict[tuple[str | None, ...], Any]:
        """The remembered reads, emptied first if another connection committed since (or
        there are too many). One `PRAGMA data_version` against a query and a row decoded, and
        that asked at most once every `reads_fresh_s` (the reads of one turn ask it once)."""
        t = self._reads_clock()
        if t - self._reads_asked >= self.reads_fresh_s:
            version = conn.execute("PRAGMA data_version").fetchone()[0]
            self._reads_asked = t
            if version != self._reads_version:
                self._reads.clear()
                self._reads_version = version
        if len(self._reads) >= READS_MAX:
            self._reads.clear()
        return self._reads

    def _forget_reads(self) -> None:
        """This store wrote a checkpoint or a stash (its own commits leave `data_version` as
        it was): what it remembered reading may be stale."""
        self._reads.clear()

    def delete_stash(self, key: str, session: str | None = None) -> int:
        self._forget_reads()
        with self._tx("delete_stash") as conn:
            if session is None:
                cur = conn.execute("DELETE FROM stashes WHERE key = ?", (key,))
            else:
                cur = conn.execute(
                    "DELETE FROM stashes WHERE key = ? AND session = ?", (key, session)
                )
        return cur.rowcount

    # -- per-message facts --------------------------------------------------------------------

    def get_facts(self, raws: Sequence[bytes]) -> dict[bytes, FactRow]:
        """The stored facts of the messages whose raw digests are `raws` (those known)."""
        out: dict[bytes, FactRow] = {}
        with self._op("get_facts") as conn:
            for i in range(0, len(raws), FACTS_BATCH):
                part = list(raws[i : i + FACTS_BATCH])
                marks = ",".join("?" * len(part))
                for raw, digest, tokens, outputs, flags in conn.execute(
                    f"SELECT raw, digest, tokens, outputs, flags FROM facts WHERE raw IN ({marks})",
                    part,
                ):
                    out[raw] = _fact_row(raw, digest, tokens, outputs, flags)
        return out

    def put_facts(self, rows: Sequence[FactRow]) -> None:
        """Remember messages' facts (a message already known keeps its row)."""
        if not rows:
            return
        t = self.now()
        with self._tx("put_facts") as conn:
            cur = conn.executemany(
                "INSERT OR IGNORE INTO facts (raw, digest, tokens, outputs, flags, seen) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                _fact_params(rows, t),
            )
            if self._facts_rows is None:
                self._facts_rows = int(conn.execute("SELECT COUNT(*) FROM facts").fetchone()[0])
            else:
                self._facts_rows += max(cur.rowcount, 0)
            # The cache's cap, kept as it fills: the oldest rows go a few at a time. Their keys
            # are random, so each deleted row rewrites a page of its own; the whole overflow
            # of a minute deleted at once (as `evict` did) put megabytes into the WAL at once.
            over = self._facts_rows - _facts_cap(self.max_bytes)
            if over >= FACTS_TRIM:
                gone = conn.execute(
                    "DELETE FROM facts WHERE raw IN (SELECT raw FROM facts ORDER BY seen LIMIT ?)",
                    (over,),
                ).rowcount
                self._facts_rows -= max(gone, 0)
        self._maybe_evict()

    # -- checkpoints ------------------------------------------------------------------------

    def put_checkpoint(self, cp: Checkpoint) -> Checkpoint:
        """Create or replace the session's checkpoint; returns it with its times stamped.

        `created` is kept from the checkpoint being replaced; `updated` is now.
        """
        t = self.now()
        meta = _meta_json(cp)
        self._forget_reads()
        with self._tx("put_checkpoint") as conn:
            row = conn.execute(
                "SELECT created FROM checkpoints WHERE session = ?", (cp.session,)
            ).fetchone()
            created = row[0] if row else t
            conn.execute(
                f"INSERT OR REPLACE INTO checkpoints ({_CP_COLS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    cp.session, cp.summary, cp.head_count, cp.covered_count, cp.covered_hash,
                    cp.key, cp.message, created, t, meta, cp.tenant,
                ),
            )  # fmt: skip
        self._maybe_evict()
        return _stamped(cp, created, t)

    def get_checkpoint(self, session: str, tenant: str | None = None) -> Checkpoint | None:
        """The conversation's checkpoint (`session`: its key), when `tenant` (if given) may
        read it. Reading it marks its stash used, so a live checkpoint's marker keeps resolving
        while older stashes are evicted first."""
        t = self.now()
        with self._op("get_checkpoint") as conn:
            reads = self._current_reads(conn)
            known = reads.get(("checkpoint", session), _UNREAD)
            if known is _UNREAD:
                row = conn.execute(
                    f"SELECT {_CP_COLS} FROM checkpoints WHERE session = ?", (session,)
                ).fetchone()
                known = reads[("checkpoint", session)] = None if row is None else _checkpoint(row)
        if known is None:
            return None
        cp: Checkpoint = known
        if tenant is not None and not readable(cp.tenant, tenant):
            return None
        k = (cp.key or "", owner(session), cp.tenant)
        # At most once a minute (the row holds the blob, and SQLite rewrites it whole), and only
        # then a write transaction: a reuse turn within the minute reads without the write lock.
        # Asked once a minute whether or not it was due: a stash written less than a minute
        # ago was asked again on every turn until it was (a write transaction each).
        if cp.key is not None and t - self._touched.get(k, float("-inf")) >= TOUCH_INTERVAL:
            with self._tx("get_checkpoint") as conn:
                conn.execute(
                    "UPDATE stashes SET last_used = ? WHERE key = ? AND session = ? "
                    "AND tenant = ? AND last_used < ?",
                    (t, cp.key, k[1], k[2], t - TOUCH_INTERVAL),
                )
            if len(self._touched) > TOUCHED_MAX:
                self._touched.clear()
            self._touched[k] = t
        return cp

    def conversation_checkpoints(self, base: str) -> list[Checkpoint]:
        """Every tenant's checkpoint of one conversation: `base` is its key without a tenant
        (`session#first`), the others `base@TENANT`. No tenant is checked here: the caller
        reads only one whose request holds every message its summary was made from (the
        summarize component's handover). One index range; remembered as `get_checkpoint` is."""
        with self._op("conversation_checkpoints") as conn:
            reads = self._current_reads(conn)
            known = reads.get(("conversation", base), _UNREAD)
            if known is _UNREAD:
                rows = conn.execute(
                    f"SELECT {_CP_COLS} FROM checkpoints WHERE session = ? "
                    "OR (session >= ? AND session < ?)",
                    (base, base + "@", base + "A"),  # ('A' follows '@')
                ).fetchall()
                known = reads[("conversation", base)] = [_checkpoint(r) for r in rows]
        return list(known)

    def checkpoints_of(self, session: str) -> list[Checkpoint]:
        """Every conversation's checkpoint under `session` (keys `session` or `session#…`)."""
        with self._op("checkpoints_of") as conn:
            rows = conn.execute(
                f"SELECT {_CP_COLS} FROM checkpoints WHERE {_OWNER_SQL} = ? ORDER BY updated",
                (session,),
            ).fetchall()
        return [_checkpoint(r) for r in rows]

    def delete_checkpoint(self, session: str) -> bool:
        self._forget_reads()
        with self._tx("delete_checkpoint") as conn:
            cur = conn.execute("DELETE FROM checkpoints WHERE session = ?", (session,))
        return cur.rowcount > 0

    # -- sessions ---------------------------------------------------------------------------

    def touch_session(
        self, session: str, now: float | None = None, cache_ttl: float | None = None
    ) -> SessionRecord | None:
        """Record a request of `session` at `now`; returns the record it replaces (None when the
        session is seen for the first time), so the caller can judge the cache state. With
        `batch_delay` > 0 the clock is held and committed with the ledger's bookings (every
        read of it here sees the held one)."""
        t = self.now() if now is None else now
        if self.batch_delay <= 0:
            with self._tx("touch_session") as conn:
                row = conn.execute(
                    "SELECT last_request, cache_ttl FROM sessions WHERE session = ?", (session,)
                ).fetchone()
                conn.execute(_CLOCK_UPSERT, (session, t, cache_ttl))
            return SessionRecord(session, row[0], row[1]) if row else None
        prev = self.get_session(session)
        self._hold(HeldWrites.clock, session, t, cache_ttl)
        return prev

    def get_session(self, session: str) -> SessionRecord | None:
        held = self._batch.clocks.get(session)
        if held is not None:
            return SessionRecord(session, held[0], held[1])
        with self._op("get_session") as conn:
            row = conn.execute(
                "SELECT last_request, cache_ttl FROM sessions WHERE session = ?", (session,)
            ).fetchone()
        return SessionRecord(session, row[0], row[1]) if row else None

    def last_request(self, session: str) -> float | None:
        rec = self.get_session(session)
        return rec.last_request if rec else None

    def sessions(self) -> list[SessionInfo]:
        """Every session the store knows of, most recently seen first: the CLI's full read
        (offline; the whole of four tables, where the control answers read pages by key:
        `session_page`). A session's conversations (checkpoint keys `session#…`) are one
        session; its newest checkpoint is the one reported, found by `checkpoints_owner`
        (`+ids.session`: without affinity, as the index's expression, or no index serves the
        comparison and each session scans every checkpoint)."""
        self._flushed()
        with self._op("sessions") as conn:
            rows = conn.execute(
                f"""
                WITH ids AS (
                    SELECT session FROM sessions
                    UNION SELECT {_OWNER_SQL} FROM checkpoints
                    UNION SELECT session FROM stashes
                    UNION SELECT session FROM ledger
                ), st AS (
                    SELECT session, COUNT(*) AS n, SUM(size) AS bytes, MAX(last_used) AS used
                    FROM stashes GROUP BY session
                ), one AS (
                    SELECT ids.session, s.last_request, s.cache_ttl,
                           (SELECT rowid FROM checkpoints WHERE {_OWNER_SQL} = +ids.session
                            ORDER BY updated DESC LIMIT 1) AS newest,
                           COALESCE(st.n, 0) AS n, COALESCE(st.bytes, 0) AS bytes, st.used,
                           l.last_seen
                    FROM ids
                    LEFT JOIN sessions s ON s.session = ids.session
                    LEFT JOIN st ON st.session = ids.session
                    LEFT JOIN ledger l ON l.session = ids.session
                )
                SELECT one.session, one.last_request, one.cache_ttl, c.updated, c.covered_count,
                       one.n, one.bytes,
                       MAX(COALESCE(one.last_request, 0), COALESCE(c.updated, 0),
                           COALESCE(one.used, 0), COALESCE(one.last_seen, 0)) AS seen
                FROM one LEFT JOIN checkpoints c ON c.rowid = one.newest
                ORDER BY seen DESC, one.session
                """
            ).fetchall()
        return [
            SessionInfo(r[0], r[1], r[2], r[3], r[4], r[5], r[6], last_seen=r[7] or None)
            for r in rows
        ]

    # -- the session list, a page at a time (the control answers; `_view`) ------------------

    def session_page(self, limit: int, after: PageKey | None = None) -> list[SessionDetail]:
        """Up to `limit` sessions of the ledger, most recently booked first (`last_seen`, then
        the id, both descending), from just after `after` (the `key` of the previous page's
        last one). Keyset, not an offset: a session booked again while someone pages moves to
        the top, and no other one is skipped or shown twice for it."""
        with self._view("session_page") as conn:
            rows = conn.execute(_PAGE_SQL, (*(after or PAGE_START), limit)).fetchall()
            return self._details(conn, [(r[0], _ledger_turns(r[1:])) for r in rows])

    def session_details(self, sessions: Sequence[str]) -> list[SessionDetail]:
        """The same for the sessions named, in that order (one with no ledger row has zero
        counters)."""
        with self._view("session_details") as conn:
            turns: dict[str, LedgerTurns] = {}
            for part in _batches(sessions):
                marks = ",".join("?" * len(part))
                for r in conn.execute(f"{_LEDGER_SELECT} WHERE session IN ({marks})", part):
                    turns[r[0]] = _ledger_turns(r[1:])
            return self._details(conn, [(s, turns.get(s, NO_TURNS)) for s in sessions])

    def _details(
        self, conn: sqlite3.Connection, listed: list[tuple[str, LedgerTurns]]
    ) -> list[SessionDetail]:
        """Each listed session's newest checkpoint, count and usage rows, all by index (the
        owner index of `checkpoints`, the primary key of `usage`)."""
        usage: dict[str, list[UsageRow]] = {}
        for part in _batches([s for s, _ in listed]):
            marks = ",".join("?" * len(part))
            for r in conn.execute(f"{_USAGE_SELECT} WHERE session IN ({marks})", part):
                usage.setdefault(r[0], []).append(_usage_row(r))
        out: list[SessionDetail] = []
        for session, turns in listed:
            row = conn.execute(_NEWEST_CP_SQL, (session,)).fetchone()
            n = 0 if row is None else conn.execute(_COUNT_CP_SQL, (session,)).fetchone()[0]
            cp = None if row is None else _checkpoint(row)
            out.append(SessionDetail(session, turns, cp, int(n), tuple(usage.get(session, ()))))
        return out

    def usage_totals(self) -> list[UsageRow]:
        """The whole ledger's usage summed in the database, one row per (kind, model, tier)
        (session ""): what `/_cg/stats` prices."""
        with self._view("usage_totals") as conn:
            rows = conn.execute(_USAGE_TOTALS_SQL).fetchall()
        return [_usage_row(("", *r)) for r in rows]

    def ledger_totals(self) -> LedgerTurns:
        """Every session's turn counters summed in the database (`last_seen` the latest)."""
        with self._view("ledger_totals") as conn:
            row = conn.execute(_LEDGER_TOTALS_SQL).fetchone()
        return _ledger_turns(row)

    # -- the usage ledger --------------------------------------------------------------------

    def record_usage(
        self,
        session: str,
        rows: Sequence[tuple[str, str, str, Usage]],
        turns: LedgerTurns | None = None,
        cache_state: CacheState | None = None,
    ) -> None:
        """Add `(kind, model, tier, usage)` rows to `session`'s ledger, and `turns` to its
        counters (`cache_state`, when given, replaces the stored one: JSON, or a callable that
        writes it when committed), all in one transaction.

        With `batch_delay` > 0 the rows are held (`cg.state.pending`) and committed with every
        other turn booked within that many seconds, by the first call after it has passed or by
        `flush_held` (the addon's timer, any read of the ledger, `close`). A crash loses at most
        that window of bookings; a failed commit keeps them held for the next (StoreError is
        raised all the same, for the caller to count)."""
        _check_kinds(rows)
        d = turns or NO_TURNS
        counts = (d.turns, d.rewritten, d.tokens_not_sent, d.estimate_skipped)
        self._hold(HeldWrites.add, session, rows, counts, cache_state, self.now())

    def _hold(self, write: Callable[[HeldWrites, *Ts], None], *args: *Ts) -> None:
        """Add a write (`write(batch, *args)`, a `HeldWrites` method: no closure made per
        booking) to the held batch; commit the batch once its window has passed (at once
        without a `batch_delay`)."""
        with self._lock:
            if not self._batch:
                self._batch_since = self._clock()
            write(self._batch, *args)
            due = self._clock() - self._batch_since >= self.batch_delay
        if due:
            self._commit_held()
            self._maybe_evict()

    def held(self) -> bool:
        """Whether ledger rows or session clocks wait for `flush_held`."""
        return bool(self._batch)

    def flush_held(self) -> None:
        """Commit the ledger rows and session clocks held (`batch_delay`). Raises StoreError
        (they stay held). No eviction follows: a commission's request hook calls this, and the
        next write due evicts as ever."""
        if self._batch:
            self._commit_held()

    def _commit_held(self) -> None:
        taken: HeldWrites | None = None
        try:
            with self._tx("commit held writes") as conn:
                taken, self._batch = self._batch, HeldWrites()  # under the lock `_tx` holds
                conn.executemany(_USAGE_UPSERT, taken.usage_params())
                conn.executemany(_LEDGER_UPSERT, taken.ledger_params())
                conn.executemany(_CLOCK_UPSERT, taken.clock_params())
        except StoreError:
            if taken is not None:
                with self._lock:
                    taken.absorb(self._batch)
                    # A store that keeps failing must not hold an unbounded batch.
                    self._batch = taken if len(taken) <= HELD_ROWS_MAX else HeldWrites()
            raise

    def _flushed(self) -> None:
        """Before a read of the ledger or the sessions table: what this process booked is in it
        (a store that cannot take the write is read as it stands)."""
        if self._batch:
            with suppress(StoreError):
                self._commit_held()

    def usage_rows(self, session: str | None = None) -> list[UsageRow]:
        """The ledger's rows (one session's, when given), in a stable order."""
        sql = f"SELECT session, kind, model, tier, {_USAGE_COLS} FROM usage"
        args: tuple[str, ...] = ()
        if session is not None:
            sql += " WHERE session = ?"
            args = (session,)
        self._flushed()
        with self._op("usage_rows") as conn:
            rows = conn.execute(sql + " ORDER BY session, kind, model, tier", args).fetchall()
        return [_usage_row(r) for r in rows]

    def ledger_turns(self, session: str | None = None) -> dict[str, LedgerTurns]:
        """Each session's turn counters (one session's, when given)."""
        sql = (
            "SELECT session, turns, rewritten, tokens_not_sent, estimate_skipped, last_seen "
            "FROM ledger"
        )
        args: tuple[str, ...] = ()
        if session is not None:
            sql += " WHERE session = ?"
            args = (session,)
        self._flushed()
        with self._op("ledger_turns") as conn:
            rows = conn.execute(sql, args).fetchall()
        return {r[0]: _ledger_turns(r[1:]) for r in rows}

    def cache_state(self, session: str) -> str | None:
        """The estimate's prompt-cache entries last stored for `session` (JSON), or None."""
        held = self._batch.cache_state(session)
        if held is not None:
            return held
        with self._op("cache_state") as conn:
            row = conn.execute(
                "SELECT cache_state FROM ledger WHERE session = ?", (session,)
            ).fetchone()
        return row[0] if row else None

    # -- bounds -----------------------------------------------------------------------------

    def stats(self) -> StoreStats:
        self._flushed()
        with self._op("stats") as conn:
            n, total = conn.execute(
                "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM stashes"
            ).fetchone()
            cps = conn.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0]
            sess = conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]
        file_bytes = 0
        if self.persistent:
            for suffix in ("", "-wal", "-shm"):
                with suppress(OSError):
                    file_bytes += os.path.getsize(self.path + suffix)
        return StoreStats(
            self.path, self.persistent, self.journal_mode, n, total, cps, sess, file_bytes,
            self.ttl / 3600.0, self.max_bytes / (1024 * 1024), self.evicted,
        )  # fmt: skip

    def _quota_victims(
        self, conn: sqlite3.Connection, cutoff: float, total: int, target: int
    ) -> tuple[list[StashRow], int]:
        """The live stashes that go to bring their `total` bytes within `target`, by quota
        (`_quotas`, `_take`), and the total left. The sums per session and tenant come from
        the `stashes_session` index alone; rows are read only for the groups over their quota,
        least recently used first, and no further than their excess."""
        usage = {
            (tn, s): int(n)
            for s, tn, n in conn.execute(
                "SELECT session, tenant, SUM(size) FROM stashes WHERE last_used >= ? "
                "GROUP BY session, tenant",
                (cutoff,),
            )
        }
        candidates: list[Candidate] = []
        for (tenant, session), cap in _quotas(usage, target).items():
            rows = conn.execute(
                "SELECT key, size, EXISTS (SELECT 1 FROM checkpoints c WHERE c.key = s.key), "
                "last_used FROM stashes s WHERE session = ? AND tenant = ? AND last_used >= ? "
                "ORDER BY last_used",
                (session, tenant, cutoff),
            )
            try:  # read only until enough has gone
                excess = _excess(rows, usage[(tenant, session)] - cap)
            finally:
                rows.close()
            candidates += [(nm, u, k, session, tenant, n) for nm, u, k, n in excess]
        return _take(candidates, total, target)

    def evict(self) -> EvictResult:
        """Drop what outlived the TTL, then, over the size cap, the stashes of the sessions
        over their quota (`_quotas`): another session's stashes, within theirs, are not touched.

        Stashes are deleted after the rest, in runs of half a WAL share each, every run after a
        checkpoint that cuts the WAL back to nothing: SQLite as Debian builds it has
        `secure_delete` on, so a deleted stash's bytes are overwritten through the WAL. One
        transaction for all of it, on top of the WAL the writes before had left, took the files
        12% over `max_mb` in a day-long soak."""
        self._flushed()  # a session's held clock keeps its checkpoint
        self._forget_reads()
        t = self.now()
        cutoff = t - self.ttl
        with self._tx("evict") as conn:
            # A checkpoint lives while its session does, even when it was written long ago.
            cps = conn.execute(
                f"DELETE FROM checkpoints WHERE updated < ? AND {_OWNER_SQL} NOT IN "
                "(SELECT session FROM sessions WHERE last_request >= ?)",
                (cutoff, cutoff),
            ).rowcount
            sess = conn.execute("DELETE FROM sessions WHERE last_request < ?", (cutoff,)).rowcount
            aged = conn.execute("DELETE FROM facts WHERE seen < ?", (cutoff,)).rowcount
            # Facts are a cache: the newest `_facts_cap` rows are kept (`put_facts` trims as
            # it writes; this is for rows other processes wrote, after which exactly the cap is
            # left: this process's count is right again).
            cap = _facts_cap(self.max_bytes)
            over = conn.execute(
                "DELETE FROM facts WHERE raw IN (SELECT raw FROM facts ORDER BY seen DESC "
                "LIMIT -1 OFFSET ?)",
                (cap,),
            ).rowcount
            if over > 0:
                self._facts_rows = cap
            elif self._facts_rows is not None:
                self._facts_rows -= max(aged, 0)
            # The ledger outlives the stashes: it is tiny, and it is the record of what was spent.
            ledger_cutoff = t - max(self.ttl, LEDGER_TTL_DAYS * 86400.0)
            conn.execute(
                "DELETE FROM usage WHERE session NOT IN "
                "(SELECT session FROM ledger WHERE last_seen >= ?)",
                (ledger_cutoff,),
            )
            conn.execute("DELETE FROM ledger WHERE last_seen < ?", (ledger_cutoff,))
            # A session's prompt-cache state (~1.8 KB) is dead once its last turn is older than
            # the longest cache TTL: every entry in it has expired, and a cold cache is what
            # it would load as. Cleared a bounded run at a time (a day-long soak's 2,305
            # sessions kept 4.2 MB of it; all at once would be as many MB of WAL).
            conn.execute(
                "UPDATE ledger SET cache_state = NULL WHERE session IN (SELECT session FROM "
                "ledger WHERE last_seen < ? AND cache_state IS NOT NULL LIMIT ?)",
                (t - CACHE_STATE_LIFE, CACHE_STATE_CLEARED),
            )
            # The sums come from the `stashes_lru` index (last_used, size) alone; rows are read
            # only for the stashes that go. Fetching every stash's row (each on a page of its
            # own, beside its span) took ~17 ms with 6,000 stashes in a full 32 MB store, on
            # the event loop, once a minute with nothing to evict; this takes ~0.6 ms.
            stashed, total = conn.execute(
                "SELECT COALESCE(SUM(size), 0), "
                "COALESCE(SUM(CASE WHEN last_used >= ? THEN size ELSE 0 END), 0) FROM stashes",
                (cutoff,),
            ).fetchone()
            stashed, total = int(stashed), int(total)
            stale: list[StashRow] = [
                (k, s, tn, int(n))
                for k, s, tn, n in conn.execute(
                    "SELECT key, session, tenant, size FROM stashes WHERE last_used < ? "
                    "ORDER BY last_used, created",
                    (cutoff,),
                )
            ]
            budget, target = _stash_limits(self.max_bytes)
            if self.persistent and self.max_bytes >= ROOM_MIN_BYTES:
                # The rest of the file (ledger, checkpoints, facts, sessions) grows with the
                # sessions seen; stashes, the part that can go, make room for it. The database
                # may take the cap less the WAL's share and its 32 KiB index; the stashes get
                # what the rest leaves of 90% of that, until the next eviction measures again
                # (`_stash_budget`). The file grows only when its pages are all in use, so
                # bounding what is live bounds the file. (Evicting only once the file had
                # grown let the stashes refill their whole share each time: the file ratcheted
                # up by a fiftieth of the cap per eviction, to 31 MB of a 32 MB cap.)
                page = conn.execute("PRAGMA page_size").fetchone()[0]
                pages = conn.execute("PRAGMA page_count").fetchone()[0]
                free = conn.execute("PRAGMA freelist_count").fetchone()[0]
                allowed = self.max_bytes - self._wal_limit() - SHM_BYTES
                rest = max(0, (pages - free) * page - stashed)
                room = max(0, int(allowed * ROOM_SHARE) - rest)
                budget = min(budget, room)
                target = min(target, int(budget * EVICT_TO))
            victims: list[StashRow] = []
            if total > budget:
                victims, total = self._quota_victims(conn, cutoff, total, target)
        expired, lru = len(stale), len(victims)
        for chunk in _chunks(stale + victims, self._wal_limit() // 2):
            self._checkpoint()
            with suppress(StoreError), self._tx("evict: stashes") as conn:
                conn.executemany(
                    "DELETE FROM stashes WHERE key = ? AND session = ? AND tenant = ?", chunk
                )
        self._last_evict = t
        self._stash_bytes, self._stashed = int(total), 0
        self._stash_budget = budget
        if lru or expired or cps or sess:
            self._checkpoint()
        self._db_at_evict = self._db_bytes()
        self._forget_reads()  # and after: nothing read between the runs outlives them
        result = EvictResult(expired, lru, cps, sess)
        self.evicted += result.expired_stashes + result.lru_stashes
        return result
