"""`simulate()`: every preset over every recorded session, and the totals
(docs/behaviour.md#usage-cost-and-savings).

The figures are model estimates, not measurements: the real pipeline of each preset runs
offline, but the summaries are a stand-in's (unless `model` names a real one), the agent's
answers are read off the trace, and the bill is the prompt-cache model of `cg.billing.cache` at
the list prices of `cg/presets/tables/prices.yaml`. `off` is always run: it is what every ratio is
taken against; `agent-compaction` (the agent compacting itself, `cg.simulate.compaction`) is the
baseline that savings are also reported against.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from cg.billing.prices import PriceTable, price_table
from cg.components import COMPONENTS
from cg.settings import Config, load_config
from cg.simulate import compaction
from cg.simulate.proxy import Options, ProxyRun, SummarizerFactory
from cg.simulate.tally import Tally
from cg.simulate.trace import Session, Warn, load
from cg.simulate.turns import Preparer, SimTurn, fill_outputs
from cg.state.facts import FactsCache
from cg.state.tokens import TokenCounter
from cg.summarize.triggers import shipped_windows

REFERENCE = "off"
BASELINE = "agent-compaction"
DEFAULT_PRESETS = ("off", "summarize", "summarizer1509", "claude-code", BASELINE)
HOW = (
    "Model estimates, not measurements: each preset's real pipeline replayed offline on a "
    "throwaway store; summaries by {summarizer}; the agent's output per turn read off the "
    "trace; every request billed under the prompt-cache model of docs/behaviour.md (5-minute/1-hour "
    "TTL, reads 0.1x, writes 1.25x/2x) at the list prices of prices.yaml ({date})."
)


@dataclass(slots=True)
class SessionResult:
    id: str
    model: str | None
    window: int | None
    turns: int
    label: str = ""  # the file it came from (and the id, when a file holds several)
    tallies: dict[str, Tally] = field(default_factory=dict)


@dataclass(slots=True)
class Result:
    presets: list[str]
    sessions: list[SessionResult]
    totals: dict[str, Tally]
    how: str
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    tokens_exact: bool = True

    def to_json(self) -> dict[str, Any]:
        def block(tallies: Mapping[str, Tally], session: bool = False) -> dict[str, Any]:
            ref = tallies[REFERENCE].cost_usd if REFERENCE in tallies else None
            base = tallies[BASELINE].cost_usd if BASELINE in tallies else None
            return {name: tallies[name].to_json(ref, base, session) for name in self.presets}

        return {
            "estimate": self.how,
            "tokens_exact": self.tokens_exact,
            "presets": block(self.totals),
            "sessions": [
                {
                    "id": s.id,
                    "label": s.label,
                    "model": s.model,
                    "window": s.window,
                    "turns": s.turns,
                    "presets": block(s.tallies, session=True),
                }
                for s in self.sessions
            ],
            "warnings": self.warnings,
            "seconds": round(self.seconds, 2),
        }


class Progress:
    """A progress bar on stderr for long runs (a line per 10% when stderr is not a terminal)."""

    def __init__(self, total: int, stream: TextIO | None, label: str = "simulate") -> None:
        self.total = max(total, 1)
        self.stream = stream
        self.label = label
        self.done = 0
        self.t0 = time.monotonic()
        self._shown = -1.0
        self.tty = bool(stream is not None and stream.isatty())

    def tick(self) -> None:
        self.done += 1
        if self.stream is None:
            return
        frac = self.done / self.total
        step = 0.01 if self.tty else 0.1
        if frac - self._shown < step and self.done != self.total:
            return
        self._shown = frac
        width = 30
        bar = "#" * round(frac * width) + "." * (width - round(frac * width))
        line = (
            f"{self.label} [{bar}] {frac:4.0%} {self.done}/{self.total} turns "
            f"{time.monotonic() - self.t0:.1f}s"
        )
        end = "\n" if not self.tty or self.done == self.total else ""
        self.stream.write(("\r" if self.tty else "") + line + end)
        self.stream.flush()


LONG_INPUT = 300  # turn x preset steps from which the progress bar shows


def _config(name: str, config_file: str | None, model: str | None) -> Config:
    cfg = load_config(name, config_file, list(COMPONENTS))
    if model and "summarize" in cfg.pipeline:
        block = dict(cfg.components.get("summarize") or {})
        m = dict(block.get("model") or {})
        m.update(source="config", model=model)
        if not os.environ.get("CHEAP_MODEL_PROVIDER"):
            m.setdefault("provider", "anthropic" if model.startswith("claude") else "openai")
        block["model"] = m
        cfg.components = {**cfg.components, "summarize": block}
    return cfg


def simulate(
    paths: Sequence[str | Path],
    presets: Sequence[str] = DEFAULT_PRESETS,
    *,
    config_file: str | None = None,
    options: Options | None = None,
    model: str | None = None,
    summarizers: SummarizerFactory | None = None,
    warn: Warn | None = None,
    progress: TextIO | None = None,
    prices: PriceTable | None = None,
) -> Result:
    """Replay `paths` under each preset. Raises ValueError (a bad preset or config, or no
    input at all); anything wrong with single lines or files goes to `warn` and is skipped.

    `model` has summaries written by that model through the project's summarizer client
    (`model.source: config`, `CHEAP_MODEL_*` for the endpoint and key): real calls, billed as
    standalone prompts at that model's price. `summarizers` overrides the client (tests)."""
    names = list(dict.fromkeys([REFERENCE, *presets]))
    configs = {n: None if n == BASELINE else _config(n, config_file, model) for n in names}
    corpus = load_corpus(paths, config_file, warn)
    return replay(
        corpus,
        configs,
        options=options,
        model=model,
        summarizers=summarizers,
        progress=progress,
        prices=prices,
    )


@dataclass(slots=True)
class Corpus:
    """Sessions read and prepared once, to be replayed under any number of configs."""

    sessions: list[Session[SimTurn]]
    facts: FactsCache
    warnings: list[str]
    seconds: float


def load_corpus(
    paths: Sequence[str | Path], config_file: str | None = None, warn: Warn | None = None
) -> Corpus:
    """Read `paths` (the config's `model_windows` decide each turn's window)."""
    t0 = time.monotonic()
    warnings: list[str] = []

    def note(msg: str) -> None:
        warnings.append(msg)
        if warn is not None:
            warn(msg)

    windows = load_config(REFERENCE, config_file, list(COMPONENTS)).model_windows
    facts = FactsCache(TokenCounter())
    sessions = load(paths, Preparer(facts, windows, shipped_windows()), note)
    for s in sessions:
        fill_outputs(s.turns)
    return Corpus(sessions, facts, warnings, time.monotonic() - t0)


def replay(
    corpus: Corpus,
    configs: Mapping[str, Config | None],
    *,
    options: Options | None = None,
    model: str | None = None,
    summarizers: SummarizerFactory | None = None,
    progress: TextIO | None = None,
    prices: PriceTable | None = None,
) -> Result:
    """Each named config (None: the `agent-compaction` baseline) over every session."""
    t0 = time.monotonic()
    options = options or Options()
    prices = prices or price_table()
    names = list(configs)
    sessions = corpus.sessions
    results = [
        SessionResult(s.id, s.turns[-1].model, s.turns[-1].window, len(s.turns), _label(s))
        for s in sessions
    ]
    stems = [r.label for r in results]
    for r in results:
        if stems.count(r.label) > 1:
            r.label = f"{r.label}:{r.id[:8]}"
    steps = sum(len(s.turns) for s in sessions) * len(names)
    bar = Progress(steps, progress if steps >= LONG_INPUT else None)
    if model is not None and summarizers is None:
        summarizers, closer = _live_summarizers()
    else:
        closer = None
    loop = asyncio.new_event_loop()
    try:
        for name, config in configs.items():
            bar.label = name
            if config is None:
                for s, r in zip(sessions, results, strict=True):
                    r.tallies[name] = compaction.run(
                        s.turns, prices, options.summary_ratio, bar.tick
                    )
                continue
            run = ProxyRun(config, corpus.facts, prices, options, loop, summarizers)
            try:
                for s, r in zip(sessions, results, strict=True):
                    r.tallies[name] = run.session(s.turns, bar.tick)
            finally:
                run.close()
    finally:
        if closer is not None:
            loop.run_until_complete(closer())
        loop.close()
    totals = {n: Tally() for n in names}
    for r in results:
        for n in names:
            totals[n].add(r.tallies[n])
    summarizer = (
        f"the model {model} (real calls)"
        if model
        else f"a deterministic stand-in ({options.summary_ratio:g} x the covered tokens)"
    )
    return Result(
        presets=names,
        sessions=results,
        totals=totals,
        how=HOW.format(summarizer=summarizer, date=prices.date),
        warnings=list(corpus.warnings),
        seconds=corpus.seconds + time.monotonic() - t0,
        tokens_exact=corpus.facts.tokens.exact,
    )


def _label(s: Session[SimTurn]) -> str:
    where = s.turns[0].request.where
    return Path(where.rsplit("#", 1)[0].rsplit(":", 1)[0]).stem


def _live_summarizers() -> tuple[SummarizerFactory, Callable[[], Any]]:
    from cg.summarize.client import HttpPool, SummarizerClient, timeout_from_env

    pool = HttpPool()
    timeout = timeout_from_env()

    def make(cfg: Any, level: str) -> Any:
        return SummarizerClient(cfg, pool, level=level, timeout=timeout)

    return make, pool.aclose


def stderr_warn(msg: str) -> None:
    print(f"context-guru simulate: {msg}", file=sys.stderr)
