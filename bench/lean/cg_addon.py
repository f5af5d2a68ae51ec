"""The least a script that meters every provider flow does: a budget, not a product.

`python -m bench.trees bench/floor bench/lean TREE --size 3000 --dialect anthropic --set
cg_preset=off` runs it beside the no-op floor, a tree and plain mitmdump. Why: the addon's cost
over the floor on a small turn is not what metering a flow must cost. This script
does each thing a metered pass-through flow needs, once and directly, so the difference
between it and the addon is what the addon's generality costs, not the job:

- request: the route (POST to `/v1/messages`, any query), the session (the `x-claude-code-session-id`
  header, else a blake2b of the body's first 4 KB: a stand-in for `session_of`, whose system
  and first message a small body holds whole), the flow remembered;
- response: the answer's `usage` read (`json.loads` of the body) and added to its session's
  sums in memory, committed to SQLite (WAL) at most once a second;
- the request's credential header redacted once the answer is read.

No decision record, no view, no index, no modelled cache, no estimate rows, no dashboard
history: what it leaves out is what the addon does beyond the bill. `/_cg/health` answers as
the addon's does (bench.trees takes it for a tree) and says what it booked, so a test can tell
that the figure measured a script that metered (tests/bench/test_proxy_latency.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
from typing import Any

from mitmproxy import ctx, http

CREDENTIALS = frozenset({b"x-api-key", b"authorization"})
USAGE_KEYS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens",
              "output_tokens")  # fmt: skip
COMMIT_S = 1.0


class Lean:
    def __init__(self) -> None:
        self.turns: dict[str, str] = {}  # flow id -> session, until its answer
        self.sums: dict[str, list[int]] = {}  # session -> USAGE_KEYS' sums, then answers
        self.committed = 0
        self.conn: sqlite3.Connection | None = None
        self.timer: asyncio.TimerHandle | None = None

    def load(self, loader: Any) -> None:
        loader.add_option("cg_preset", str, "off", "(bench.trees sets it; unused)")
        loader.add_option("cg_db", str, "", "the SQLite file the sums go to")

    def running(self) -> None:
        self.conn = sqlite3.connect(ctx.options.cg_db or ":memory:", isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS usage (session TEXT PRIMARY KEY, input INT, "
            "cache_write INT, cache_read INT, output INT, answers INT)"
        )

    def done(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.commit()
        if self.conn is not None:
            self.conn.close()

    def request(self, flow: http.HTTPFlow) -> None:
        req = flow.request
        if req.path.startswith("/_cg/"):
            health = {"ok": True, "version": "lean", "preset": "off", "summaries": {},
                      "sums": self.sums, "committed": self.committed}  # fmt: skip
            flow.response = http.Response.make(
                200, json.dumps(health).encode(), {"content-type": "application/json"}
            )
            return
        if req.method != "POST" or req.path.partition("?")[0] != "/v1/messages":
            return
        raw = req.raw_content or b""
        head = hashlib.blake2b(raw[:4096], digest_size=16).hexdigest()
        self.turns[flow.id] = req.headers.get("x-claude-code-session-id") or f"h:{head}"

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        pass

    async def response(self, flow: http.HTTPFlow) -> None:
        session = self.turns.pop(flow.id, None)
        if session is None or flow.response is None:
            return
        try:
            doc = json.loads(flow.response.content or b"{}")
            usage = doc.get("usage") if isinstance(doc, dict) else None
            if isinstance(usage, dict):
                sums = self.sums.setdefault(session, [0] * (len(USAGE_KEYS) + 1))
                for i, k in enumerate(USAGE_KEYS):
                    sums[i] += int(usage.get(k) or 0)
                sums[-1] += 1
                if self.timer is None:
                    self.timer = asyncio.get_running_loop().call_later(COMMIT_S, self.commit)
        except ValueError:
            pass
        fields = flow.request.headers.fields
        if any(k.lower() in CREDENTIALS for k, _ in fields):
            flow.request.headers.fields = tuple(
                (k, b"[redacted]" if k.lower() in CREDENTIALS else v) for k, v in fields
            )

    def commit(self) -> None:
        self.timer = None
        if self.conn is None or not self.sums:
            return
        self.conn.execute("BEGIN")
        self.conn.executemany(
            "INSERT OR REPLACE INTO usage VALUES (?, ?, ?, ?, ?, ?)",
            [(s, *v) for s, v in self.sums.items()],
        )
        self.conn.execute("COMMIT")
        self.committed += 1


addons = [Lean()]
