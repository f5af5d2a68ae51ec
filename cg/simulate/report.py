"""The simulator's tables: one per session and one in total, in plain text for a terminal."""

from __future__ import annotations

from collections.abc import Mapping

from cg.simulate.run import BASELINE, REFERENCE, Result
from cg.simulate.tally import Tally

COLUMNS = (
    ("preset", "<"),
    ("cost $", ">"),
    ("x off", ">"),
    ("x agent", ">"),
    ("sent Mtok", ">"),
    ("summ. $", ">"),
    ("rewritten", ">"),
    ("summaries", ">"),
    ("peak", ">"),
    ("agent-compact", ">"),
)


def _money(x: float | None) -> str:
    return "unknown" if x is None else f"{x:.2f}"


def _ratio(x: float | None, ref: float | None) -> str:
    if x is None or ref is None or ref <= 0:
        return "-"
    return f"{x / ref:.3f}"


def rows(tallies: Mapping[str, Tally], names: list[str]) -> list[list[str]]:
    ref = tallies[REFERENCE].cost_usd if REFERENCE in tallies else None
    base = tallies[BASELINE].cost_usd if BASELINE in tallies else None
    out = []
    for name in names:
        t = tallies[name]
        out.append(
            [
                name,
                _money(t.cost_usd),
                _ratio(t.cost_usd, ref),
                _ratio(t.cost_usd, base),
                f"{t.tokens_sent / 1e6:.2f}",
                _money(t.summarizer_cost_usd),
                f"{t.rewritten}/{t.turns}",
                str(t.summaries),
                "-" if t.peak_frac is None else f"{t.peak_frac:.0%}",
                str(t.agent_compaction_turns),
            ]
        )
    return out


def table(tallies: Mapping[str, Tally], names: list[str]) -> str:
    body = rows(tallies, names)
    head = [c for c, _ in COLUMNS]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if a == "<" else c.rjust(w)
            for c, w, (_, a) in zip(cells, widths, COLUMNS, strict=True)
        ).rstrip()

    return "\n".join([line(head), *(line(r) for r in body)])


def text(result: Result) -> str:
    parts = []
    for s in result.sessions:
        window = f"{s.window:,}" if s.window else "unknown"
        parts.append(f"{s.label}  session {s.id}  ({s.model}, window {window}, {s.turns} turns)")
        parts.append(table(s.tallies, result.presets))
        parts.append("")
    parts.append(f"total  ({len(result.sessions)} sessions)")
    parts.append(table(result.totals, result.presets))
    unpriced = sorted(set().union(*(t.unpriced for t in result.totals.values())))
    if unpriced:
        parts.append(f"no price for {', '.join(unpriced)}: those costs are unknown, not zero")
    parts.append("")
    parts.append(
        "x off / x agent: cost against `off` (no rewrite, no compaction) and against "
        "`agent-compaction` (the agent compacting itself); peak: the largest request sent, as "
        "a share of the window; agent-compact: turns on which the agent's own compaction "
        "would start."
    )
    parts.append(result.how)
    if not result.tokens_exact:
        parts.append("token counts are estimates (4 bytes/token): tiktoken's encoding is missing")
    parts.append(f"({result.seconds:.1f}s)")
    return "\n".join(parts)
