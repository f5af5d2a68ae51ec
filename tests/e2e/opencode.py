"""opencode, pinned, installed into a cache folder the suite owns.

    binary = install()                       # .cache/opencode; a no-op when already there

`install()` runs `npm install --prefix .cache/opencode opencode-ai@VERSION` once, under a file
lock (two test runs may start together), and checks that the binary reports the pinned version;
anything else raises `OpencodeUnavailable` with what to do about it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VERSION = "1.18.33"
PACKAGE = f"opencode-ai@{VERSION}"
CACHE = REPO / ".cache" / "opencode"
INSTALL_TIMEOUT = 100.0


class OpencodeUnavailable(RuntimeError):
    pass


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
            env={"PATH": os.environ.get("PATH", ""), "HOME": str(CACHE)},
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    words = out.stdout.split()
    return words[-1] if out.returncode == 0 and words else None


def find() -> Path | None:
    binary = CACHE / "node_modules" / ".bin" / "opencode"
    return binary if _version(binary) == VERSION else None


def install() -> Path:
    """The pinned opencode binary, npm-installed into CACHE unless it already is."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE.parent / "opencode.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = find()
        if found is not None:
            return found
        npm = shutil.which("npm")
        if npm is None:
            raise OpencodeUnavailable(
                f"opencode {VERSION} is not in {CACHE} and npm is not on PATH: the real-client "
                "tests need Node.js with npm (deselect them with -m 'not slow')."
            )
        cmd = [npm, "install", "--prefix", str(CACHE), "--no-audit", "--no-fund", PACKAGE]
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise OpencodeUnavailable(
                f"`{' '.join(cmd)}` did not finish in {INSTALL_TIMEOUT:.0f}s"
            ) from None
        found = find()
        if found is None:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
            raise OpencodeUnavailable(
                f"`{' '.join(cmd)}` exited {done.returncode} and left no working `opencode` "
                f"{VERSION} in {CACHE}:\n{tail}"
            )
        return found
