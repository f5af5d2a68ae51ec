"""Hot-path timings on a ~1 MiB, 400-message body: `python -m bench.hotpath [--json] [--check]`.

What runs per request (docs/behaviour.md#the-hot-path), step by step and together, for an Anthropic
body grown from a real Claude Code capture and its OpenAI equivalent (`bench/corpus.py`), on two
paths:

cold — no `MessageCache` (the first request of a session, or a cache miss): every message is
parsed and viewed.

    index_body                 decode, locate every message's span, parse each once, build views
      · its parts              the UTF-8 decode, the span walk (each message parsed by the C
                               scanner), the dialect views; and `json.loads` of the whole body,
                               for reference: the cost of parsing it all once, at C speed
    identity splice            `identity(n)` plan + `splice` (returns the original bytes object)
    validate_shape             the four list rules over the 400 views
    index+splice+validate      the three above in sequence: the budget line
    rewrite_body, no comps     what the addon runs with `cg_preset=off` (index + input validation)
    cut plan: splice+validate  keep messages[0], insert a summary, keep the last 3; splice, then
                               validate exactly as `rewrite_body` does (list rules on the plan's
                               views, introduced-violation diff, wire-role check on the new bytes)
    rewrite_body, cut comp     the whole rewrite with a component that returns that plan

warm — the steady state of an agent session: a `MessageCache` that has seen the previous turn,
which is this body without its last 2 messages (made by splicing, so every byte before them is
identical). Before each timed call, outside the timing, a fresh cache is primed with that turn,
so every call finds 398 messages known and parses 2.

    index_body                 as above, with the cache
    index_body, the previous   as above, but the previous turn's last message differs from
      last message changed     this turn's copy (Claude Code moves its cache breakpoint to the
                               last message every turn): 397 messages shared, found by a binary
                               search over the previous body's message boundaries
    index_body, the previous   as above, but the previous turn was itself read warm (from the
      turn read warm too       turn before it, untimed, before each call), as in a session:
                               it knows its messages' byte offsets over the prefix it shared,
                               and this turn finds the rest (`--ascii`: the bodies in ASCII)
    index+splice+validate      the budget line, with the cache
    rewrite_body, no comps     as above, with the cache (what the addon does per agent turn)

`--ascii` writes every non-ASCII character of the bodies as its JSON escape: an all-ASCII
transcript (an SDK app's), whose byte offsets are its character positions.

Each line is `--reps` timed calls after `--warmup` untimed ones, the steps of one body taken in
turn (round-robin) so that other load on the machine spreads over all of them; the garbage
collector stays on, as it is in the proxy. Median, p90 and min in milliseconds.

The budget: index + identity splice + validation under 5 ms median. `--check` exits 1 when the
warm line (a steady-state agent turn) misses it, and also reports whether the cold line meets it.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.corpus import TARGET_MESSAGES, anthropic_body, openai_body
from cg.pipeline.contract import RequestContext, Step
from cg.pipeline.rewrite import rewrite_body
from cg.wire.body import BodyIndex, MessageCache, index_body
from cg.wire.dialects import ANTHROPIC, OPENAI, Dialect
from cg.wire.jsonspan import walk_document
from cg.wire.shape import check_wire_roles, introduced, validate_shape
from cg.wire.splice import Insert, Keep, Plan, identity, plan_sources, plan_views, splice

BUDGET_MS = 5.0
BUDGET_STEP = "index+splice+validate"
NEW_PER_TURN = 2  # messages an agent turn appends: the assistant's tool call and its result

Timed = Callable[[], object]


@dataclass
class Line:
    """One timed line: `fn`, or, when `prime` is set, what `prime()` returns, made untimed
    before each timed call (a fresh cache that has seen the previous turn)."""

    path: str  # "cold" | "warm"
    step: str
    fn: Timed | None = None
    prime: Callable[[], Timed] | None = None


@dataclass
class Row:
    body: str
    path: str
    step: str
    median_ms: float
    p90_ms: float
    min_ms: float
    reps: int


def timeit(lines: list[Line], reps: int, warmup: int) -> list[list[float]]:
    """Samples in ms per line. Lines run round-robin, so a burst of load hits all of them alike."""

    def call(line: Line) -> Timed:
        if line.prime is not None:
            return line.prime()
        assert line.fn is not None
        return line.fn

    for _ in range(warmup):
        for line in lines:
            call(line)()
    gc.collect()
    out: list[list[float]] = [[] for _ in lines]
    clock = time.perf_counter
    for _ in range(reps):
        for line, samples in zip(lines, out, strict=True):
            fn = call(line)
            t0 = clock()
            fn()
            samples.append((clock() - t0) * 1000.0)
    return out


def p90(samples: list[float]) -> float:
    s = sorted(samples)
    return s[max(0, math.ceil(0.9 * len(s)) - 1)]


def summary_insert(dialect: Dialect) -> Insert:
    text = (
        "<context-guru-summary>\nEarlier in this session the agent ran the test suite, read "
        "src/app/config.py and src/app/parser.py, found that Config.load crashed on an empty "
        "file, guarded it, and re-ran the failing tests, which now pass.\n</context-guru-summary>"
    )
    if dialect.name == "anthropic":
        return Insert.message(
            {"role": "user", "content": [{"type": "text", "text": text}]}, dialect
        )
    return Insert.message({"role": "user", "content": text}, dialect)


def cut_plan(n: int, summary: Insert) -> Plan:
    """Keep the first message, insert the summary, keep the last three."""
    return [Keep(0), summary, *(Keep(i) for i in range(n - 3, n))]


class CutMiddle:
    """A stand-in for `summarize` with its summary already made (a reused checkpoint)."""

    name = "cut-middle"

    def __init__(self, summary: Insert) -> None:
        self.summary = summary

    def apply(self, req: RequestContext, plan: Plan) -> Step:
        index = req.index
        return Step(cut_plan(len(index.messages), self.summary), "bench")


def validate_cut(index: BodyIndex, plan: Plan, new: bytes, before: list[Any]) -> list[Any]:
    """The post-splice checks of `rewrite_body`, in the same order."""
    d = index.dialect
    after = validate_shape(plan_views(index, plan), d)
    sources = plan_sources(plan)
    bad = introduced(before, after, sources)
    wire = check_wire_roles(new, d)
    before_roles = {f"m{i}" for i, m in enumerate(index.views) if m.role not in d.wire_roles}
    bad += [v for v in wire if v.index < 0 or sources[v.index] not in before_roles]
    return bad


def previous_turn(index: BodyIndex) -> bytes:
    """The body as the agent sent it one turn earlier: the same bytes without the last 2
    messages (a splice, so everything before them, and after the array, is byte-identical)."""
    return splice(index, identity(len(index.messages) - NEW_PER_TURN))


def moved_breakpoint(prev: BodyIndex) -> BodyIndex:
    """`prev` as Claude Code sends it: its last message carried the cache breakpoint that this
    turn's copy of it no longer has (here: one byte more), so a turn shares only the messages
    before it and the cache finds how many by a binary search over message boundaries."""
    start = prev.messages[-1].start + 1  # just inside the message object's `{`
    moved = index_body((prev.text[:start] + " " + prev.text[start:]).encode("utf-8"), prev.dialect)
    moved.byte_ends()  # as the turns before it leave it (computed incrementally, turn by turn)
    return moved


def primed(prev: BodyIndex) -> MessageCache:
    """A fresh cache that has seen `prev`, exactly as `index_body(prev_raw, d, cache)` leaves it."""
    cache = MessageCache()
    cache.remember(prev)
    return cache


def check_corpus(name: str, raw: bytes, dialect: Dialect) -> dict[str, Any]:
    """Sanity checks, outside the timings: the benchmark measures what it claims to."""
    index = index_body(raw, dialect)
    n = len(index.messages)
    assert n == TARGET_MESSAGES, f"{name}: {n} messages"
    assert validate_shape(index.views, dialect) == [], f"{name}: input has violations"
    assert splice(index, identity(n)) is raw
    result = rewrite_body(raw, dialect, [])
    assert result.outcome == "passed_through", result.record
    assert result.record["reason"] == "no components in the pipeline", result.record
    summary = summary_insert(dialect)
    plan = cut_plan(n, summary)
    new = splice(index, plan)
    assert validate_cut(index, plan, new, []) == [], f"{name}: cut plan introduced violations"
    out = index_body(new, dialect)
    assert [out.source(i) for i in (0, 2, 3, 4)] == [
        index.source(i) for i in (0, n - 3, n - 2, n - 1)
    ]
    assert out.source(1) == summary.json
    cut = rewrite_body(raw, dialect, [CutMiddle(summary)])
    assert cut.outcome == "rewritten" and cut.body == new, cut.record

    # The warm path: the previous turn shares every byte up to the end of message n-3.
    prev_raw = previous_turn(index)
    common = index.text[: index.messages[n - NEW_PER_TURN - 1].end].encode("utf-8")
    assert prev_raw.startswith(common) and raw.startswith(common)
    assert prev_raw.endswith(index.text[index.array.end :].encode("utf-8"))
    assert len(prev_raw) < len(raw)
    prev = index_body(prev_raw, dialect)
    assert len(prev.messages) == n - NEW_PER_TURN
    # priming with `remember` leaves the cache as indexing the previous turn through it does
    via_index = MessageCache()
    index_body(prev_raw, dialect, via_index)
    for cache in (primed(prev), via_index):
        warm = index_body(raw, dialect, cache)
        assert cache.hits == n - NEW_PER_TURN, f"{name}: {cache.hits} cache hits"
        assert [(m.start, m.end) for m in warm.messages] == [
            (m.start, m.end) for m in index.messages
        ]
        assert warm.views == index.views and warm.members.keys() == index.members.keys()
    # The moved breakpoint: the search finds all but the previous turn's last message shared.
    moved = moved_breakpoint(prev)
    warm = index_body(raw, dialect, primed(moved))
    assert warm.shared == n - NEW_PER_TURN - 1, f"{name}: {warm.shared} shared"
    assert warm.views == index.views
    # The chain: the previous turn read warm from the one before it, then this turn from it.
    chained = primed(index_body(previous_turn(prev), dialect))
    index_body(prev_raw, dialect, chained)
    warm = index_body(raw, dialect, chained)
    assert chained.prefix_hits == 2 and warm.shared == n - NEW_PER_TURN, f"{name}: chain cold"
    assert warm.byte_ends() == index.byte_ends(), f"{name}: chain's byte offsets"
    cache = primed(prev)
    result = rewrite_body(raw, dialect, [], cache=cache)
    assert result.outcome == "passed_through" and cache.hits == n - NEW_PER_TURN, result.record
    return {
        "bytes": len(raw),
        "messages": n,
        "cut_bytes": len(new),
        "previous_turn_bytes": len(prev_raw),
        "warm_cache_hits": n - NEW_PER_TURN,
    }


def bench_body(name: str, raw: bytes, dialect: Dialect, reps: int, warmup: int) -> list[Row]:
    index = index_body(raw, dialect)
    n = len(index.messages)
    summary = summary_insert(dialect)
    plan = cut_plan(n, summary)
    before = validate_shape(index.views, dialect)
    comp = [CutMiddle(summary)]
    prev = index_body(previous_turn(index), dialect)

    def budget(cache: MessageCache | None) -> None:
        ix = index_body(raw, dialect, cache)
        splice(ix, identity(len(ix.messages)))
        validate_shape(ix.views, dialect)

    def cut() -> None:
        new = splice(index, plan)
        validate_cut(index, plan, new, before)

    moved = moved_breakpoint(prev)
    before_prev = index_body(previous_turn(prev), dialect)

    def chain() -> Timed:
        """A cache that read the previous turn warm, from the one before it (untimed)."""
        cache = primed(before_prev)
        index_body(prev.raw, dialect, cache)
        return lambda: index_body(raw, dialect, cache)

    def warm(fn: Callable[[MessageCache], object], seen: BodyIndex = prev) -> Callable[[], Timed]:
        def prime() -> Timed:
            cache = primed(seen)
            return lambda: fn(cache)

        return prime

    text = raw.decode("utf-8")
    values = [m.value for m in index.messages]
    lines = [
        Line("cold", "index_body", lambda: index_body(raw, dialect)),
        Line("cold", "· utf-8 decode", lambda: raw.decode("utf-8")),
        Line("cold", "· walk_document (parse + spans)", lambda: walk_document(text, ("messages",))),
        Line("cold", f"· dialect.view × {n}", lambda: [dialect.view(v) for v in values]),
        Line("cold", "· ref: json.loads(body)", lambda: json.loads(raw)),
        Line("cold", "identity splice", lambda: splice(index, identity(n))),
        Line("cold", "validate_shape", lambda: validate_shape(index.views, dialect)),
        Line("cold", BUDGET_STEP, lambda: budget(None)),
        Line("cold", "rewrite_body, no components", lambda: rewrite_body(raw, dialect, [])),
        Line("cold", "cut plan: splice+validate", cut),
        Line("cold", "rewrite_body, cut component", lambda: rewrite_body(raw, dialect, comp)),
        Line("warm", "index_body", prime=warm(lambda c: index_body(raw, dialect, c))),
        Line(
            "warm",
            "index_body, the previous last message changed",
            prime=warm(lambda c: index_body(raw, dialect, c), moved),
        ),
        Line("warm", "index_body, the previous turn read warm too", prime=chain),
        Line("warm", BUDGET_STEP, prime=warm(budget)),
        Line(
            "warm",
            "rewrite_body, no components",
            prime=warm(lambda c: rewrite_body(raw, dialect, [], cache=c)),
        ),
    ]
    return [
        Row(name, line.path, line.step, statistics.median(s), p90(s), min(s), reps)
        for line, s in zip(lines, timeit(lines, reps, warmup), strict=True)
    ]


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu
            )
    except OSError:
        pass
    return {
        "cpu": cpu,
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "loadavg": os.getloadavg(),
    }


def markdown(rows: list[Row], bodies: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| body | path | step | median ms | p90 ms | min ms |",
        "|---|---|---|--:|--:|--:|",
    ]
    for r in rows:
        step = f"**{r.step}**" if r.step == BUDGET_STEP else r.step
        lines.append(
            f"| {r.body} | {r.path} | {step} | {r.median_ms:.3f} | {r.p90_ms:.3f} "
            f"| {r.min_ms:.3f} |"
        )
    sizes = ", ".join(
        f"{k}: {v['bytes']:,} bytes, {v['messages']} messages (cut: {v['cut_bytes']:,} bytes; "
        f"previous turn: {v['previous_turn_bytes']:,} bytes, {v['warm_cache_hits']} messages)"
        for k, v in bodies.items()
    )
    return "\n".join([f"Bodies — {sizes}; {rows[0].reps} reps per line.", "", *lines])


def verdict(rows: list[Row], path: str) -> tuple[bool, str]:
    budget = [r for r in rows if r.step == BUDGET_STEP and r.path == path]
    ok = all(r.median_ms < BUDGET_MS for r in budget)
    parts = ", ".join(f"{r.body} {r.median_ms:.2f} ms" for r in budget)
    word = "met" if ok else "NOT met"
    what = {
        "warm": "warm (steady-state agent turn, previous turn cached)",
        "cold": "cold (no cache: a session's first request)",
    }[path]
    return ok, f"{what}: {word} — {parts}."


def ascii_only(raw: bytes) -> bytes:
    """`raw` with every non-ASCII character written as its JSON escape: the same document, in
    ASCII. (JSON puts non-ASCII only inside strings, where an escape means the character.)"""
    text = raw.decode("utf-8")
    return re.sub(r"[^\x00-\x7f]", lambda m: json.dumps(m.group())[1:-1], text).encode("ascii")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.hotpath", description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=200, help="timed calls per line (default 200)")
    ap.add_argument("--warmup", type=int, default=20, help="untimed calls first (default 20)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a markdown table")
    ap.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when the warm (steady-state) budget line misses the budget",
    )
    ap.add_argument(
        "--dialect", choices=("anthropic", "openai", "both"), default="both", help="which body"
    )
    ap.add_argument(
        "--ascii",
        action="store_true",
        help="every non-ASCII character of the bodies escaped (\\uXXXX), as in an all-ASCII "
        "transcript (an SDK app's): a body's byte offsets are then its character positions",
    )
    args = ap.parse_args(argv)
    if args.reps < 1 or args.warmup < 0:
        ap.error("--reps must be >= 1 and --warmup >= 0")

    cases: list[tuple[str, bytes, Dialect]] = []
    if args.dialect in ("anthropic", "both"):
        cases.append(("anthropic", anthropic_body(), ANTHROPIC))
    if args.dialect in ("openai", "both"):
        cases.append(("openai", openai_body(), OPENAI))

    if args.ascii:
        cases = [(name, ascii_only(raw), d) for name, raw, d in cases]
    bodies = {name: check_corpus(name, raw, d) for name, raw, d in cases}
    rows = [r for name, raw, d in cases for r in bench_body(name, raw, d, args.reps, args.warmup)]
    warm_ok, warm_line = verdict(rows, "warm")
    cold_ok, cold_line = verdict(rows, "cold")
    if args.json:
        payload = {
            "machine": machine(),
            "budget_ms": BUDGET_MS,
            "budget_met": warm_ok,
            "budget_met_warm": warm_ok,
            "budget_met_cold": cold_ok,
            "bodies": bodies,
            "rows": [r.__dict__ for r in rows],
        }
        json.dump(payload, sys.stdout, indent=1)
        print()
    else:
        m = machine()
        load = " ".join(f"{x:.2f}" for x in m["loadavg"])
        print(f"{m['cpu']}, {m['nproc']} CPUs, Python {m['python']}, load average {load}\n")
        print(markdown(rows, bodies))
        print()
        print(f"Budget (index + identity splice + validation, median < {BUDGET_MS:g} ms):")
        print(f"- {warm_line}")
        print(f"- {cold_line}")
    if args.check:
        print(
            f"--check: {'pass' if warm_ok else 'FAIL'} (checks the warm line; the cold line "
            f"{'meets' if cold_ok else 'does not meet'} the budget)",
            file=sys.stderr,
        )
    return 1 if (args.check and not warm_ok) else 0


if __name__ == "__main__":
    sys.exit(main())
