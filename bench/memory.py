"""Memory bound: RSS and the store's file after many sessions, in-process:
`python -m bench.memory`.

Every long-lived structure of the addon's hot path, as the addon holds them — one
`MessageCache`, one `FactsCache` (and its `TokenCounter`), the `summarize` component on a real
SQLite store (`store.max_mb` as configured), `ExpandPolicy` — sees `--sessions` distinct
sessions (default 10,000), each `--turns` growing turns of a ~`--kb` KB transcript of its own
(every message unique, so nothing is shared between sessions), and then the same number again
(the soak: a bounded process stops growing). RSS (`/proc/self/status` VmRSS) and the store file
are sampled every 1,000 sessions. Summaries are commissioned and dropped (no model), so the
store holds what a proxy without a summarizer holds: session clocks and per-message facts.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from cg.pipeline.rewrite import ExpandPolicy, rewrite_body
from cg.state.facts import FactsCache
from cg.state.sqlite import SqliteStore
from cg.state.tokens import TokenCounter
from cg.summarize.component import Summarize
from cg.summarize.config import SummarizeConfig
from cg.wire.body import MessageCache
from cg.wire.dialects import ANTHROPIC


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def body(session: int, n: int, kb: int) -> bytes:
    text = f"session {session}: " + "lorem ipsum dolor sit amet " * max(1, kb * 1024 // n // 27)
    msgs = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"{i} {text}"} for i in range(n)
    ]
    return json.dumps({"model": "claude-sonnet-4-5", "messages": msgs}).encode()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--kb", type=int, default=20, help="transcript size per session (KB)")
    ap.add_argument("--max-mb", type=float, default=64.0, help="store.max_mb (default 64)")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="cg-memory-"))
    db = tmp / "cg.sqlite3"
    store = SqliteStore(db, max_mb=args.max_mb)
    tokens = TokenCounter()
    facts = FactsCache(tokens)
    cfg = SummarizeConfig.model_validate({"trigger": {"min_request_tokens": 1000}})
    comp = Summarize(cfg, store, tokens, facts=facts)
    cache = MessageCache()
    expand = ExpandPolicy("auto", store)
    gc.collect()
    start = rss_mb()
    print(f"RSS at start {start:.1f} MB; load {os.getloadavg()[0]:.2f}", file=sys.stderr)
    rows = []
    t0 = time.perf_counter()
    for phase in ("sessions", "soak"):
        for s in range(args.sessions):
            sid = s + (args.sessions if phase == "soak" else 0)
            for t in range(args.turns):
                raw = body(sid, 6 + 2 * t, args.kb)
                r = rewrite_body(
                    raw,
                    ANTHROPIC,
                    [comp],
                    headers={"x-context-guru-session": f"mem-{sid}"},
                    cache=cache,
                    expand=expand,
                )
                for c, job in r.commissions:
                    c.abandon(job)  # type: ignore[attr-defined]
            facts.flush()
            if (s + 1) % 1000 == 0:
                gc.collect()
                size = sum(p.stat().st_size for p in tmp.iterdir()) / 1e6
                rows.append((phase, s + 1, rss_mb(), size))
                print(f"  {phase} {s + 1}: RSS {rows[-1][2]:.1f} MB, store {size:.1f} MB",
                      file=sys.stderr)  # fmt: skip
    store.evict()
    final = sum(p.stat().st_size for p in tmp.iterdir()) / 1e6
    dt = time.perf_counter() - t0
    print(
        f"{args.sessions:,} sessions x {args.turns} turns (~{args.kb} KB each), then as many "
        f"again; store.max_mb {args.max_mb:g}; {dt:.0f} s; load {os.getloadavg()[0]:.2f}\n"
    )
    print("| phase | sessions | RSS MB | store files MB |\n|---|--:|--:|--:|")
    print(f"| start | 0 | {start:.1f} | 0 |")
    for phase, n, rss, size in rows:
        print(f"| {phase} | {n:,} | {rss:.1f} | {size:.1f} |")
    print(f"\nstore files after evict(): {final:.1f} MB")
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
