"""A full store's eviction with nothing to evict, timed: `python -m bench.evict [--stashes
12000] [--span-kb 2] [--max-mb 32] [--reps 20]`.

Why: `SqliteStore.evict` runs inline in whichever hook's write finds a minute gone since the last one
(or the stashes over their budget), on the proxy's event loop, so its time is a stall of every
flow in flight. This fills a real SQLite store the way the addon does (`put_stash`, spans of
`--span-kb`, the size bound evicting as it fills), then times `evict()` calls that find nothing
stale and nothing over the budget: the steady state of a busy store, once a minute.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any


def measure(stashes: int, span_kb: int, max_mb: float, reps: int) -> dict[str, Any]:
    from cg.state.sqlite import SqliteStore

    clock = [1_000_000.0]
    span = [json.dumps("x" * (span_kb * 1024))]
    with tempfile.TemporaryDirectory(prefix="cg-bench-evict-") as d:
        st = SqliteStore(Path(d) / "cg.sqlite3", max_mb=max_mb, now=lambda: clock[0])
        try:
            for i in range(stashes):
                st.put_stash(uuid.uuid4().hex[:24], f"s{i % 64}", span, "anthropic")
                clock[0] += 0.01
            clock[0] += 61
            st.evict()  # whatever the last puts left over
            times = []
            for _ in range(reps):
                clock[0] += 61
                t0 = time.perf_counter()
                result = st.evict()
                times.append((time.perf_counter() - t0) * 1000)
                if result.total:
                    raise RuntimeError(f"an eviction found work: {result}")  # not the steady state
            left = st.stats()
        finally:
            st.close()
    return {
        "stashes_put": stashes,
        "stashes_left": left.stashes,
        "stash_mb": round(left.stash_bytes / 2**20, 1),
        "file_mb": round(left.file_bytes / 2**20, 1),
        "evict_ms_median": round(statistics.median(times), 2),
        "evict_ms_max": round(max(times), 2),
        "reps": reps,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="A full store's no-op eviction, timed.")
    ap.add_argument("--stashes", type=int, default=12_000, help="stashes put (default 12000)")
    ap.add_argument("--span-kb", type=int, default=2, help="KB per stash (default 2)")
    ap.add_argument("--max-mb", type=float, default=32, help="the store's max_mb (default 32)")
    ap.add_argument("--reps", type=int, default=20, help="evictions timed (default 20)")
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args(argv)
    out = measure(args.stashes, args.span_kb, args.max_mb, args.reps)
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"{out['stashes_left']} stashes ({out['stash_mb']} MB, file {out['file_mb']} MB of "
            f"{args.max_mb:g}): evict() with nothing to do {out['evict_ms_median']} ms median, "
            f"{out['evict_ms_max']} ms max of {out['reps']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
