"""Hostile requests through a real mitmdump (docs/behaviour.md#bounded-work-and-shared-use):
decompression bombs and large bodies, each sent while a small agent turn and `/_cg/health` are asked
again and again, with the proxy's peak RSS read from the kernel.

    python -m tests.e2e.hostile [--json] [--only NAME ...]   the probe: docs/reliability.md's
                                                              figures, one line per body
    python -m tests.e2e.hostile sink                         the upstream the probe uses

The upstream is `sink`: a small server in a process of its own that reads every body whole,
keeps only its length and digest, and answers a short Anthropic message. The measuring client
shares no interpreter with it (the fake provider, in the test process, parses and bills every
body: 30 MB of it held the GIL the client needs to time a turn). The proxy runs with the
default options (`cg_preset=auto`) and its own store.

Per body: the hostile request's own time and status; the slowest small turn and health answer
sent while it was in flight (and how many were); the proxy's peak RSS while it was in flight
(`VmHWM`, reset before each body through `/proc/PID/clear_refs`) beside its idle RSS; and the
decision record's outcome and bound.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx

from tests.e2e.harness import LISTENING, MITMDUMP, Proxy, new_id
from tests.support import bombs

SMALL = json.dumps(
    {
        "model": "claude-sonnet-4-5",
        "max_tokens": 16,
        "messages": [
            {"role": "user", "content": "Say hello."},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Again, please."},
        ],
    }
).encode()
ANSWER = json.dumps(
    {
        "id": "msg_sink",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 1},
    }
).encode()
MIN_ROUNDS = 3  # small turns asked at least, even after the hostile request is done


# -- the sink: an upstream in a process of its own ------------------------------------------


class _Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # (headers and body in two writes: no 40 ms delayed ACK)
    seen: ClassVar[list[dict[str, Any]]] = []
    lock = threading.Lock()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        with self.lock:
            body = json.dumps(self.seen).encode()
        self._send(200, body)

    def _quickack(self) -> None:
        """ACK at once (Linux): mitmproxy writes a request's head and body apart, and a
        delayed ACK of the head held the body back 40 ms (Nagle), on every turn."""
        with suppress(AttributeError, OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)

    def handle_one_request(self) -> None:
        self._quickack()
        super().handle_one_request()

    def do_POST(self) -> None:
        self._quickack()
        n = int(self.headers.get("content-length") or 0)
        h = hashlib.blake2b(digest_size=16)
        left = n
        while left:
            chunk = self.rfile.read(min(left, 1 << 20))
            if not chunk:
                break
            h.update(chunk)
            left -= len(chunk)
        with self.lock:
            self.seen.append(
                {
                    "id": self.headers.get("x-e2e-id"),
                    "size": n,
                    "digest": h.hexdigest(),
                    "encoding": self.headers.get("content-encoding"),
                }
            )
        self._send(200, ANSWER)

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def serve_sink() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    server.daemon_threads = True
    print(f"sink listening at 127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


@dataclass
class Sink:
    proc: subprocess.Popen[str]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    @contextmanager
    def running(cls) -> Iterator[Sink]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.hostile", "sink"],
            cwd=Path(__file__).resolve().parents[2],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            port = int(line.rsplit(":", 1)[1])
            yield cls(proc, port)
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()

    def received(self, e2e_id: str) -> dict[str, Any] | None:
        seen = httpx.get(self.url + "/_sink", trust_env=False, timeout=10).json()
        return next((r for r in seen if r["id"] == e2e_id), None)


# -- measuring -------------------------------------------------------------------------------


def memory(pid: int) -> tuple[float, float]:
    """(RSS, peak RSS) of a process in MiB, from /proc/PID/status."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        fields[k] = v.strip()
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def reset_peak(pid: int) -> None:
    """Start the process's peak RSS afresh (Linux: `5` to /proc/PID/clear_refs)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


@dataclass
class Outcome:
    """One hostile request and what the proxy did meanwhile."""

    name: str
    sent_bytes: int
    seconds: float
    status: int | None
    error: str | None
    turns: int  # small turns answered while it was in flight
    slowest_turn_ms: float
    median_turn_ms: float
    slowest_health_ms: float
    peak_rss_mib: float
    idle_rss_mib: float
    outcome: str | None  # the decision record's
    bound: str | None
    forwarded_identical: bool  # the upstream got the client's bytes exactly


def small_turn(client: httpx.Client, session: str) -> float:
    t = time.perf_counter()
    r = client.post(
        "/v1/messages",
        content=SMALL,
        headers={"content-type": "application/json", "x-context-guru-session": session},
    )
    assert r.status_code == 200, r.text
    return (time.perf_counter() - t) * 1000


def health(client: httpx.Client, addon: bool = True) -> float:
    if not addon:
        return 0.0
    t = time.perf_counter()
    r = client.get("/_cg/health")
    assert r.status_code == 200 and r.json()["ok"] is True, r.text
    return (time.perf_counter() - t) * 1000


def idle_rss(proxy: Any) -> float:
    """The proxy's RSS once it has served a few ordinary turns."""
    with proxy.client(timeout=30.0) as c:
        for _ in range(20):
            small_turn(c, "warm-up")
            health(c, getattr(proxy, "addon", True))
    return memory(proxy.proc.pid)[0]


def send_hostile(
    proxy: Any,
    sink: Sink,
    name: str,
    body: bytes,
    headers: Mapping[str, str],
    idle: float,
    timeout: float = 120.0,
) -> Outcome:
    """`body` sent once while small turns and health are asked (each after the other), until
    it is answered and at least MIN_ROUNDS of them were."""
    e2e = new_id()
    pid = proxy.proc.pid
    reset_peak(pid)
    result: dict[str, Any] = {}

    def hostile() -> None:
        t = time.perf_counter()
        try:
            with httpx.Client(base_url=proxy.url, trust_env=False, timeout=timeout) as c:
                r = c.post(
                    "/v1/messages",
                    content=body,
                    headers={"content-type": "application/json", "x-e2e-id": e2e, **headers},
                )
                result["status"] = r.status_code
        except httpx.HTTPError as e:
            result["error"] = f"{type(e).__name__}: {e}"
        result["seconds"] = time.perf_counter() - t

    thread = threading.Thread(target=hostile, name=f"hostile {name}")
    turns: list[float] = []
    checks: list[float] = []
    with proxy.client(timeout=timeout) as c:
        thread.start()
        while thread.is_alive() or len(turns) < MIN_ROUNDS:
            turns.append(small_turn(c, "bystander"))
            checks.append(health(c, getattr(proxy, "addon", True)))
        thread.join()
    peak = memory(pid)[1]
    record: dict[str, Any] = {}
    if getattr(proxy, "addon", True):  # (a plain mitmdump, the control, keeps no record)
        with suppress(TimeoutError, AssertionError):
            record = proxy.records.cg(e2e, timeout=10.0)
    got = sink.received(e2e)
    digest = hashlib.blake2b(body, digest_size=16).hexdigest()
    return Outcome(
        name=name,
        sent_bytes=len(body),
        seconds=round(result.get("seconds", 0.0), 3),
        status=result.get("status"),
        error=result.get("error"),
        turns=len(turns),
        slowest_turn_ms=round(max(turns), 1),
        median_turn_ms=round(statistics.median(turns), 1),
        slowest_health_ms=round(max(checks), 1),
        peak_rss_mib=round(peak, 1),
        idle_rss_mib=round(idle, 1),
        outcome=record.get("outcome"),
        bound=record.get("bound"),
        forwarded_identical=got is not None and got["digest"] == digest,
    )


Case = tuple[Callable[[], bytes], dict[str, str]]  # (make the body, its extra headers)


def cases() -> dict[str, Case]:
    """Every hostile body of issue 29, by name."""
    out: dict[str, Case] = {
        f"bomb {coding}, 1 GiB decoded": (make, {"content-encoding": coding})
        for coding, make in bombs.BOMBS.items()
    }
    out["gzip, 200 MB of ordinary messages"] = (
        lambda: bombs.gzip_of(bombs.ordinary(200 * bombs.MIB)),
        {"content-encoding": "gzip"},
    )
    out.update({name: (make, {}) for name, make in bombs.LARGE.items()})
    return out


@dataclass
class Plain:
    """mitmdump without the addon, in front of the same sink: the control (no `/_cg/`)."""

    proc: subprocess.Popen[str]
    port: int
    addon = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(**{"base_url": self.url, "trust_env": False, "timeout": 30.0, **kw})

    @classmethod
    def start(cls, upstream: str, workdir: Path) -> Plain:
        proc = subprocess.Popen(
            [str(MITMDUMP), "--mode", f"reverse:{upstream}", "--listen-host", "127.0.0.1",
             "--listen-port", "0", "--set", f"confdir={workdir / 'confdir'}"],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        assert proc.stdout is not None
        for line in proc.stdout:
            m = LISTENING.search(line)
            if m:
                plain = cls(proc, int(m.group(1)))
                threading.Thread(
                    target=lambda: [None for _ in proc.stdout or ()], daemon=True
                ).start()
                return plain
        raise RuntimeError("plain mitmdump did not start")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@contextmanager
def proxy_and_sink(
    workdir: Path, options: tuple[str, ...] = (), plain: bool = False
) -> Iterator[tuple[Any, Sink]]:
    """The sink, and mitmdump in front of it: with the addon on its own store (default
    options, `cg_preset=auto`), or `plain` without it."""
    with Sink.running() as sink:
        proxy: Any
        if plain:
            proxy = Plain.start(sink.url, workdir)
        else:
            proxy = Proxy.start(
                sink.url,
                workdir,
                preset="auto",
                options=(f"cg_db={workdir / 'cg.sqlite3'}", *options),
            )
        try:
            yield proxy, sink
        finally:
            proxy.stop()


def probe(only: list[str] | None = None, plain: bool = False) -> list[Outcome]:
    """Each body through a proxy of its own (freshly started: what one body left in memory
    is not counted in the next one's peak)."""
    out: list[Outcome] = []
    for name, (make, headers) in cases().items():
        if only and not any(o in name for o in only):
            continue
        with (
            tempfile.TemporaryDirectory(prefix="cg-hostile-") as tmp,
            proxy_and_sink(Path(tmp), plain=plain) as (proxy, sink),
        ):
            idle = idle_rss(proxy)
            out.append(send_hostile(proxy, sink, name, make(), headers, idle))
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["sink"]:
        serve_sink()
        return 0
    ap = argparse.ArgumentParser(prog="python -m tests.e2e.hostile", description=__doc__)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--only", nargs="*", help="bodies whose name holds one of these")
    ap.add_argument("--plain", action="store_true", help="mitmdump without the addon (control)")
    opts = ap.parse_args(args)
    rows = probe(opts.only, opts.plain)
    if opts.json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
        return 0
    print(
        f"{'body':44} {'sent':>10} {'own s':>7} {'turns':>5} {'slowest':>8} {'median':>7} "
        f"{'health':>7} {'peak RSS':>9} {'idle':>6}  outcome"
    )
    for r in rows:
        print(
            f"{r.name:44} {r.sent_bytes:>10} {r.seconds:>7} {r.turns:>5} "
            f"{r.slowest_turn_ms:>6}ms {r.median_turn_ms:>5}ms {r.slowest_health_ms:>5}ms "
            f"{r.peak_rss_mib:>7}MB {r.idle_rss_mib:>6}  {r.outcome} ({r.bound or '-'}), "
            f"status {r.status or r.error}, forwarded identical: {r.forwarded_identical}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
