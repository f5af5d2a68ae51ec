"""The dashboard's "all time" row: the store's whole ledger (`/_cg/stats`' `ledger`), shown
apart from the figures since this proxy started (`cg.proxy.scope`), each with its JSON value
in `data-value` under a `ledger.` name, as the other figures."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cg.proxy.dashboard import card, esc, figure, num, share, usd


def section(ledger: Mapping[str, Any] | None) -> str:
    """`<h2>All time</h2>` and its cards, or a line saying the ledger could not be read."""
    ledger = ledger or {}
    head = (
        '<h2 id="all-time">All time (the store\'s ledger, every process)</h2>'
        '<p class="note">Every turn this store has booked, this proxy\'s and those before a '
        "restart (or another proxy's on a shared store).</p>"
    )
    if ledger.get("ledger_error") or not isinstance(ledger.get("savings"), dict):
        why = ledger.get("ledger_error") or "no ledger"
        return f'{head}<p class="note">The ledger could not be read: {esc(why)}</p>'
    sv = ledger["savings"]
    cards = "".join(
        [
            card("turns", figure("ledger.turns", sv.get("turns"), num(sv.get("turns")))),
            card("tokens not sent", figure("ledger.tokens_not_sent", sv.get("tokens_not_sent"), num(sv.get("tokens_not_sent")))),
            card("billed", figure("ledger.billed_usd", sv.get("billed_usd"), usd(sv.get("billed_usd")))),
            card("without the rewrite", figure("ledger.without_rewrite_usd", sv.get("without_rewrite_usd"), usd(sv.get("without_rewrite_usd")), True)),
            card("saved", figure("ledger.saved_usd", sv.get("saved_usd"), usd(sv.get("saved_usd")), True)),
            card("saved share", figure("ledger.saved_share", sv.get("saved_share"), share(sv.get("saved_share")), True)),
        ]
    )  # fmt: skip
    return f"{head}<div class=cards>{cards}</div>"
