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

from tests.e2e import npm_pin

REPO = Path(__file__).resolve().parents[2]
VERSION = "0.61.0"
PACKAGE = f"@google/gemini-cli@{VERSION}"
CACHE = REPO / ".cache" / "gemini-cli"
RUN_TIMEOUT = 60.0
API_KEY = "AIza-e2e-gemini-cli-key-0001"
MODEL = "gemini-2.5-flash"
OFFLINE = {"GEMINI_TELEMETRY_ENABLED": "false", "NO_BROWSER": "true"}


class GeminiCliUnavailable(RuntimeError):
    pass


def binary_path() -> Path:
    return CACHE / "node_modules" / ".bin" / "gemini"


def _pin() -> npm_pin.Pin:
    return npm_pin.Pin(
        name="Gemini CLI",
        package=PACKAGE.rsplit("@", 1)[0],
        version=VERSION,
        cache=CACHE,
        command="gemini",
        candidates=lambda: [binary_path()],
        unavailable=GeminiCliUnavailable,
        env=OFFLINE,
    )


def find() -> Path | None:
    """The installed binary of the pinned version, if any."""
    return npm_pin.find(_pin())


def install() -> Path:
    """The pinned binary, npm-installed into CACHE unless it already is."""
    return npm_pin.install(_pin())


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
