"""Gemini CLI itself (pinned, see tests/e2e/gemini_cli.py) through `mitmdump -s cg_addon.py` in
reverse mode (`GOOGLE_GEMINI_BASE_URL` at the proxy), driven by a scripted model.

The fake provider answers its turns from tests/support/gemini_script.py: `run_shell_command`
calls (Gemini CLI's own tool and arguments) step by step, streamed as the API streams, then a
final text. Gemini CLI really runs the commands; the script checks their results and the fake
refuses (400, the oracle's `contents_problem`) anything the API would refuse. The tap
(tests/e2e/tap.py) keeps what the CLI put on the wire, so every provider request is compared
with it byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.agents import HOP, Sent, start_proxy, tapped, wait_settled
from tests.e2e.gemini_cli import MODEL, VERSION, Run, run_gemini
from tests.e2e.harness import Proxy, by_id, header_pairs, low
from tests.support import gemini_api
from tests.support.fakeprovider import FakeProvider, Recorded
from tests.support.gemini_script import EXPAND_TOOL, MARKER, SHELL, GeminiScript

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

HEADER = "=== History Summary ==="
# Low enough for the CLI's fourth turn to qualify; no roll-forward, so every later turn reuses
# the one summary.
LOW = low(min_messages=6, resummarize_tokens=1_000_000)


@dataclass
class Turn:
    sent: Sent
    got: Recorded
    outcome: str
    cg: dict[str, Any]
    summary: str | None = None  # the spliced summary content, as the provider got it
    continuation: Recorded | None = None


@dataclass
class Session:
    run: Run
    script: GeminiScript
    turns: list[Turn]


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeProvider]:
    with FakeProvider() as p:
        yield p


def summary_of(contents: list[Any]) -> str | None:
    for c in contents:
        texts = [p.get("text", "") for p in c.get("parts", [])]
        if c.get("role") == "user" and any(t.startswith(HEADER) for t in texts):
            return json.dumps(c)
    return None


def audit(sent: list[Sent], fake: FakeProvider, proxy: Proxy) -> list[Turn]:
    """Each request the CLI sent, against what the provider got and the proxy decided."""
    turns = []
    for s in sent:
        got = fake.wait_for(1, where=by_id(s.eid))
        assert 1 <= len(got) <= 2, f"{len(got)} provider requests for one agent request"
        line = proxy.records.wait(s.eid)
        assert line["status"] == 200, line
        cg = line["cg"]
        assert cg is not None, line
        first = got[0]
        assert (first.method, first.path) == (s.method, s.path)
        assert header_pairs(first.headers, HOP) == header_pairs(s.headers, HOP)
        turn = Turn(s, first, cg["outcome"], cg)
        if turn.outcome == "rewritten":
            doc = first.json()
            assert gemini_api.contents_problem(doc) is None, gemini_api.contents_problem(doc)
            mine = json.loads(s.body)
            turn.summary = summary_of(doc["contents"])
            assert turn.summary is not None, "a rewritten turn without a summary"
            assert MARKER.search(turn.summary)
            assert doc["contents"][0] == mine["contents"][0], "the head is not kept"
            assert doc["contents"][-1] == mine["contents"][-1], "the newest turn is not kept"
            assert len(doc["contents"]) < len(mine["contents"])
            assert doc["systemInstruction"] == mine["systemInstruction"]
            assert doc["tools"][: len(mine["tools"])] == mine["tools"]
        else:
            assert turn.outcome == "passed_through", cg
            assert first.body == s.body, "a passed-through body is not byte-identical"
        if len(got) == 2:
            assert turn.outcome == "rewritten", "an expand round for a turn without a summary"
            turn.continuation = got[1]
            assert gemini_api.contents_problem(got[1].json()) is None
        turns.append(turn)
    return turns


def drive(
    binary: Path,
    fake: FakeProvider,
    proxy: Proxy,
    workdir: Path,
    n: int,
    *,
    settle: bool = False,
    expand: bool = False,
) -> Session:
    tag = f"CG-{workdir.name}"
    script = GeminiScript(tag, n, expand=expand)
    script.before = (lambda step: wait_settled(proxy)) if settle else None
    fake.responder = script
    try:
        run = run_gemini(
            binary,
            f"{tag}: run the scripted steps, one shell command each.",
            workdir,
            base_url=proxy.url,
        )
    finally:
        fake.responder = None
    run.assert_succeeded()
    assert run.response == script.final_text, run.describe()
    assert script.refusals == [], script.refusals
    assert [a.step for a in script.answers if a.expand is None] == list(range(1, n + 2))
    # Gemini CLI really ran every command the script called, and sent back what they printed.
    assert sorted(script.results) == list(range(1, n + 1))
    assert all(f"step {k}" in script.results[k] for k in range(1, n + 1))
    assert run.tool_calls()["byName"][SHELL]["success"] == n
    tap = tapped(workdir / "tap.jsonl")
    assert {x.method for x in tap} == {"POST"}, [(x.method, x.path) for x in tap]
    turns = audit(tap, fake, proxy)
    assert len(turns) == n + 1, [t.sent.path for t in turns]
    return Session(run, script, turns)


def test_gemini_cli_default_preset_every_request_reaches_the_provider_byte_identical(
    gemini: Path, fake: FakeProvider, tmp_path: Path, proxies
) -> None:
    proxy = proxies(start_proxy(fake.url, tmp_path, "auto"))
    s = drive(gemini, fake, proxy, tmp_path, 6)

    assert [t.outcome for t in s.turns] == ["passed_through"] * 7
    stats = proxy.stats()
    assert (stats["passed_through"], stats["rewritten"]) == (7, 0)
    assert stats["summaries"]["commissioned"] == 0
    assert fake.summarizer_requests == []
    assert {t.cg["dialect"] for t in s.turns} == {"gemini"}
    # What Gemini CLI sends, as the addon must take it (live).
    for t in s.turns:
        headers = {k.lower(): v for k, v in t.sent.headers}
        assert t.sent.path == f"/v1beta/models/{MODEL}:streamGenerateContent?alt=sse"
        assert headers["user-agent"].startswith(f"GeminiCLI-tui/{VERSION}/{MODEL} ")
        assert "x-goog-api-key" in headers
        body = json.loads(t.sent.body)
        names = {f["name"] for tool in body["tools"] for f in tool["functionDeclarations"]}
        assert SHELL in names and EXPAND_TOOL not in names
        assert s.script.tag in json.dumps(body["contents"][:2])


def test_gemini_cli_session_is_summarized_and_the_summary_reused_byte_identically(
    gemini: Path, fake: FakeProvider, tmp_path: Path, proxies
) -> None:
    proxy = proxies(start_proxy(fake.url, tmp_path, "summarize", LOW))
    s = drive(gemini, fake, proxy, tmp_path, 10, settle=True)
    rewritten = [i for i, t in enumerate(s.turns) if t.outcome == "rewritten"]
    assert len(rewritten) >= 3, [t.outcome for t in s.turns]
    assert rewritten == list(range(rewritten[0], len(s.turns))), "a later turn was not rewritten"
    assert len({s.turns[i].summary for i in rewritten}) == 1, "the summary bytes changed"
    stats = proxy.stats()
    assert stats["summaries"]["commissioned"] == stats["summaries"]["completed"] == 1
    assert stats["summaries"]["reused"] == len(rewritten)
    assert (stats["failed_open"], stats["retried_original"]) == (0, 0)
    (call,) = fake.summarizer_requests
    assert gemini_api.model_of(call.path) == MODEL, call.path  # called back on the agent's model


def test_gemini_cli_models_expand_call_is_answered_by_the_proxy(
    gemini: Path, fake: FakeProvider, tmp_path: Path, proxies
) -> None:
    proxy = proxies(start_proxy(fake.url, tmp_path, "summarize", LOW))
    s = drive(gemini, fake, proxy, tmp_path, 8, settle=True, expand=True)
    expanded = [t for t in s.turns if t.continuation is not None]
    assert len(expanded) == 1, [t.outcome for t in s.turns]
    (asked,) = [a for a in s.script.answers if a.expand is not None]
    (expansion,) = s.script.expansions
    assert f"<<cg:{asked.expand}>>" in expansion and "echo step 1" in expansion
    assert proxy.stats()["expansions"] == 1
    # Gemini CLI never saw the expand tool: its own requests never named it.
    assert all(EXPAND_TOOL.encode() not in t.sent.body for t in s.turns)
    assert EXPAND_TOOL not in s.run.stdout
