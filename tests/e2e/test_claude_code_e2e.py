"""Claude Code itself (pinned, see tests/e2e/claude_code.py) through `mitmdump -s cg_addon.py`
in reverse mode (`ANTHROPIC_BASE_URL` at the proxy), driven by a scripted model.

The fake provider answers Claude Code's requests from tests/support/agent_script.py: turns of Bash
`echo step N` calls (parallel ones, a Read of a file), signed thinking, streamed as the API
streams, then a final answer. Claude Code really runs the tools; the script checks their results
and refuses (400) anything a provider would refuse. The tap (tests/e2e/tap.py) keeps what
Claude Code put on the wire, so every provider request is compared with it byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.e2e.agents import (
    assert_expanded_once,
    assert_summarized,
    drive_claude,
    never_saw_expand,
    start_proxy,
    summary_index,
)
from tests.e2e.claude_code import VERSION
from tests.e2e.harness import low, message_sources
from tests.support.fakeprovider import FakeProvider
from tests.support.shared_request import split_shared

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# Claude Code's requests besides its turns in reverse mode: none since 2.1.328 (2.1.197 sent a
# `HEAD` of the base URL as it started, warming the connection).
PRECONNECT: set[tuple[str, str]] = set()
# Low enough for Claude Code's third request (6 messages) to qualify; no roll-forward, so every
# later turn reuses the one summary.
LOW = low(min_messages=6, resummarize_tokens=1_000_000)


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeProvider]:
    """This module's own provider: its responder is the running test's script."""
    with FakeProvider() as p:
        yield p


# -- default preset: nothing changes -------------------------------------------------------------


def test_claude_code_default_preset_every_request_reaches_the_provider_byte_identical(
    claude_code, fake, tmp_path, proxies
):
    proxy = proxies(start_proxy(fake.url, tmp_path, "summarize"))
    s = drive_claude(
        claude_code, fake, proxy, tmp_path, 6, {"ANTHROPIC_BASE_URL": proxy.url}, PRECONNECT
    )

    assert [t.outcome for t in s.turns] == ["passed_through"] * 7
    stats = proxy.stats()
    assert (stats["requests"], stats["passed_through"], stats["rewritten"]) == (7, 7, 0)
    assert stats["summaries"]["commissioned"] == 0
    assert fake.summarizer_requests == []

    # What Claude Code sends, as the addon must take it (the fixture of this version, live).
    session_ids = set()
    for n, sent in enumerate(s.sent):
        headers = dict((k.lower(), v) for k, v in sent.headers)
        assert sent.method == "POST" and sent.path == "/v1/messages?beta=true"
        assert headers["user-agent"].startswith(f"claude-cli/{VERSION} ")
        body = json.loads(sent.body)
        assert body["stream"] is True
        assert body["thinking"] == {"type": "adaptive", "display": "updates"}
        assert len(body["system"]) == 3
        assert any("cache_control" in b for b in body["system"])
        assert len(body["tools"]) == 12
        assert "context_management" in body and "output_config" in body
        user_id = json.loads(body["metadata"]["user_id"])  # a JSON object, as a string
        assert user_id["session_id"] == headers["x-claude-code-session-id"]
        session_ids.add(user_id["session_id"])
        messages = body["messages"]
        assert [m["role"] for m in messages[:2]] == ["user", "system"]
        # One cache_control breakpoint, on the last message: it moves every turn (on the first,
        # the last message is the system message, sent then as a list of blocks).
        marked = [
            i
            for i, m in enumerate(messages)
            if isinstance(m["content"], list) and any("cache_control" in b for b in m["content"])
        ]
        assert marked == [len(messages) - 1], (n, marked)
        for m in messages:
            if m["role"] == "assistant":
                assert m["content"][0]["type"] == "thinking" and m["content"][0]["signature"]
    assert len(session_ids) == 1


# -- lowered triggers: splice, reuse, expand ----------------------------------------------------------


def test_claude_code_session_is_summarized_reused_and_expanded_without_claude_code_noticing(
    claude_code, fake, tmp_path, proxies
):
    proxy = proxies(start_proxy(fake.url, tmp_path, "summarize", LOW))
    s = drive_claude(
        claude_code,
        fake,
        proxy,
        tmp_path,
        12,
        {"ANTHROPIC_BASE_URL": proxy.url},
        PRECONNECT,
        expand=True,
        settle=True,
    )
    assert_summarized(s.turns, proxy, head=1)
    assert_expanded_once(s.turns, s.script, proxy)
    (call,) = fake.summarizer_requests
    never_saw_expand(s)
    # The summary was written by the shared-cache call: Claude Code's own request as the
    # provider got it, plus one instruction (its max_tokens, thinking, breakpoints all kept).
    (turn,) = [
        t
        for t in s.turns
        if any(c.get("commission") == "trigger fired" for c in t.cg["components"])
    ]
    ask, changed = split_shared(turn.got.body, call.body, "anthropic")
    assert changed == {} and "<summary>" in ask["content"]
    assert proxy.stats()["summaries"]["shared"] == 1


# -- summarizer1509: keep_first 2 and Claude Code's system message at [1] ---------------------------


def test_claude_code_summarizer1509_never_leaves_the_summary_after_its_system_message(
    claude_code, fake, tmp_path, proxies
):
    proxy = proxies(start_proxy(fake.url, tmp_path, "summarizer1509", low(min_messages=6)))
    s = drive_claude(
        claude_code,
        fake,
        proxy,
        tmp_path,
        10,
        {"ANTHROPIC_BASE_URL": proxy.url},
        PRECONNECT,
        settle=True,
    )
    rewritten = [t for t in s.turns if t.outcome == "rewritten"]
    assert len(rewritten) >= 3
    for t in rewritten:
        _, sent, _ = message_sources(t.sent.body)
        assert json.loads(sent[1])["role"] == "system"  # what keep_first: 2 would have kept
        assert summary_index(t) == 1  # the head retreated to [task]; no system before the summary
        assert t.cg["components"][0]["span"][0] == 1
    assert len({t.summary for t in rewritten}) == len(rewritten), "summarizer1509 reused a summary"
    stats = proxy.stats()
    assert stats["summaries"]["completed"] == stats["summaries"]["commissioned"] >= len(rewritten)
    assert (stats["failed_open"], stats["retried_original"]) == (0, 0)
