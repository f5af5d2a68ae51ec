"""The dashboard's part for subscription sessions (`cg.billing.plan`): a session's plan beside
its id, and a paragraph per plan saying what its dollars mean, its savings in tokens and the
share of each rate-limit window not spent, marked ESTIMATE with how it is made. Apart from
`cg.proxy.dashboard` so the page's layout and these labels change independently."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any


def plan_tag(session: Mapping[str, Any]) -> str:
    """The label after a listed session's id: its plan and what its dollars are ("" when it
    is billed by the token)."""
    plan = session.get("plan")
    if not plan:
        return ""
    dollars = html.escape(str(session.get("dollars") or ""))
    return f' <span class="plan" title="dollars: {dollars}">{html.escape(str(plan))}</span>'


def _percent(x: Any) -> str:
    return "unknown" if not isinstance(x, int | float) else f"{x:.2f} points"


def plans_html(plans: Any) -> str:
    """One paragraph per plan (`/_cg/stats`' `plans`); "" without subscription sessions."""
    if not isinstance(plans, dict) or not plans:
        return ""
    out = ["<h2>On a subscription</h2>"]
    for name, p in sorted(plans.items()):
        windows = (p.get("rate_limits") or {}).get("windows") or {}
        how = html.escape(str((p.get("rate_limits") or {}).get("how") or ""))
        limits = "".join(
            f"<li>{html.escape(str(w))} window: {_percent(v.get('used_percent'))} used; not "
            f'spent <span class="est">ESTIMATE</span> {_percent(v.get("not_spent_percent"))}</li>'
            for w, v in sorted(windows.items())
        )
        out.append(
            f'<p class="note" data-plan="{html.escape(str(name))}"><b>{html.escape(str(name))}'
            f"</b>: {int(p.get('sessions') or 0)} sessions, billed by the plan, not by the "
            f"token: their dollars are {html.escape(str(p.get('dollars')))}s. Tokens not sent: "
            f"{int(p.get('tokens_not_sent') or 0):,}.</p>"
            + (f"<ul>{limits}</ul><p class=note>{how}</p>" if limits else "")
        )
    return "".join(out)
