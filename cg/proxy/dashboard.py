"""`GET /_cg/`: the savings dashboard, one self-contained HTML page for a person.

The same figures as `/_cg/stats` (the facts retained among them) and one page of
`/_cg/sessions` (each shown figure carries its JSON value in `data-value`, so a test can hold
the page to the endpoints), with links to the next page and back, plus a chart per listed
session of the cost of each turn with and without the rewrite, drawn as inline SVG from the
ledger's in-memory history of this process's turns.
No script, no build step, no external asset (the answer's Content-Security-Policy forbids
any); it reloads itself every few seconds. Estimated figures say ESTIMATE, as everywhere.
Every string that came from outside (a session id, a cursor) is escaped; nothing here ever
held a header, so no credential can be shown.
"""

from __future__ import annotations

import html
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cg.proxy.planview import plan_tag, plans_html
from cg.retention.facts import KINDS

REFRESH_S = 5
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
CHART_W, CHART_H = 560, 140

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.4em;margin:0 0 .2em} h2{font-size:1.1em;margin:1.5em 0 .4em}
.note{color:#666;font-size:.9em} .est{color:#9a5b00;font-weight:600;font-size:.8em}
.cards{display:flex;flex-wrap:wrap;gap:.8em} .card{background:#fff;border:1px solid #ddd;
border-radius:6px;padding:.6em .9em;min-width:10em} .card b{display:block;font-size:1.3em}
table{border-collapse:collapse;background:#fff} td,th{border:1px solid #ddd;padding:.3em .6em;
text-align:right} th{background:#f0f0f0} td.id{text-align:left;font-family:monospace}
svg{background:#fff;border:1px solid #ddd} .legend span{margin-right:1.2em}
"""


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def usd(x: Any) -> str:
    if not isinstance(x, int | float):
        return "unknown"
    return f"-${-x:,.4f}" if x < 0 else f"${x:,.4f}"


def num(x: Any) -> str:
    return f"{x:,}" if isinstance(x, int) else ("unknown" if x is None else esc(x))


def figure(name: str, value: Any, text: str, estimate: bool = False) -> str:
    """One figure with its JSON value in `data-value` (the tests compare it to the JSON)."""
    label = ' <span class="est">ESTIMATE</span>' if estimate else ""
    raw = "" if value is None else value
    return f'<span data-figure="{esc(name)}" data-value="{esc(raw)}">{esc(text)}</span>{label}'


def share(x: Any) -> str:
    """A ratio as a percentage; "none" where there was nothing to measure (null)."""
    return f"{x * 100:.1f}%" if isinstance(x, int | float) else "none"


def retention_table(r: Mapping[str, Any] | None) -> str:
    """`/_cg/stats`' `retention`: the rewritten turns measured, their mean and least retention,
    and each kind's share summed over them."""
    r = r or {}
    kinds = r.get("by_kind") or {}
    cells = [
        figure("retention.turns", r.get("turns"), num(r.get("turns"))),
        figure("retention.mean", r.get("mean"), share(r.get("mean"))),
        figure("retention.min", r.get("min"), share(r.get("min"))),
        *(figure(f"retention.by_kind.{k}", kinds.get(k), share(kinds.get(k))) for k in KINDS),
    ]
    return (
        '<table id="retention"><tr><th>rewritten turns measured</th><th>mean</th><th>least</th>'
        + "".join(f"<th>{k}</th>" for k in KINDS)
        + "</tr><tr>"
        + "".join(f"<td>{c}</td>" for c in cells)
        + "</tr></table>"
    )


def card(title: str, body: str) -> str:
    return f'<div class="card">{esc(title)}<b>{body}</b></div>'


def chart(points: Sequence[Mapping[str, Any]], sid: str) -> str:
    """Cost per turn, billed (with the summarizer) and without the rewrite (ESTIMATE)."""
    billed = [p.get("billed_usd") for p in points]
    without = [p.get("without_rewrite_usd") for p in points]
    values = [v for v in (*billed, *without) if isinstance(v, int | float)]
    if len(points) < 1 or not values:
        return '<p class="note">No priced turn yet in this process.</p>'
    top = max(values) or 1.0
    n = len(points)

    def xy(i: int, v: float) -> str:
        x = 40 + (CHART_W - 50) * (i / max(n - 1, 1))
        y = CHART_H - 20 - (CHART_H - 35) * (v / top)
        return f"{x:.1f},{y:.1f}"

    def line(series: list[Any], color: str, name: str, dash: str = "") -> str:
        pts = " ".join(xy(i, v) for i, v in enumerate(series) if isinstance(v, int | float))
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        return (
            f'<polyline data-series="{name}" points="{pts}" fill="none" stroke="{color}" '
            f'stroke-width="2"{extra}/>'
        )

    rewritten = "".join(
        f'<circle cx="{xy(i, v).split(",")[0]}" cy="{xy(i, v).split(",")[1]}" r="3" fill="#2a7"/>'
        for i, (p, v) in enumerate(zip(points, billed, strict=True))
        if p.get("rewritten") and isinstance(v, int | float)
    )
    return (
        f'<svg data-chart="{esc(sid)}" width="{CHART_W}" height="{CHART_H}" '
        f'viewBox="0 0 {CHART_W} {CHART_H}" role="img" '
        f'aria-label="cost per turn, with and without the rewrite">'
        f'<text x="4" y="14" font-size="11">{esc(usd(top))}</text>'
        f'<text x="4" y="{CHART_H - 6}" font-size="11">turn 1 … {n}</text>'
        f'<line x1="40" y1="{CHART_H - 20}" x2="{CHART_W - 10}" y2="{CHART_H - 20}" '
        f'stroke="#999"/>'
        + line(without, "#c60", "without", "5,3")
        + line(billed, "#27a", "billed")
        + rewritten
        + "</svg>"
        '<div class="legend note"><span style="color:#27a">━ billed (with the summarizer)</span>'
        '<span style="color:#c60">╌ without the rewrite (ESTIMATE)</span>'
        '<span style="color:#2a7">● rewritten turn</span></div>'
    )


def _ago(t: Any, now: float) -> str:
    if not isinstance(t, int | float):
        return "?"
    s = max(0, int(now - t))
    return f"{s}s ago" if s < 120 else f"{s // 60} min ago" if s < 7200 else f"{s // 3600} h ago"


def session_rows(sessions: Iterable[Mapping[str, Any]], now: float) -> str:
    out = []
    for s in sessions:
        sid = str(s.get("id"))
        sv = s.get("savings") or {}
        cp = s.get("checkpoint")
        checkpoint = (
            f"{cp.get('covered_messages')} messages → {cp.get('summary_tokens')} tokens"
            if isinstance(cp, dict)
            else "none"
        )
        out.append(
            f'<tr data-session="{esc(sid)}"><td class="id">{esc(sid)}{plan_tag(s)}</td>'
            f"<td>{esc(_ago(s.get('last_seen'), now))}</td><td>{esc(checkpoint)}</td>"
            f"<td>{num(sv.get('turns'))} / {num(sv.get('rewritten_turns'))}</td>"
            f"<td>{figure('session:tokens_not_sent', sv.get('tokens_not_sent'), num(sv.get('tokens_not_sent')))}</td>"
            f"<td>{figure('session:billed_usd', sv.get('billed_usd'), usd(sv.get('billed_usd')))}</td>"
            f"<td>{figure('session:billed_summarizer_usd', sv.get('billed_summarizer_usd'), usd(sv.get('billed_summarizer_usd')))}</td>"
            f"<td>{figure('session:without_rewrite_usd', sv.get('without_rewrite_usd'), usd(sv.get('without_rewrite_usd')), True)}</td>"
            f"<td>{figure('session:saved_usd', sv.get('saved_usd'), usd(sv.get('saved_usd')), True)}</td></tr>"
        )
    return "".join(out)


def pager(next_href: str | None, first_href: str | None) -> str:
    """Links to the next page of sessions and back to the first (a page is `/_cg/sessions`'
    page: `limit` and `cursor` in the query)."""
    links = []
    if first_href is not None:
        links.append(f'<a id="first-page" href="{esc(first_href)}">first page</a>')
    if next_href is not None:
        links.append(f'<a id="next-page" href="{esc(next_href)}">next page</a>')
    return f'<p class="note">{" · ".join(links)}</p>' if links else ""


def render(
    stats: Mapping[str, Any],
    sessions: Sequence[Mapping[str, Any]],
    history: Mapping[str, Sequence[Mapping[str, Any]]],
    now: float | None = None,
    error: str | None = None,
    next_href: str | None = None,
    first_href: str | None = None,
) -> str:
    """The page: totals (as `/_cg/stats`), one page of sessions (as `/_cg/sessions`, most
    recently booked first, with links to the next page and back), a chart per listed session
    with turns in this process's history."""
    from cg.proxy import alltime  # (it builds on this module's cards)

    now = time.time() if now is None else now
    sv = stats.get("savings") or {}
    sm = stats.get("summaries") or {}
    totals = "".join(
        [
            card("requests", figure("requests", stats.get("requests"), num(stats.get("requests")))),
            card("rewritten", figure("rewritten", stats.get("rewritten"), num(stats.get("rewritten")))),
            card("failed open", figure("failed_open", stats.get("failed_open"), num(stats.get("failed_open")))),
            card("retried original", figure("retried_original", stats.get("retried_original"), num(stats.get("retried_original")))),
            card("summaries completed", figure("summaries.completed", sm.get("completed"), num(sm.get("completed")))),
            card("tokens not sent", figure("tokens_not_sent", sv.get("tokens_not_sent"), num(sv.get("tokens_not_sent")))),
            card("billed", figure("billed_usd", sv.get("billed_usd"), usd(sv.get("billed_usd")))),
            card("summarizer cost", figure("billed_summarizer_usd", sv.get("billed_summarizer_usd"), usd(sv.get("billed_summarizer_usd")))),
            card("without the rewrite", figure("without_rewrite_usd", sv.get("without_rewrite_usd"), usd(sv.get("without_rewrite_usd")), True)),
            card("saved", figure("saved_usd", sv.get("saved_usd"), usd(sv.get("saved_usd")), True)),
            card("saved share", figure("saved_share", sv.get("saved_share"), share(sv.get("saved_share")), True)),
        ]
    )  # fmt: skip
    if sessions:
        table = (
            '<table id="sessions"><tr><th>session</th><th>last seen</th><th>checkpoint</th>'
            "<th>turns / rewritten</th><th>tokens not sent</th><th>billed</th>"
            "<th>summarizer</th><th>without rewrite</th><th>saved</th></tr>"
            + session_rows(sessions, now)
            + "</table>"
        )
    elif first_href is not None:
        table = '<p id="no-sessions" class="note">No sessions on this page.</p>'
    else:
        table = '<p id="no-sessions" class="note">No sessions yet: nothing has been booked.</p>'
    table += pager(next_href, first_href)
    charts = "".join(
        f"<h3 class=note>{esc(sid)}</h3>{chart(points, sid)}"
        for sid, points in history.items()
        if points
    )
    problem = f'<p class="note">The store could not be read: {esc(error)}</p>' if error else ""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f'<meta http-equiv="refresh" content="{REFRESH_S}">'
        "<title>context-guru — savings</title>"
        f"<style>{STYLE}</style></head><body>"
        "<h1>context-guru — savings</h1>"
        f'<p class="note">Refreshes every {REFRESH_S} s. Figures as <code>/_cg/stats</code> and '
        "<code>/_cg/sessions</code>; ESTIMATE marks what the turns would have cost unrewritten "
        f"(priced under a prompt-cache model). {esc(sv.get('note', ''))}</p>"
        f'{problem}<h2 id="since-start">Since this proxy started</h2><div class=cards>{totals}</div>'
        f"{alltime.section(stats.get('ledger'))}"
        f"{plans_html((stats.get('ledger') or {}).get('plans'))}"
        "<h2>Facts retained</h2>"
        '<p class="note">Of each rewritten turn\'s facts (what the user typed, the files, the '
        "commands, the errors), the share still visible in the request sent; measured once the "
        "turn's answer is done.</p>"
        f"{retention_table(stats.get('retention'))}"
        f"<h2>Sessions</h2>{table}"
        "<h2>Cost per turn, with and without the rewrite</h2>"
        + (charts or '<p class="note">No turns booked since the proxy started.</p>')
        + "</body></html>"
    )
