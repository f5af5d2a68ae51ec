"""The simulator's tables: one per session and one in total, in plain text for a terminal, the
total followed by its retention per fact kind."""

from __future__ import annotations

from collections.abc import Mapping

from cg.retention.facts import KINDS
from cg.simulate.retained import FLOOR_LABEL, LABEL, Retained
from cg.simulate.run import BASELINE, REFERENCE, Result
from cg.simulate.tally import Tally

RETENTION = "retained min/mean"
COLUMNS = (
    "preset",
    "cost $",
    "x off",
    "x agent",
    RETENTION,
    "sent Mtok",
    "summ. $",
    "rewritten",
    "summaries",
    "peak",
    "agent-compact",
)


def _money(x: float | None) -> str:
    return "unknown" if x is None else f"{x:.2f}"


def _ratio(x: float | None, ref: float | None) -> str:
    if x is None or ref is None or ref <= 0:
        return "-"
    return f"{x / ref:.3f}"


def _pair(low: float | None, mean: float | None) -> str:
    if low is None or mean is None:
        return "-"
    return f"{low:.3f}/{mean:.3f}"


def _kept(r: Retained) -> str:
    """min/mean over the rewritten turns; a floor (the stand-in's summaries) is starred."""
    if not r.measured:
        return "-"
    return _pair(r.low, r.mean) + ("*" if r.floor is not False else "")


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
                _kept(t.retained),
                f"{t.tokens_sent / 1e6:.2f}",
                _money(t.summarizer_cost_usd),
                f"{t.rewritten}/{t.turns}",
                str(t.summaries),
                "-" if t.peak_frac is None else f"{t.peak_frac:.0%}",
                str(t.agent_compaction_turns),
            ]
        )
    return out


def _grid(head: list[str], body: list[list[str]]) -> str:
    """Columns padded to their widths: the first left-aligned, the rest right-aligned."""
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([line(head), *(line(r) for r in body)])


def table(tallies: Mapping[str, Tally], names: list[str]) -> str:
    return _grid(list(COLUMNS), rows(tallies, names))


def kinds(tallies: Mapping[str, Tally], names: list[str]) -> str:
    """Retention per fact kind: min/mean over the rewritten turns that have facts of the kind,
    and the facts visible / facts summed over those turns."""
    head = ["preset", "measured", "unchanged", *KINDS]
    body = []
    for name in names:
        r = tallies[name].retained
        cells = [name + ("*" if r.floor is not False and r.measured else ""), str(r.measured),
                 str(r.unchanged)]  # fmt: skip
        for k in KINDS:
            if not r.total[k]:
                cells.append("-")
                continue
            cells.append(
                f"{_pair(r.kind_low.get(k), r.kind_mean(k))} ({r.visible[k]}/{r.total[k]})"
            )
        body.append(cells)
    return _grid(head, body)


def text(result: Result) -> str:
    parts = []
    for s in result.sessions:
        window = f"{s.window:,}" if s.window else "unknown"
        parts.append(f"{s.label}  session {s.id}  ({s.model}, window {window}, {s.turns} turns)")
        parts.append(table(s.tallies, result.presets))
        parts.append("")
    parts.append(f"total  ({len(result.sessions)} sessions)")
    parts.append(table(result.totals, result.presets))
    parts.append("")
    parts.append("retention per fact kind, total: min/mean (facts visible/facts)")
    parts.append(kinds(result.totals, result.presets))
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
    parts.append(retention_note(result))
    parts.append(result.how)
    if not result.tokens_exact:
        parts.append("token counts are estimates (4 bytes/token): tiktoken's encoding is missing")
    parts.append(f"({result.seconds:.1f}s)")
    return "\n".join(parts)


def retention_note(result: Result) -> str:
    """What the retention column is, and whether it is a floor (said once, starred per row)."""
    note = (
        f"{RETENTION}: the share of the client's facts (user texts, files, commands, errors) "
        "each rewritten request still shows, lowest and mean over the rewritten turns "
        "('measured'); turns sent unchanged keep them all (1.0) and are counted apart "
        "('unchanged')."
    )
    if any(t.retained.floor is not False and t.retained.measured for t in result.totals.values()):
        note += (
            f" * {FLOOR_LABEL}: only the kept messages and what the component writes around "
            "the summary (its framing, the floor where there is one) show facts "
            "(agent-compaction's summary is modelled as tokens, so it is a floor too)."
        )
    if any(t.retained.floor is False and t.retained.measured for t in result.totals.values()):
        note += f" Unstarred: {LABEL}, the summaries written by a real model."
    return note
