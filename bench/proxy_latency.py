"""End-to-end latency through mitmdump with and without the addon: `python -m bench.proxy_latency`.

In one run, on 127.0.0.1 only:

    upstream   a tiny HTTP/1.1 server (this module, `--serve-upstream`) that reads the body and
               answers 200 at once
    plain      `mitmdump --mode reverse:http://127.0.0.1:UP` with no script
    addon      the same plus `-s cg_addon.py --set cg_preset=off` (index + validate, then the
               original bytes go upstream)

The same ~1 MiB, 400-message body (`bench/corpus.py`) is POSTed `-n` times to each target over one
keep-alive httpx connection per target, the three targets taken in turn (order alternating every
round) so that load from elsewhere hits all of them alike. Reported: median, p90, p99, min and max
per target, the ratio addon/plain of the medians, and the addon's overhead per request (the
difference of the medians, and the median of the per-round differences). Before timing, each
proxy is checked to forward the body byte-for-byte (the upstream echoes a SHA-256 of what it
received), and afterwards the addon's `/_cg/stats` must show that it saw every request.
`--extra-script PATH` loads another mitmproxy script into the addon proxy, for experiments.

Every process is started and stopped by its PID; every wait has a deadline.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from bench.corpus import anthropic_body, openai_body

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
VERIFY_HEADER = "x-bench-verify"
PATHS = {"anthropic": "/v1/messages?beta=true", "openai": "/v1/chat/completions"}
HEADERS = {
    "anthropic": {"anthropic-version": "2023-06-01", "x-api-key": "sk-ant-bench"},
    "openai": {"authorization": "Bearer sk-bench"},
}


# -- the upstream (runs in its own process) ----------------------------------------------------


class _Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # One write per response, sent at once: no Nagle / delayed-ACK stall of ~40 ms per request.
    disable_nagle_algorithm = True
    _REPLY = json.dumps(
        {
            "id": "msg_bench",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": "ok"}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }
    ).encode()

    def _send(self, body: bytes) -> None:
        head = (
            f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        )
        self.wfile.write(head.encode("ascii") + body)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        if self.headers.get(VERIFY_HEADER):
            digest = hashlib.sha256(body).hexdigest()
            self._send(json.dumps({"bytes": len(body), "sha256": digest}).encode())
        else:
            self._send(self._REPLY)

    def do_GET(self) -> None:
        self._send(b'{"ok":true}')

    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve_upstream(port_file: Path) -> None:
    server = ThreadingHTTPServer((HOST, 0), _Upstream)
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(str(server.server_address[1]))
    tmp.rename(port_file)
    server.serve_forever()


# -- process handling ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{self.name} (pid {self.popen.pid}) exited early:\n{tail}")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(STOP_TIMEOUT_S)


def start(name: str, argv: list[str], tmp: Path) -> Proc:
    log = tmp / f"{name}.log"
    with log.open("wb") as f:
        popen = subprocess.Popen(
            argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT
        )
    return Proc(name, popen, log)


def wait_for_file(proc: Proc, path: Path) -> str:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        proc.check_alive()
        if path.exists():
            return path.read_text()
        time.sleep(0.05)
    raise TimeoutError(f"{proc.name} did not write {path} within {READY_TIMEOUT_S:g} s")


def wait_for_http(proc: Proc, url: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    last: Exception | str = "no attempt"
    with httpx.Client(trust_env=False, timeout=2.0) as c:
        while time.monotonic() < deadline:
            proc.check_alive()
            try:
                r = c.get(url)
                if r.status_code == 200:
                    return
                last = f"HTTP {r.status_code}"
            except httpx.HTTPError as e:
                last = e
            time.sleep(0.1)
    raise TimeoutError(f"{proc.name} not ready at {url} within {READY_TIMEOUT_S:g} s: {last}")


def mitmdump() -> str:
    local = Path(sys.executable).parent / "mitmdump"
    found = str(local) if local.exists() else shutil.which("mitmdump")
    if not found:
        raise FileNotFoundError("mitmdump not found next to this Python or on PATH")
    return found


# -- measuring ---------------------------------------------------------------------------------


@dataclass
class Target:
    name: str
    base: str
    samples: list[float] = field(default_factory=list)


def pct(samples: list[float], p: int) -> float:
    """The nearest-rank percentile."""
    s = sorted(samples)
    return s[max(0, -(-p * len(s) // 100) - 1)]


def run(dialect: str, n: int, warmup: int, keep: bool, extra_scripts: list[str]) -> dict[str, Any]:
    body = anthropic_body() if dialect == "anthropic" else openai_body()
    digest = hashlib.sha256(body).hexdigest()
    path = PATHS[dialect]
    headers = {"content-type": "application/json", **HEADERS[dialect]}
    tmp = Path(tempfile.mkdtemp(prefix="cg-bench-"))
    procs: list[Proc] = []
    try:
        port_file = tmp / "upstream.port"
        upstream = start(
            "upstream",
            [sys.executable, "-m", "bench.proxy_latency", "--serve-upstream", str(port_file)],
            tmp,
        )
        procs.append(upstream)
        up = int(wait_for_file(upstream, port_file))
        common = ["--mode", f"reverse:http://{HOST}:{up}", "--listen-host", HOST]
        plain_port, addon_port = free_port(), free_port()
        plain = start(
            "plain",
            [
                mitmdump(),
                *common,
                "--listen-port",
                str(plain_port),
                "--set",
                f"confdir={tmp / 'plain'}",
            ],
            tmp,
        )
        procs.append(plain)
        addon = start(
            "addon",
            [
                mitmdump(),
                *common,
                "--listen-port",
                str(addon_port),
                "--set",
                f"confdir={tmp / 'addon'}",
                "-s",
                str(ROOT / "cg_addon.py"),
                "--set",
                "cg_preset=off",
                *(a for path in extra_scripts for a in ("-s", str(Path(path).resolve()))),
            ],
            tmp,
        )
        procs.append(addon)
        wait_for_http(upstream, f"http://{HOST}:{up}/")
        wait_for_http(plain, f"http://{HOST}:{plain_port}/")
        wait_for_http(addon, f"http://{HOST}:{addon_port}/_cg/health")

        targets = [
            Target("upstream, direct", f"http://{HOST}:{up}"),
            Target("mitmdump, no script", f"http://{HOST}:{plain_port}"),
            Target("mitmdump -s cg_addon.py, cg_preset=off", f"http://{HOST}:{addon_port}"),
        ]
        clients = [httpx.Client(base_url=t.base, trust_env=False, timeout=60.0) for t in targets]
        try:
            for t, c in zip(targets, clients, strict=True):
                r = c.post(path, content=body, headers={**headers, VERIFY_HEADER: "1"})
                r.raise_for_status()
                got = r.json()
                if got.get("sha256") != digest:
                    raise RuntimeError(f"{t.name} did not forward the body unchanged: {got}")
            for rnd in range(warmup + n):
                order = list(zip(targets, clients, strict=True))
                if rnd % 2:
                    order.reverse()
                for t, c in order:
                    t0 = time.perf_counter()
                    r = c.post(path, content=body, headers=headers)
                    dt = (time.perf_counter() - t0) * 1000.0
                    if r.status_code != 200:
                        raise RuntimeError(f"{t.name}: HTTP {r.status_code}: {r.text[:200]}")
                    if rnd >= warmup:
                        t.samples.append(dt)
            stats = clients[2].get("/_cg/stats").json()
        finally:
            for c in clients:
                c.close()
        seen = stats.get("passed_through", 0)
        if seen != 1 + warmup + n:
            raise RuntimeError(
                f"the addon passed through {seen} requests, expected {1 + warmup + n}"
            )
    finally:
        for p in reversed(procs):
            p.stop()
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)

    _, plain_t, addon_t = targets
    pm, am = statistics.median(plain_t.samples), statistics.median(addon_t.samples)
    paired = [a - p for a, p in zip(addon_t.samples, plain_t.samples, strict=True)]
    return {
        "dialect": dialect,
        "body_bytes": len(body),
        "requests": n,
        "warmup": warmup,
        "targets": [
            {
                "target": t.name,
                "median_ms": statistics.median(t.samples),
                "p90_ms": pct(t.samples, 90),
                "p99_ms": pct(t.samples, 99),
                "min_ms": min(t.samples),
                "max_ms": max(t.samples),
                "samples_ms": [round(x, 3) for x in t.samples],
            }
            for t in targets
        ],
        "ratio_addon_plain": am / pm,
        "overhead_ms": am - pm,
        "overhead_paired_median_ms": statistics.median(paired),
        "addon_stats": stats,
        "extra_scripts": extra_scripts,
        "tmpdir": str(tmp) if keep else None,
    }


def markdown(res: dict[str, Any]) -> str:
    lines = [
        f"{res['dialect']} body, {res['body_bytes']:,} bytes; {res['requests']} timed POSTs per "
        f"target after {res['warmup']} warm-up rounds.",
        "",
        "| target | median ms | p90 ms | p99 ms | min ms | max ms |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    lines += [
        f"| {t['target']} | {t['median_ms']:.2f} | {t['p90_ms']:.2f} | {t['p99_ms']:.2f} "
        f"| {t['min_ms']:.2f} "
        f"| {t['max_ms']:.2f} |"
        for t in res["targets"]
    ]
    lines += [
        "",
        f"addon/plain (medians): **{res['ratio_addon_plain']:.2f}×**; addon overhead per request: "
        f"**{res['overhead_ms']:.2f} ms** (difference of medians), "
        f"{res['overhead_paired_median_ms']:.2f} ms (median of per-round differences).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.proxy_latency", description=__doc__.split("\n")[0]
    )
    ap.add_argument("-n", type=int, default=50, help="timed POSTs per target (default 50)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed rounds first (default 5)")
    ap.add_argument("--dialect", choices=("anthropic", "openai", "both"), default="anthropic")
    ap.add_argument("--json", action="store_true", help="print JSON instead of markdown")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir with the logs")
    ap.add_argument(
        "--extra-script",
        action="append",
        default=[],
        metavar="PATH",
        help="load this mitmproxy script too, in the addon proxy only (repeatable)",
    )
    ap.add_argument("--serve-upstream", metavar="PORT_FILE", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve_upstream:
        serve_upstream(Path(args.serve_upstream))
        return 0
    if not 1 <= args.n <= 10_000 or not 0 <= args.warmup <= 1_000:
        ap.error("-n must be in 1..10000 and --warmup in 0..1000")
    dialects = ["anthropic", "openai"] if args.dialect == "both" else [args.dialect]
    results = [run(d, args.n, args.warmup, args.keep, args.extra_script) for d in dialects]
    if args.json:
        json.dump({"loadavg": os.getloadavg(), "results": results}, sys.stdout, indent=1)
        print()
    else:
        print("\n\n".join(markdown(r) for r in results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
