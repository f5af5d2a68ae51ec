"""One log line per intercepted turn, so a person watching mitmdump sees what context-guru did
(mitmproxy's own `<< 200 OK` says nothing of it):

    context-guru 3f2a9c1d anthropic claude-code: passed (below the trigger: 4 messages < 8)
    context-guru 3f2a9c1d anthropic claude-code: commissioned a summary of messages 2–40
    context-guru 3f2a9c1d anthropic claude-code: rewritten 181,204→9,012 tokens (212→5 messages)
    context-guru 3f2a9c1d openai summarize: failed open: cannot re-encode body: …

(the session id's first 8 characters, the dialect, the preset). Made from the view record
(`cg.proxy.view.view_record`), which holds no message text and no header: nothing secret can
reach the log. `failed open` is a WARNING and is always logged; the others are INFO, silenced
by `--set cg_quiet=true`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("context_guru")

REASON_MAX = 160  # characters of a reason shown (the decision record keeps it whole)


def _span(x: Any) -> tuple[int, int] | None:
    if isinstance(x, list | tuple) and len(x) == 2 and all(isinstance(v, int) for v in x):
        return int(x[0]), int(x[1])
    return None


def _reason(rec: Mapping[str, Any]) -> str:
    why = str(rec.get("reason") or "").strip()
    return why if len(why) <= REASON_MAX else why[: REASON_MAX - 1] + "…"


def what(rec: Mapping[str, Any]) -> str:
    """What the turn's line says after its prefix."""
    action = rec.get("action")
    why = _reason(rec)
    if action == "failed_open":
        return f"failed open: {why or 'no reason recorded'}"
    if action == "bypassed":
        return f"bypassed ({why})" if why else "bypassed"
    out: list[str] = []
    if action == "rewritten":
        toks, msgs = _span(rec.get("tokens")), _span(rec.get("messages"))
        text = "rewritten"
        if toks is not None:
            text += f" {toks[0]:,}→{toks[1]:,} tokens"
        if msgs is not None:
            text += f" ({msgs[0]}→{msgs[1]} messages)"
        out.append(text)
    summarizing = _span(rec.get("summarizing"))
    if rec.get("summary_flow") is not None or rec.get("rolling") is not None:
        span = f" of messages {summarizing[0]}–{summarizing[1]}" if summarizing else ""
        out.append(f"commissioned a summary{span}")
    if not out:
        return f"passed ({why})" if why else "passed"
    return "; ".join(out)


def line(rec: Mapping[str, Any]) -> str:
    session = rec.get("session")
    who = str(session)[:8] if isinstance(session, str) and session else "-"
    parts = [p for p in (who, rec.get("dialect"), rec.get("preset")) if p]
    return f"context-guru {' '.join(str(p) for p in parts)}: {what(rec)}"


def turn(rec: Mapping[str, Any], quiet: bool) -> None:
    """Log one turn's line (never raises: a log line must not touch the turn)."""
    try:
        if rec.get("action") == "failed_open":
            log.warning("%s", line(rec))
        elif not quiet:
            log.info("%s", line(rec))
    except Exception:  # (the record was not as expected: no line)
        log.debug("context-guru: no turn line", exc_info=True)
