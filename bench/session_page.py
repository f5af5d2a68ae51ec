"""The session list at 10k sessions: `python -m bench.session_page`.

A store of `--sessions` sessions (default 10,000; half with checkpoints, every tenth of those
with three conversations, each with a ledger row, usage rows, a session clock, and a stash per
checkpoint) is written straight into an SQLite file (`populate`: one transaction, not 10k
`put_checkpoint` calls), then served by a real `mitmdump -s cg_addon.py` in reverse mode in
front of `bench.proxy_latency`'s upstream. Measured, on 127.0.0.1:

    page        `GET /_cg/sessions` (the first page, then the pages after it by `next`), and
                `GET /_cg/` (the dashboard), one after the other from one client: the median
                and p90 over `--rounds` requests each
    small turn  a small agent turn (`POST /v1/messages`, ~100 bytes) sent every `--pause`
                seconds by a second client, alone first and then while the first client fetches
                the pages: its median, p90 and the slowest, and the same for `/_cg/health`

`--main PATH` measures the same against another checkout of context-guru too (say a clone of
main at 30e9709: `git clone -q /work/main /tmp/cg-main && git -C /tmp/cg-main checkout -q
30e9709`), on a store built by that checkout's own schema, with `--main-rounds` requests (the
whole list at once: seconds each), and reports each figure's ratio.

Budget (issue 29): a page under 200 ms at 10k sessions, and a small turn within 250 ms while
pages are being fetched. Every process is started and stopped by its PID; every wait has a
deadline.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.proxy_latency import (
    HOST,
    ROOT,
    Proc,
    free_port,
    mitmdump,
    pct,
    start,
    start_upstream,
    wait_for_addon,
)

MODEL = "claude-sonnet-4-5"
SUMMARIZER = "claude-haiku-4-5"
TURN_BODY = json.dumps(
    {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
).encode()
TURN_HEADERS = {
    "content-type": "application/json",
    "anthropic-version": "2023-06-01",
    "x-api-key": "sk-ant-bench",
}
SPAN = '[{"role":"user","content":"a stashed message of the bench"}]'


def session_id(i: int) -> str:
    return f"bench-{i:06d}"


# table -> its columns, as `rows` gives them (the SQLite names; PostgreSQL's are `cg_` + these)
COLUMNS = {
    "ledger": "session, turns, rewritten, tokens_not_sent, estimate_skipped, cache_state, "
    "last_seen",
    "usage": "session, kind, model, tier, input_tokens, cache_write_tokens, "
    "cache_write_1h_tokens, cache_read_tokens, output_tokens, requests, updated",
    "sessions": "session, last_request, cache_ttl",
    "checkpoints": "session, summary, head_count, covered_count, covered_hash, key, message, "
    "created, updated",
    "stashes": "key, session, created, last_used, size, dialect, count, span",
}
Row = tuple[str | int | float | bytes | None, ...]


def rows(
    sessions: int = 10_000, checkpointed: int = 2, conversations: int = 3, now: float | None = None
) -> dict[str, list[Row]]:
    """Each table's rows for `sessions` sessions: session `i` (id `session_id(i)`) last seen
    `i` seconds before `now`; one in `checkpointed` with a checkpoint (one in ten of those with
    `conversations` of them, keys `id#conversation`) and its stash; every one with a ledger
    row, agent and estimate usage rows (a summarizer row too with a checkpoint) and a session
    clock."""
    t0 = time.time() if now is None else now
    out: dict[str, list[Row]] = {table: [] for table in COLUMNS}
    for i in range(sessions):
        sid, seen = session_id(i), t0 - i
        cp = i % checkpointed == 0
        out["ledger"].append((sid, 3, int(cp), 900 * (i % 7), 0, None, seen))
        out["usage"].append((sid, "agent", MODEL, "", 1200, 300, 0, 5000, 80, 3, seen))
        out["usage"].append((sid, "estimate", MODEL, "", 1500, 900, 0, 4000, 80, 3, seen))
        out["sessions"].append((sid, seen, 300.0))
        if not cp:
            continue
        out["usage"].append((sid, "summarizer", SUMMARIZER, "", 4000, 0, 0, 0, 300, 1, seen))
        for c in range(conversations if i % (10 * checkpointed) == 0 else 1):
            conv = hashlib.blake2b(f"{sid}/{c}".encode(), digest_size=8).hexdigest()
            key = hashlib.blake2b(f"{sid}/{c}/stash".encode(), digest_size=12).hexdigest()
            summary = f"=== History Summary ===\nsession {i}, conversation {c}: files read, a fix"
            message = json.dumps({"role": "user", "content": summary})
            at = seen - 1 - c
            out["checkpoints"].append(
                (f"{sid}#{conv}", summary, 1, 40, f"h{i}", key, message, at, at)
            )
            out["stashes"].append((key, sid, at, at, len(SPAN), "anthropic", 1, SPAN.encode()))
    return out


def populate(
    path: Path,
    sessions: int = 10_000,
    python: str = sys.executable,
    tree: Path = ROOT,
    **kw: int,
) -> None:
    """Write `rows(sessions, **kw)` straight into the SQLite store at `path`, in one
    transaction. The file is created by the store of the checkout at `tree` (its schema), run
    by `python`."""
    code = "import sys; from cg.state.sqlite import SqliteStore; SqliteStore(sys.argv[1], evict=False).close()"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([python, "-c", code, str(path)], check=True, cwd=tree, env=env)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        for table, data in rows(sessions, **kw).items():
            cols = COLUMNS[table]
            have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
            if "tenant" in have:  # (a store with tenancy: these rows are unbound, as migrated)
                cols += ", tenant"
                data = [(*r, "*") for r in data]
            marks = ", ".join("?" * len(cols.split(",")))
            conn.executemany(f"INSERT INTO {table} ({cols}) VALUES ({marks})", data)
        conn.execute("COMMIT")
        conn.execute("ANALYZE")
    finally:
        conn.close()


# -- measuring ---------------------------------------------------------------------------------


@dataclass
class Figures:
    """Milliseconds per request kind."""

    samples: dict[str, list[float]] = field(default_factory=dict)

    def add(self, kind: str, ms: float) -> None:
        self.samples.setdefault(kind, []).append(ms)

    def line(self, kind: str) -> dict[str, float]:
        s = self.samples.get(kind) or [float("nan")]
        return {"n": len(s), "median": statistics.median(s), "p90": pct(s, 90), "max": max(s)}


def _timed(send: Callable[[], httpx.Response]) -> tuple[float, httpx.Response]:
    t0 = time.perf_counter()
    r = send()
    return (time.perf_counter() - t0) * 1000.0, r


def _turns(base: str, figures: Figures, kind: str, stop: threading.Event, pause: float) -> None:
    """A small turn and a health check every `pause` s until `stop` (one client of its own)."""
    gap = threading.Event()  # never set: a bounded pause between turns
    with httpx.Client(base_url=base, trust_env=False, timeout=120.0) as c:
        while not stop.is_set():
            ms, r = _timed(lambda: c.post("/v1/messages", content=TURN_BODY, headers=TURN_HEADERS))
            if r.status_code != 200:
                raise RuntimeError(f"small turn: HTTP {r.status_code}: {r.text[:200]}")
            figures.add(f"{kind} turn", ms)
            ms, r = _timed(lambda: c.get("/_cg/health"))
            figures.add(f"{kind} health", ms)
            gap.wait(pause)


def _pages(base: str, figures: Figures, rounds: int) -> None:
    """`rounds` pages of `/_cg/sessions` (following `next`, from the first again at the end)
    and as many dashboards, alternately."""
    cursor: str | None = None
    with httpx.Client(base_url=base, trust_env=False, timeout=600.0) as c:
        for _ in range(rounds):
            path = f"/_cg/sessions?cursor={cursor}" if cursor else "/_cg/sessions"
            ms, r = _timed(functools.partial(c.get, path))
            figures.add("sessions page", ms)
            if r.status_code != 200:
                raise RuntimeError(f"/_cg/sessions: HTTP {r.status_code}: {r.text[:200]}")
            doc = r.json()
            if not doc.get("sessions"):
                raise RuntimeError(f"/_cg/sessions listed nothing: {r.text[:200]}")
            cursor = doc.get("next")
            ms, r = _timed(lambda: c.get("/_cg/"))
            if r.status_code != 200:
                raise RuntimeError(f"/_cg/: HTTP {r.status_code}")
            figures.add("dashboard", ms)


def measure(
    tree: Path, python: str, tmp: Path, sessions: int, rounds: int, pause: float, name: str
) -> Figures:
    """One checkout's figures: its store, its mitmdump, the turns alone, then under pages."""
    work = tmp / name
    work.mkdir()
    db = work / "cg.sqlite3"
    t0 = time.perf_counter()
    populate(db, sessions, python=python, tree=tree)
    print(f"{name}: {sessions:,} sessions written in {time.perf_counter() - t0:.1f} s", flush=True)
    procs: list[Proc] = []
    figures = Figures()
    try:
        _, up = start_upstream(work, procs)
        port = free_port()
        argv = [mitmdump(), "--mode", f"reverse:http://{HOST}:{up}", "--listen-host", HOST]
        argv += ["--listen-port", str(port), "--set", f"confdir={work / 'confdir'}"]
        argv += ["-s", str(tree / "cg_addon.py"), "--set", f"cg_db={db}"]
        proc = _start_in(tree, python, f"{name}-mitmdump", argv, work)
        procs.append(proc)
        base = f"http://{HOST}:{port}"
        wait_for_addon(proc, base)
        with httpx.Client(base_url=base, trust_env=False, timeout=600.0) as c:  # warm-up, untimed
            c.post("/v1/messages", content=TURN_BODY, headers=TURN_HEADERS).raise_for_status()
        stop = threading.Event()
        stop_timer = threading.Timer(max(2.0, 40 * pause), stop.set)
        stop_timer.start()
        _turns(base, figures, "alone:", stop, pause)  # the turns with nothing else going on
        stop.clear()
        turns = threading.Thread(target=_turns, args=(base, figures, "under pages:", stop, pause))
        turns.start()
        try:
            _pages(base, figures, rounds)
        finally:
            stop.set()
            turns.join(600)
    finally:
        for p in reversed(procs):
            p.stop()
    return figures


def _start_in(tree: Path, python: str, name: str, argv: list[str], tmp: Path) -> Proc:
    """`start`, with the checkout at `tree` first on the path (its `cg`, not this one's)."""
    if tree == ROOT:
        return start(name, argv, tmp)
    log = tmp / f"{name}.log"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with log.open("wb") as f:
        popen = subprocess.Popen(
            argv, cwd=tree, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, env=env
        )
    return Proc(name, popen, log)


KINDS = (
    "sessions page",
    "dashboard",
    "alone: turn",
    "under pages: turn",
    "alone: health",
    "under pages: health",
)


def report(this: Figures, main: Figures | None, sessions: int) -> str:
    head = f"{sessions:,} sessions; ms"
    lines = [f"{head:<28} {'n':>4} {'median':>9} {'p90':>9} {'max':>9}"]
    for kind in KINDS:
        f = this.line(kind)
        row = f"{kind:<28} {f['n']:>4} {f['median']:>9.1f} {f['p90']:>9.1f} {f['max']:>9.1f}"
        if main is not None:
            m = main.line(kind)
            row += f"   main {m['median']:>9.1f} {m['p90']:>9.1f} {m['max']:>9.1f}"
            row += f"   main/this {m['median'] / f['median']:>7.1f}x"
        lines.append(row)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.session_page", description=__doc__)
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=40, help="pages and dashboards fetched")
    ap.add_argument("--pause", type=float, default=0.05, help="seconds between small turns")
    ap.add_argument("--main", type=Path, help="another checkout to measure the same way")
    ap.add_argument("--main-rounds", type=int, default=3)
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="cg-session-page-"))
    t0 = time.perf_counter()
    try:
        this = measure(ROOT, sys.executable, tmp, args.sessions, args.rounds, args.pause, "this")
        other = None
        if args.main is not None:
            other = measure(
                args.main.resolve(), sys.executable, tmp, args.sessions, args.main_rounds,
                args.pause, "main",
            )  # fmt: skip
        print(report(this, other, args.sessions))
        print(f"({time.perf_counter() - t0:.0f} s in all)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
