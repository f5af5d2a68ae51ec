"""The addon's three hooks on one small pass-through flow, timed in process: `python -m
bench.hooks [--preset off] [--flows 1500] [--rounds 7] [--evict-kb 0] [--lean] [--real-headers]
[--json]`.

Why: on `bench.proxy_latency`'s small turn the addon's whole cost is its own hooks (a script with
the same hooks doing nothing costs plain mitmdump nothing measurable; docs/benchmarks.md, stop
23), and the proxy's CPU per request moves by more from run to run than one change is worth.
Here the hooks run alone: `request`, `responseheaders` and `response` of fresh flows (new body
and header objects each, as mitmproxy makes them) through mitmproxy's `taddons`, with a real
SQLite store, the 515-byte Anthropic body of `bench.proxy_latency --size 3000` and the JSON
answer (with usage) that its fake upstream gives. Each round times every flow's hooks (`perf_counter_ns`, the collector paused) and
the fastest round is reported per hook.

`--evict-kb N` reads N KB of unrelated objects before each hook, as mitmproxy's own work and the
other threads do between a flow's hooks in a loaded proxy: the hooks then cost 1.5-2.2x more,
towards the 2.4x that `time.thread_time` measures around them inside the proxy at 16 clients.
That figure moves by +-25% from run to run: read it for the factor, not to compare trees.

`--lean` times `bench/lean`'s script instead (the least a script that meters every flow does),
the same flows, guarded by its sums: the budget beside the addon's figure.

`--real-headers` gives every flow Claude Code's captured request headers (21, its session id
among them) and an Anthropic answer's (~20: ids, rate limits, the CDN's), where the bench's own
flows carry 5 and 2: the cost that grows with a message's headers.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import json
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.proxy_latency import ANTHROPIC_REPLY, HEADERS, PATHS, ROOT, same_traffic

HOOKS = ("request", "responseheaders", "response")
LEAN = ROOT / "bench" / "lean" / "cg_addon.py"


# Claude Code's request headers as captured (tests/fixtures), and the headers an Anthropic
# answer carries (ids, rate limits, the CDN's): ~20 a side, where the bench's own have 5 and 2.
CLAUDE_CODE_HEADERS = ROOT / "tests" / "fixtures" / "claude_code_2.1.197_turn16.headers.json"
ANSWER_HEADERS = {
    "date": "Tue, 01 Dec 2026 12:00:00 GMT",
    "content-type": "application/json",
    "request-id": "req_011CVbenchbenchbenchbench",
    "strict-transport-security": "max-age=31536000; includeSubDomains; preload",
    "anthropic-organization-id": "00000000-0000-4000-8000-000000000000",
    **{
        f"anthropic-ratelimit-{kind}-{what}": "1000000"
        for kind in ("requests", "input-tokens", "output-tokens", "tokens")
        for what in ("limit", "remaining")
    },
    "anthropic-ratelimit-tokens-reset": "2026-12-01T12:00:05Z",
    "via": "1.1 google",
    "cf-cache-status": "DYNAMIC",
    "x-robots-tag": "none",
    "server": "cloudflare",
    "cf-ray": "8f0000000000beef-FRA",
    "x-envoy-upstream-service-time": "812",
}


def real_headers() -> tuple[dict[str, str], dict[str, str]]:
    """(request, answer) headers of a Claude Code flow: its capture's (but the host and the
    length, which the flow sets itself), and `ANSWER_HEADERS`."""
    captured = json.loads(CLAUDE_CODE_HEADERS.read_text(encoding="utf-8"))["headers"]
    request = {k: v for k, v in captured if k not in ("host", "content-length")}
    return request, dict(ANSWER_HEADERS)


def flows(
    n: int, body: bytes, headers: tuple[dict[str, str], dict[str, str]] | None = None
) -> list[Any]:
    """`n` provider flows as mitmproxy hands them to the hooks, each with its own objects;
    `headers`: (request, answer) headers in place of the bench's few."""
    from mitmproxy import http
    from mitmproxy.test import tflow, tutils

    request, answer = headers or (
        {"content-type": "application/json", **HEADERS["anthropic"]},
        {"content-type": "application/json", "request-id": "req_bench"},
    )
    out = []
    for _ in range(n):
        req = tutils.treq(
            method=b"POST",
            path=PATHS["anthropic"].encode(),
            host="api.anthropic.com",
            content=bytes(body),
        )
        for k, v in request.items():
            req.headers[k] = v
        f = tflow.tflow(req=req)
        f.client_conn.peername = ("127.0.0.1", 50000)
        f.response = http.Response.make(200, bytes(ANTHROPIC_REPLY), dict(answer))
        out.append(f)
    return out


async def _round(cg: Any, batch: list[Any], junk: list[dict[str, int]]) -> list[float]:
    """Each hook's mean µs over `batch`; `junk` is read before each hook (outside the timing)."""
    spent = [0, 0, 0]
    gc.collect()
    gc.disable()
    try:
        for f in batch:
            for i, hook in enumerate((cg.request, cg.responseheaders, cg.response)):
                _read(junk)
                t0 = time.perf_counter_ns()
                done = hook(f)
                if done is not None:  # the async `response`
                    await done
                spent[i] += time.perf_counter_ns() - t0
    finally:
        gc.enable()
    return [x / len(batch) / 1000 for x in spent]


def _read(junk: list[dict[str, int]]) -> int:
    """Every object of `junk` read once (evicting the caches' lines of what ran before)."""
    s = 0
    for d in junk:
        s += d["a"]
    return s


async def measure(
    preset: str, n: int, rounds: int, evict_kb: int, lean: bool = False, real: bool = False
) -> dict[str, Any]:
    """The fastest round's µs per hook. `lean`: `bench/lean`'s script instead of the addon
    (the least a metering script does), guarded the same way: its warm-up flows were booked."""
    from mitmproxy.test import taddons

    body = same_traffic("anthropic", 1, 3000).body(0)
    # ~100 bytes a small dict: the objects read between hooks
    junk = [{"a": i} for i in range(evict_kb * 10)]
    addon, booked = _lean() if lean else _addon()
    with tempfile.TemporaryDirectory(prefix="cg-bench-hooks-") as d, taddons.context(addon) as tctx:
        tctx.configure(addon, cg_preset=preset, cg_db=str(Path(d) / "cg.sqlite3"))
        if lean:
            addon.running()
        headers = real_headers() if real else None
        warm = flows(min(n, 500), body, headers)
        await _round(addon, warm, junk)
        outcome = booked(warm)  # raises unless the path under test ran
        results = [await _round(addon, flows(n, body, headers), junk) for _ in range(rounds)]
        addon.done()
    best = [min(r[i] for r in results) for i in range(3)]
    return {
        "script": "bench/lean" if lean else "cg_addon.py",
        "preset": preset,
        "body_bytes": len(body),
        "flows": n,
        "rounds": rounds,
        "evict_kb": evict_kb,
        "headers": "claude-code" if real else "bench",
        "outcome": outcome,
        "us": {h: round(v, 1) for h, v in zip(HOOKS, best, strict=True)},
        "total_us": round(sum(best), 1),
    }


def _addon() -> tuple[Any, Callable[[list[Any]], str]]:
    from cg.proxy.addon import META, ContextGuru

    def booked(warm: list[Any]) -> str:
        record = warm[-1].metadata.get(META)
        if not isinstance(record, dict) or "ledger" not in record:
            raise RuntimeError(f"the flow was not booked: {record!r}")
        return str(record.get("outcome"))

    return ContextGuru(), booked


def _lean() -> tuple[Any, Callable[[list[Any]], str]]:
    spec = importlib.util.spec_from_file_location("cg_bench_lean", LEAN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lean = module.Lean()

    def booked(warm: list[Any]) -> str:
        answers = sum(sums[-1] for sums in lean.sums.values())
        if answers != len(warm):
            raise RuntimeError(f"{answers} of {len(warm)} answers booked by bench/lean")
        return "metered"

    return lean, booked


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="The addon's hooks on a small flow, in process.")
    ap.add_argument("--preset", default="off", help="cg_preset (default off, as the bench)")
    ap.add_argument("--flows", type=int, default=1500, help="flows per round (default 1500)")
    ap.add_argument("--rounds", type=int, default=7, help="rounds; the fastest is kept")
    ap.add_argument("--evict-kb", type=int, default=0, help="KB of objects read between hooks")
    ap.add_argument("--lean", action="store_true", help="bench/lean's script, not the addon")
    ap.add_argument(
        "--real-headers",
        action="store_true",
        help="Claude Code's captured request headers (21) and an Anthropic answer's (~20)",
    )
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args(argv)
    if args.flows < 1 or args.rounds < 1 or args.evict_kb < 0:
        ap.error("--flows and --rounds must be >= 1, --evict-kb >= 0")
    warnings.simplefilter("ignore")
    out = asyncio.run(
        measure(args.preset, args.flows, args.rounds, args.evict_kb, args.lean, args.real_headers)
    )
    if args.json:
        print(json.dumps(out))
    else:
        us = out["us"]
        print(
            f"{out['script']}: {out['body_bytes']}-byte {out['outcome']} flow, "
            f"cg_preset={out['preset']}, "
            f"{out['evict_kb']} KB read between hooks, {out['headers']} headers: "
            f"request {us['request']} us, "
            f"responseheaders {us['responseheaders']} us, response {us['response']} us; "
            f"total {out['total_us']} us (fastest of {out['rounds']} rounds of {out['flows']})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
