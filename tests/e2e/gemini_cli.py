"""Gemini CLI (`@google/gemini-cli`), pinned, installed into a cache folder the suite owns, run
headless and offline.

    binary = install()                       # .cache/gemini-cli; a no-op when already there
    run = run_gemini(binary, prompt, workdir, base_url=proxy.url)

`install()` runs `npm install --prefix .cache/gemini-cli @google/gemini-cli@VERSION` once,
under a file lock (two test runs may start together), and checks that `gemini --version` says
the pinned version; anything else raises `GeminiCliUnavailable` with what to do about it.

`run_gemini()` runs `gemini -m MODEL -p PROMPT --yolo --output-format json` in
`workdir/project` with a clean environment: HOME in `workdir/home` (never the developer's),
the test key in `GEMINI_API_KEY` (sent as `x-goog-api-key`), and `GOOGLE_GEMINI_BASE_URL` at
the proxy or the fake (the CLI takes it for its API-key sign-in; plain http only for
loopback). Its settings (`~/.gemini/settings.json`, `settings()`) choose the API-key sign-in
and switch off usage statistics, telemetry, auto-update and its notice, checkpointing, the IDE
integration and folder trust. The model is named (`-m`): with the default (`auto`) it first
asks a router model (a `generateContent` wanting a JSON verdict) which model to use. Measured
with strace -f -e trace=connect (0.61.0): with this environment the only connections it opens
are to 127.0.0.1. Stdin is closed; it is stopped by its process group's id after `timeout`
seconds.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
VERSION = "0.61.0"
PACKAGE = f"@google/gemini-cli@{VERSION}"
CACHE = REPO / ".cache" / "gemini-cli"
INSTALL_TIMEOUT = 100.0  # under pytest's per-test timeout (120 s)
RUN_TIMEOUT = 60.0
API_KEY = "AIza-e2e-gemini-cli-key-0001"
MODEL = "gemini-2.5-flash"
OFFLINE = {"GEMINI_TELEMETRY_ENABLED": "false", "NO_BROWSER": "true"}


class GeminiCliUnavailable(RuntimeError):
    pass


def binary_path() -> Path:
    return CACHE / "node_modules" / ".bin" / "gemini"


def _version(binary: Path) -> str | None:
    if not os.access(binary, os.X_OK):
        return None
    try:
        out = subprocess.run(
            [str(binary), "--version"],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
            env={"PATH": os.environ.get("PATH", ""), "HOME": str(CACHE), **OFFLINE},
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    words = out.stdout.split()  # "0.61.0"
    return words[-1] if out.returncode == 0 and words else None


def find() -> Path | None:
    """The installed binary of the pinned version, if any."""
    b = binary_path()
    return b if _version(b) == VERSION else None


def install() -> Path:
    """The pinned `gemini`, npm-installed into CACHE unless it already is."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE.parent / "gemini-cli.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = find()
        if found is not None:
            return found
        npm = shutil.which("npm")
        if npm is None:
            raise GeminiCliUnavailable(
                f"Gemini CLI {VERSION} is not in {CACHE} and npm is not on PATH: the real-client "
                "tests need Node.js with npm (deselect them with -m 'not slow')."
            )
        cmd = [npm, "install", "--prefix", str(CACHE), "--no-audit", "--no-fund", PACKAGE]
        try:
            done = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=INSTALL_TIMEOUT,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise GeminiCliUnavailable(
                f"`{' '.join(cmd)}` did not finish in {INSTALL_TIMEOUT:.0f}s; is the npm "
                "registry reachable?"
            ) from None
        found = find()
        if found is None:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
            raise GeminiCliUnavailable(
                f"`{' '.join(cmd)}` exited {done.returncode} and left no working `gemini` "
                f"{VERSION} in {CACHE}:\n{tail}"
            )
        return found


def settings(extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What `~/.gemini/settings.json` holds: the API-key sign-in, nothing that phones home;
    `extra` merged over the top level (e.g. `model.compressionThreshold`)."""
    out: dict[str, Any] = {
        "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "general": {
            "enableAutoUpdate": False,
            "enableAutoUpdateNotification": False,
            "checkpointing": {"enabled": False},
        },
        "ide": {"enabled": False, "hasSeenNudge": True},
    }
    for key, value in (extra or {}).items():
        old = out.get(key)
        out[key] = {**old, **value} if isinstance(old, dict) and isinstance(value, dict) else value
    return out


@dataclass
class Run:
    returncode: int
    output: dict[str, Any] | None  # the --output-format json document
    stdout: str
    stderr: str
    seconds: float

    def describe(self) -> str:
        return (
            f"gemini exited {self.returncode}\nstdout:\n{self.stdout[-4000:]}\n"
            f"stderr:\n{self.stderr[-4000:]}"
        )

    @property
    def response(self) -> str:
        assert self.output is not None, self.describe()
        return str(self.output.get("response"))

    def tool_calls(self) -> dict[str, Any]:
        """The stats' per-tool counts."""
        assert self.output is not None, self.describe()
        return dict(self.output["stats"]["tools"])

    def assert_succeeded(self) -> None:
        """It finished without an error, and every tool call it made succeeded."""
        assert self.returncode == 0 and self.output is not None, self.describe()
        assert "error" not in self.output, self.describe()
        tools = self.tool_calls()
        assert tools["totalFail"] == 0, self.describe()


def run_gemini(
    binary: Path,
    prompt: str,
    workdir: Path,
    *,
    base_url: str,
    model: str = MODEL,
    extra: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = RUN_TIMEOUT,
) -> Run:
    """Run `gemini -p` once in `workdir/project`, HOME in `workdir/home`."""
    home = workdir / "home"
    project = workdir / "project"
    for d in (home / ".gemini", project):
        d.mkdir(parents=True, exist_ok=True)
    (home / ".gemini" / "settings.json").write_text(json.dumps(settings(extra)))
    full = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "SHELL": shutil.which("bash") or "/bin/sh",
        "LANG": "C.UTF-8",
        "GEMINI_API_KEY": API_KEY,
        "GOOGLE_GEMINI_BASE_URL": base_url,
        **OFFLINE,
        **(env or {}),
    }
    cmd = [str(binary), "-m", model, "-p", prompt, "--yolo", "--output-format", "json"]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=project,
        env=full,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: a timeout stops the tools it runs too
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
        raise AssertionError(
            f"gemini did not finish in {timeout:.0f}s (killed)\nstdout:\n{out[-4000:]}\n"
            f"stderr:\n{err[-4000:]}"
        ) from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    doc: dict[str, Any] | None = None
    with contextlib.suppress(ValueError):
        parsed = json.loads(out[out.find("{") :]) if "{" in out else None
        doc = parsed if isinstance(parsed, dict) else None
    return Run(proc.returncode, doc, out, err, time.monotonic() - t0)
