"""The ledger priced: `usage` split agent / summarizer, and `savings`
(docs/behaviour.md#usage-cost-and-savings).

    billed_usd            the ledger's agent and summarizer rows priced: what was billed
    without_rewrite_usd   ESTIMATE: the `estimate` rows priced (what the agent's turns would
                          have been billed unrewritten; see docs/control.md "What it saved")
    saved_usd             ESTIMATE: without_rewrite_usd - billed agent - billed summarizer
    saved_share           ESTIMATE: saved_usd / without_rewrite_usd, the share of the
                          would-have-been cost not spent (None where that cost is 0 or unknown)

A model with no price makes every figure it enters `None` (unknown, never zero), and
`unpriced_models` names it. Token figures need no price and are always exact sums.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cg.billing.prices import PriceTable
from cg.state import LedgerTurns, Store, UsageRow
from cg.wire.usage import Usage

ESTIMATED = ("without_rewrite_usd", "saved_usd", "saved_share")
NOTE = (
    "billed_usd prices the provider's own usage; without_rewrite_usd and saved_usd are "
    "ESTIMATES (the original requests priced under a prompt-cache model, scaled to the "
    "provider's token counts); see docs/control.md 'What it saved'"
)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def rows_cost(
    rows: Iterable[UsageRow], prices: PriceTable, unpriced: set[str] | None = None
) -> float | None:
    """The rows priced and summed; None when a model has no price (named in `unpriced`)."""
    total: float | None = 0.0
    for r in rows:
        c = prices.cost(r.model, r.usage, r.tier)
        if c is None:
            if unpriced is not None:
                unpriced.add(r.model)
            total = None
        elif total is not None:
            total += c
    return total


def _sum(rows: Iterable[UsageRow]) -> Usage:
    total = Usage()
    for r in rows:
        total = total + r.usage
    return total


def usage_split(rows: list[UsageRow]) -> dict[str, dict[str, int]]:
    """`{"agent": {5 keys}, "summarizer": {5 keys}}`: exact sums of what providers reported."""
    return {
        kind: _sum(r for r in rows if r.kind == kind).to_json() for kind in ("agent", "summarizer")
    }


def savings(rows: list[UsageRow], turns: LedgerTurns, prices: PriceTable) -> dict[str, Any]:
    """The `savings` object for these ledger rows and turn counters (one session's or all)."""
    unpriced: set[str] = set()
    agent = rows_cost((r for r in rows if r.kind == "agent"), prices, unpriced)
    summ = rows_cost((r for r in rows if r.kind == "summarizer"), prices, unpriced)
    without = rows_cost((r for r in rows if r.kind == "estimate"), prices, unpriced)
    billed = None if agent is None or summ is None else agent + summ
    saved = None if without is None or billed is None else without - billed
    return {
        "tokens_not_sent": turns.tokens_not_sent,
        "turns": turns.turns,
        "rewritten_turns": turns.rewritten,
        "estimate_skipped_turns": turns.estimate_skipped,
        "billed_usd": _round(billed),
        "billed_agent_usd": _round(agent),
        "billed_summarizer_usd": _round(summ),
        "without_rewrite_usd": _round(without),
        "saved_usd": _round(saved),
        "saved_share": saved_share(saved, without),
        "estimated": list(ESTIMATED),
        "unpriced_models": sorted(unpriced),
        "prices_date": prices.date,
        "note": NOTE,
    }


def saved_share(saved: float | None, without: float | None) -> float | None:
    """The share of the would-have-been cost not spent (negative while summaries cost more
    than they saved); None where there is nothing to divide by."""
    if saved is None or not without:
        return None
    return round(saved / without, 4)


def total_turns(turns: Iterable[LedgerTurns]) -> LedgerTurns:
    out = LedgerTurns()
    for t in turns:
        out = LedgerTurns(
            out.turns + t.turns,
            out.rewritten + t.rewritten,
            out.tokens_not_sent + t.tokens_not_sent,
            out.estimate_skipped + t.estimate_skipped,
            max(out.last_seen, t.last_seen),
        )
    return out


def report(store: Store, prices: PriceTable, session: str | None = None) -> dict[str, Any]:
    """`{"usage": {agent, summarizer}, "savings": {…}}` over the store's whole ledger (summed in
    the database: one row per model and tier is priced, not every session's), or one
    session's."""
    if session is None:
        rows = store.usage_totals()
        turns = store.ledger_totals()
    else:
        rows = store.usage_rows(session)
        turns = total_turns(store.ledger_turns(session).values())
    return {"usage": usage_split(rows), "savings": savings(rows, turns, prices)}
