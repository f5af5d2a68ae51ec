"""Time to first byte of a streamed answer, with and without the expand tool injected:
`python -m bench.ttfb`.

One upstream (`bench.proxy_latency`'s, answering SSE: its first text delta at once, the rest
`--pause` seconds later, like a model still generating) behind three mitmdumps: plain, the addon
with `cg_preset=summarize` (every timed turn reuses a checkpoint, and the request declares tools,
so `context_guru_expand` is injected and the turn goes through the relay), and the same with
`cg_expand_inject=never`. Per target: the time to the first byte of the body (the first event)
and to the end of the answer. A buffering proxy shows a first byte after the pause; a streaming
one long before it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.proxy_latency import (
    HEADERS,
    HOST,
    PATHS,
    PROBE,
    ROOT,
    SSE_HEADER,
    Proc,
    corpus_body,
    free_port,
    mitmdump,
    start,
    start_upstream,
    wait_for_http,
    wait_for_summary,
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.ttfb", description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=20)
    ap.add_argument("--pause", type=float, default=0.2, help="seconds between first delta and rest")
    args = ap.parse_args(argv)
    body = corpus_body("anthropic")
    path = PATHS["anthropic"]
    headers = {"content-type": "application/json", **HEADERS["anthropic"]}
    tmp = Path(tempfile.mkdtemp(prefix="cg-ttfb-"))
    procs: list[Proc] = []
    try:
        _, up = start_upstream(tmp, procs)
        common = ["--mode", f"reverse:http://{HOST}:{up}", "--listen-host", HOST]
        targets: dict[str, str] = {}
        for name, extra in (
            ("mitmdump, no script", []),
            ("addon, expand tool injected (relay)", ["cg_expand_inject=auto"]),
            ("addon, cg_expand_inject=never", ["cg_expand_inject=never"]),
        ):
            port = free_port()
            argv = [mitmdump(), *common, "--listen-port", str(port)]
            argv += ["--set", f"confdir={tmp / str(port)}", "-s", str(PROBE)]
            if extra:
                argv += ["-s", str(ROOT / "cg_addon.py"), "--set", "cg_preset=summarize"]
                argv += ["--set", f"cg_db={tmp / f'{port}.sqlite3'}", "--set", extra[0]]
            proc = start(name.split(",")[0].replace(" ", "-") + str(port), argv, tmp)
            procs.append(proc)
            wait_for_http(proc, f"http://{HOST}:{port}/_bench/probe")
            targets[name] = f"http://{HOST}:{port}"
        clients = {
            k: httpx.Client(base_url=v, trust_env=False, timeout=60.0) for k, v in targets.items()
        }
        try:
            for name, c in clients.items():  # the first turn: commissions the summary
                c.post(path, content=body, headers=headers).raise_for_status()
                if "addon" in name:
                    wait_for_summary(c)
            first: dict[str, list[float]] = {k: [] for k in targets}
            whole: dict[str, list[float]] = {k: [] for k in targets}
            sse = {**headers, SSE_HEADER: str(args.pause)}
            for rnd in range(args.n + 2):
                order = list(clients.items())
                if rnd % 2:
                    order.reverse()
                for name, c in order:
                    t0 = time.perf_counter()
                    with c.stream("POST", path, content=body, headers=sse) as r:
                        it = r.iter_raw()
                        next(it)
                        t1 = time.perf_counter()
                        for _ in it:
                            pass
                    t2 = time.perf_counter()
                    if rnd >= 2:
                        first[name].append((t1 - t0) * 1000)
                        whole[name].append((t2 - t0) * 1000)
            stats = clients["addon, expand tool injected (relay)"].get("/_cg/stats").json()
        finally:
            for c in clients.values():
                c.close()
    finally:
        for p in reversed(procs):
            p.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"anthropic, 1 MB reuse turn, streamed; the rest of the answer {args.pause * 1000:.0f} ms "
        f"after its first delta; {args.n} rounds; load {load}\n"
    )
    print("| target | first byte ms (median) | min | whole answer ms (median) |")
    print("|---|--:|--:|--:|")
    for name in targets:
        print(
            f"| {name} | {statistics.median(first[name]):.2f} | {min(first[name]):.2f} | "
            f"{statistics.median(whole[name]):.2f} |"
        )
    plain = statistics.median(first["mitmdump, no script"])
    relay = statistics.median(first["addon, expand tool injected (relay)"])
    never = statistics.median(first["addon, cg_expand_inject=never"])
    print(
        f"\ninjected − uninjected first byte: {relay - never:+.2f} ms (median); "
        f"uninjected − plain: {never - plain:+.2f} ms; addon stats: rewritten "
        f"{stats.get('rewritten')}, expansions {stats.get('expansions')}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
