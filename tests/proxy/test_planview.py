"""The dashboard labels subscription sessions (cg.proxy.planview): a listed session's plan,
and a paragraph per plan saying what its dollars are, with its rate-limit share an ESTIMATE."""

from __future__ import annotations

from typing import Any

from cg.billing.plan import DOLLARS, HOW
from cg.proxy.dashboard import render

PLANS = {
    "chatgpt": {
        "sessions": 1,
        "turns": 9,
        "rewritten_turns": 4,
        "tokens_not_sent": 12345,
        "dollars": DOLLARS,
        "rate_limits": {
            "estimate": True,
            "how": HOW,
            "windows": {"primary": {"used_percent": 12.0, "not_spent_percent": 3.5}},
        },
    }
}
SESSIONS: list[dict[str, Any]] = [
    {"id": "codex-1", "plan": "chatgpt", "dollars": DOLLARS, "savings": {}},
    {"id": "api-1", "plan": None, "savings": {}},
]


def test_a_subscription_sessions_dollars_and_rate_limit_share_are_labelled():
    page = render({"ledger": {"plans": PLANS}, "savings": {}}, SESSIONS, {}, now=0.0)
    assert "On a subscription" in page and 'data-plan="chatgpt"' in page
    assert "API-list-price equivalents" in page and "12,345" in page
    assert "primary window: 12.00 points used" in page
    assert "ESTIMATE</span> 3.50 points" in page and "presumed spent in proportion" in page
    row = page[page.index('data-session="codex-1"') :]
    assert row.index('<span class="plan"') < row.index("</td>")
    api = page[page.index('data-session="api-1"') :]
    assert 'class="plan"' not in api[: api.index("</tr>")]


def test_a_page_without_subscription_sessions_says_nothing_of_plans():
    page = render({"savings": {}}, [{"id": "api-1", "plan": None, "savings": {}}], {}, now=0.0)
    assert "On a subscription" not in page and 'class="plan"' not in page
