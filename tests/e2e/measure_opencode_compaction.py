"""Measure where the real opencode compacts its own session (the figures in docs/opencode.md).

    python -m tests.e2e.measure_opencode_compaction                          # claude-haiku-4-5
    python -m tests.e2e.measure_opencode_compaction --context 50000 --output 8000
    python -m tests.e2e.measure_opencode_compaction --model anthropic/claude-opus-5-5 --high 2000000

opencode (installed as the suite installs it, tests/e2e/opencode.py) runs a two-step session
against the fake provider and the scripted model (tests/support/agent_script.py), which reports
usage as the bytes would bill it plus `X` extra input tokens on the first answer. After the
first step's command ran, opencode either sends its next turn or first asks its summarization
agent for a summary (a request without tools whose system prompt is `COMPACTION`); bisecting on
`X` finds the smallest first answer's token count (input + output, as opencode adds them) that
makes it compact. `--context`/`--output` give the model that `limit` in opencode's config (as a
user would for a model outside its catalogue). Each trial is one `opencode run` of a few seconds.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tests.e2e.opencode import MODEL, install, run_opencode
from tests.support.agent_script import AgentScript, Call, Step
from tests.support.fakeprovider import FakeProvider, Recorded, Reply

COMPACTION = "You are a context summarization agent."


def is_compaction(rec: Recorded) -> bool:
    """opencode's own compaction request: its summarization agent's system prompt."""
    return rec.method == "POST" and COMPACTION.encode() in (rec.decoded or rec.body)


def is_side_request(rec: Recorded) -> bool:
    """A request of opencode's that is not a turn of the session: the title and the
    summarization agents send no tools."""
    try:
        body = rec.json()
    except ValueError:
        return True
    return not isinstance(body, dict) or "tools" not in body


class PaddedScript(AgentScript):
    """The scripted model, its first answer reporting `extra` more input tokens."""

    extra = 0

    def _message(self, *args: Any, **kw: Any) -> dict[str, Any]:
        message = super()._message(*args, **kw)
        if len(self.answers) == 1:
            message["usage"]["input_tokens"] += self.extra
        return message


def steps(n: int) -> list[Step]:
    return [
        Step(
            (Call("bash", {"command": f"echo step {k}", "description": f"step {k}"}),),
            f"Running step {k}.",
            f"Step {k}: the next command.",
        )
        for k in range(1, n + 1)
    ]


def trial(
    binary: Path, work: Path, model: str, extra_config: dict[str, Any], extra: int
) -> tuple[bool, int]:
    """(did opencode compact after the first step, the first answer's input + output tokens)."""
    shutil.rmtree(work, ignore_errors=True)
    script = PaddedScript("CG-measure", steps(2))
    script.extra = extra

    def respond(rec: Recorded) -> Reply | None:
        if is_side_request(rec):
            return None
        return script(rec)

    with FakeProvider() as fake:
        fake.responder = respond
        url = fake.url + "/v1"
        anthropic = model.startswith("anthropic/")
        run = run_opencode(
            binary,
            "CG-measure: go",
            work,
            model=model,
            extra=extra_config,
            anthropic_url=url if anthropic else None,
            openai_url=None if anthropic else url,
        )
        requests = fake.requests
    assert run.returncode == 0 and script.refusals == [], run.describe()
    tokens = run.parts("step_finish")[0]["tokens"]
    return any(is_compaction(r) for r in requests), int(tokens["input"]) + int(tokens["output"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=MODEL, help="provider/model, as opencode names it")
    ap.add_argument("--context", type=int, default=None, help="the model's context limit")
    ap.add_argument("--output", type=int, default=None, help="the model's output limit")
    ap.add_argument("--high", type=int, default=1_000_000, help="extra tokens that must compact")
    a = ap.parse_args()
    extra_config: dict[str, Any] = {}
    if a.context is not None:
        provider, name = a.model.split("/", 1)
        limit = {"context": a.context, "output": a.output or 8000}
        extra_config = {"provider": {provider: {"models": {name: {"limit": limit}}}}}
    binary = install()
    work = Path(tempfile.mkdtemp(prefix="opencode-measure-"))
    try:
        lo, hi = 0, a.high
        compacts, _ = trial(binary, work, a.model, extra_config, hi)
        assert compacts, f"no compaction even with {hi} extra tokens"
        compacts, _ = trial(binary, work, a.model, extra_config, lo)
        assert not compacts, "opencode compacted after the first step with no extra tokens"
        while hi - lo > 1:
            mid = (lo + hi) // 2
            compacts, total = trial(binary, work, a.model, extra_config, mid)
            print(
                f"first answer input + output {total:>9,}: {'compacts' if compacts else 'goes on'}"
            )
            lo, hi = (lo, mid) if compacts else (mid, hi)
        _, below = trial(binary, work, a.model, extra_config, lo)
        _, at = trial(binary, work, a.model, extra_config, hi)
        print(f"opencode goes on at {below:,} tokens and compacts at {at:,}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
