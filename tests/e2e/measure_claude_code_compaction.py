"""Measure where the real Claude Code compacts its own transcript (the figures in
cg/presets/claude-code.yaml).

    python -m tests.e2e.measure_claude_code_compaction                 # its default model
    python -m tests.e2e.measure_claude_code_compaction --env CLAUDE_CODE_AUTO_COMPACT_WINDOW=200000

Claude Code (installed as the suite installs it, tests/e2e/claude_code.py) runs a two-step
session against the fake provider and the scripted model (tests/support/agent_script.py), whose
first answer reports `X` more input tokens than the bytes would bill. After the first step's
command ran, Claude Code either sends its next turn or first asks for a summary (its "CRITICAL:
Respond with TEXT ONLY" instruction); bisecting on `X` finds the smallest first answer's token
count (input + output) that makes it compact. Each trial is one `claude -p` of a few seconds.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tests.e2e.claude_code import install, run_claude
from tests.support.agent_script import AgentScript, Call, Step
from tests.support.fakeprovider import FakeProvider, Recorded, Reply

COMPACT = b"CRITICAL: Respond with TEXT ONLY"


class PaddedScript(AgentScript):
    """The scripted model, its first answer reporting `extra` more input tokens."""

    extra = 0
    first = 0  # the first answer's input + output tokens, as reported

    def _message(self, *args: Any, **kw: Any) -> dict[str, Any]:
        message = super()._message(*args, **kw)
        if len(self.answers) == 1:
            message["usage"]["input_tokens"] += self.extra
            self.first = message["usage"]["input_tokens"] + message["usage"]["output_tokens"]
        return message


def trial(binary: Path, work: Path, env: dict[str, str], extra: int) -> tuple[bool, int]:
    """(did Claude Code compact after the first step, the first answer's input + output)."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    steps = [
        Step(
            (Call("Bash", {"command": f"echo step {k}", "description": f"step {k}"}),),
            "Go.",
            "Next.",
        )
        for k in (1, 2)
    ]
    script = PaddedScript("CG-measure", steps)
    script.extra = extra
    compacted: list[Recorded] = []

    def respond(rec: Recorded) -> Reply | None:
        if rec.method == "POST" and COMPACT in (rec.decoded or rec.body):
            compacted.append(rec)
            return None  # the default text answer: the summary
        return script(rec)

    with FakeProvider() as fake:
        fake.responder = respond
        run_claude(binary, "CG-measure: go", work, {"ANTHROPIC_BASE_URL": fake.url, **env})
    return bool(compacted), script.first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for Claude Code")
    ap.add_argument("--high", type=int, default=1_100_000, help="extra tokens that must compact")
    a = ap.parse_args()
    env = dict(s.split("=", 1) for s in a.env)
    binary = install()
    work = Path(tempfile.mkdtemp(prefix="claude-measure-"))
    try:
        lo, hi = 0, a.high
        compacts, _ = trial(binary, work, env, hi)
        assert compacts, f"no compaction even with {hi} extra tokens"
        compacts, _ = trial(binary, work, env, lo)
        assert not compacts, "Claude Code compacted after the first step with no extra tokens"
        while hi - lo > 1:
            mid = (lo + hi) // 2
            compacts, total = trial(binary, work, env, mid)
            print(
                f"first answer input + output {total:>9,}: {'compacts' if compacts else 'goes on'}"
            )
            lo, hi = (lo, mid) if compacts else (mid, hi)
        _, below = trial(binary, work, env, lo)
        _, at = trial(binary, work, env, hi)
        print(f"Claude Code goes on at {below:,} tokens and compacts at {at:,}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
