"""Sessions a subscription pays for (docs/control.md "On a subscription"): which plan, and the
share of its rate limits a session's savings left unspent.

A plan pays by the month, not by the token, so a subscription session's dollar figures are
API-list-price equivalents (what the same tokens would cost on an API key), and its savings are
also given in tokens and, where the provider's answers carry rate-limit headers, as the share of
those limits not spent. The plan is told from the turn's credential kind, never from its value:

    claude-subscription   Claude Pro/Max: `authorization: Bearer sk-ant-oat…` (Claude Code's
                          OAuth token) and no `x-api-key`
    chatgpt               Codex signed in with ChatGPT: its own route, `…/backend-api/codex/
                          responses`

Rate-limit readings, per window, as the provider's answers report the share used (0–100):

    ChatGPT      `x-codex-primary-used-percent` (the 5-hour window), `x-codex-secondary-used-
                 percent` (the weekly one); a window's `x-codex-*-reset-at` tells a new window
    Anthropic    `anthropic-ratelimit-unified-5h-utilization`, `…-7d-utilization` (fractions);
                 `…-5h-reset`, `…-7d-reset`

Per session and window the store keeps the first and latest reading and the points spent in
windows already rolled over (JSON in the ledger's `plan_limits`; no header value but these
numbers). The session's use of a window is the rise of its readings. ESTIMATE of the share not
spent: that use times (the tokens the agent's turns would have sent unrewritten - those sent -
the summarizer's own) / (those sent + the summarizer's), i.e. the limits are presumed spent in
proportion to the tokens a session sends; the first reading already includes the first turn.
Nothing here holds a credential: headers are only tested for their kind.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from cg.state import Store, UsageRow
from cg.wire.dialects.responses import CHATGPT_SUFFIX

CLAUDE = "claude-subscription"
CHATGPT = "chatgpt"
DOLLARS = "API-list-price equivalent"
HOW = (
    "ESTIMATE: the rise of the provider's rate-limit readings over the session (used_percent), "
    "times the tokens not sent net of the summarizer's own over the tokens sent: the limits "
    "are presumed spent in proportion to the tokens a session sends"
)
# window -> (its header, the factor that makes it a percentage, its reset header)
WINDOWS: dict[str, tuple[str, float, str]] = {
    "primary": ("x-codex-primary-used-percent", 1.0, "x-codex-primary-reset-at"),
    "secondary": ("x-codex-secondary-used-percent", 1.0, "x-codex-secondary-reset-at"),
    "5h": (
        "anthropic-ratelimit-unified-5h-utilization",
        100.0,
        "anthropic-ratelimit-unified-5h-reset",
    ),
    "7d": (
        "anthropic-ratelimit-unified-7d-utilization",
        100.0,
        "anthropic-ratelimit-unified-7d-reset",
    ),
}


def plan_of(path: str, headers: Mapping[str, str]) -> str | None:
    """The plan that pays for a turn, from its route and its credential's kind; None when it
    is billed by the token (an API key)."""
    if path.split("?", 1)[0].rstrip("/").endswith(CHATGPT_SUFFIX):
        return CHATGPT
    auth = headers.get("authorization") or ""
    oauth = auth[:7].lower() == "bearer " and auth[7:].lstrip().startswith("sk-ant-oat")
    return CLAUDE if oauth and not headers.get("x-api-key") else None


def _number(value: str | None) -> float | None:
    try:
        x = float(value) if value else None
    except ValueError:
        return None
    return x if x is not None and math.isfinite(x) and x >= 0 else None


def readings(headers: Mapping[str, str]) -> dict[str, tuple[float, str]]:
    """window -> (percent used, its reset) of one answer's rate-limit headers."""
    out: dict[str, tuple[float, str]] = {}
    for name, (header, factor, reset) in WINDOWS.items():
        used = _number(headers.get(header))
        if used is not None:
            out[name] = (round(used * factor, 4), (headers.get(reset) or "")[:32])
    return out


def merged(stored: str | None, now: Mapping[str, tuple[float, str]]) -> str:
    """The session's stored readings (JSON) with one answer's added."""
    try:
        doc = json.loads(stored) if stored else {}
    except ValueError:
        doc = {}
    found = doc.get("windows") if isinstance(doc, dict) else None
    windows: dict[str, Any] = found if isinstance(found, dict) else {}
    for name, (used, reset) in now.items():
        w = windows.get(name)
        if not isinstance(w, dict):
            windows[name] = {"first": used, "last": used, "spent": 0.0, "reset": reset}
            continue
        if reset != w.get("reset") or used < float(w.get("last", used)):
            # A new window: what the old one rose by is kept, the new one starts here.
            w["spent"] = float(w.get("spent", 0)) + float(w["last"]) - float(w["first"])
            w["first"], w["reset"] = used, reset
        w["last"] = used
    return json.dumps({"v": 1, "windows": windows}, sort_keys=True)


class PlanBook:
    """Labels subscription sessions in the store as their answers are booked. The readings of
    each labelled session are kept in memory as last written (no read per answer)."""

    def __init__(self, store: Store, max_sessions: int = 256) -> None:
        self.store = store
        self.max_sessions = max_sessions
        self._known: dict[str, str | None] = {}

    def book(
        self, session: str, path: str, headers: Mapping[str, str], answer: Mapping[str, str]
    ) -> str | None:
        """Record the plan of one answered turn (and the answer's readings); its plan."""
        plan = plan_of(path, headers)
        if plan is None:
            return None
        now = readings(answer)
        if session in self._known:
            stored = self._known[session]
        else:
            stored = self.store.plans(session).get(session, (plan, None))[1]
        limits = merged(stored, now) if now else stored
        if session in self._known and limits == stored:
            return plan
        self.store.record_plan(session, plan, limits if now else None)
        self._known[session] = limits
        while len(self._known) > self.max_sessions:
            self._known.pop(next(iter(self._known)))
        return plan


def _tokens(rows: Iterable[UsageRow], kind: str) -> int:
    return sum(r.usage.prompt_tokens + r.usage.output_tokens for r in rows if r.kind == kind)


def session_limits(limits: str | None, rows: list[UsageRow]) -> dict[str, Any] | None:
    """One session's rate-limit figures: per window the points used, and the ESTIMATE of the
    points not spent (`HOW`); None without readings."""
    try:
        doc = json.loads(limits) if limits else None
    except ValueError:
        return None
    windows = doc.get("windows") if isinstance(doc, dict) else None
    if not isinstance(windows, dict) or not windows:
        return None
    sent = _tokens(rows, "agent") + _tokens(rows, "summarizer")
    net = _tokens(rows, "estimate") - sent
    out: dict[str, Any] = {}
    for name, w in sorted(windows.items()):
        try:
            used = float(w["spent"]) + float(w["last"]) - float(w["first"])
        except (KeyError, TypeError, ValueError):
            continue
        share = used * net / sent if sent else None
        out[name] = {
            "used_percent": round(used, 4),
            "not_spent_percent": None if share is None else round(share, 4),
        }
    return out


def plan_report(store: Store, session: str | None = None) -> dict[str, dict[str, Any]]:
    """`plans` of `/_cg/stats`: per plan, its sessions, their savings in tokens, the label of
    their dollars, and the share of the plan's rate limits not spent (an ESTIMATE, `HOW`).
    The labelled sessions' rows are read one session at a time: there are few."""
    labelled = store.plans(session)
    if not labelled:
        return {}
    turns = store.ledger_turns(session)
    out: dict[str, dict[str, Any]] = {}
    for sid, (plan, limits) in sorted(labelled.items()):
        p = out.setdefault(
            plan,
            {
                "sessions": 0,
                "turns": 0,
                "rewritten_turns": 0,
                "tokens_not_sent": 0,
                "dollars": DOLLARS,
                "rate_limits": {"estimate": True, "how": HOW, "windows": {}},
            },
        )
        t = turns.get(sid)
        p["sessions"] += 1
        if t is not None:
            p["turns"] += t.turns
            p["rewritten_turns"] += t.rewritten
            p["tokens_not_sent"] += t.tokens_not_sent
        for name, w in (session_limits(limits, store.usage_rows(sid)) or {}).items():
            acc = p["rate_limits"]["windows"].setdefault(
                name, {"used_percent": 0.0, "not_spent_percent": 0.0}
            )
            acc["used_percent"] = round(acc["used_percent"] + w["used_percent"], 4)
            if w["not_spent_percent"] is None or acc["not_spent_percent"] is None:
                acc["not_spent_percent"] = None
            else:
                acc["not_spent_percent"] = round(
                    acc["not_spent_percent"] + w["not_spent_percent"], 4
                )
    return out


def plan_lines(plans: Any, indent: str = "  ") -> list[str]:
    """`plans` as the CLI prints them: each plan's sessions, what its dollars mean, its savings
    in tokens and the share of its rate limits not spent (labelled an estimate, with how)."""
    if not isinstance(plans, dict) or not plans:
        return []
    out = [
        "on a subscription (billed by the plan, not by the token: the dollars above are "
        f"{DOLLARS}s for these sessions):"
    ]
    for name, p in sorted(plans.items()):
        out.append(
            f"{indent}{name}: {p['sessions']} sessions, {p['rewritten_turns']} rewritten of "
            f"{p['turns']} turns, tokens not sent (our count) {p['tokens_not_sent']:,}"
        )
        limits = p.get("rate_limits") or {}
        for window, w in sorted((limits.get("windows") or {}).items()):
            spared = w.get("not_spent_percent")
            shown = "unknown" if spared is None else f"{spared:.2f} points"
            out.append(
                f"{indent}  {window} window: {w['used_percent']:.2f} points used; "
                f"not spent (ESTIMATE) {shown}"
            )
        if limits.get("windows"):
            out.append(f"{indent}  ({limits.get('how', HOW)})")
    return out


def labelled(store: Store, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Session list entries (`cg.billing.listing`) with `plan` (None: billed by the token)
    and, for a plan's sessions, what their dollars mean and their rate-limit figures. One read
    of the labelled sessions per page."""
    plans = store.plans() if entries else {}
    for e in entries:
        found = plans.get(e["id"])
        e["plan"] = found[0] if found else None
        if found:
            e["dollars"] = DOLLARS
            e["rate_limits"] = session_limits(found[1], store.usage_rows(e["id"]))
    return entries
