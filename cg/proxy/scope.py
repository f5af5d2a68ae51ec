"""What `/_cg/stats`, `cg.stats` and the dashboard report, on one scope: since this process
started.

The counters (`requests`, `rewritten`, …, `retention`) are this process's, so the usage and
savings beside them are too (`cg.billing.tally`); the store's whole ledger, which outlives
restarts, is under `ledger` (`{"usage", "savings"}`, or `ledger_error` when it could not be
read). `scope` and `started` say so in the JSON itself.
"""

from __future__ import annotations

from typing import Any

from cg.billing.tally import Tally
from cg.proxy.meter import Meter

SCOPE = "since_start"


def stats_doc(counters: dict[str, Any], meter: Meter, tally: Tally) -> dict[str, Any]:
    """The counters, this process's `usage` and `savings`, and the whole ledger's under
    `ledger`. Reads the store (off the event loop where it can be: `meter.report`)."""
    ledger = meter.ledger
    mine: dict[str, Any] = {"usage": None, "savings": None}
    if ledger is not None:
        try:
            mine = tally.report(ledger.prices)
        except Exception as e:  # noqa: BLE001 - a pricing bug must not break /_cg/stats
            mine = {"usage": None, "savings": None, "error": f"{type(e).__name__}: {e}"}
    return {
        **counters,
        "scope": SCOPE,
        "started": round(tally.started, 3),
        **mine,
        "ledger": meter.report(),
    }
