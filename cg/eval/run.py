"""`evaluate()`: replay recorded sessions through one preset, then ask the user's model what the
rewrite may have lost (docs/eval.md).

The replay is the simulator's (`cg.simulate.proxy.ProxyRun`: the preset's real pipeline offline,
a throwaway store, summaries by the stand-in unless a summary model is named). At each
checkpoint every probe is asked three times — of the client's request (`original`), of the
request as rewritten (`rewritten`), and of it with the expand tool answered from the replay's
store (`rewritten+expand`) — and scored by exact match. The asking happens once the whole plan is
known and confirmed (it spends the user's money), while the replay's store still holds the
stashes.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cg.billing.prices import PriceTable, price_table
from cg.eval.ask import CONDITIONS, Answer, Budget, Condition, Endpoint, ask, client, endpoint
from cg.eval.ask import probe_body as build_probe
from cg.eval.checkpoints import Checkpoint, collector
from cg.eval.probes import Probe, correct
from cg.expand.tool import resolve
from cg.retention.facts import KINDS
from cg.simulate.proxy import Options, ProxyRun, SummarizerFactory
from cg.simulate.run import _config, _label, _live_summarizers, load_corpus
from cg.simulate.trace import Warn
from cg.state import Store
from cg.wire.usage import Usage

DEFAULT_PROBES = 12
DEFAULT_CONCURRENCY = 4


@dataclass(frozen=True, slots=True)
class Plan:
    """What will be asked, before anything is: the calls it takes and where they go."""

    checkpoints: int
    probes: int  # asked (after --max-calls)
    left_out: int  # probes --max-calls leaves unasked
    calls: int  # one per probe and condition
    most_calls: int  # with every expand round taken (bounded by --max-calls)
    endpoints: dict[str, str]  # dialect -> URL
    models: list[str]

    def describe(self) -> str:
        if not self.probes:
            return f"{self.checkpoints} checkpoints, nothing to ask: no calls."
        where = ", ".join(f"{d} at {u}" for d, u in self.endpoints.items()) or "nowhere"
        models = ", ".join(self.models) or "(none)"
        extra = f"; {self.left_out} probes left out by --max-calls" if self.left_out else ""
        return (
            f"{self.probes} probes over {self.checkpoints} checkpoints: {self.calls} calls to "
            f"{models} ({where}), up to {self.most_calls} with expand rounds{extra}. "
            "They are billed to your API key."
        )


@dataclass(slots=True)
class Asked:
    probe: Probe
    answers: dict[Condition, Answer] = field(default_factory=dict)

    def score(self, condition: Condition) -> bool | None:
        """1/0 by exact match; None when the call failed (an error, not a wrong answer)."""
        a = self.answers.get(condition)
        if a is None or a.error is not None:
            return None
        return correct(self.probe.expected, a.text)


@dataclass(slots=True)
class Scores:
    """Per condition and kind: correct, asked (answered), errors."""

    cells: dict[str, dict[str, list[int]]] = field(
        default_factory=lambda: {c: {k: [0, 0, 0] for k in KINDS} for c in CONDITIONS}
    )

    def add(self, asked: Asked) -> None:
        for c in CONDITIONS:
            if c not in asked.answers:
                continue
            cell = self.cells[c][asked.probe.kind]
            s = asked.score(c)
            if s is None:
                cell[2] += 1
            else:
                cell[0] += int(s)
                cell[1] += 1

    def merge(self, other: Scores) -> None:
        for c in CONDITIONS:
            for k in KINDS:
                for n in range(3):
                    self.cells[c][k][n] += other.cells[c][k][n]

    def total(self, condition: str) -> list[int]:
        cells = self.cells[condition].values()
        return [sum(cell[n] for cell in cells) for n in range(3)]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for c in CONDITIONS:
            right, asked, errors = self.total(c)
            out[c] = {
                "correct": right,
                "asked": asked,
                "errors": errors,
                "score": round(right / asked, 4) if asked else None,
                "by_kind": {
                    k: {"correct": v[0], "asked": v[1], "errors": v[2]}
                    for k, v in self.cells[c].items()
                    if any(v)
                },
            }
        return out


@dataclass(slots=True)
class CheckpointResult:
    checkpoint: Checkpoint
    asked: list[Asked]
    scores: Scores

    def to_json(self, answers: bool = True) -> dict[str, Any]:
        cp = self.checkpoint
        out: dict[str, Any] = {
            "session": cp.label,
            "turn": cp.turn,
            "dialect": cp.dialect,
            "span": cp.span,
            "replaced": len(cp.replaced),
            "ids": list(cp.keys),
            "facts": [{"kind": a.probe.kind, "text": a.probe.expected} for a in self.asked],
            "scores": self.scores.to_json(),
        }
        if answers:
            out["probes"] = [
                {
                    "kind": a.probe.kind,
                    "question": a.probe.question,
                    "expected": a.probe.expected,
                    "answers": {
                        c: {
                            "correct": a.score(c),
                            "text": ans.text[:500],
                            "error": ans.error,
                            "expanded": ans.expanded,
                        }
                        for c, ans in a.answers.items()
                    },
                }
                for a in self.asked
            ]
        return out


@dataclass(slots=True)
class Result:
    preset: str
    checkpoints: list[CheckpointResult]
    totals: Scores
    usage: dict[str, Usage]  # model -> the probes' usage, as the provider reported it
    cost_usd: float | None  # None: some model has no price
    calls: int
    plan: Plan
    warnings: list[str]
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "preset": self.preset,
            "plan": {
                "checkpoints": self.plan.checkpoints,
                "probes": self.plan.probes,
                "left_out": self.plan.left_out,
                "calls": self.plan.calls,
                "most_calls": self.plan.most_calls,
            },
            "totals": self.totals.to_json(),
            "checkpoints": [c.to_json() for c in self.checkpoints],
            "calls": self.calls,
            "usage": {m: _usage_json(u) for m, u in self.usage.items()},
            "cost_usd": None if self.cost_usd is None else round(self.cost_usd, 6),
            "warnings": self.warnings,
            "seconds": round(self.seconds, 2),
        }


def _usage_json(u: Usage) -> dict[str, int]:
    return {
        "input_tokens": u.input_tokens,
        "cache_write_tokens": u.cache_write_tokens + u.cache_write_1h_tokens,
        "cache_read_tokens": u.cache_read_tokens,
        "output_tokens": u.output_tokens,
        "requests": u.requests,
    }


def _chosen(checkpoints: Sequence[Checkpoint], max_calls: int | None) -> int:
    """Cut each checkpoint's probes so that one call per probe and condition fits the bound,
    taking the checkpoints' probes in turn (the first of each, then the second, ...); returns
    how many were left out."""
    total = sum(len(cp.probes) for cp in checkpoints)
    if max_calls is None or total * len(CONDITIONS) <= max_calls:
        return 0
    room = max_calls // len(CONDITIONS)
    keep = [0] * len(checkpoints)
    depth = 0
    while room > 0 and any(keep[i] < len(cp.probes) for i, cp in enumerate(checkpoints)):
        for i, cp in enumerate(checkpoints):
            if room > 0 and depth < len(cp.probes):
                keep[i] += 1
                room -= 1
        depth += 1
    for i, cp in enumerate(checkpoints):
        del cp.probes[keep[i] :]
    return total - sum(keep)


def evaluate(
    paths: Sequence[str | Path],
    preset: str = "summarize",
    *,
    config_file: str | None = None,
    options: Options | None = None,
    summary_model: str | None = None,
    summarizers: SummarizerFactory | None = None,
    model: str | None = None,
    base_url: str | None = None,
    probes: int = DEFAULT_PROBES,
    seed: str = "0",
    concurrency: int = DEFAULT_CONCURRENCY,
    max_calls: int | None = None,
    confirm: Callable[[Plan], bool] = lambda plan: True,
    env: Mapping[str, str] | None = None,
    warn: Warn | None = None,
    prices: PriceTable | None = None,
) -> Result | None:
    """Replay `paths` under `preset`, then probe every checkpoint. None when `confirm` (shown
    the plan) says no. ValueError: bad input, a bad preset or config, no key for a dialect
    that has probes."""
    t0 = time.monotonic()
    env = os.environ if env is None else env
    corpus = load_corpus(paths, config_file, warn)
    config = _config(preset, config_file, summary_model)
    closer = None
    if summary_model is not None and summarizers is None:
        summarizers, closer = _live_summarizers()
    loop = asyncio.new_event_loop()
    table = prices or price_table()
    run = ProxyRun(config, corpus.facts, table, options or Options(), loop, summarizers)
    try:
        checkpoints: list[Checkpoint] = []
        labels = [_label(s) for s in corpus.sessions]
        for s, label in zip(corpus.sessions, labels, strict=True):
            if labels.count(label) > 1:  # several sessions in one file: as simulate names them
                label = f"{label}:{s.id[:8]}"
            observe = collector(label, s.turns, checkpoints, probes, seed)
            run.session(s.turns, observe=observe)
        left_out = _chosen(checkpoints, max_calls)
        dialects = sorted({cp.dialect for cp in checkpoints if cp.probes})
        endpoints = {d: endpoint(d, base_url, env) for d in dialects}
        asked_n = sum(len(cp.probes) for cp in checkpoints)
        calls = asked_n * len(CONDITIONS)
        most = calls + asked_n * 3  # every expand condition taking its 3 rounds
        models = sorted({model or cp.model for cp in checkpoints if cp.probes})
        plan = Plan(
            len(checkpoints),
            asked_n,
            left_out,
            calls,
            most if max_calls is None else min(most, max_calls),
            {d: e.url for d, e in endpoints.items()},
            models,
        )
        if asked_n and not confirm(plan):
            return None
        budget = Budget(max_calls, calls)
        results = loop.run_until_complete(
            _ask_all(checkpoints, endpoints, run.store, model, budget, concurrency)
        )
    finally:
        run.close()
        if closer is not None:
            loop.run_until_complete(closer())
        loop.close()
    totals = Scores()
    usage: dict[str, Usage] = {}
    cost: float | None = 0.0
    for r in results:
        totals.merge(r.scores)
        m = model or r.checkpoint.model
        for a in r.asked:
            for ans in a.answers.values():
                usage[m] = usage.get(m, Usage()) + ans.usage
                # Each answer at the tier of its own requests' size (a long-context price is
                # by the request, not by the sum).
                per = ans.usage.prompt_tokens // max(ans.usage.requests, 1)
                c = table.cost(m, ans.usage, table.tier(m, per)) if ans.usage.requests else 0.0
                cost = None if cost is None or c is None else cost + c
    return Result(
        preset,
        results,
        totals,
        usage,
        cost,
        budget.made,
        plan,
        list(corpus.warnings),
        time.monotonic() - t0,
    )


async def _ask_all(
    checkpoints: Sequence[Checkpoint],
    endpoints: Mapping[str, Endpoint],
    store: Store,
    model: str | None,
    budget: Budget,
    concurrency: int,
) -> list[CheckpointResult]:
    limit = asyncio.Semaphore(max(1, concurrency))
    out: list[CheckpointResult] = []
    async with client(budget) as http:
        jobs = []
        for cp in checkpoints:
            asked = [Asked(p) for p in cp.probes]
            out.append(CheckpointResult(cp, asked, Scores()))

            def answer(key: str, session: str = cp.session) -> str:
                return resolve(store, key, session)

            for a in asked:
                for c in CONDITIONS:
                    body = cp.original if c == "original" else cp.rewritten
                    req = build_probe(cp.dialect, body, a.probe.question, c, model)
                    ep = endpoints[cp.dialect]
                    jobs.append((a, c, ask(http, ep, cp.headers, req, c, answer, limit)))
        answers = await asyncio.gather(*(j[2] for j in jobs))
        for (a, c, _), ans in zip(jobs, answers, strict=True):
            a.answers[c] = ans
    for r in out:
        for a in r.asked:
            r.scores.add(a)
    return out
