"""The agent as a child: its exit status ours, a signal sent to the launcher passed on to it, the
launcher's own handlers put back."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

from cg.launch import child

WAIT = 20.0


def test_the_exit_status_is_the_agents() -> None:
    assert child.run([sys.executable, "-c", "raise SystemExit(3)"], os.environ) == 3
    assert child.run([sys.executable, "-c", "pass"], os.environ) == 0


def test_an_agent_killed_by_a_signal_is_128_plus_its_number() -> None:
    kill = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    assert child.run([sys.executable, "-c", kill], os.environ) == 128 + signal.SIGKILL
    assert child.status(-15) == 143 and child.status(5) == 5


def test_the_environment_given_is_the_agents() -> None:
    check = "import os; raise SystemExit(0 if os.environ.get('CG_T') == 'yes' else 9)"
    assert child.run([sys.executable, "-c", check], {**os.environ, "CG_T": "yes"}) == 0


def test_a_sigterm_sent_to_the_launcher_reaches_the_agent(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    agent = (
        "import pathlib, signal, sys\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
        f"pathlib.Path({str(ready)!r}).write_text('up')\n"
        "signal.pause()\n"
    )
    sent = threading.Event()

    def send() -> None:
        pause = threading.Event()
        for _ in range(int(WAIT / 0.01)):
            if ready.exists():
                os.kill(os.getpid(), signal.SIGTERM)  # to the launcher, not the agent
                sent.set()
                return
            pause.wait(0.01)

    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=send)
    thread.start()
    try:
        assert child.run([sys.executable, "-c", agent], os.environ) == 7
    finally:
        thread.join(WAIT)
    assert sent.is_set()
    assert signal.getsignal(signal.SIGTERM) is before  # the launcher's own handler back
