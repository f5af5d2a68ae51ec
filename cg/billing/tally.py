"""What this process booked in the usage ledger since it started, kept in memory.

The ledger in the store outlives the process (docs/control.md "What it saved"), while the
counters of `/_cg/stats` (`requests`, `rewritten`, …) start at zero with it. Read side by side,
"3 requests" would sit beside "$41 saved" of a month's traffic. So `/_cg/stats`, the dashboard
and `stats --proxy` show usage and savings over one scope, this process's bookings (this
tally), and the whole ledger's figures apart, under `ledger`.

The ledger hands every booking it writes to its tally (`add`), on the event loop; `report`
copies and prices it (the dashboard prices in a worker thread: the copy is taken under a lock).
A tally is summed per (kind, model, tier), a few entries whatever the traffic.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from cg.billing.prices import PriceTable
from cg.billing.savings import savings, usage_split
from cg.state import NO_TURNS, LedgerTurns, UsageRow
from cg.wire.usage import Usage

# One booking as the ledger writes it: (kind, model, price tier, usage).
Booking = tuple[str, str, str, Usage]


class Tally:
    """This process's bookings: usage per (kind, model, tier) and the turn counters."""

    def __init__(self, now: float | None = None) -> None:
        self.started = time.time() if now is None else now
        self._usage: dict[tuple[str, str, str], Usage] = {}
        self._turns = NO_TURNS
        self._lock = threading.Lock()

    def add(self, rows: Iterable[Booking], turns: LedgerTurns = NO_TURNS) -> None:
        """One booking of the ledger's: its rows and turn counters (never raises)."""
        with self._lock:
            for kind, model, tier, usage in rows:
                key = (kind, model, tier)
                was = self._usage.get(key)
                self._usage[key] = usage if was is None else was + usage
            if turns is not NO_TURNS:
                t = self._turns
                self._turns = LedgerTurns(
                    t.turns + turns.turns,
                    t.rewritten + turns.rewritten,
                    t.tokens_not_sent + turns.tokens_not_sent,
                    t.estimate_skipped + turns.estimate_skipped,
                )

    def rows(self) -> tuple[list[UsageRow], LedgerTurns]:
        """A copy: the rows (session-less) and the turn counters."""
        with self._lock:
            rows = [UsageRow("", k, m, t, u) for (k, m, t), u in self._usage.items()]
            return rows, self._turns

    def report(self, prices: PriceTable) -> dict[str, Any]:
        """`{"usage": {agent, summarizer}, "savings": {…}}` as the ledger's, over this
        process's bookings."""
        rows, turns = self.rows()
        return {"usage": usage_split(rows), "savings": savings(rows, turns, prices)}
