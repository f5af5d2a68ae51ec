"""Sweep the `claude-code` preset's thresholds with the cost simulator (docs/savings.md).

    python -m bench.sweep CORPUS_DIR [--latency S] [--only NAME]… [--preset NAME]

Reads the corpus once (`python -m bench.sessions CORPUS_DIR` writes it), replays `off`, the
`agent-compaction` baseline and every variant below, and prints one markdown table per window
class (200k, 1M): the cost against both references, the largest request as a share of the
window, whether any request reached 80% of it (the preset's constraint: a checkpoint is
spliced before then), and the retention of the rewritten turns, in all and of the user's own
texts (lowest / mean; a floor with the stand-in summarizer, which writes no facts). Figures are
the simulator's estimates.
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cg.components import COMPONENTS
from cg.settings import Config, load_config
from cg.simulate.proxy import Options
from cg.simulate.run import BASELINE, REFERENCE, Result, load_corpus, replay
from cg.simulate.tally import Tally

LIMIT = 0.8


def variants() -> dict[str, dict[str, Any]]:
    """Name -> overrides of the preset's `summarize` block: one knob at a time around the
    preset, then the two that matter most together."""
    out: dict[str, dict[str, Any]] = {"preset": {}}
    for v in (30_000, 50_000, 70_000, 130_000):
        out[f"min_request_tokens={v // 1000}k"] = {"trigger": {"min_request_tokens": v}}
    for f in (0.3, 0.5):
        out[f"min_request_frac={f}"] = {"trigger": {"min_request_frac": f}}
    for f in (0.6, 0.75, 0.8):
        out[f"ceiling_frac={f}"] = {"trigger": {"ceiling_frac": f}}
    out["cache_state=cold"] = {"cache_state": "cold"}
    for r in (10_000, 20_000, 60_000, 80_000):
        out[f"resummarize_tokens={r // 1000}k"] = {"resummarize_tokens": r}
    for k in (6, 10):
        out[f"keep_last={k}"] = {"keep_last": k}
    for t in (40_000, 60_000, 80_000):
        for r in (20_000, 60_000):
            out[f"min={t // 1000}k resum={r // 1000}k"] = {
                "trigger": {"min_request_tokens": t},
                "resummarize_tokens": r,
            }
    for t in (40_000, 50_000, 60_000):
        for r in (30_000, 40_000):
            out[f"min={t // 1000}k resum={r // 1000}k"] = {
                "trigger": {"min_request_tokens": t},
                "resummarize_tokens": r,
            }
    out["shared off (never)"] = {"model": {"share_cache": "never"}}
    # The component with the first design's defaults, then the shipped ones added a step at a time.
    spec: dict[str, Any] = {
        "cache_state": "cold",
        "resummarize_tokens": 6000,
        "trigger": {"min_request_tokens": 0, "min_request_frac": 0.9, "ceiling_frac": 0.95},
    }
    out["first defaults"] = spec
    out["first + resum=40k"] = _merge(spec, {"resummarize_tokens": 40_000})
    out["first + resum=40k + any"] = _merge(
        spec, {"resummarize_tokens": 40_000, "cache_state": "any"}
    )
    return out


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out.get(k) or {}, v) if isinstance(v, Mapping) else v
    return out


def config(over: Mapping[str, Any], preset: str = "claude-code") -> Config:
    cfg = load_config(preset, None, list(COMPONENTS))
    block = _merge(cfg.components.get("summarize") or {}, over)
    return cfg.model_copy(update={"components": {**cfg.components, "summarize": block}})


def _sum(result: Result, name: str, window: int) -> Tally:
    t = Tally()
    for s in result.sessions:
        if s.window == window:
            t.add(s.tallies[name])
    return t


def table(result: Result, window: int) -> str:
    off, base = _sum(result, REFERENCE, window), _sum(result, BASELINE, window)
    floor = "floor " if any(_sum(result, n, window).retained.floor for n in result.presets) else ""
    lines = [
        "| variant | cost $ | x off | x agent | peak | >= 80% | summaries | summ. $ "
        f"| {floor}min / mean | user {floor}min / mean | rewritten |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in result.presets:
        t = _sum(result, name, window)
        cost = t.cost_usd or 0.0
        peak = t.peak_frac or 0.0
        r = t.retained
        lines.append(
            f"| {name} | {cost:.2f} | {cost / (off.cost_usd or 1):.3f} | "
            f"{cost / (base.cost_usd or 1):.3f} | {peak:.0%} | "
            f"{'**yes**' if peak >= LIMIT else 'no'} | {t.summaries} | {t.summarizer_usd:.2f} | "
            f"{_pair(r.low, r.mean)} | {_pair(r.kind_low.get('user'), r.kind_mean('user'))} | "
            f"{r.measured}/{t.turns} |"
        )
    return "\n".join(lines)


def _pair(low: float | None, mean: float | None) -> str:
    """Retention over the rewritten turns (the unchanged ones keep everything: not counted)."""
    return "-" if low is None or mean is None else f"{low:.3f} / {mean:.3f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("corpus", type=Path)
    p.add_argument("--latency", type=float, default=0.0, help="--summary-latency, seconds")
    p.add_argument("--only", action="append", help="a variant name (repeatable)")
    p.add_argument("--preset", default="claude-code", help="the preset the variants vary")
    args = p.parse_args()
    corpus = load_corpus(sorted(args.corpus.glob("*.jsonl")), warn=print)
    wanted = {k: v for k, v in variants().items() if not args.only or k in args.only}
    configs: dict[str, Config | None] = {REFERENCE: config({}, "off"), BASELINE: None}
    configs.update({k: config(v, args.preset) for k, v in wanted.items()})
    result = replay(
        corpus, configs, options=Options(summary_latency=args.latency), progress=sys.stderr
    )
    for window in sorted({s.window for s in result.sessions if s.window}):
        print(f"\n### window {window:,} (latency {args.latency:g}s)\n")
        print(table(result, window))
    print(f"\n({result.seconds:.0f}s)")


if __name__ == "__main__":
    main()
