"""`launch` with a stand-in agent (a script that writes down how it was run) and a stand-in proxy
on CG_PORT (a loopback server answering `/_cg/health` and `/_cg/stats`): the arguments passed
through unchanged, the agent pointed at the port, its exit status returned, a missing binary's
one-line error and exit 127, and the closing line from the stats before and after."""

from __future__ import annotations

import json
import os
import pty
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from cg.launch.run import EXIT_NOT_FOUND, launch


class StandIn:
    """`/_cg/health` serving; `/_cg/stats` a little further on at each ask."""

    def __init__(self) -> None:
        outer = self
        self.asked: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.asked.append(self.path)
                n = outer.asked.count("/_cg/stats")
                doc: dict[str, Any] = {"ok": True, "serving": True}
                if self.path == "/_cg/stats":
                    doc = {
                        "requests": 10 * n,
                        "rewritten": 3 * n,
                        "savings": {
                            "tokens_not_sent": 1000 * n,
                            "saved_usd": 0.5 * n,
                            "billed_usd": n,
                        },
                        "retention": {"turns": 3 * n, "mean": 1.0},
                    }
                body = json.dumps(doc).encode()
                self.send_response(200)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture
def standin() -> Iterator[StandIn]:
    s = StandIn()
    yield s
    s.close()


def agent_script(tmp_path: Path, code: int) -> tuple[Path, Path]:
    """An executable that writes its argv and environment to a file, then exits `code`."""
    out = tmp_path / "ran.json"
    script = tmp_path / "agent"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        f"open({str(out)!r}, 'w').write(json.dumps({{'argv': sys.argv, 'env': dict(os.environ)}}))\n"
        f"sys.exit({code})\n"
    )
    script.chmod(0o755)
    return script, out


def test_the_agents_arguments_pass_through_and_its_exit_status_is_returned(
    standin: StandIn, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary, ran = agent_script(tmp_path, 5)
    args = ["-p", "hi there", "--model", "x", "--help", "--"]
    env = {"PATH": "/usr/bin:/bin", "CG_PORT": str(standin.port), "CG_AGENT_BIN": str(binary)}
    assert launch("claude", args, env) == 5
    seen = json.loads(ran.read_text())
    assert seen["argv"] == [str(binary), *args]  # nothing added, nothing taken
    assert seen["env"]["ANTHROPIC_BASE_URL"] == f"http://127.0.0.1:{standin.port}"
    assert "127.0.0.1" in seen["env"]["NO_PROXY"].split(",")
    assert standin.asked == ["/_cg/health", "/_cg/stats", "/_cg/stats"]
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "context-guru: 3 of 10 turns rewritten, 1,000 tokens not sent, retention 100.0%, "
        f"$0.5000 saved (estimate; $1.0000 billed) — proxy 127.0.0.1:{standin.port} reused, "
        "left running"
    ]


def test_codex_gets_its_overrides_before_the_users_arguments(
    standin: StandIn, tmp_path: Path
) -> None:
    binary, ran = agent_script(tmp_path, 0)
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "CG_PORT": str(standin.port),
        "CG_AGENT_BIN": str(binary),
    }
    assert launch("codex", ["exec", "do it"], env) == 0
    argv = json.loads(ran.read_text())["argv"]
    assert argv[-2:] == ["exec", "do it"]
    assert f'model_providers.context-guru.base_url="http://127.0.0.1:{standin.port}/v1"' in argv
    assert argv[1] == "-c"


def test_a_missing_agent_is_one_line_naming_its_package_and_exit_127(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}
    assert launch("codex", ["exec", "x"], env) == EXIT_NOT_FOUND == 127
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "`codex` not found" in line and "npm install -g @openai/codex" in line
    assert "CG_AGENT_BIN" in line
    assert not (tmp_path / ".context-guru").exists()  # no proxy was started, nothing logged
    assert launch("claude", [], {**env, "CG_AGENT_BIN": str(tmp_path / "nope")}) == 127


def test_a_port_held_by_something_else_is_refused_before_the_agent_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary, ran = agent_script(tmp_path, 0)

    class NotOurs(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(404)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotOurs)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        env = {
            "PATH": "/usr/bin:/bin",
            "CG_PORT": str(server.server_address[1]),
            "CG_AGENT_BIN": str(binary),
        }
        assert launch("claude", [], env) == 1
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
    assert not ran.exists()
    assert "not context-guru's" in capsys.readouterr().err


def test_a_bad_setting_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert launch("claude", [], {"PATH": "/usr/bin:/bin", "CG_PORT": "x"}) == 2
    assert "CG_PORT" in capsys.readouterr().err


def test_the_cli_hands_every_argument_after_the_agents_name_to_the_launcher(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cg.cli import main

    monkeypatch.setenv("PATH", str(tmp_path))  # no opencode there
    assert main(["opencode", "--help"]) == 127  # not argparse's help: the agent's argument
    assert "npm install -g opencode-ai" in capsys.readouterr().err


def test_ctrl_c_at_the_terminal_is_the_agents_and_the_launcher_carries_on(
    standin: StandIn, tmp_path: Path
) -> None:
    """In a pseudo-terminal, as a user runs it: Ctrl-C reaches the agent (which exits 42 on it),
    not the launcher, which returns the agent's status and says its closing line."""
    ready = tmp_path / "ready"
    agent = tmp_path / "agent"
    agent.write_text(
        f"#!{sys.executable}\n"
        "import pathlib, signal, sys\n"
        "signal.signal(signal.SIGINT, lambda *a: (print('agent: SIGINT', flush=True), sys.exit(42)))\n"
        f"pathlib.Path({str(ready)!r}).write_text('up')\n"
        "signal.pause()\n"
    )
    agent.chmod(0o755)
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "CG_PORT": str(standin.port),
        "CG_AGENT_BIN": str(agent),
    }
    pid, fd = pty.fork()
    if pid == 0:  # the launcher, its terminal the pty
        os.execve(sys.executable, [sys.executable, "-m", "cg", "claude"], env)
    out = b""
    try:
        pause = threading.Event()
        for _ in range(2000):
            if ready.exists():
                break
            pause.wait(0.01)
        assert ready.exists(), "the agent never started"
        os.write(fd, b"\x03")  # Ctrl-C, as typed
        while True:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: the launcher closed its end
                break
            if not chunk:
                break
            out += chunk
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    text = out.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 42, text
    assert "agent: SIGINT" in text and "Traceback" not in text
    assert "turns rewritten" in text and "reused, left running" in text


def test_a_started_proxy_takes_the_agents_preset_where_the_package_has_it() -> None:
    from cg.launch.agents import AGENTS
    from cg.launch.run import preset_for
    from cg.settings import preset_names

    assert preset_for(AGENTS["claude"], None) == "claude-code"
    assert preset_for(AGENTS["codex"], None) == "codex"
    assert preset_for(AGENTS["opencode"], None) == (
        "opencode" if "opencode" in preset_names() else "auto"
    )
    assert preset_for(AGENTS["claude"], "off") == "off"  # CG_PRESET


def test_an_agent_binary_is_a_path_or_a_name_on_path(tmp_path: Path) -> None:
    from cg.launch.agents import AGENTS
    from cg.launch.run import find_binary

    binary, _ = agent_script(tmp_path, 0)
    plain = tmp_path / "plain"
    plain.write_text("not executable")
    claude = AGENTS["claude"]
    assert find_binary(claude, str(binary), {}) == str(binary)
    assert find_binary(claude, str(plain), {}) is None
    assert find_binary(claude, "agent", {"PATH": str(tmp_path)}) == str(binary)
    assert find_binary(claude, None, {"PATH": str(tmp_path)}) is None  # no `claude` there
