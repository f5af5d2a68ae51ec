"""The agent, run in the foreground as if started from the shell.

It inherits the terminal (stdin, stdout, stderr) and stays in the launcher's process group, so
the terminal's own signals (Ctrl-C, Ctrl-\\, a resize, job control) reach it directly. A signal
sent to the launcher itself is passed on: SIGTERM and SIGHUP always, SIGINT and SIGQUIT unless
the launcher's group holds the terminal (then the terminal sent them to the agent too, and a
second Ctrl-C would be the agent's "press again to exit"). Its exit status is the launcher's;
killed by signal N, the shell's 128 + N.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from types import FrameType

FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT)
FROM_TERMINAL = (signal.SIGINT, signal.SIGQUIT)


def _terminal_is_ours() -> bool:
    """Whether the launcher's process group is the terminal's foreground group."""
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        try:
            return os.tcgetpgrp(stream.fileno()) == os.getpgrp()
        except (OSError, ValueError, AttributeError):
            continue
    return False


def status(returncode: int) -> int:
    """The exit status a shell would report for a child that returned `returncode`."""
    return returncode if returncode >= 0 else 128 - returncode


def run(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Run `argv` to its end; its exit status."""
    procs: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        if signum in FROM_TERMINAL and _terminal_is_ours():
            return
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in FORWARDED}
    try:
        procs.append(subprocess.Popen(list(argv), env=dict(env)))
        return status(procs[0].wait())
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
