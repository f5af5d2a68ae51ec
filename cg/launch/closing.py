"""The one line said when the session ends: what went through the proxy while the agent ran.

Read from the proxy's `/_cg/stats` before the agent starts and after it exits, and differenced:
the counters are the process's since it started and the savings the whole store's ledger, so a
reused proxy's other traffic before this run, and a started proxy's store's earlier sessions,
are left out. Retention is the mean over this run's rewritten turns (from the counts and means
before and after). The dollars are the ledger's estimate (docs/control.md#what-it-saved); for
a subscription's session (Codex signed in with ChatGPT, Claude Code on OAuth) they are labelled
plan-equivalent.
"""

from __future__ import annotations

from typing import Any


def _num(doc: Any, *path: str) -> float | None:
    for key in path:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(key)
    return doc if isinstance(doc, int | float) and not isinstance(doc, bool) else None


def _delta(before: Any, after: Any, *path: str) -> float | None:
    a, b = _num(after, *path), _num(before, *path)
    if a is None:
        return None
    return a - (b or 0)


def retention(before: Any, after: Any) -> tuple[int, float | None]:
    """(rewritten turns measured in this run, their mean retention)."""
    n_after = _num(after, "retention", "turns") or 0
    n_before = _num(before, "retention", "turns") or 0
    turns = int(n_after - n_before)
    if turns <= 0:
        return 0, None
    m_after = _num(after, "retention", "mean")
    m_before = _num(before, "retention", "mean") or 0.0
    if m_after is None:
        return turns, None
    mean = (m_after * n_after - m_before * n_before) / turns
    return turns, min(1.0, max(0.0, mean))


def _usd(x: float | None) -> str:
    if x is None:
        return "unknown"
    return f"{'-' if x < 0 else ''}${abs(x):,.4f}"


def line(before: Any, after: Any, where: str, plan: bool = False) -> str:
    """`context-guru: N of M turns rewritten, T tokens not sent, retention R, $S saved
    (estimate; $B billed) — WHERE`; `plan`: the session is a subscription's, so the dollars
    are what the tokens would cost at API list prices (docs/behaviour.md)."""
    requests = int(_delta(before, after, "requests") or 0)
    rewritten = int(_delta(before, after, "rewritten") or 0)
    not_sent = _delta(before, after, "savings", "tokens_not_sent")
    if not_sent is None:
        spliced = _delta(before, after, "tokens_before")
        kept = _delta(before, after, "tokens_after")
        not_sent = None if spliced is None or kept is None else spliced - kept
    turns, mean = retention(before, after)
    kept_facts = f"retention {mean * 100:.1f}%" if mean is not None else "retention n/a"
    if turns == 0:
        kept_facts = "retention n/a (no rewritten turn measured)"
    tokens = "unknown" if not_sent is None else f"{int(not_sent):,}"
    saved = _usd(_delta(before, after, "savings", "saved_usd"))
    billed = _usd(_delta(before, after, "savings", "billed_usd"))
    return (
        f"context-guru: {rewritten} of {requests} turns rewritten, {tokens} tokens not sent, "
        f"{kept_facts}, {saved} saved (estimate; {billed} billed)"
        f"{' at API list prices, plan-equivalent' if plan else ''} — {where}"
    )
