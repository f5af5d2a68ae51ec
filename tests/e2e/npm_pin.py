"""A real agent CLI, pinned, npm-installed once into a cache folder the suite owns.

Each agent module (claude_code, codex, opencode, gemini_cli) describes its package with a `Pin`
and keeps its own `find()` / `install()` as one-line calls here, so what differs between agents
(where npm puts the binary, how `--version` answers, which platform package it needs) is all
that is written there.

`install(pin)` runs `npm install --prefix CACHE PACKAGE@VERSION` under a file lock (two test
runs may start together) unless a binary of the pinned version is already there, and checks that
the binary reports the pinned version; anything else raises the agent's own error saying what
to do about it (no npm, a registry that does not answer, an install that left no binary).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

# Under pytest's per-test timeout (120 s), so ours is the failure that says what happened.
INSTALL_TIMEOUT = 100.0


def last_word(out: str) -> str | None:
    """`codex-cli 0.171.0`, `1.18.33`: the version is the last word."""
    words = out.split()
    return words[-1] if words else None


@dataclass(frozen=True)
class Pin:
    name: str  # how the messages call it: "Claude Code"
    package: str  # the npm package, without the version
    version: str
    cache: Path  # .cache/<agent>
    command: str  # the binary's name in the messages: "claude"
    candidates: Callable[[], Iterable[Path]]  # where the binary may be, first found wins
    unavailable: type[RuntimeError]
    version_of: Callable[[str], str | None] = last_word  # from `--version`'s stdout
    env: Mapping[str, str] = field(default_factory=dict)  # for `--version` (offline switches)
    needs: str = ""  # what else the install needs, said when it fails: a platform package

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}"


def version(pin: Pin, binary: Path) -> str | None:
    if not os.access(binary, os.X_OK):
        return None
    try:
        out = subprocess.run(
            [str(binary), "--version"],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
            env={"PATH": os.environ.get("PATH", ""), "HOME": str(pin.cache), **pin.env},
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return pin.version_of(out.stdout) if out.returncode == 0 else None


def find(pin: Pin) -> Path | None:
    """The installed binary of the pinned version, if any."""
    return next((b for b in pin.candidates() if version(pin, b) == pin.version), None)


def install(pin: Pin) -> Path:
    """The pinned binary, npm-installed into the cache unless it already is."""
    pin.cache.mkdir(parents=True, exist_ok=True)
    with open(pin.cache.parent / f"{pin.cache.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = find(pin)
        if found is not None:
            return found
        npm = shutil.which("npm")
        if npm is None:
            raise pin.unavailable(
                f"{pin.name} {pin.version} is not in {pin.cache} and npm is not on PATH: the "
                "real-client tests need Node.js with npm (deselect them with -m 'not slow')."
            )
        cmd = [npm, "install", "--prefix", str(pin.cache), "--no-audit", "--no-fund", pin.spec]
        try:
            done = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=INSTALL_TIMEOUT,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise pin.unavailable(
                f"`{' '.join(cmd)}` did not finish in {INSTALL_TIMEOUT:.0f}s; is the npm "
                "registry reachable?"
            ) from None
        found = find(pin)
        if found is None:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
            needs = f" ({pin.needs})" if pin.needs else ""
            raise pin.unavailable(
                f"`{' '.join(cmd)}` exited {done.returncode} and left no working "
                f"`{pin.command}` {pin.version} in {pin.cache}{needs}:\n{tail}"
            )
        return found
