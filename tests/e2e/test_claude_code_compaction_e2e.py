"""Claude Code never stops to compact its own transcript behind the `claude-code` preset.

Claude Code sizes its context from the usage of the previous answer and compacts when it passes
its threshold (../notes/claude-code-compaction.md). With `CLAUDE_CODE_AUTO_COMPACT_WINDOW=200000`
and `CLAUDE_AUTOCOMPACT_PCT_OVERRIDE=P` that threshold is P% of (200k - 20k output reserve): 25%
gives 45,000 tokens, which a scripted session of `seq` outputs passes in about a dozen turns. The
fake provider reports usage as the body it received would bill it (bytes / 4), like the
measurements in the notes.

The proxy runs `cg_preset=claude-code` on a window lowered to match (`model_windows`), so its
ceiling (and the roll-forward at the same ceiling) fires at a fraction of the window as it would
on a real 200k one. The control run, with `cg_preset=off`, shows Claude Code compacting on the
same session — the guard that the first test is not passing vacuously.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.agents import start_proxy, tapped, wait_settled
from tests.e2e.claude_code import run_claude
from tests.e2e.harness import Proxy
from tests.support.agent_script import AgentScript, Call, Step, _reply
from tests.support.fakeprovider import FakeProvider, Recorded, Reply

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

COMPACT = "CRITICAL: Respond with TEXT ONLY"
THRESHOLD = 45_000  # 25% of (200,000 - 20,000), in the fake's bytes/4 tokens
ENV = {"CLAUDE_CODE_AUTO_COMPACT_WINDOW": "200000", "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "25"}
# A 50k window puts the preset's ceiling (0.6) at 30k tokens (the proxy's tiktoken count, close
# to the fake's bytes / 4 here): Claude Code's system and tools alone are ~18k of it, so the
# checkpoint rolls forward every few turns — and the context Claude Code is told of stays under
# its 45k.
WINDOW = 50_000
STEPS = 18


def tool_heavy(n: int) -> list[Step]:
    """n steps, each a Bash call printing ~9 KB (~2.2k tokens as the fake bills them)."""
    return [
        Step(
            (Call("Bash", {"command": f"echo step {k}; seq 1 1500", "description": f"step {k}"}),),
            f"Running step {k}.",
            f"Step {k}: the next listing.",
        )
        for k in range(1, n + 1)
    ]


class Session:
    """The scripted model, plus Claude Code's own compaction request answered as the API would
    (a text summary that keeps the session's tag, so the script recognises what follows)."""

    def __init__(self, tag: str, steps: list[Step], proxy: Proxy | None) -> None:
        settle = (lambda step: wait_settled(proxy)) if proxy is not None else None
        self.script = AgentScript(tag, steps, before=settle)
        self.tag = tag
        self.compactions: list[int] = []

    def __call__(self, rec: Recorded) -> Reply | None:
        if rec.method == "POST" and COMPACT.encode() in (rec.decoded or rec.body):
            body = rec.json()
            self.compactions.append(len(rec.body) // 4)
            text = f"<analysis>done so far</analysis><summary>{self.tag}: steps ran.</summary>"
            message = {
                "id": "msg_compaction",
                "type": "message",
                "role": "assistant",
                "model": body["model"],
                "content": [{"type": "text", "text": text}],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": len(rec.body) // 4, "output_tokens": 40},
            }
            return _reply("anthropic", message, body.get("stream") is True, body)
        return self.script(rec)


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with FakeProvider() as p:
        yield p


def drive(claude: Path, fake: FakeProvider, proxy: Proxy, workdir: Path) -> Session:
    work = workdir / "work"
    work.mkdir(parents=True, exist_ok=True)
    session = Session(f"CG-{workdir.name}", tool_heavy(STEPS), proxy)
    fake.responder = session
    try:
        run = run_claude(
            claude,
            f"{session.tag}: run the scripted steps, one tool call each.",
            work,
            {"ANTHROPIC_BASE_URL": proxy.url, **ENV},
            timeout=100,
        )
    finally:
        fake.responder = None
    result = run.assert_succeeded()
    assert result["result"] == session.script.final_text
    assert session.script.refusals == [], session.script.refusals
    return session


def agent_turns(fake: FakeProvider) -> list[Recorded]:
    return [r for r in fake.requests if r.method == "POST" and not r.is_summarizer]


def start(fake: FakeProvider, workdir: Path, preset: str) -> Proxy:
    config = workdir / "windows.yaml"
    config.write_text(yaml.safe_dump({"model_windows": {"claude-opus-5-5": WINDOW}}))
    return start_proxy(fake.url, workdir, preset, options=[f"cg_config={config}"])


def test_claude_code_never_compacts_behind_the_claude_code_preset(
    claude_code: Path, fake: FakeProvider, tmp_path: Path, proxies: Any
) -> None:
    proxy = proxies(start(fake, tmp_path, "claude-code"))
    session = drive(claude_code, fake, proxy, tmp_path)

    assert session.compactions == []
    sent = [x for x in tapped(tmp_path / "tap.jsonl") if x.method == "POST"]
    assert not any(COMPACT.encode() in x.body for x in sent)
    # Claude Code's own transcript grew past its threshold: without the proxy it would have
    # compacted (the control test below shows it does) ...
    assert max(len(x.body) // 4 for x in sent) > THRESHOLD
    # ... but every context it was told about (the usage of what the provider got) stayed below.
    got = agent_turns(fake)
    assert len(got) == len(sent) == STEPS + 1
    assert max(len(r.body) // 4 for r in got) < THRESHOLD
    records = [json.loads(x) for x in (tmp_path / "decisions.jsonl").read_text().splitlines()]
    outcomes = [r["cg"]["outcome"] for r in records if r.get("cg")]
    assert outcomes.count("rewritten") >= 3, outcomes
    presets = {r["cg"].get("preset") for r in records if r.get("cg")}
    assert presets == {"claude-code"}
    stats = proxy.stats()
    assert stats["summaries"]["completed"] >= 1
    assert (stats["failed_open"], stats["retried_original"]) == (0, 0)


def test_control_the_same_session_without_the_proxy_acting_makes_claude_code_compact(
    claude_code: Path, fake: FakeProvider, tmp_path: Path, proxies: Any
) -> None:
    proxy = proxies(start(fake, tmp_path, "off"))
    session = drive(claude_code, fake, proxy, tmp_path)
    assert session.compactions, "Claude Code never compacted: the first test proves nothing"
    assert min(session.compactions) > THRESHOLD * 0.9
