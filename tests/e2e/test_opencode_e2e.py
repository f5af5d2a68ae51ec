"""opencode itself (pinned, see tests/e2e/opencode.py) through `mitmdump -s cg_addon.py` in
reverse mode (its anthropic or openai provider's `baseURL` at the proxy), driven by a scripted
model.

The fake provider answers opencode's turns from tests/support/agent_script.py: `bash` calls
(opencode's own tool names and arguments; parallel ones, a `read` of a file), signed thinking,
streamed as the API streams, then a final answer. opencode really runs the tools; the script
checks their results and refuses (400) anything a provider would refuse. Its side requests (the
title agent's, with no tools) get the fake's default answer. The tap (tests/e2e/tap.py) keeps what
opencode put on the wire, so every provider request is compared with it byte for byte.

On its openai provider opencode speaks the Responses API (`store: false`, reasoning items sent
back by their `encrypted_content` alone): tests/support/codex_script.py answers it, its calls
made as opencode's `bash`, and tests/e2e/codex_sessions.py audits it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.agents import (
    SECRET,
    Sent,
    Turn,
    assert_summarized,
    audit,
    start_proxy,
    tapped,
    wait_settled,
)
from tests.e2e.codex_sessions import CodexTurn, assert_codex_summarized
from tests.e2e.codex_sessions import audit as audit_responses
from tests.e2e.harness import Proxy, low
from tests.e2e.measure_opencode_compaction import is_side_request
from tests.e2e.opencode import VERSION, Run, run_opencode
from tests.support.agent_script import AgentScript, Call, Step
from tests.support.codex_script import CodexScript
from tests.support.codex_script import session as responses_session
from tests.support.fakeprovider import FakeProvider, Recorded, Reply

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# Low enough for opencode's third turn (5 messages) to qualify; no roll-forward, so every later
# turn reuses the one summary.
LOW = low(min_messages=5, resummarize_tokens=1_000_000)


def bash(k: int, part: str = "") -> Call:
    return Call("bash", {"command": f"echo step {k}{part}", "description": f"Run step {k}{part}"})


def steps(n: int, read_path: str) -> list[Step]:
    """n steps of `echo step K`; two parallel calls at step 3, a `read` at step 5."""
    out = []
    for k in range(1, n + 1):
        calls: tuple[Call, ...] = (bash(k),)
        if k == 3:
            calls = (bash(k), bash(k, "b"))
        if k == 5:
            calls = (Call("read", {"filePath": read_path}),)
        out.append(Step(calls, f"Running step {k}.", f"Step {k}: I need to run the next command."))
    return out


@dataclass
class Session:
    run: Run
    script: AgentScript
    turns: list[Turn]  # the session's own turns (they declare tools)
    side: list[Turn]  # the title agent's


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeProvider]:
    with FakeProvider() as p:
        yield p


def drive(
    binary: Path, fake: FakeProvider, proxy: Proxy, workdir: Path, n: int, settle: bool = False
) -> Session:
    notes = workdir / "project" / "notes.txt"
    notes.parent.mkdir(parents=True, exist_ok=True)
    notes.write_text(SECRET + "\n")
    tag = f"CG-{workdir.name}"
    before = (lambda step: wait_settled(proxy)) if settle else None
    script = AgentScript(tag, steps(n, str(notes)), before=before)

    def respond(rec: Recorded) -> Reply | None:
        return None if is_side_request(rec) else script(rec)

    fake.responder = respond
    try:
        run = run_opencode(
            binary,
            f"{tag}: run the scripted steps, one tool call each.",
            workdir,
            anthropic_url=proxy.url + "/v1",
        )
    finally:
        fake.responder = None
    run.assert_succeeded()
    assert run.final_text == script.final_text
    assert script.refusals == [], script.refusals
    assert [a.step for a in script.answers] == list(range(n + 1))
    # opencode really ran every tool the script called, and sent back what they printed.
    outputs = [str(v) for v in script.results.values()]
    assert all(any(f"step {k}\n" in o for o in outputs) for k in range(1, n + 1) if k != 5)
    assert any("step 3b" in o for o in outputs) and any(SECRET in o for o in outputs)
    sent: list[Sent] = [x for x in tapped(workdir / "tap.jsonl") if x.method == "POST"]
    assert {x.method for x in tapped(workdir / "tap.jsonl")} == {"POST"}  # no other requests
    turns = audit(sent, fake, proxy, "anthropic")
    own = [t for t in turns if "tools" in json.loads(t.sent.body)]
    side = [t for t in turns if t not in own]
    assert len(own) == n + 1, f"opencode made {len(own)} turns for {n} steps"
    return Session(run, script, own, side)


def test_opencode_default_preset_every_request_reaches_the_provider_byte_identical(
    opencode: Path, fake: FakeProvider, tmp_path: Path, proxies
) -> None:
    proxy = proxies(start_proxy(fake.url, tmp_path, "auto"))
    s = drive(opencode, fake, proxy, tmp_path, 6)

    assert [t.outcome for t in s.turns + s.side] == ["passed_through"] * (7 + len(s.side))
    assert len(s.side) == 1  # the title agent's one request
    stats = proxy.stats()
    assert (stats["passed_through"], stats["rewritten"]) == (7 + len(s.side), 0)
    assert stats["summaries"]["commissioned"] == 0
    assert fake.summarizer_requests == []
    # `auto` picked the opencode preset from opencode's own headers, on every request.
    assert {t.cg["preset"] for t in s.turns + s.side} == {"opencode"}
    assert {t.cg["preset_reason"] for t in s.turns} == {"auto: user-agent: opencode/"}

    # What opencode sends, as the addon must take it (live).
    session_ids = set()
    for t in s.turns:
        headers = {k.lower(): v for k, v in t.sent.headers}
        assert t.sent.path == "/v1/messages"
        assert headers["user-agent"].startswith(f"opencode/{VERSION} ai-sdk/")
        session_ids.add(headers["x-session-id"])
        body = json.loads(t.sent.body)
        assert body["stream"] is True and body["model"] == "claude-haiku-4-5"
        assert {"bash", "read"} <= {tool["name"] for tool in body["tools"]}
        messages = body["messages"]
        assert messages[0]["role"] == "user" and s.script.tag in json.dumps(messages[0])
        for m in messages:
            if m["role"] == "assistant":
                assert m["content"][0]["type"] == "thinking" and m["content"][0]["signature"]
    assert len(session_ids) == 1


def test_opencode_session_is_summarized_and_the_summary_reused_byte_identically(
    opencode: Path, fake: FakeProvider, tmp_path: Path, proxies
) -> None:
    proxy = proxies(start_proxy(fake.url, tmp_path, "opencode", LOW))
    s = drive(opencode, fake, proxy, tmp_path, 12, settle=True)
    # Spliced after the task, the summary valid by the provider's rules (the script refused
    # nothing, audit checked every kept message's bytes and the shape), and re-emitted
    # byte-identically turn after turn.
    rewritten = assert_summarized(s.turns, proxy, head=1)
    assert len(rewritten) >= 6
    assert all(t.outcome == "passed_through" for t in s.side)
    (call,) = fake.summarizer_requests
    assert call.path == "/v1/messages"


# -- its openai provider: the Responses API --------------------------------------------------------


def bash_call(command: str) -> tuple[str, dict[str, str]]:
    return "bash", {"command": command, "description": f"Run {command}"}


def drive_responses(
    binary: Path, fake: FakeProvider, proxy: Proxy, workdir: Path, n: int, settle: bool = False
) -> tuple[CodexScript, list[CodexTurn]]:
    """One `opencode run` on `openai/gpt-5.5` of n steps (two parallel calls at step 3), audited;
    the session's own turns (they declare tools)."""
    tag = f"CG-{workdir.name}"
    script = CodexScript(tag, responses_session(n, parallel_at=(3,)), call=bash_call)
    script.before = (lambda step: wait_settled(proxy)) if settle else None

    def respond(rec: Recorded) -> Reply | None:
        return None if is_side_request(rec) else script(rec)

    fake.responder = respond
    try:
        run = run_opencode(
            binary,
            f"{tag}: run the scripted steps, one command each.",
            workdir,
            openai_url=proxy.url + "/v1",
            model="openai/gpt-5.5",
        )
    finally:
        fake.responder = None
    run.assert_succeeded()
    assert run.final_text == script.final_text
    assert script.refusals == [], script.refusals
    outputs = list(script.results.values())
    assert all(any(f"step {k}\n" in o for o in outputs) for k in range(1, n + 1))
    assert any("step 3b\n" in o for o in outputs)
    sent = [x for x in tapped(workdir / "tap.jsonl") if x.method == "POST"]
    assert {x.path for x in tapped(workdir / "tap.jsonl")} == {"/v1/responses"}
    turns = audit_responses(sent, fake, proxy)
    own = [t for t in turns if "tools" in json.loads(t.sent.body)]
    assert len(own) == n + 1 and len(turns) == n + 2  # and the title agent's one request
    return script, own


def test_opencode_on_responses_default_preset_every_request_reaches_the_provider_byte_identical(
    opencode: Path, fake: FakeProvider, tmp_path: Path, proxies
) -> None:
    proxy = proxies(start_proxy(fake.url, tmp_path, "auto"))
    _, turns = drive_responses(opencode, fake, proxy, tmp_path, 6)
    assert [t.outcome for t in turns] == ["passed_through"] * 7
    assert {t.cg["preset"] for t in turns} == {"opencode"}
    assert {t.cg["preset_reason"] for t in turns} == {"auto: user-agent: opencode/"}
    assert proxy.stats()["summaries"]["commissioned"] == 0
    for t in turns:
        headers = {k.lower(): v for k, v in t.sent.headers}
        assert headers["user-agent"].startswith(f"opencode/{VERSION} (")
        assert headers["originator"] == "opencode"
        body = json.loads(t.sent.body)
        assert body["stream"] is True and body["store"] is False
        assert body["include"] == ["reasoning.encrypted_content"]
        assert body["prompt_cache_key"] == headers["x-session-id"]
        reasoning = [x for x in body["input"] if x.get("type") == "reasoning"]
        assert all("id" not in x and x["encrypted_content"] for x in reasoning)


def test_opencode_on_responses_is_summarized_and_the_summary_reused_byte_identically(
    opencode: Path, fake: FakeProvider, tmp_path: Path, proxies
) -> None:
    proxy = proxies(start_proxy(fake.url, tmp_path, "opencode", LOW))
    _, turns = drive_responses(opencode, fake, proxy, tmp_path, 12, settle=True)
    rewritten = assert_codex_summarized(turns, proxy)
    assert len(rewritten) >= 6
    stats = proxy.stats()
    assert stats["summaries"]["commissioned"] == stats["summaries"]["completed"] == 1
    assert stats["summaries"]["reused"] == len(rewritten)
