"""The proxy a session goes through: one found serving on the chosen port, or one started here.

A port is asked `GET /_cg/health` (with CONTEXT_GURU_CONTROL_TOKEN, if set): nothing listening
means start one; a context-guru answer that says it serves (`serving: true`, or, from a proxy
older than that key, `ok: true`) means reuse it; anything else is an error naming the port.

A started proxy is mitmdump with the packaged addon in reverse mode, one listener per provider on
127.0.0.1, in its own session (a Ctrl-C at the terminal is the agent's, not the proxy's), its
output to the log file, told by the kernel to stop if the launcher dies first (Linux). It is ready once every listener answers `/_cg/health`; it is stopped by
PID (terminate, then kill).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from cg.launch.agents import LOOPBACK, Route
from cg.launch.mitm import proxy_command

CONTROL_TOKEN_ENV = "CONTEXT_GURU_CONTROL_TOKEN"  # as cg.proxy.environ (not imported: a layer up)
START_TIMEOUT = 60.0  # seconds for a started proxy to answer on every listener
STOP_TIMEOUT = 10.0
POLL = 0.05
LOG_TAIL = 12  # lines of its log quoted when a started proxy does not come up
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class NotAProxy(RuntimeError):
    """Something that is not a serving context-guru proxy answered on the chosen port."""


def _headers() -> dict[str, str]:
    token = os.environ.get(CONTROL_TOKEN_ENV, "")
    return {"authorization": f"Bearer {token}"} if token else {}


def base_url(port: int) -> str:
    return f"http://{LOOPBACK}:{port}"


def ask(port: int, path: str, timeout: float = 5.0) -> Any:
    """GET a control endpoint of the proxy on `port`: its JSON, or None when nothing listens.
    Raises NotAProxy for any other answer."""
    try:
        resp = httpx.get(
            base_url(port) + path, headers=_headers(), timeout=timeout, trust_env=False
        )
    except httpx.ConnectError:
        return None
    except httpx.HTTPError as e:
        raise NotAProxy(f"port {port}: {path} failed: {e}") from None
    try:
        doc = resp.json()
    except ValueError:
        doc = None
    if resp.status_code != 200 or not isinstance(doc, dict):
        raise NotAProxy(f"port {port} answered {path} with {resp.status_code}, not context-guru's")
    return doc


def serving(health: dict[str, Any]) -> bool:
    """Whether a `/_cg/health` answer says the proxy serves: `serving` where it is given, else
    (an older proxy) `ok`."""
    return (health["serving"] if "serving" in health else health.get("ok")) is True


def found(port: int) -> bool:
    """Whether a serving proxy is on `port` (False: nothing listens). Raises NotAProxy when
    something else, or a proxy that does not serve, answers."""
    health = ask(port, "/_cg/health")
    if health is None:
        return False
    if not serving(health):
        raise NotAProxy(f"the context-guru proxy on port {port} is not serving: {health}")
    modes = health.get("mode")
    if isinstance(modes, list) and not any(str(m).startswith("reverse:") for m in modes):
        # A forward proxy (`make run`'s default) would answer the agent's turns with 502.
        raise NotAProxy(
            f"the context-guru proxy on port {port} runs in mode {', '.join(map(str, modes))}, "
            "not in reverse mode to the agent's provider: start it with "
            "`make run MODE=reverse:URL`, or leave CG_PORT unset to have one started"
        )
    return True


def free_ports(n: int) -> list[int]:
    """`n` distinct ports nothing listens on now (held open together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def die_with_parent() -> None:
    """Run in the started proxy before it execs (Linux): the kernel sends it SIGTERM if the
    launcher dies without stopping it (`kill -9`), so no orphan keeps holding the store."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def command(
    routes: Sequence[Route], ports: Sequence[int], preset: str, extra: Sequence[str]
) -> list[str]:
    """The mitmdump command: reverse mode per route on its port, the preset, then `extra`
    (a later `--set` of the same option wins)."""
    args: list[str] = []
    for route, port in zip(routes, ports, strict=True):
        args += ["--mode", f"reverse:{route.upstream}@{port}"]
    # Lazy: the upstream is dialled for a request that goes there, not on every connection (so
    # `/_cg/health` answers while the provider is unreachable).
    args += ["--listen-host", LOOPBACK, "--set", "connection_strategy=lazy"]
    args += ["--set", f"cg_preset={preset}", *extra]
    return proxy_command(args)


class Started:
    """A proxy this launcher started, and stops."""

    def __init__(self, proc: subprocess.Popen[bytes], ports: Sequence[int], log: Path) -> None:
        self.proc = proc
        self.ports = list(ports)
        self.log = log

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    def start(
        cls,
        routes: Sequence[Route],
        ports: Sequence[int],
        preset: str,
        extra: Sequence[str],
        log: Path,
    ) -> Started:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                command(routes, ports, preset, extra),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        started = cls(proc, ports, log)
        try:
            started._wait_ready()
        except BaseException:
            started.stop()
            raise
        return started

    def _wait_ready(self) -> None:
        pause = threading.Event()  # never set: a bounded pause between polls
        end = time.monotonic() + START_TIMEOUT
        waiting = list(self.ports)
        while waiting:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the proxy exited ({self.proc.returncode}) as it started:\n{self.tail()}"
                )
            if time.monotonic() > end:
                raise RuntimeError(
                    f"the proxy did not answer in {START_TIMEOUT:.0f}s:\n{self.tail()}"
                )
            try:
                if found(waiting[0]):
                    waiting.pop(0)
                    continue
            except NotAProxy:
                pass  # (starting: the addon may not have configured yet)
            pause.wait(POLL)

    def tail(self) -> str:
        try:
            lines = self.log.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return f"(its log {self.log} could not be read)"
        return "\n".join(lines[-LOG_TAIL:]) + f"\n(the whole log: {self.log})"

    def stop(self) -> None:
        """Terminate it by PID, kill it if it lingers; reaped either way."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=STOP_TIMEOUT)
