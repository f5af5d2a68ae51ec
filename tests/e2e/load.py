"""Load: many concurrent agent sessions through one real `mitmdump -s cg_addon.py`, on 127.0.0.1.

    python -m tests.e2e.load                             # 64 sessions x 50 turns, 15 min cap
    python -m tests.e2e.load --sessions 8 --turns 12 --json out.json

Each session is one agent (anthropic or openai, half of them streaming) with its own session
header and a tag of its own in every message it writes; each turn sends the whole transcript so
far plus one assistant step and one user note (~200 tokens), as an agent does. The proxy runs the
summarize preset with triggers low enough that every session is summarized a few times (a first
summary, then roll-forwards), and the fake provider (tests/support/fakeprovider.py) writes each summary
from the tags it was shown. The figures, and what must hold:

    failures      requests that did not get a 200 with a readable answer: none (the fake answers
                  every request it receives, so without the addon none fails)
    summaries     commissioned = completed: none failed, timed out or was left running; every
                  session had a summary spliced
    isolation     no request the provider received carries another session's tag (a foreign
                  checkpoint or stash would); every stash a marker names belongs to the session
                  that carried the marker and holds only its tag (`/_cg/expand`)
    memory        the proxy's RSS after a warm-up session (`warm`), then sampled every 0.5 s
                  (mid-run, peak, end), and the growth over `warm` per session
    store         its SQLite file's size on disk (the file and its -wal and -shm) and the
                  stashes' bytes as the store counts them, sampled with the RSS (peak, each
                  wave's end); with `--max-mb N` (the config's `store.max_mb`), the file stays
                  within N and the stashes within their share (STASH_SLACK says how), and each wave's
                  markers are checked at its end (a marker whose stash was evicted: `gone`)
    time          wall time, and p50/p99 of the request latency through the proxy

The run is bounded (`--seconds`) and stops by itself; every process it starts it stops by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from contextlib import closing, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from cg.state.policy import STASH_SHARE
from tests.e2e.harness import Proxy, low, start_summarize
from tests.support.fakeprovider import FakeProvider, Recorded, Reply

TAG = re.compile(r"\bS\d{3,}-[0-9a-f]{8}\b")  # 1,000 sessions and more: S1000-…
MARKER = re.compile(r"<<cg:([0-9a-f]{24})>>")
HEADER = "=== History Summary ==="
SESSION_HEADER = "x-context-guru-session"
FILLER = " ".join(f"w{i}" for i in range(120))  # ~150 tokens a message
# What `--max-mb` checks: the store's promise (`cg.state.policy`, STASH_SHARE). The SQLite file
# on disk (database, -wal and -shm together, sampled every 0.5 s) stays within max_mb; the
# stashes' bytes (SUM(stashes.size)) within their share of it, plus STASH_SLACK: a span is
# committed before the eviction it triggers runs, and a sample can fall between the two.
STASH_SLACK = 512 * 1024


def config(resummarize_tokens: int = 2500) -> dict[str, Any]:
    return low(min_messages=6, keep_last=3, resummarize_tokens=resummarize_tokens)


@dataclass
class Result:
    sessions: int
    turns: int
    requests: int = 0
    failures: list[str] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)
    seconds: float = 0.0
    latency_ms: dict[str, float] = field(default_factory=dict)
    summaries: dict[str, int] = field(default_factory=dict)
    spliced_sessions: int = 0
    stashes_checked: int = 0
    rss_mb: dict[str, float] = field(default_factory=dict)
    rss_per_session_mb: float = 0.0
    waves: int = 1
    wave_end_rss_mb: list[float] = field(default_factory=list)
    cut_short: bool = False
    max_mb: float | None = None  # the config's `store.max_mb`; None: the preset's (512)
    store_mb_peak: float = 0.0  # the SQLite file + -wal + -shm on disk, sampled with the RSS
    store_mb_peak_parts: list[float] = field(default_factory=list)  # database, -wal, -shm
    wave_end_store_mb: list[float] = field(default_factory=list)
    # each wave's highest sample: database + -wal (which of the two grew, and when)
    wave_peak_store_mb: list[tuple[float, float]] = field(default_factory=list)
    stash_mb_peak: float = 0.0  # SUM(stashes.size): what `max_mb` caps, as the store counts it
    wave_end_stash_mb: list[float] = field(default_factory=list)
    stash_mb_bound: float = 0.0  # with max_mb: the stashes' share of it + STASH_SLACK
    stashes_gone: int = 0  # with max_mb: markers whose stash was evicted (404), not leaks
    check_seconds: float = 0.0  # with max_mb: the per-wave isolation checks (not in `seconds`)

    def problems(self) -> list[str]:
        out = [*self.failures[:5], *self.leaks[:5]]
        s = self.summaries
        if s.get("commissioned") != s.get("completed"):
            out.append(f"summaries did not all complete: {s}")
        if self.spliced_sessions != self.sessions * self.waves:
            out.append(
                f"only {self.spliced_sessions} of {self.sessions * self.waves} sessions were "
                "spliced"
            )
        if self.cut_short:
            out.append("the run hit its time cap")
        out += self.store_problems()
        return out

    def store_problems(self) -> list[str]:
        """With `max_mb`: the file and the stashes within the store's promise (STASH_SLACK)."""
        if self.max_mb is None:
            return []
        out = []
        if self.store_mb_peak > self.max_mb:
            out.append(f"the store's files peaked at {self.store_mb_peak} MB: over {self.max_mb}")
        if self.stash_mb_peak > self.stash_mb_bound:
            out.append(
                f"the stashes peaked at {self.stash_mb_peak} MB: over their share of max_mb "
                f"({self.stash_mb_bound} MB with the slack)"
            )
        return out


def summarizer(rec: Recorded) -> Reply:
    """A summary naming the session tags the summarizer was shown (one, if all is well)."""
    tags = sorted(set(TAG.findall(rec.body.decode("utf-8", "replace"))))
    return Reply(text=f"<summary>The agent worked on {' '.join(tags)}.</summary>")


def store_parts(db: Path) -> tuple[int, int, int]:
    """The SQLite store's files' sizes on disk: the database, its -wal and its -shm."""
    sizes = [0, 0, 0]
    for i, suffix in enumerate(("", "-wal", "-shm")):
        with suppress(OSError):
            sizes[i] = os.path.getsize(f"{db}{suffix}")
    return sizes[0], sizes[1], sizes[2]


def store_bytes(db: Path) -> int:
    """The SQLite store's size on disk: the file and its -wal and -shm files."""
    return sum(store_parts(db))


def stash_bytes(db: Path) -> int | None:
    """The stashes' bytes as the store counts them against `max_mb` (`SUM(size)`, the spans'
    bytes: `Store.evict`), read on a connection of its own that writes nothing (a WAL reader
    never blocks the proxy's writers); None when the file cannot be read (not there yet)."""
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5.0)) as conn:
            row = conn.execute("SELECT COALESCE(SUM(size), 0) FROM stashes").fetchone()
    except sqlite3.Error:
        return None
    return int(row[0])


def mb(n: float) -> float:
    return round(n / 1024 / 1024, 1)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Sampler:
    """The proxy's RSS every `every` seconds, on a thread, until stopped; with `db`, its
    store's size on disk (`store`) and (time, stash bytes) when readable (`stash`) too."""

    def __init__(self, pid: int, every: float = 0.5, db: Path | None = None) -> None:
        self.pid, self.every, self.db = pid, every, db
        self.samples: list[tuple[float, int]] = []
        self.store: list[tuple[int, int, int]] = []  # store_parts
        self.stash: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss", daemon=True)

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.is_set():
            t = time.monotonic() - t0
            try:
                self.samples.append((t, rss_kb(self.pid)))
            except OSError:
                return
            if self.db is not None:
                self.store.append(store_parts(self.db))
                stashed = stash_bytes(self.db)
                if stashed is not None:
                    self.stash.append((t, stashed))
            self._stop.wait(self.every)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def anthropic_turn(tag: str, n: int) -> list[dict[str, Any]]:
    return [
        {"role": "assistant", "content": f"Step {n} for {tag}: I read the code. {FILLER}"},
        {"role": "user", "content": f"Note {n} for {tag}: go on. {FILLER}"},
    ]


async def session(
    client: httpx.AsyncClient,
    i: int,
    turns: int,
    result: Result,
    lat: list[float],
    end: float,
    prefix: str = "S",
) -> None:
    """One agent: `turns` turns, each the whole transcript so far plus one step and a note."""
    tag = f"{prefix}{i:03d}-{uuid.uuid4().hex[:8]}"
    dialect = "anthropic" if i % 2 == 0 else "openai"
    stream = i % 4 in (2, 3)
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"Task {tag}: fix the parser."}]
    if dialect == "openai":
        messages.insert(0, {"role": "system", "content": "You are a coding agent."})
    headers = {SESSION_HEADER: tag, "x-api-key": "sk-load", "authorization": "Bearer sk-load"}
    for n in range(turns):
        if time.monotonic() > end:
            result.cut_short = True
            return
        if n:
            messages += anthropic_turn(tag, n)
        body: dict[str, Any] = {"model": "fake-model", "messages": messages}
        if dialect == "anthropic":
            body["max_tokens"] = 64
            path = "/v1/messages"
        else:
            path = "/v1/chat/completions"
        if stream:
            body["stream"] = True
        t0 = time.monotonic()
        try:
            r = await client.post(path, json=body, headers=headers)
            text = r.text
        except httpx.HTTPError as e:
            result.failures.append(f"{tag} turn {n}: {type(e).__name__}: {e}")
            continue
        lat.append(time.monotonic() - t0)
        result.requests += 1
        ok = r.status_code == 200 and (
            "message_stop" in text or "[DONE]" in text if stream else '"usage"' in text
        )
        if not ok:
            result.failures.append(f"{tag} turn {n}: HTTP {r.status_code}: {text[:200]}")


def check_isolation(
    fake: FakeProvider, proxy: Proxy | None, result: Result, since: int = 0
) -> None:
    """Over the requests the provider received from the `since`-th on (adds to `result`); with
    `result.max_mb`, a marker that no longer resolves is a stash evicted under the cap."""
    spliced: set[str] = set()
    keys: dict[str, set[str]] = {}
    for rec in fake.requests[since:]:
        if rec.is_summarizer:
            continue
        tag = rec.header(SESSION_HEADER)
        if tag is None or not TAG.fullmatch(tag):
            continue  # not a session of the run (the warm-up's are W…)
        text = rec.body.decode("utf-8", "replace")
        foreign = set(TAG.findall(text)) - {tag}
        if foreign:
            result.leaks.append(f"{tag}'s request carried {sorted(foreign)}")
        if HEADER in text:
            spliced.add(tag)
            for key in MARKER.findall(text):
                keys.setdefault(key, set()).add(tag)
    result.spliced_sessions += len(spliced)
    if proxy is None or not keys:
        return
    with proxy.client(timeout=30.0) as c:
        for key, owners in keys.items():
            r = c.get("/_cg/expand", params={"id": key})
            if r.status_code == 404 and result.max_mb is not None:
                result.stashes_gone += 1
                continue
            if r.status_code != 200:
                result.leaks.append(f"marker {key} does not resolve: HTTP {r.status_code}")
                continue
            doc = r.json()
            result.stashes_checked += 1
            if owners != {doc["session"]}:
                result.leaks.append(f"stash {key} of {doc['session']} named by {sorted(owners)}")
            held = set(TAG.findall(json.dumps(doc["messages"]))) - {doc["session"]}
            if held:
                result.leaks.append(f"stash {key} of {doc['session']} holds {sorted(held)}")


async def drive(
    url: str,
    sessions: int,
    turns: int,
    result: Result,
    cap: float,
    prefix: str = "S",
    first: int = 0,
) -> list[float]:
    lat: list[float] = []
    limits = httpx.Limits(max_connections=sessions, max_keepalive_connections=sessions)
    end = time.monotonic() + cap
    async with httpx.AsyncClient(
        base_url=url, trust_env=False, timeout=120.0, limits=limits
    ) as client:
        await asyncio.gather(
            *(session(client, first + i, turns, result, lat, end, prefix) for i in range(sessions))
        )
    return lat


def run(
    sessions: int = 64,
    turns: int = 50,
    workdir: Path | None = None,
    seconds: float = 900.0,
    resummarize_tokens: int = 2500,
    waves: int = 1,
    max_mb: float | None = None,
) -> Result:
    """One load run of `waves` waves of `sessions` concurrent sessions, each wave new ones on
    the same proxy (the RSS at each wave's end shows whether memory grows with the sessions
    seen, or stays flat); `max_mb`, if given, is the config's `store.max_mb`. The caller
    decides what to assert (`Result.problems()`)."""
    workdir = workdir or Path(tempfile.mkdtemp(prefix="cg-load-"))
    result = Result(sessions, turns, waves=waves, max_mb=max_mb)
    db = workdir / "cg.sqlite3"  # start_summarize's default `cg_db`
    store = None if max_mb is None else {"max_mb": max_mb}
    with FakeProvider() as fake:
        fake.summarizer_responder = summarizer
        proxy = start_summarize(fake.url, workdir, config(resummarize_tokens), db=db, store=store)
        try:
            # Warm-up, not counted: one short session loads the tokenizer and fills the caches
            # a first request fills, so the baseline is the proxy at work, not at rest.
            asyncio.run(drive(proxy.url, 1, 8, Result(1, 8), seconds, prefix="W"))
            base = rss_kb(proxy.proc.pid)
            t0 = time.monotonic()
            with Sampler(proxy.proc.pid, db=db) as rss:
                lat: list[float] = []
                end = time.monotonic() + seconds
                checked = 0.0  # seconds spent in per-wave isolation checks
                sampled = 0  # store samples read into wave_peak_store_mb
                for wave in range(waves):
                    left = max(end - time.monotonic(), 0.0)
                    since = len(fake.requests)
                    first = wave * sessions
                    lat += asyncio.run(drive(proxy.url, sessions, turns, result, left, "S", first))
                    # the summaries still running: until every commissioned one ended
                    deadline = time.monotonic() + 120
                    while time.monotonic() < deadline:
                        s = proxy.stats()["summaries"]
                        if s["commissioned"] == s["completed"] + s["failed"] + s["timed_out"]:
                            break
                        threading.Event().wait(0.2)  # a bounded poll of the proxy's counters
                    result.wave_end_rss_mb.append(round(rss_kb(proxy.proc.pid) / 1024, 1))
                    result.wave_end_store_mb.append(mb(store_bytes(db)))
                    wave_samples, sampled = rss.store[sampled:], len(rss.store)
                    top = max(wave_samples, key=sum, default=(0, 0, 0))
                    result.wave_peak_store_mb.append((mb(top[0]), mb(top[1])))
                    result.wave_end_stash_mb.append(mb(stash_bytes(db) or 0))
                    if max_mb is not None:
                        # A capped store evicts the older waves' stashes (least recently used
                        # first): each wave's markers are checked at its end, while newest.
                        c0 = time.monotonic()
                        check_isolation(fake, proxy, result, since)
                        checked += time.monotonic() - c0
            result.seconds = round(time.monotonic() - t0 - checked, 1)
            result.check_seconds = round(checked, 1)
            stats = proxy.stats()
            result.summaries = {
                k: stats["summaries"][k]
                for k in ("commissioned", "completed", "failed", "timed_out", "reused")
            }
            if max_mb is None:
                check_isolation(fake, proxy, result)
            kb = [k for _, k in rss.samples if k]
            if kb:
                result.rss_mb = {
                    "warm": round(base / 1024, 1),
                    "mid": round(kb[len(kb) // 2] / 1024, 1),
                    "peak": round(max(kb) / 1024, 1),
                    "end": round(kb[-1] / 1024, 1),
                    "samples": len(kb),
                }
                result.rss_per_session_mb = round((max(kb) - base) / 1024 / sessions, 2)
            peak = max(rss.store, key=sum, default=(0, 0, 0))
            result.store_mb_peak = mb(sum(peak))
            result.store_mb_peak_parts = [mb(n) for n in peak]
            result.stash_mb_peak = mb(max((b for _, b in rss.stash), default=0))
            if max_mb is not None:
                result.stash_mb_bound = mb(max_mb * 1024 * 1024 * STASH_SHARE + STASH_SLACK)
            if lat:
                q = statistics.quantiles(lat, n=100) if len(lat) >= 2 else lat * 99
                result.latency_ms = {
                    "p50": round(statistics.median(lat) * 1000, 1),
                    "p99": round(q[98] * 1000, 1),
                    "max": round(max(lat) * 1000, 1),
                }
        finally:
            proxy.stop()
        errors = proxy.addon_errors()
        if errors:
            result.failures.append(f"the proxy logged addon errors: {errors[:3]}")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--turns", type=int, default=50)
    ap.add_argument("--waves", type=int, default=1, help="rounds of new sessions, one proxy")
    ap.add_argument("--seconds", type=float, default=900.0, help="the run's time cap")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument(
        "--max-mb", type=float, help="the store's size cap (`store.max_mb`), checked on the run"
    )
    args = ap.parse_args(argv)
    result = run(
        args.sessions, args.turns, seconds=args.seconds, waves=args.waves, max_mb=args.max_mb
    )
    doc = {**asdict(result), "problems": result.problems()}
    doc["failures"] = result.failures[:20]
    doc["leaks"] = result.leaks[:20]
    text = json.dumps(doc, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 1 if result.problems() else 0


if __name__ == "__main__":
    sys.exit(main())
