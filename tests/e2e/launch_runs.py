"""`context-guru AGENT …` run as a user runs it: `python -m cg AGENT ARGS` in a subprocess with a
throwaway HOME (so the default store and mitmproxy's confdir are the test's), the agent's binary
by CG_AGENT_BIN, the fake provider as CG_UPSTREAM, and what it printed kept.

    run = launch("claude", ["-p", prompt, …], workdir, {"CG_PORT": "…"}, settle=…)
    run.closing            # the closing line's figures (turns, rewritten, tokens, retention, …)

`LaunchRun.closing` parses the one line the launcher prints at the end; `pid_gone(pid)` says a
process this test did not start (the launcher's proxy) is no longer there.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.e2e.harness import REPO, hermetic, low, poll

TIMEOUT = 90.0
CLOSING = re.compile(
    r"^context-guru: (?P<rewritten>\d+) of (?P<turns>\d+) turns rewritten, "
    r"(?P<tokens>-?[\d,]+|unknown) tokens not sent, retention (?P<retention>[\d.]+%|n/a[^,]*), "
    r"(?P<saved>-?\$[\d,.]+|unknown) saved \(estimate; (?P<billed>-?\$[\d,.]+|unknown) billed\) "
    r"(?P<plan>at API list prices, plan-equivalent )?— proxy 127\.0\.0\.1:(?P<port>\d+) (?P<how>started and stopped \(pid (?P<pid>\d+), "
    r"log (?P<log>[^)]+)\)|reused, left running)$",
    re.M,
)
# Low enough for a short session's third request to qualify; one summary, reused to the end.
LOW = low(min_messages=6, resummarize_tokens=1_000_000)


@dataclass
class LaunchRun:
    returncode: int
    stdout: str
    stderr: str

    def describe(self) -> str:
        return (
            f"context-guru exited {self.returncode}\nstdout:\n{self.stdout[-4000:]}\n"
            f"stderr:\n{self.stderr[-4000:]}"
        )

    @property
    def closing(self) -> dict[str, Any]:
        found = CLOSING.findall(self.stderr)
        assert len(found) == 1, self.describe()
        m = CLOSING.search(self.stderr)
        assert m is not None
        return m.groupdict()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def low_config(workdir: Path) -> Path:
    """A config file whose summarize triggers a short session passes."""
    path = workdir / "cg.yaml"
    path.write_text(yaml.safe_dump({"components": {"summarize": LOW}}))
    return path


def settled(port: int, timeout: float = 10.0) -> None:
    """Until no summary is in flight in the proxy on `port` (a script's gate)."""
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=5) as c:
        for _ in poll(timeout):
            s = c.get("/_cg/stats").json()["summaries"]
            if s["commissioned"] == s["completed"] + s["failed"] + s["timed_out"]:
                return
    raise TimeoutError(f"a summary was still in flight after {timeout}s")


def launch(
    agent: str,
    args: Sequence[str],
    workdir: Path,
    env: Mapping[str, str],
    timeout: float = TIMEOUT,
) -> LaunchRun:
    """`python -m cg AGENT ARGS` in `workdir/work` with HOME `workdir/home`; `env` over a
    clean environment (PATH, HOME, the checkout on PYTHONPATH)."""
    home = workdir / "home"
    home.mkdir(parents=True, exist_ok=True)
    work = workdir / "work"
    work.mkdir(parents=True, exist_ok=True)
    full = {
        **{k: v for k, v in os.environ.items() if k in ("PATH", "LANG") and not hermetic(k)},
        "HOME": str(home),
        "SHELL": shutil.which("bash") or "/bin/sh",
        "PYTHONPATH": str(REPO),
        **env,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "cg", agent, *args],
        cwd=work,
        env=full,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group: a timeout stops the agent and its proxy too
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
        raise AssertionError(
            f"context-guru {agent} did not finish:\n{out[-3000:]}\n{err[-3000:]}"
        ) from None
    return LaunchRun(proc.returncode, out, err)


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # (a zombie is gone in all but name: its parent, the launcher, has exited)
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except (OSError, IndexError):
        return True


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
