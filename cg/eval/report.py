"""The eval's plain-text report: per checkpoint, then the totals, then what it cost."""

from __future__ import annotations

from cg.eval.ask import CONDITIONS
from cg.eval.run import Result, Scores
from cg.retention.facts import KINDS

LOST_SHOWN = 5


def _short(text: str, width: int = 90) -> str:
    line = " ".join(text.split())
    return repr(line if len(line) <= width else line[: width - 1] + "…")


def _cell(v: list[int]) -> str:
    right, asked, errors = v
    out = f"{right}/{asked}" if asked else "-"
    return out + (f" ({errors} err)" if errors else "")


def _table(scores: Scores, indent: str) -> list[str]:
    kinds = [k for k in KINDS if any(any(scores.cells[c][k]) for c in CONDITIONS)]
    head = f"{indent}{'condition':<18}" + "".join(f"{k:>14}" for k in kinds) + f"{'all':>16}"
    lines = [head]
    for c in CONDITIONS:
        total = scores.total(c)
        pct = f" {total[0] / total[1]:4.0%}" if total[1] else ""
        lines.append(
            f"{indent}{c:<18}"
            + "".join(f"{_cell(scores.cells[c][k]):>14}" for k in kinds)
            + f"{_cell(total) + pct:>16}"
        )
    return lines


def text(result: Result) -> str:
    out = [f"context-guru eval: preset {result.preset}, {result.plan.describe()}"]
    for r in result.checkpoints:
        cp = r.checkpoint
        span = f"messages {cp.span[0]}..{cp.span[1] - 1}" if cp.span else "-"
        ids = ", ".join(cp.keys) or "no id"
        out.append("")
        out.append(
            f"{cp.label} turn {cp.turn}: {len(cp.replaced)} messages replaced ({span}; {ids}), "
            f"{len(r.asked)} probes"
        )
        if r.asked:
            out += _table(r.scores, "  ")
        lost = [a.probe for a in r.asked if a.score("original") and a.score("rewritten") is False]
        for p in lost[:LOST_SHOWN]:
            out.append(f"  lost by the rewrite: {p.kind} {_short(p.expected)}")
        if len(lost) > LOST_SHOWN:
            out.append(f"  ... and {len(lost) - LOST_SHOWN} more (--json lists every probe)")
    if not result.checkpoints:
        out.append("")
        out.append("no checkpoint: the preset replaced nothing in these sessions")
    out.append("")
    out.append("total (correct/asked per kind; a failed call is an error, not a wrong answer)")
    out += _table(result.totals, "  ")
    out.append("")
    out.append(f"calls made: {result.calls}")
    for model, u in result.usage.items():
        out.append(
            f"  {model}: input {u.input_tokens:,}  cache write "
            f"{u.cache_write_tokens + u.cache_write_1h_tokens:,}  cache read "
            f"{u.cache_read_tokens:,}  output {u.output_tokens:,}  requests {u.requests:,}"
        )
    cost = (
        "unknown (a model has no price)" if result.cost_usd is None else f"${result.cost_usd:,.4f}"
    )
    out.append(f"cost at list prices: {cost}")
    out += [f"warning: {w}" for w in result.warnings]
    return "\n".join(out)
