"""Codex CLI itself (pinned, see tests/e2e/codex.py) through `mitmdump -s cg_addon.py` in
reverse mode (its model provider's `base_url` at the proxy), driven by a scripted model.

The fake provider answers Codex's requests from tests/support/codex_script.py: turns of `exec_command`
calls (`echo step N`, two in parallel at step 3, preambles), reasoning items with
`encrypted_content`, streamed as the Responses API streams, then a final answer. Codex really
runs the commands; the script checks the outputs and refuses (400, in the API's words) anything
the API would refuse. The tap (tests/e2e/tap.py) keeps what Codex put on the wire, so every
provider request is compared with it byte for byte (tests/e2e/codex_sessions.py).

These need the `responses` dialect (the decision records, summarizing, the expand tool in the
Responses shape, the `codex` preset that `cg_preset=auto` picks for Codex).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.agents import start_proxy
from tests.e2e.codex import VERSION
from tests.e2e.codex_sessions import (
    NEEDS_CODEX_PRESET,
    NEEDS_RESPONSES,
    RESPONSES,
    assert_codex_expanded_once,
    assert_codex_summarized,
    codex_steps,
    drive_codex,
    elements,
    never_saw_expand,
    summary_index,
    text_of,
)
from tests.e2e.harness import low
from tests.support.codex_script import CodexScript, request_kind
from tests.support.fakeprovider import FakeProvider

pytestmark = [pytest.mark.e2e, pytest.mark.slow, NEEDS_RESPONSES]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "codex-0.169.0"
# Over the `codex` preset (what `cg_preset=auto` picks for Codex: keep_first 2 after the
# developer items keeps the environment context and the task, keep_last 6): low enough for
# Codex's third request to qualify; no roll-forward, so every later turn reuses the one summary.
LOW = low(min_messages=6, resummarize_tokens=1_000_000)


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeProvider]:
    """This module's own provider: its responder is the running test's script."""
    with FakeProvider() as p:
        yield p


def tag(workdir: Path) -> str:
    return f"CG-{workdir.name}"


def headers(sent: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in sent.headers}


# -- the default preset: nothing changes ---------------------------------------------------------


@pytest.mark.parametrize("preset", [pytest.param("auto", marks=NEEDS_CODEX_PRESET), "summarize"])
def test_codex_default_presets_leave_every_request_byte_identical(
    codex, fake, tmp_path, proxies, preset
):
    proxy = proxies(start_proxy(fake.url, tmp_path / "proxy", preset))
    script = CodexScript(tag(tmp_path), codex_steps(6))
    s = drive_codex(codex, fake, proxy, tmp_path / "codex", script)

    assert s.run.final_message == script.final_text
    assert [t.outcome for t in s.turns] == ["passed_through"] * 7
    assert {t.cg.get("preset") for t in s.turns} == {"codex" if preset == "auto" else preset}
    stats = proxy.stats()
    assert (stats["requests"], stats["passed_through"], stats["rewritten"]) == (7, 7, 0)
    assert stats["summaries"]["commissioned"] == 0
    assert fake.summarizer_requests == []
    # Codex really ran every command and sent back what it printed.
    outputs = list(script.results.values())
    assert all(any(f"step {k}\n" in o for o in outputs) for k in range(1, 7))
    assert any("step 3b\n" in o for o in outputs)
    # Its turns were booked in the ledger as the provider reported them.
    usage = stats["usage"]["agent"]
    assert usage["requests"] == 7
    assert usage["input_tokens"] + usage["cache_read_tokens"] == sum(
        len(x.body) // 4 for x in s.sent
    )

    # What Codex sends, as the addon must take it (the fixtures' facts, live).
    first = json.loads((FIXTURES / "first.json").read_text())
    fixture_tools = [t.get("name", t["type"]) for t in json.loads(first["body"])["tools"]]
    session_ids = set()
    previous: list[bytes] = []
    for sent in s.sent:
        h = headers(sent)
        assert (sent.method, sent.path) == ("POST", RESPONSES)
        assert h["user-agent"].startswith(f"codex_exec/{VERSION} ")
        assert h["authorization"] == "Bearer sk-test"
        assert request_kind_of(h) == "turn"
        body = json.loads(sent.body)
        assert body["stream"] is True and body["store"] is False
        assert "previous_response_id" not in body and "instructions" not in body
        assert body["include"] == ["reasoning.encrypted_content"]
        assert body["prompt_cache_key"] == h["session-id"] == h["thread-id"]
        assert h["x-client-request-id"] == h["session-id"]
        session_ids.add(h["session-id"])
        assert [t.get("name", t["type"]) for t in body["tools"]] == fixture_tools
        items = body["input"]
        assert items[0]["type"] == "message" and items[0]["role"] == "developer"
        for x in items:
            if x["type"] == "reasoning":
                assert x["encrypted_content"].startswith("gAAAAA")
        # The whole history is re-sent every turn: each input a prefix of the next, byte for byte.
        raw = elements(sent.body, "input")
        assert raw[: len(previous)] == previous
        previous = raw
    assert len(session_ids) == 1


def request_kind_of(h: dict[str, str]) -> str:
    kind: str = json.loads(h["x-codex-turn-metadata"])["request_kind"]
    return kind


# -- lowered triggers: splice, reuse, expand ------------------------------------------------------


@NEEDS_CODEX_PRESET
def test_codex_session_is_summarized_reused_and_expanded_without_codex_noticing(
    codex, fake, tmp_path, proxies
):
    proxy = proxies(start_proxy(fake.url, tmp_path / "proxy", "codex", LOW))
    script = CodexScript(tag(tmp_path), codex_steps(12), expand=True)
    s = drive_codex(codex, fake, proxy, tmp_path / "codex", script, settle=True)

    assert s.run.final_message == script.final_text
    assert [a.step for a in script.answers if a.expand is None] == list(range(13))
    rewritten = assert_codex_summarized(s.turns, proxy)
    assert_codex_expanded_once(s, proxy)
    never_saw_expand(s)
    # The task stays before the summary, byte for byte; the summary is the one summarizer call,
    # which spoke Responses.
    turn = s.turns[rewritten[0]]
    head = [json.loads(x) for x in elements(turn.got.body, "input")[: summary_index(turn)]]
    assert any(x.get("role") == "user" and script.tag in text_of(x) for x in head)
    (call,) = fake.summarizer_requests
    assert call.path == RESPONSES
    stats = proxy.stats()
    assert stats["summaries"]["commissioned"] == stats["summaries"]["completed"] == 1
    assert stats["summaries"]["reused"] == len(rewritten)
    # Every step ran for real, the one that followed the expansion too.
    outputs = list(script.results.values())
    assert all(any(f"step {k}\n" in o for o in outputs) for k in range(1, 13))


# -- `codex exec resume --last` after a proxy restart ----------------------------------------------


@NEEDS_CODEX_PRESET
def test_codex_resume_after_a_proxy_restart_reuses_the_checkpoint(codex, fake, tmp_path, proxies):
    db = tmp_path / "cg.sqlite3"
    work = tmp_path / "codex"
    script = CodexScript(tag(tmp_path), codex_steps(12), pause_at=(8,))
    first = start_proxy(fake.url, tmp_path / "a", "codex", LOW, db=db)
    with first:
        a = drive_codex(codex, fake, first, work, script, settle=True)
    assert a.run.final_message == script.pause_text
    before = [t for t in a.turns if t.outcome == "rewritten"]
    assert len(before) >= 3 and len({t.summary for t in before}) == 1

    # A new proxy process on the same SQLite file; Codex (a new process too) re-sends the whole
    # history with the next prompt.
    second = proxies(start_proxy(fake.url, tmp_path / "b", "codex", LOW, db=db))
    b = drive_codex(
        codex, fake, second, work, script, prompt="Go on with the remaining steps.", resume=True
    )
    assert b.run.final_message == script.final_text
    assert [a.step for a in script.answers][-5:] == [8, 9, 10, 11, 12]
    # Codex re-sent the whole history, byte for byte, then the pause and the new prompt.
    resent = elements(b.sent[0].body, "input")
    assert resent[: len(elements(a.sent[-1].body, "input"))] == elements(a.sent[-1].body, "input")
    after = b.turns
    assert [t.outcome for t in after] == ["rewritten"] * len(after)
    assert {t.summary for t in after} == {before[0].summary}, "the checkpoint was not reused"
    assert {t.key for t in after} == {before[0].key}
    stats = second.stats()
    assert stats["summaries"]["commissioned"] == 0
    assert stats["summaries"]["reused"] == len(after)
    assert (stats["failed_open"], stats["retried_original"]) == (0, 0)
    never_saw_expand(b)
    assert request_kind(after[0].got) == "turn"
