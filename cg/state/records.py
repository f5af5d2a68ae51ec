"""What the store holds and answers, as values: the record types both engines return, the
keys and spans they are addressed by, and the errors they raise. No engine is imported here, so
every caller can name these without loading SQLite's or PostgreSQL's code."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from cg.state.tenant import ANONYMOUS
from cg.wire.jsonspan import JsonSpanError, walk_array
from cg.wire.usage import Usage

USAGE_KINDS = ("agent", "summarizer", "estimate")
MEMORY = ":memory:"  # the SQLite target of a store that does not persist
KEY_PATTERN = r"[0-9a-f]{24}"
KEY_RE = re.compile(rf"\A{KEY_PATTERN}\Z")
# (raw digest, canonical digest, tokens, tool output tokens, flags: 1 breakpoint, 2 ttl 1h)
FactRow = tuple[bytes, bytes, int, tuple[int, ...], int]


class StoreError(RuntimeError):
    """The store cannot be opened or an operation on it failed."""


class StoreClaimed(StoreError):
    """Another process holds this SQLite file (`claim_file`): one file serves one proxy."""


def owner(checkpoint_key: str) -> str:
    """The session that owns a checkpoint key (`session#conversation` or a plain session)."""
    return checkpoint_key.split("#", 1)[0]


def is_url(target: str) -> bool:
    """Whether `target` (option `cg_db`, `store.url`) names a PostgreSQL database."""
    return target.startswith(("postgresql://", "postgres://"))


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


NO_TURNS = LedgerTurns()  # a call that records no turn (made once: `record_usage` is per answer)


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


def redact_url(url: str) -> str:
    """The URL with its password (if any) replaced by `***`: what may be shown anywhere."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "postgresql://(unparseable URL)"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))
