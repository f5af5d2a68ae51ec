"""Finding a proxy on a port (serving, nothing there, something else), and the command a started
one runs."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from cg.launch import proxy
from cg.launch.agents import Route
from cg.launch.mitm import addon_path


class Answers:
    """A loopback HTTP server answering GET with `status` and `body` (what a port may hold)."""

    def __init__(self, status: int, body: bytes) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.paths.append(self.path)
                self.send_response(outer.status)
                self.send_header("content-length", str(len(outer.body)))
                self.end_headers()
                self.wfile.write(outer.body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.status, self.body = status, body
        self.paths: list[str] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Answers:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture
def nothing() -> Iterator[int]:
    """A port nothing listens on."""
    (port,) = proxy.free_ports(1)
    yield port


def test_serving_reads_the_serving_key_else_ok_from_an_older_proxy() -> None:
    assert proxy.serving({"ok": True})
    assert proxy.serving({"ok": True, "serving": True})
    assert not proxy.serving({"ok": True, "serving": False})
    assert not proxy.serving({"ok": False})
    assert not proxy.serving({})


def test_a_serving_proxy_is_found_and_nothing_listening_is_not(nothing: int) -> None:
    with Answers(200, json.dumps({"ok": True, "version": "x"}).encode()) as srv:
        assert proxy.found(srv.port)
        assert srv.paths == ["/_cg/health"]
    reverse = {"serving": True, "mode": ["reverse:https://api.anthropic.com"]}
    with Answers(200, json.dumps(reverse).encode()) as srv:
        assert proxy.found(srv.port)
    assert proxy.found(nothing) is False


@pytest.mark.parametrize(
    ("status", "body", "says"),
    [
        (404, b"not here", "not context-guru's"),
        (200, b"<html>", "not context-guru's"),
        (200, json.dumps({"ok": True, "serving": False}).encode(), "not serving"),
        # `make run`'s default: a forward proxy would answer the agent's turns with 502.
        (200, json.dumps({"serving": True, "mode": ["regular"]}).encode(), "not in reverse mode"),
    ],
)
def test_anything_else_on_the_port_is_an_error_naming_it(
    status: int, body: bytes, says: str
) -> None:
    with Answers(status, body) as srv, pytest.raises(proxy.NotAProxy, match=says) as e:
        proxy.found(srv.port)
    assert str(srv.port) in str(e.value)


def test_free_ports_are_distinct() -> None:
    ports = proxy.free_ports(3)
    assert len(set(ports)) == 3 and all(0 < p < 65536 for p in ports)


def test_the_started_command_is_the_packaged_addon_in_reverse_mode_per_route() -> None:
    routes = [
        Route("anthropic", "https://api.anthropic.com", "/v1"),
        Route("openai", "https://api.openai.com"),
    ]
    cmd = proxy.command(routes, [4001, 4002], "opencode", ["--set", "cg_db=/tmp/x"])
    assert cmd[0] == sys.executable and cmd[3:5] == ["-s", addon_path()]
    rest = cmd[5:]
    assert rest[:4] == [
        "--mode",
        "reverse:https://api.anthropic.com@4001",
        "--mode",
        "reverse:https://api.openai.com@4002",
    ]
    assert rest[rest.index("--listen-host") + 1] == "127.0.0.1"
    assert "connection_strategy=lazy" in rest and "cg_preset=opencode" in rest
    assert rest[-2:] == ["--set", "cg_db=/tmp/x"]  # the user's extras last: theirs win


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_started_process_goes_when_the_launcher_is_killed(tmp_path: Path) -> None:
    """What `kill -9` of the launcher leaves: nothing, the proxy (here a `sleep`, started the
    same way) is sent SIGTERM by the kernel."""
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys; from cg.launch.proxy import die_with_parent\n"
         "p = subprocess.Popen(['sleep', '600'], preexec_fn=die_with_parent, start_new_session=True)\n"
         "print(p.pid, flush=True); p.wait()"],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())
    try:
        assert Path(f"/proc/{pid}").exists()  # vacuity: it was running
        parent.kill()
        parent.wait(10)
        pause = threading.Event()
        for _ in range(1000):
            if gone(pid):
                break
            pause.wait(0.01)
        assert gone(pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        parent.stdout.close()


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")
