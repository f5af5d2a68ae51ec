"""How much the store keeps and for how long, as pure functions both engines call: the share of
`max_mb` each part gets, the largest stash, the facts cache's cap, how long the ledger and a
session's prompt-cache state live, and which stashes go when the stashes are over their budget
(max-min fair quotas per tenant, then per session within it). Each engine only reads the sums and
rows these ask for and deletes what they name; tests/state/test_policy.py holds the rules.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

LEDGER_TTL_DAYS = 30.0
# A ledger row's prompt-cache state outlives its last turn by twice the longest cache TTL (1 h):
# by then every entry has expired. Cleared at most this many rows per eviction.
CACHE_STATE_LIFE = 2 * 3600.0
CACHE_STATE_CLEARED = 256
TOUCH_INTERVAL = 60.0  # seconds between `last_used` updates of a live checkpoint's stash
# `put_facts` trims the facts cache once it is this many rows over its cap (a delete of that
# many random keys writes about as many pages to the WAL).
FACTS_TRIM = 64
# How `max_mb` is shared, so that the store holds to it (not only the stashes): the stashes get
# half, the facts cache a quarter (`facts_cap`), and the rest is for checkpoints, sessions, the
# ledger, pages freed by eviction and not yet reused, and (SQLite) the WAL. Stashes over their
# half are evicted least recently used first, down to 90% of it, so that one eviction makes room
# for several stashes rather than one.
STASH_SHARE = 0.5
STASH_MAX = 8 * 1024 * 1024  # bytes of one stash, at most (`max_stash_bytes`)
EVICT_TO = 0.9


def facts_cap(max_bytes: int) -> int:
    """Rows the facts cache keeps: a quarter of `max_bytes` at ~100 bytes a row with its index
    (facts are a cache: a lost row is a recount), at least 1000."""
    return max(1000, max_bytes // 400)


def stash_limits(max_bytes: int) -> tuple[int, int]:
    """(budget, target): stashes over `budget` bytes are evicted down to `target`."""
    budget = int(max_bytes * STASH_SHARE)
    return budget, int(budget * EVICT_TO)


def max_stash_bytes(max_bytes: int) -> int:
    """The largest span one stash may hold: a quarter of the stashes' share of `max_bytes`, so
    that one summary never evicts most of what every other session stashed, and at most
    STASH_MAX (a 1M-token window's transcript is ~4 MB)."""
    return min(stash_limits(max_bytes)[0] // 4, STASH_MAX)


def ledger_cutoff(now: float, ttl: float) -> float:
    """Ledger rows last seen before this go: the ledger outlives the stashes (it is tiny, and it
    is the record of what was spent), by LEDGER_TTL_DAYS or the store TTL if that is longer."""
    return now - max(ttl, LEDGER_TTL_DAYS * 86400.0)


StashRow = tuple[str, str, str, int]  # key, session, tenant, size
Group = tuple[str, str]  # (tenant, session): the stashes one quota holds


def fair_level(sizes: Iterable[int], room: int) -> int:
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


def quotas(usage: dict[Group, int], target: int) -> dict[Group, int]:
    """The cap of each (tenant, session) over its quota when `usage` must come down to
    `target` bytes: the tenants share `target` fairly (`fair_level`), then each tenant over
    its share shares that among its sessions the same way. The caps sum to at most `target`,
    so cutting every group to its cap is enough, and a group within its cap loses nothing:
    one session's flood (or one credential's flood of sessions) evicts only its own stashes."""
    sessions: dict[str, dict[str, int]] = {}
    for (tenant, session), n in usage.items():
        sessions.setdefault(tenant, {})[session] = n
    totals = {t: sum(by.values()) for t, by in sessions.items()}
    level = fair_level(totals.values(), target)
    caps: dict[Group, int] = {}
    for tenant, by in sessions.items():
        if totals[tenant] <= level:
            continue
        inner = fair_level(by.values(), level)
        caps.update({(tenant, s): inner for s, n in by.items() if n > inner})
    return caps


# A stash that may go: (whether a checkpoint names it, last used, key, session, tenant, size).
Candidate = tuple[bool, float, str, str, str, int]


def excess(
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


def take(candidates: list[Candidate], total: int, target: int) -> tuple[list[StashRow], int]:
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


def chunks(victims: list[StashRow], limit: int) -> list[list[tuple[str, str, str]]]:
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


def quota_victims(
    usage: dict[Group, int],
    total: int,
    target: int,
    rows_of: Callable[[str, str], Iterable[tuple[str, Any, Any, Any]]],
) -> tuple[list[StashRow], int]:
    """The stashes that go to bring `total` live bytes within `target`, by quota (`quotas`,
    `take`), and the total left. `usage` holds the live bytes per (tenant, session);
    `rows_of(session, tenant)` reads one group's rows for `excess`, least recently used first,
    and is asked only for the groups over their quota (a cursor it returns is closed after)."""
    candidates: list[Candidate] = []
    for (tenant, session), cap in quotas(usage, target).items():
        rows = rows_of(session, tenant)
        try:  # read only until enough has gone
            out = excess(rows, usage[(tenant, session)] - cap)
        finally:
            close = getattr(rows, "close", None)
            if close is not None:
                close()
        candidates += [(nm, u, k, session, tenant, n) for nm, u, k, n in out]
    return take(candidates, total, target)
