"""The session list (`GET /_cg/sessions`, the dashboard, `cg.sessions`, `context-guru sessions`):
sessions with their newest checkpoint, usage and savings, a page at a time.

Which sessions, in which order: those with a ledger row (an answer or a summarizer call of
theirs was booked; rows live `LEDGER_TTL_DAYS` after the last), most recently booked first, by
the ledger's `last_seen` then the id. That order is an index of the store (`ledger_page`), so a
page costs the same at ten sessions or ten thousand: the page from the index, then each listed
session's parts by key (`Store.session_page`).

A page names where the next one starts with `next`, a cursor: the last listed session's
`(last_seen, id)`, opaque to the caller (base64url of a JSON pair). Keyset, not an offset: a
session booked again while someone pages moves to the top of the first page, and nothing else
is skipped or repeated because of it. The CLI, offline, reads everything the store holds
instead (`Store.sessions`: also sessions with no booking yet).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from cg.billing.plan import labelled
from cg.billing.prices import PriceTable
from cg.billing.savings import savings, usage_split
from cg.state import PageKey, SessionDetail, Store

PAGE_DEFAULT = 50  # sessions on a page when `limit` is not given
PAGE_MAX = 500
CURSOR_MAX = 1024  # characters of a cursor read at all (one this module writes is far shorter)


class BadPage(ValueError):
    """A page parameter that cannot be used: `name` is the parameter (`limit`, `cursor`)."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"{name}: {why}")
        self.name = name


def cursor_of(key: PageKey) -> str:
    """The cursor of the page that starts after `key` (a session's `SessionDetail.key`)."""
    raw = json.dumps([key[0], key[1]], ensure_ascii=False, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode("utf-8")).rstrip(b"=").decode("ascii")


def page_key(cursor: str) -> PageKey:
    """The key a cursor names; BadPage("cursor") for anything `cursor_of` did not write."""
    bad = BadPage("cursor", "not a cursor of this list (pass the `next` of a page as it is)")
    if not cursor or len(cursor) > CURSOR_MAX:
        raise bad
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        value = json.loads(raw.decode("utf-8"))
    except (binascii.Error, ValueError, RecursionError):
        raise bad from None
    if not (isinstance(value, list) and len(value) == 2):
        raise bad
    seen, session = value
    if isinstance(seen, bool) or not isinstance(seen, int | float) or not math.isfinite(seen):
        raise bad
    if not isinstance(session, str):
        raise bad
    return (float(seen), session)


def page_limit(text: str | None) -> int:
    """`limit` as given (None: the default); BadPage("limit") unless 1 to PAGE_MAX."""
    if text is None:
        return PAGE_DEFAULT
    t = text.strip()
    if not (t.isascii() and t.isdigit()) or not 1 <= int(t) <= PAGE_MAX:
        raise BadPage("limit", f"an integer from 1 to {PAGE_MAX}, got {text[:32]!r}")
    return int(t)


def entry(
    d: SessionDetail,
    prices: PriceTable,
    count_tokens: Callable[[str], int],
    last_seen: float | None = None,
) -> dict[str, Any]:
    """One session as listed: id, last seen (its ledger's unless given), newest checkpoint
    (messages covered, the summary's tokens by our count), usage split and savings."""
    checkpoint = None
    if d.checkpoint is not None:
        cp = d.checkpoint
        try:
            text = json.loads(cp.message).get("content")
        except (ValueError, AttributeError):
            text = None
        checkpoint = {
            "covered_messages": cp.covered_count,
            "head_messages": cp.head_count,
            "summary_tokens": count_tokens(text if isinstance(text, str) else cp.summary),
            "updated": cp.updated,
            "conversations": d.conversations,
        }
    rows = list(d.usage)
    return {
        "id": d.session,
        "last_seen": last_seen if last_seen is not None else (d.turns.last_seen or None),
        "checkpoint": checkpoint,
        "usage": usage_split(rows),
        "savings": savings(rows, d.turns, prices),
    }


def sessions_page(
    store: Store,
    prices: PriceTable,
    count_tokens: Callable[[str], int],
    limit: int = PAGE_DEFAULT,
    cursor: str | None = None,
) -> dict[str, Any]:
    """`{"sessions": [...], "next": cursor or None}`: the page after `cursor` (the first page
    without one). One session more than asked is read to know whether a next page exists."""
    after = page_key(cursor) if cursor else None
    found = store.session_page(limit + 1, after)
    shown = found[:limit]
    nxt = cursor_of(shown[-1].key) if len(found) > limit else None
    return {"sessions": labelled(store, [entry(d, prices, count_tokens) for d in shown]),
            "next": nxt}  # fmt: skip


def sessions_named(
    store: Store, prices: PriceTable, count_tokens: Callable[[str], int], sessions: Sequence[str]
) -> list[dict[str, Any]]:
    """The sessions named that a page would list (those with a ledger row), in that order: a
    remote caller's own session."""
    details = store.session_details(sessions)
    return labelled(store, [entry(d, prices, count_tokens) for d in details if d.turns.last_seen])
