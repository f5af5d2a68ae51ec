"""opencode never stops to compact its own session behind the `opencode` preset.

opencode compacts once the last answer's reported tokens (input + output, cache reads and writes
included) reach the model's context limit less min(its output limit, 32,000) (docs/opencode.md).
Given `limit: {context: 50000, output: 8000}` for its model, that is 42,000, which a scripted
session of `seq` outputs passes in about twenty steps. The fake provider reports usage as the
body it received would bill it (bytes / 4).

The proxy runs `cg_preset=auto` (which picks `opencode` from opencode's user-agent) on the same
window (`model_windows`), so its ceiling (60%: 30,000) and the roll-forward at it fire as they
would on a real window. The control run, with `cg_preset=off`, shows opencode compacting on the
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
from tests.e2e.harness import Proxy
from tests.e2e.measure_opencode_compaction import is_compaction, is_side_request
from tests.e2e.opencode import run_opencode
from tests.support.agent_script import AgentScript, Call, Step
from tests.support.fakeprovider import FakeProvider, Recorded, Reply

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "claude-haiku-4-5"
WINDOW = 50_000
THRESHOLD = WINDOW - 8_000  # opencode's: the window less min(the output limit, 32,000)
LIMIT = {
    "provider": {"anthropic": {"models": {MODEL: {"limit": {"context": WINDOW, "output": 8_000}}}}}
}
STEPS = 24


def tool_heavy(n: int) -> list[Step]:
    """n steps, each a bash call printing ~6.9 KB (~2k tokens as the fake bills them)."""
    return [
        Step(
            (Call("bash", {"command": f"echo step {k}; seq 1 1500", "description": f"step {k}"}),),
            f"Running step {k}.",
            f"Step {k}: the next listing.",
        )
        for k in range(1, n + 1)
    ]


class Session:
    """The scripted model; opencode's own requests without tools (its title agent's, its
    summarization agent's) get the fake's default answer, each compaction kept with the tokens
    the answer before it reported."""

    def __init__(self, tag: str, proxy: Proxy) -> None:
        self.script = AgentScript(tag, tool_heavy(STEPS), before=lambda step: wait_settled(proxy))
        self.compactions: list[int] = []
        self.reported: list[int] = []  # each scripted answer's input + output tokens

    def __call__(self, rec: Recorded) -> Reply | None:
        if is_compaction(rec):
            self.compactions.append(self.reported[-1] if self.reported else 0)
        if is_side_request(rec):
            return None
        reply = self.script(rec)
        if reply is not None:
            self.reported.append(len(rec.decoded or rec.body) // 4 + 35)
        return reply


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with FakeProvider() as p:
        yield p


def start(fake: FakeProvider, workdir: Path, preset: str) -> Proxy:
    config = workdir / "windows.yaml"
    config.write_text(yaml.safe_dump({"model_windows": {MODEL: WINDOW}}))
    return start_proxy(fake.url, workdir, preset, options=[f"cg_config={config}"])


def drive(binary: Path, fake: FakeProvider, proxy: Proxy, workdir: Path) -> Session:
    session = Session(f"CG-{workdir.name}", proxy)
    fake.responder = session
    try:
        run = run_opencode(
            binary,
            f"{session.script.tag}: run the scripted steps, one tool call each.",
            workdir,
            anthropic_url=proxy.url + "/v1",
            model=f"anthropic/{MODEL}",
            extra=LIMIT,
            timeout=100,
        )
    finally:
        fake.responder = None
    run.assert_succeeded()
    assert session.script.refusals == [], session.script.refusals
    return session


def agent_turns(fake: FakeProvider) -> list[Recorded]:
    return [
        r
        for r in fake.requests
        if r.method == "POST" and not r.is_summarizer and not is_side_request(r)
    ]


def test_opencode_never_compacts_behind_the_opencode_preset(
    opencode: Path, fake: FakeProvider, tmp_path: Path, proxies: Any
) -> None:
    proxy = proxies(start(fake, tmp_path, "auto"))
    session = drive(opencode, fake, proxy, tmp_path)

    assert session.compactions == []
    sent = [x for x in tapped(tmp_path / "tap.jsonl") if x.method == "POST"]
    assert not any(b"You are a context summarization agent." in x.body for x in sent)
    assert [a.step for a in session.script.answers] == list(range(STEPS + 1))
    # opencode's own session grew past its threshold: without the proxy it would have
    # compacted (the control test below shows it does) ...
    assert max(len(x.body) // 4 for x in sent) > THRESHOLD
    # ... but every context it was told about (the usage of what the provider got) stayed below.
    got = agent_turns(fake)
    assert len(got) == STEPS + 1
    assert max(session.reported) < THRESHOLD
    records = [json.loads(x) for x in (tmp_path / "decisions.jsonl").read_text().splitlines()]
    outcomes = [r["cg"]["outcome"] for r in records if r.get("cg")]
    assert outcomes.count("rewritten") >= 3, outcomes
    assert {r["cg"].get("preset") for r in records if r.get("cg")} == {"opencode"}
    stats = proxy.stats()
    assert stats["summaries"]["completed"] >= 1
    assert (stats["failed_open"], stats["retried_original"]) == (0, 0)


def test_control_the_same_session_without_the_proxy_acting_makes_opencode_compact(
    opencode: Path, fake: FakeProvider, tmp_path: Path, proxies: Any
) -> None:
    proxy = proxies(start(fake, tmp_path, "off"))
    session = drive(opencode, fake, proxy, tmp_path)
    assert session.compactions, "opencode never compacted: the first test proves nothing"
    # It compacted right after the first answer that reported THRESHOLD or more.
    first = next(i for i, t in enumerate(session.reported) if t >= THRESHOLD)
    assert session.compactions[0] == session.reported[first]
    assert all(t < THRESHOLD for t in session.reported[:first])
