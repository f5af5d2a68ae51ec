"""Crash safety: `kill -9` the proxy while summaries and stash writes are in flight, restart it on
the same SQLite file, again and again.

    python -m tests.e2e.crash                     # 20 rounds, 24 sessions each
    python -m tests.e2e.crash --rounds 3 --json out.json

Each round starts `mitmdump -s cg_addon.py` on the one file, drives concurrent sessions through
it (tests/e2e/load.py's agents; the fake provider takes a moment over each summary, so several
are always in flight), waits until summaries have completed and others are still running, and
SIGKILLs the process. Then, with the process gone:

    the file      opens; `PRAGMA integrity_check` is ok
    checkpoints   none points at a stash that is not there (its key, owned by its session)
    restart       a proxy on the same file answers /_cg/health with the store ok, and every
                  checkpoint's stash resolves through /_cg/expand

Every process is stopped by its PID; every wait is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sqlite3
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.e2e.harness import poll, start_summarize
from tests.e2e.load import Result, config, drive, summarizer
from tests.support.fakeprovider import FakeProvider, Recorded, Reply

ORPHANS = """
SELECT c.session, c.key FROM checkpoints c
WHERE c.key IS NOT NULL AND NOT EXISTS (
    SELECT 1 FROM stashes s WHERE s.key = c.key AND s.session = (
        CASE WHEN instr(c.session, '#') > 0
             THEN substr(c.session, 1, instr(c.session, '#') - 1) ELSE c.session END))
"""


@dataclass
class Round:
    killed_with_in_flight: int = 0  # summaries commissioned but not ended at the kill
    completed_before: int = 0
    checkpoints: int = 0
    stashes: int = 0
    integrity: str = ""
    orphans: list[str] = field(default_factory=list)
    restart_ok: bool = False
    unresolved: list[str] = field(default_factory=list)


def slow_summarizer(rec: Recorded) -> Reply:
    """The load's summarizer, a little slow: summaries overlap the kill."""
    threading.Event().wait(random.uniform(0.05, 0.4))  # cg: allow-sleep: a summarizer at work
    return summarizer(rec)


def inspect(db: Path, r: Round) -> list[tuple[str, str]]:
    conn = sqlite3.connect(db)
    try:
        r.integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
        r.checkpoints = conn.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0]
        r.stashes = conn.execute("SELECT COUNT(*) FROM stashes").fetchone()[0]
        r.orphans = [f"{s} -> {k}" for s, k in conn.execute(ORPHANS).fetchall()]
        keys = conn.execute("SELECT key FROM checkpoints WHERE key IS NOT NULL").fetchall()
    finally:
        conn.close()
    return [(k, "") for (k,) in keys]


def one_round(fake: FakeProvider, db: Path, workdir: Path, sessions: int) -> Round:
    r = Round()
    proxy = start_summarize(fake.url, workdir, config(resummarize_tokens=1200), db=db)
    result = Result(sessions, 40)
    driver = threading.Thread(
        target=lambda: asyncio.run(drive(proxy.url, sessions, 40, result, 60.0)),
        name="crash-load",
        daemon=True,
    )
    try:
        driver.start()
        want = random.randint(2, 3 * sessions)
        for _ in poll(60.0):
            s = proxy.stats()["summaries"]
            running = s["commissioned"] - s["completed"] - s["failed"] - s["timed_out"]
            if s["completed"] >= want and running > 0:
                r.killed_with_in_flight, r.completed_before = running, s["completed"]
                break
        os.kill(proxy.proc.pid, signal.SIGKILL)
        proxy.proc.wait(timeout=10)
    finally:
        proxy.stop()
        driver.join(timeout=90)
    keys = inspect(db, r)
    again = start_summarize(fake.url, workdir / "restart", config(), db=db)
    try:
        with again.client(timeout=10.0) as c:
            h = c.get("/_cg/health").json()
            r.restart_ok = h["ok"] is True and h["store"]["ok"] is True
            for key, _ in keys:
                if c.get("/_cg/expand", params={"id": key}).status_code != 200:
                    r.unresolved.append(key)
    finally:
        again.stop()
    return r


def run(rounds: int = 20, sessions: int = 24, workdir: Path | None = None) -> dict[str, Any]:
    workdir = workdir or Path(tempfile.mkdtemp(prefix="cg-crash-"))
    db = workdir / "cg.sqlite3"
    out: list[Round] = []
    t0 = time.monotonic()
    with FakeProvider() as fake:
        fake.summarizer_responder = slow_summarizer
        for n in range(rounds):
            out.append(one_round(fake, db, workdir / f"round-{n}", sessions))
    problems = [
        f"round {n}: {what}"
        for n, r in enumerate(out)
        for what in (
            *(["integrity " + r.integrity] if r.integrity != "ok" else []),
            *(f"orphan checkpoint {o}" for o in r.orphans),
            *([] if r.restart_ok else ["the restarted proxy's store is not ok"]),
            *(f"stash {k} does not resolve after the restart" for k in r.unresolved),
        )
    ]
    return {
        "rounds": rounds,
        "sessions": sessions,
        "seconds": round(time.monotonic() - t0, 1),
        "kills_with_summaries_in_flight": sum(1 for r in out if r.killed_with_in_flight),
        "summaries_in_flight_at_kills": sum(r.killed_with_in_flight for r in out),
        "checkpoints_at_end": out[-1].checkpoints if out else 0,
        "stashes_at_end": out[-1].stashes if out else 0,
        "problems": problems,
        "per_round": [asdict(r) for r in out],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--sessions", type=int, default=24)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    doc = run(args.rounds, args.sessions)
    text = json.dumps({k: v for k, v in doc.items() if k != "per_round"}, indent=1)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 1 if doc["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
