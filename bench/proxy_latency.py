"""End-to-end latency through mitmdump with and without the addon: `python -m bench.proxy_latency`.

In one run, on 127.0.0.1 only:

    upstream   a tiny HTTP/1.1 server (this module, `--serve-upstream`) that reads the body and
               answers 200 at once
    plain      `mitmdump --mode reverse:http://127.0.0.1:UP` with no script but the probe
    addon      the same plus `-s cg_addon.py --set cg_preset=off` (index + input validation, then
               the original bytes go upstream)

Two kinds of traffic (`--traffic`, default both, each in its own run with fresh processes):

    same       the same ~1 MiB, 400-message body (`bench/corpus.py`) every time: after the first
               request the addon's MessageCache knows every message, so nothing is parsed again
    growing    an agent session: each request is the previous body plus the next turn (the
               assistant's message and the tool results or prompt that answer it: 2 messages
               for most turns) at a turn boundary, byte for byte, so the addon's cache knows all
               but the new messages. The bodies are prefixes of one longer transcript in the same
               style, centred on 400 messages / ~1 MiB (`-n 50`: ~330 to ~465 messages)

Each body is POSTed to the three targets in turn (order alternating every round) over one
keep-alive httpx connection per target, so that load from elsewhere hits all of them alike.
Reported: median, p90, p99, min and max per target, the ratio addon/plain of the medians, and the
addon's overhead per request (the difference of the medians, and the median of the per-round
differences). Before timing, each proxy is checked to forward the body byte-for-byte (the
upstream echoes a SHA-256 of what it received), and afterwards the addon's `/_cg/stats` must show
that it saw every request. Both proxies load `bench/probe.py`, which reports the addon's own
timings (`flow.metadata`), its cache hits and every full garbage collection inside the process.
`--extra-script PATH` loads another mitmproxy script into the addon proxy, for experiments;
`--set KEY=VALUE` sets one of its options. `--preset summarize` runs the addon's summarize
preset instead of `off`: the verification turn commissions a summary (the upstream's answers all
carry one), the run waits for it, and every timed turn must reuse the checkpoint (a turn whose
request declares tools and streams then goes through the expand relay; its timings are
reported). `--concurrency N` adds a throughput phase: N clients in parallel per target, each
target alone; `--throughput-rounds R` repeats it R times, the targets interleaved (who goes
first rotating), and reports the median of each, the median of the rounds' own addon/plain
ratios (each round's two runs seconds apart, so the machine's drift between rounds cancels),
and the CPU time each proxy process spent per request (Linux: from /proc/PID/stat).
`--size BYTES` scales the same-body traffic (10 KB to 5 MB: `bench.sizes`).

Every process is started and stopped by its PID; every wait has a deadline.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from bench.corpus import TARGET_BYTES, TARGET_MESSAGES, anthropic_body, openai_body
from cg.wire.body import BodyIndex, index_body
from cg.wire.dialects import ANTHROPIC, OPENAI
from cg.wire.shape import validate_shape
from cg.wire.splice import identity, splice

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
VERIFY_HEADER = "x-bench-verify"
SSE_HEADER = "x-bench-sse"  # answer as SSE, the rest this many seconds after the first delta
PROBE = ROOT / "bench" / "probe.py"
PROBE_PATH = "/_bench/probe"
PATHS = {"anthropic": "/v1/messages?beta=true", "openai": "/v1/chat/completions"}
HEADERS = {
    "anthropic": {"anthropic-version": "2023-06-01", "x-api-key": "sk-ant-bench"},
    "openai": {"authorization": "Bearer sk-bench"},
}


# -- the upstream (runs in its own process) ----------------------------------------------------


# A summary in every answer: under `--preset summarize` the addon's summarizer call (the
# shared-cache request, to this same upstream) gets one, and its checkpoint is reused.
ANTHROPIC_REPLY = json.dumps(
    {
        "id": "msg_bench",
        "type": "message",
        "role": "assistant",
        "model": "claude-bench",
        "content": [{"type": "text", "text": "<summary>The bench summary.</summary>"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }
).encode()


class _Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # One write per response, sent at once: no Nagle / delayed-ACK stall of ~40 ms per request.
    disable_nagle_algorithm = True
    _REPLY = ANTHROPIC_REPLY
    _OPENAI_REPLY = json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 1,
            "model": "gpt-bench",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": "<summary>The bench summary.</summary>",
                    },
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    ).encode()

    def _send(self, body: bytes) -> None:
        head = (
            f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        )
        self.wfile.write(head.encode("ascii") + body)

    def _sse(self, pause: float) -> None:
        """An Anthropic SSE answer: its first text delta at once, the rest `pause` s later."""

        def ev(name: str, data: dict[str, Any]) -> bytes:
            return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()

        msg = {k: v for k, v in json.loads(self._REPLY).items() if k != "content"}
        msg.update(content=[], stop_reason=None)
        first = (
            ev("message_start", {"message": msg})
            + ev("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
            + ev("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "Hi"}})
        )
        rest = (
            ev("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "!"}})
            + ev("content_block_stop", {"index": 0})
            + ev(
                "message_delta",
                {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}},
            )
            + ev("message_stop", {})
        )
        self.wfile.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n" % (len(first), first)
        )
        self.wfile.flush()
        threading.Event().wait(pause)  # a model still generating
        self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(rest), rest))

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        if self.headers.get(SSE_HEADER):
            self._sse(float(self.headers[SSE_HEADER]))
        elif self.headers.get(VERIFY_HEADER):
            digest = hashlib.sha256(body).hexdigest()
            self._send(json.dumps({"bytes": len(body), "sha256": digest}).encode())
        elif "chat/completions" in self.path:
            self._send(self._OPENAI_REPLY)
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


def start_upstream(tmp: Path, procs: list[Proc]) -> tuple[Proc, int]:
    """Start this module's `--serve-upstream` server (added to `procs`, to be stopped with
    them), and its port once it has written it."""
    port_file = tmp / "upstream.port"
    upstream = start(
        "upstream",
        [sys.executable, "-m", "bench.proxy_latency", "--serve-upstream", str(port_file)],
        tmp,
    )
    procs.append(upstream)
    return upstream, int(wait_for_file(upstream, port_file))


def wait_for_http(proc: Proc, url: str) -> httpx.Response:
    deadline = time.monotonic() + READY_TIMEOUT_S
    last: Exception | str = "no attempt"
    with httpx.Client(trust_env=False, timeout=2.0) as c:
        while time.monotonic() < deadline:
            proc.check_alive()
            try:
                r = c.get(url)
                if r.status_code == 200:
                    return r
                last = f"HTTP {r.status_code}"
            except httpx.HTTPError as e:
                last = e
            time.sleep(0.1)
    raise TimeoutError(f"{proc.name} not ready at {url} within {READY_TIMEOUT_S:g} s: {last}")


def wait_for_addon(proc: Proc, base: str) -> None:
    """`wait_for_http` on the addon's `/_cg/health`, then proof that the addon answered it: a
    reverse proxy whose script did not load forwards the path to the fake upstream, which
    answers any GET with 200 too. (mitmdump runs on without a script whose options fail to
    apply, as with one option given twice: every figure would then be plain mitmdump's.)"""
    got = wait_for_http(proc, f"{base}/_cg/health")
    try:
        answer = got.json()
    except ValueError:
        answer = None
    if not (isinstance(answer, dict) and "version" in answer and "preset" in answer):
        raise RuntimeError(
            f"{proc.name}: the addon did not load (its /_cg/health went upstream: "
            f"{got.text[:80]!r}); see {proc.log}"
        )


def mitmdump() -> str:
    local = Path(sys.executable).parent / "mitmdump"
    found = str(local) if local.exists() else shutil.which("mitmdump")
    if not found:
        raise FileNotFoundError("mitmdump not found next to this Python or on PATH")
    return found


# -- traffic ---------------------------------------------------------------------------------


@dataclass
class Traffic:
    """The body of each round (`body(-1)`: the verification request, sent before round 0)."""

    name: str
    body: Callable[[int], bytes]
    messages: list[int]  # per body, starting with the verification request's


def corpus_body(
    dialect: str, n_messages: int = TARGET_MESSAGES, target: int = TARGET_BYTES
) -> bytes:
    build = anthropic_body if dialect == "anthropic" else openai_body
    return build(n_messages, target)


def small_body(dialect: str, size: int) -> bytes:
    """A body under ~150 KB (the capture's system and tools alone are ~70 KB): the corpus
    transcript's first turns up to `size` bytes, with only `model`, `max_tokens` and `stream`
    beside them."""
    d = ANTHROPIC if dialect == "anthropic" else OPENAI
    index = index_body(corpus_body(dialect), d)
    model = index.members["model"].value
    head = '{"model":' + json.dumps(model) + ',"max_tokens":1024,"stream":true,"messages":['
    best = b""
    for k in turn_ends(index):
        body = (head + ",".join(index.source(i) for i in range(k)) + "]}").encode()
        if not best or abs(len(body) - size) < abs(len(best) - size):
            best = body
        if len(body) > size:
            break
    return best


def same_traffic(dialect: str, rounds: int, size: int = TARGET_BYTES) -> Traffic:
    """The same body every round; `size` other than ~1 MiB scales its message count too."""
    n = max(4, round(TARGET_MESSAGES * size / TARGET_BYTES))
    if size < 150_000:
        body = small_body(dialect, size)
    else:
        body = corpus_body(dialect, n, size) if size != TARGET_BYTES else corpus_body(dialect)
    count = len(index_body(body, ANTHROPIC if dialect == "anthropic" else OPENAI).messages)
    return Traffic("same", lambda r: body, [count] * (rounds + 1))


def turn_ends(index: BodyIndex) -> list[int]:
    """Every k where `messages[:k]` is a request an agent sends: it ends with the tool results
    (or the prompt) that answer the last assistant message."""
    roles = [v.role for v in index.views]
    n = len(roles)
    return [
        k
        for k in range(1, n + 1)
        if roles[k - 1] in ("user", "tool") and (k == n or roles[k] != "tool")
    ]


def growing_traffic(dialect: str, rounds: int) -> Traffic:
    """`rounds + 1` consecutive turn boundaries of one long transcript, centred on 400 messages;
    body r is its first `messages[r]` messages, spliced, so body r+1 extends body r."""
    count = rounds + 1
    total = TARGET_MESSAGES + 3 * count
    big = corpus_body(dialect, total, TARGET_BYTES * total // TARGET_MESSAGES)
    d = ANTHROPIC if dialect == "anthropic" else OPENAI
    index = index_body(big, d)
    ends = turn_ends(index)
    centre = min(range(len(ends)), key=lambda i: abs(ends[i] - TARGET_MESSAGES))
    first = max(0, centre - count // 2)
    chosen = ends[first : first + count]
    if len(chosen) < count:
        raise RuntimeError(f"the transcript has too few turns for {rounds} rounds")
    views = index.views
    for k in chosen:
        if validate_shape(views[:k], d):
            raise RuntimeError(f"messages[:{k}] is not a valid request")
    return Traffic("growing", lambda r: splice(index, identity(chosen[r + 1])), chosen)


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


def timed_post(
    name: str, client: httpx.Client, path: str, body: bytes, headers: dict[str, str]
) -> float:
    """One POST through `client`, in ms; anything but a 200 stops the run."""
    t0 = time.perf_counter()
    r = client.post(path, content=body, headers=headers)
    dt = (time.perf_counter() - t0) * 1000.0
    if r.status_code != 200:
        raise RuntimeError(f"{name}: HTTP {r.status_code}: {r.text[:200]}")
    return dt


def per_client(n: int, c: int) -> int:
    """POSTs per client in a throughput run: at least 20. With 2 (n=30, c=16: 32 requests in
    all) start-up dominated, and the ratio swung 0.3-0.9x between runs of one build."""
    return max(20, n // c)


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds process `pid` has used so far (Linux), else None."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def throughput(base: str, path: str, body: bytes, headers: dict[str, str], c: int, n: int) -> float:
    """Requests per second with `c` clients in parallel (each its own keep-alive connection)
    sending `n` POSTs each."""
    errors: list[str] = []

    def client() -> None:
        with httpx.Client(base_url=base, trust_env=False, timeout=120.0) as cl:
            for _ in range(n):
                r = cl.post(path, content=body, headers=headers)
                if r.status_code != 200:
                    errors.append(f"HTTP {r.status_code}")

    threads = [threading.Thread(target=client) for _ in range(c)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{base}: {errors[0]} ({len(errors)} failed)")
    return c * n / dt


def wait_for_summary(client: httpx.Client, deadline_s: float = 60.0) -> None:
    """Under `summarize`: the first turn commissioned a summary; wait until it is stored."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        counts = client.get("/_cg/stats").json().get("summaries", {})
        if counts.get("completed", 0) >= 1:
            return
        if counts.get("failed", 0) or counts.get("timed_out", 0):
            raise RuntimeError(f"the bench summary failed: {counts}")
        threading.Event().wait(0.05)  # cg: allow-sleep: polling a process we started
    raise RuntimeError("no summary completed within the deadline")


def run(
    dialect: str,
    traffic_name: str,
    n: int,
    warmup: int,
    keep: bool,
    extra_scripts: list[str],
    preset: str = "off",
    concurrency: int = 1,
    size: int = TARGET_BYTES,
    sets: list[str] | None = None,
    throughput_rounds: int = 1,
) -> dict[str, Any]:
    rounds = warmup + n
    if traffic_name == "growing":
        traffic = growing_traffic(dialect, rounds)
    else:
        traffic = same_traffic(dialect, rounds, size)
    path = PATHS[dialect]
    headers = {"content-type": "application/json", **HEADERS[dialect]}
    tmp = Path(tempfile.mkdtemp(prefix="cg-bench-"))
    procs: list[Proc] = []
    sizes: list[int] = []
    try:
        upstream, up = start_upstream(tmp, procs)
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
                "-s",
                str(PROBE),
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
                f"cg_preset={preset}",
                "--set",
                f"cg_db={tmp / 'cg.sqlite3'}",
                *(a for kv in sets or [] for a in ("--set", kv)),
                *(a for path in extra_scripts for a in ("-s", str(Path(path).resolve()))),
                "-s",
                str(PROBE),
            ],
            tmp,
        )
        procs.append(addon)
        wait_for_http(upstream, f"http://{HOST}:{up}/")
        wait_for_http(plain, f"http://{HOST}:{plain_port}{PROBE_PATH}")
        wait_for_addon(addon, f"http://{HOST}:{addon_port}")
        wait_for_http(addon, f"http://{HOST}:{addon_port}{PROBE_PATH}")

        targets = [
            Target("upstream, direct", f"http://{HOST}:{up}"),
            Target("mitmdump, no script", f"http://{HOST}:{plain_port}"),
            Target(f"mitmdump -s cg_addon.py, cg_preset={preset}", f"http://{HOST}:{addon_port}"),
        ]
        clients = [httpx.Client(base_url=t.base, trust_env=False, timeout=60.0) for t in targets]
        try:
            body = traffic.body(-1)
            digest = hashlib.sha256(body).hexdigest()
            for t, c in zip(targets, clients, strict=True):
                r = c.post(path, content=body, headers={**headers, VERIFY_HEADER: "1"})
                r.raise_for_status()
                got = r.json()
                if got.get("sha256") != digest:
                    raise RuntimeError(f"{t.name} did not forward the body unchanged: {got}")
            reuse = False
            if preset != "off":
                # The verification turn commissioned the summary the timed turns reuse (a body
                # too small to summarize commissions none: its turns pass through).
                commissioned = clients[2].get("/_cg/stats").json()["summaries"]["commissioned"]
                if commissioned:
                    wait_for_summary(clients[2])
                    reuse = True
            for rnd in range(rounds):
                body = traffic.body(rnd)
                if rnd >= warmup:
                    sizes.append(len(body))
                order = list(zip(targets, clients, strict=True))
                if rnd % 2:
                    order.reverse()
                for t, c in order:
                    dt = timed_post(t.name, c, path, body, headers)
                    if rnd >= warmup:
                        t.samples.append(dt)
            stats = clients[2].get("/_cg/stats").json()
            probe = clients[2].get(PROBE_PATH).json()
            plain_probe = clients[1].get(PROBE_PATH).json()
            rps: dict[str, float] = {}
            cpu_us: dict[str, float] = {}
            per_round: list[float] = []  # addon/plain throughput, round by round
            if concurrency > 1:
                body = traffic.body(rounds - 1)
                per = per_client(n, concurrency)
                pids = {targets[1].name: plain.popen.pid, targets[2].name: addon.popen.pid}
                runs: dict[str, list[float]] = {t.name: [] for t in targets}
                cpu: dict[str, list[float]] = {name: [] for name in pids}
                for k in range(throughput_rounds):
                    # After the sequential rounds, each target alone; who goes first rotates,
                    # so no target always follows the same one (the machine's speed drifts).
                    first = k % len(targets)
                    for t in targets[first:] + targets[:first]:
                        before = cpu_seconds(pids.get(t.name))
                        runs[t.name].append(
                            throughput(t.base, path, body, headers, concurrency, per)
                        )
                        after = cpu_seconds(pids.get(t.name))
                        if before is not None and after is not None:
                            cpu[t.name].append((after - before) / (concurrency * per) * 1e6)
                rps = {name: statistics.median(v) for name, v in runs.items()}
                per_round = [
                    a / p for a, p in zip(runs[targets[2].name], runs[targets[1].name], strict=True)
                ]
                cpu_us = {name: statistics.median(v) for name, v in cpu.items() if v}
        finally:
            for c in clients:
                c.close()
        seen = stats.get("passed_through", 0) + stats.get("rewritten", 0)
        if seen != 1 + rounds:
            raise RuntimeError(f"the addon saw {seen} requests, expected {1 + rounds}")
        if reuse and stats.get("rewritten", 0) != rounds:
            raise RuntimeError(f"not every timed turn reused the checkpoint: {stats}")
        if len(probe["records"]) != 1 + rounds:
            raise RuntimeError(f"the probe saw {len(probe['records'])} requests, not {1 + rounds}")
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
        "traffic": traffic.name,
        "body_bytes": {
            "min": min(sizes),
            "median": int(statistics.median(sizes)),
            "max": max(sizes),
        },
        "messages": {"min": min(traffic.messages), "max": max(traffic.messages)},
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
        "preset": preset,
        "reuse": reuse,
        "sets": sets or [],
        "concurrency": concurrency,
        "throughput_rps": rps,
        "throughput_rounds": throughput_rounds,
        "cpu_us_per_request": cpu_us,
        "throughput_ratio_addon_plain": (
            rps[addon_t.name] / rps[plain_t.name] if rps.get(plain_t.name) else None
        ),
        "throughput_ratios_per_round": [round(x, 3) for x in per_round],
        "ratio_addon_plain": am / pm,
        "overhead_ms": am - pm,
        "overhead_paired_median_ms": statistics.median(paired),
        "in_proxy": in_proxy(probe, warmup),
        "full_gcs": {"addon": gc_summary(probe), "plain": gc_summary(plain_probe)},
        "addon_stats": stats,
        "extra_scripts": extra_scripts,
        "tmpdir": str(tmp) if keep else None,
    }


def in_proxy(probe: dict[str, Any], warmup: int) -> dict[str, Any]:
    """The addon's own timings and cache hits over the timed requests."""
    records = probe["records"]
    hits = [r["cache_hits_total"] for r in records]
    timed = records[1 + warmup :]
    out: dict[str, Any] = {
        f"{k}_ms": statistics.median(r["timings_ms"][k] for r in timed)
        for k in ("index", "total", "hook")
        if all(k in r["timings_ms"] for r in timed)
    }
    relay = [r["timings_ms"]["relay"] for r in timed if "relay" in r["timings_ms"]]
    if relay:  # turns offered the expand tool, streamed through the loopback relay
        out["relay_ms"] = {k: statistics.median(x[k] for x in relay) for k in relay[0]}
    if all(isinstance(h, int) for h in hits):
        new = [h - g for g, h in itertools.pairwise(hits)][warmup:]
        parsed = [r["messages_in"] - d for r, d in zip(timed, new, strict=True)]
        out["cache_hits_per_request"] = statistics.median(new)
        out["parsed_per_request"] = statistics.median(parsed)
    return out


def gc_summary(probe: dict[str, Any]) -> dict[str, Any]:
    ms = probe["full_gcs_ms"]
    return {
        "count": len(ms),
        "median_ms": statistics.median(ms) if ms else None,
        "max_ms": max(ms) if ms else None,
        "freeze_count": probe["gc_freeze_count"],
        "objects_at_end": probe["gc_objects"],
    }


def markdown(res: dict[str, Any]) -> str:
    b, m = res["body_bytes"], res["messages"]
    if res["traffic"] == "same":
        what = f"the same {b['median']:,} bytes, {m['max']} messages, every time"
    else:
        what = (
            f"a growing transcript, {m['min']}–{m['max']} messages, "
            f"{b['min']:,}–{b['max']:,} bytes (median {b['median']:,})"
        )
    lines = [
        f"{res['dialect']}, {res['traffic']}: {what}; {res['requests']} timed POSTs per target "
        f"after {res['warmup']} warm-up rounds"
        + (f"; extra scripts: {', '.join(res['extra_scripts'])}" if res["extra_scripts"] else "")
        + ".",
        "",
        "| target | median ms | p90 ms | p99 ms | min ms | max ms |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    lines += [
        f"| {t['target']} | {t['median_ms']:.2f} | {t['p90_ms']:.2f} | {t['p99_ms']:.2f} "
        f"| {t['min_ms']:.2f} | {t['max_ms']:.2f} |"
        for t in res["targets"]
    ]
    ip = res["in_proxy"]
    inside = ", ".join(
        f"{k.removesuffix('_ms')} {ip[k]:.2f} ms"
        for k in ("index_ms", "total_ms", "hook_ms")
        if k in ip
    )
    if "relay_ms" in ip:
        inside += "; relay: " + ", ".join(f"{k} {v:.2f} ms" for k, v in ip["relay_ms"].items())
    if "cache_hits_per_request" in ip:
        inside += (
            f"; cache hits per request {ip['cache_hits_per_request']:g}, "
            f"messages parsed {ip['parsed_per_request']:g}"
        )
    gcs = "; ".join(
        f"{who}: {g['count']}"
        + (f" (median {g['median_ms']:.1f} ms, max {g['max_ms']:.1f} ms)" if g["count"] else "")
        + f", frozen objects {g['freeze_count']:,}"
        for who, g in res["full_gcs"].items()
    )
    lines += [
        "",
        f"addon/plain (medians): **{res['ratio_addon_plain']:.2f}×**; addon overhead per request: "
        f"**{res['overhead_ms']:.2f} ms** (difference of medians), "
        f"{res['overhead_paired_median_ms']:.2f} ms (median of per-round differences).",
        f"Inside the addon proxy (medians, timed requests): {inside}.",
        f"Full garbage collections during the run — {gcs}.",
    ]
    if res.get("throughput_rps"):
        rps = res["throughput_rps"]
        rounds = res.get("throughput_rounds", 1)
        lines.append(
            f"Throughput with {res['concurrency']} clients in parallel"
            + (f" (median of {rounds} interleaved rounds)" if rounds > 1 else "")
            + ": "
            + ", ".join(f"{k} {v:.1f} req/s" for k, v in rps.items())
            + f"; addon/plain **{res['throughput_ratio_addon_plain']:.2f}×**."
        )
        each = per_round_line(res.get("throughput_ratios_per_round") or [])
        if each:
            lines.append(each)
        cpu = res.get("cpu_us_per_request") or {}
        if len(cpu) == 2:
            (pn, pv), (an, av) = cpu.items()
            lines.append(
                f"CPU per request at {res['concurrency']} clients: {pn} {pv:.0f} µs, {an} "
                f"{av:.0f} µs: **+{av - pv:.0f} µs**, plain/addon **{pv / av:.2f}×**."
            )
    return "\n".join(lines)


def per_round_line(ratios: list[float]) -> str:
    """The rounds' own addon/plain throughput ratios, summarised ("" for fewer than two): a
    round runs plain and the addon seconds apart, so its ratio is free of the drift between
    rounds that moves each target's median."""
    if len(ratios) < 2:
        return ""
    return (
        f"Addon/plain round by round (each round's two runs side by side): median "
        f"**{statistics.median(ratios):.2f}×**, {min(ratios):.2f}–{max(ratios):.2f}× "
        f"over {len(ratios)} rounds."
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.proxy_latency", description=__doc__.split("\n")[0]
    )
    ap.add_argument("-n", type=int, default=50, help="timed POSTs per target (default 50)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed rounds first (default 5)")
    ap.add_argument("--dialect", choices=("anthropic", "openai", "both"), default="anthropic")
    ap.add_argument(
        "--traffic",
        choices=("same", "growing", "both"),
        default="both",
        help="the same body every time, a growing agent transcript, or both (default)",
    )
    ap.add_argument("--json", action="store_true", help="print JSON instead of markdown")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir with the logs")
    ap.add_argument(
        "--extra-script",
        action="append",
        default=[],
        metavar="PATH",
        help="load this mitmproxy script too, in the addon proxy only (repeatable)",
    )
    ap.add_argument(
        "--preset",
        default="off",
        help="the addon's cg_preset (default off: index and validate only); summarize: the "
        "first turn commissions a summary and every timed turn reuses its checkpoint",
    )
    ap.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="also measure throughput with this many clients in parallel (default 1: no)",
    )
    ap.add_argument(
        "--throughput-rounds",
        type=int,
        default=1,
        help="repeat the throughput phase this many times, the targets interleaved, and report "
        "medians (default 1)",
    )
    ap.add_argument(
        "--size",
        type=int,
        default=TARGET_BYTES,
        help="body size in bytes for --traffic same (default ~1 MiB, 400 messages; the "
        "message count scales with it)",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="sets",
        help="a mitmproxy option for the addon proxy only, e.g. cg_expand_inject=never",
    )
    ap.add_argument("--serve-upstream", metavar="PORT_FILE", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve_upstream:
        serve_upstream(Path(args.serve_upstream))
        return 0
    if not 1 <= args.n <= 10_000 or not 0 <= args.warmup <= 1_000:
        ap.error("-n must be in 1..10000 and --warmup in 0..1000")
    if not 1 <= args.throughput_rounds <= 50:
        ap.error("--throughput-rounds must be in 1..50")
    dialects = ["anthropic", "openai"] if args.dialect == "both" else [args.dialect]
    kinds = ["same", "growing"] if args.traffic == "both" else [args.traffic]
    results = [
        run(
            d,
            k,
            args.n,
            args.warmup,
            args.keep,
            args.extra_script,
            args.preset,
            args.concurrency,
            args.size,
            args.sets,
            args.throughput_rounds,
        )
        for d in dialects
        for k in kinds
    ]
    if args.json:
        json.dump({"loadavg": os.getloadavg(), "results": results}, sys.stdout, indent=1)
        print()
    else:
        print("\n\n".join(markdown(r) for r in results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
