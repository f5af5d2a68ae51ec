"""Claude Code, pinned, installed into a cache folder the suite owns, run headless and offline.

    binary = install()                       # .cache/claude-code; a no-op when already there
    run = run_claude(binary, prompt, workdir, {"ANTHROPIC_BASE_URL": proxy.url})

`install()` runs `npm install --prefix .cache/claude-code @anthropic-ai/claude-code@VERSION`
once, under a file lock (two test runs may start together), and checks that the binary reports
the pinned version; anything else raises `ClaudeCodeUnavailable` with what to do about it.

`run_claude()` starts `claude -p PROMPT --dangerously-skip-permissions --output-format
stream-json --verbose` with a clean environment: HOME and CLAUDE_CONFIG_DIR in the test's
directory (never the developer's), `IS_SANDBOX=1` (root may skip permissions only then), the
switches for telemetry, auto-update, error reporting and non-essential traffic off, the test key
`sk-test`, and only the variables the test passes (ANTHROPIC_BASE_URL, or HTTPS_PROXY with
NODE_EXTRA_CA_CERTS). Given `CLAUDE_CODE_OAUTH_TOKEN` (a Pro/Max sign-in's token,
`sk-ant-oat01-…`, which 2.1.328 honours without a login or a refresh), no key is set: Claude
Code then sends the token as `authorization: Bearer` with the `oauth-2025-04-20` beta. It is stopped by its process group's id after `timeout` seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.e2e import npm_pin

VERSION = "2.1.328"
PACKAGE = f"@anthropic-ai/claude-code@{VERSION}"
CACHE = Path(__file__).resolve().parents[2] / ".cache" / "claude-code"
# Both under pytest's per-test timeout (120 s), so ours is the failure that says what happened.
RUN_TIMEOUT = 60.0  # a scripted session takes 2-3 s
API_KEY = "sk-test"
OFFLINE = {
    "IS_SANDBOX": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
}


class ClaudeCodeUnavailable(RuntimeError):
    pass


def _platform_package() -> str:
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}
    machine = platform.machine().lower()
    system = platform.system().lower()
    musl = system == "linux" and "musl" in (platform.libc_ver()[0] or "glibc").lower()
    return f"claude-code-{system}-{arch.get(machine, machine)}{'-musl' if musl else ''}"


def _candidates() -> Iterator[Path]:
    modules = CACHE / "node_modules"
    yield modules / ".bin" / "claude"  # the wrapper, once its postinstall linked the binary
    yield modules / "@anthropic-ai" / _platform_package() / "claude"  # the binary itself


def _pin() -> npm_pin.Pin:
    return npm_pin.Pin(
        name="Claude Code",
        package=PACKAGE.rsplit("@", 1)[0],
        version=VERSION,
        cache=CACHE,
        command="claude",
        candidates=_candidates,
        unavailable=ClaudeCodeUnavailable,
        version_of=lambda out: out.split(" ", 1)[0].strip() or None,
        env=OFFLINE,
        needs=f"the npm registry and the platform package @anthropic-ai/{_platform_package()} are needed",
    )


def find() -> Path | None:
    """The installed binary of the pinned version, if any."""
    return npm_pin.find(_pin())


def install() -> Path:
    """The pinned binary, npm-installed into CACHE unless it already is."""
    return npm_pin.install(_pin())


# -- running it ----------------------------------------------------------------------------------


@dataclass
class Run:
    returncode: int
    events: list[dict[str, Any]]  # the stream-json lines
    stdout: str
    stderr: str
    seconds: float

    @property
    def result(self) -> dict[str, Any]:
        results = [e for e in self.events if e.get("type") == "result"]
        assert len(results) == 1, self.describe()
        return results[0]

    def blocks(self, role: str) -> list[dict[str, Any]]:
        """Every content block of every `assistant` (or `user`) message Claude Code printed."""
        out: list[dict[str, Any]] = []
        for e in self.events:
            if e.get("type") == role:
                content = e.get("message", {}).get("content")
                out += (
                    [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
                )
        return out

    def describe(self) -> str:
        return f"claude exited {self.returncode}\nstdout:\n{self.stdout[-4000:]}\nstderr:\n{self.stderr[-4000:]}"

    def assert_succeeded(self) -> dict[str, Any]:
        """Claude Code finished without an error; its result event."""
        assert self.returncode == 0, self.describe()
        result = self.result
        assert result["subtype"] == "success", self.describe()
        assert result["is_error"] is False, self.describe()
        assert result.get("api_error_status") is None, self.describe()
        return result


def run_claude(
    binary: Path,
    prompt: str,
    workdir: Path,
    env: Mapping[str, str],
    timeout: float = RUN_TIMEOUT,
) -> Run:
    """Run one headless session in `workdir`; HOME and the config live in `workdir/home`."""
    home = workdir / "home"
    home.mkdir(parents=True, exist_ok=True)
    full = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "SHELL": shutil.which("bash") or "/bin/sh",
        "LANG": "C.UTF-8",
        **({} if "CLAUDE_CODE_OAUTH_TOKEN" in env else {"ANTHROPIC_API_KEY": API_KEY}),
        **OFFLINE,
        **env,
    }
    cmd = [str(binary), "-p", prompt, "--dangerously-skip-permissions"]
    cmd += ["--output-format", "stream-json", "--verbose"]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=workdir,
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
            f"claude did not finish in {timeout:.0f}s (killed)\nstdout:\n{out[-4000:]}\n"
            f"stderr:\n{err[-4000:]}"
        ) from None
    events = []
    for line in out.splitlines():
        with contextlib.suppress(ValueError):
            events.append(json.loads(line))
    return Run(proc.returncode, events, out, err, time.monotonic() - t0)
