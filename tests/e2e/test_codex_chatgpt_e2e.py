"""Codex CLI itself (pinned, tests/e2e/codex.py) signed in with ChatGPT, through `mitmdump -s
cg_addon.py` in reverse mode to a fake ChatGPT backend (tests/support/signin.py): Codex's turns
go to `…/backend-api/codex/responses` with its bearer and `chatgpt-account-id`, the addon reads
them as the `responses` dialect and rewrites them under lowered triggers, and its summarizer
calls back on that route with the same bearer and ChatGPT headers, in both forms (the shared
prompt-cache call, and the standalone prompt that backend only takes streamed). The bearer is
kept nowhere: not in the store, not in the proxy's log, not in a saved flow.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.e2e.agents import start_proxy
from tests.e2e.codex_sessions import (
    CHATGPT_RESPONSES,
    NEEDS_CODEX_PRESET,
    assert_codex_expanded_once,
    assert_codex_summarized,
    codex_steps,
    drive_codex,
)
from tests.e2e.harness import low
from tests.e2e.test_secrets_e2e import assert_nowhere, everything
from tests.support.codex_script import CodexScript
from tests.support.fakeprovider import FakeProvider
from tests.support.signin import ChatGPTAccount

pytestmark = [pytest.mark.e2e, pytest.mark.slow, NEEDS_CODEX_PRESET]

LOW = low(min_messages=6, resummarize_tokens=1_000_000)
# Kept on the summarizer's call: what Codex sends that the backend reads (the rest, such as
# `x-codex-turn-metadata`, describes Codex's own turn).
KEPT = ("authorization", "chatgpt-account-id", "originator", "session-id", "thread-id")


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeProvider]:
    with FakeProvider() as p:
        yield p


@pytest.mark.parametrize("form", ["shared", "standalone"])
def test_codex_signed_in_with_chatgpt_is_rewritten_and_summarized_on_its_own_route(
    codex, fake, tmp_path, proxies, form
):
    account = ChatGPTAccount()
    fake.chatgpt = account
    flows = tmp_path / "proxy" / "flows.mitm"
    summarize = {**LOW, "model": {"share_cache": "always" if form == "shared" else "never"}}
    options = [f"save_stream_file={flows}", "termlog_verbosity=debug"]
    proxy = proxies(start_proxy(fake.url, tmp_path / "proxy", "codex", summarize, options=options))
    # The model calls context_guru_expand once: the addon's continuation round goes to the
    # backend signed in as Codex (the fake refuses it otherwise).
    script = CodexScript(f"CG-{tmp_path.name}", codex_steps(10), expand=True)
    before = len(fake.requests)
    try:
        s = drive_codex(
            codex, fake, proxy, tmp_path / "codex", script, settle=True, chatgpt=account
        )
    finally:
        fake.chatgpt = None

    assert s.run.final_message == script.final_text
    rewritten = assert_codex_summarized(s.turns, proxy)
    assert_codex_expanded_once(s, proxy)
    # Every turn went to the ChatGPT route, signed in: the bearer and the account (the fake
    # refuses a request without them, so a turn that reached the script carried them).
    for sent in s.sent:
        h = {k.lower(): v for k, v in sent.headers}
        assert sent.path == CHATGPT_RESPONSES
        assert h["authorization"] == f"Bearer {account.access_token}"
        assert h["chatgpt-account-id"] == account.account_id
        assert h["originator"] == "codex_exec"
    codex_headers = {k.lower(): v for k, v in s.sent[-1].headers}

    # The summarizer called back on that route, as Codex, in the form asked for.
    calls = [r for r in fake.requests[before:] if r.is_summarizer]
    assert calls, "no summarizer call reached the backend"
    for call in calls:
        assert call.path == CHATGPT_RESPONSES
        for name in KEPT:
            assert call.header(name) == codex_headers[name], name
        assert call.header("x-api-key") is None
        body = call.json()
        assert body["stream"] is True and body["store"] is False
        assert "max_output_tokens" not in body
        shared = isinstance(body.get("tools"), list) and len(body["input"]) > 1
        assert shared is (form == "shared"), body.get("input")
    stats = proxy.stats()
    assert stats["summaries"]["failed"] == 0 and stats["summaries"]["completed"] >= 1
    assert stats["rewritten"] == len(rewritten)

    # Labelled a subscription session (the ledger's plan), its savings in tokens and in the
    # share of the plan's rate limits, from the backend's x-codex-*-used-percent headers.
    # (A session this short sends more with its summary than without: its savings are
    # negative, and the share is too; the figures are the ledger's, whatever their sign.)
    plan = stats["ledger"]["plans"]["chatgpt"]
    assert plan["sessions"] == 1 and plan["turns"] == len(s.turns)
    assert plan["tokens_not_sent"] == stats["ledger"]["savings"]["tokens_not_sent"] != 0
    assert plan["rewritten_turns"] == len(rewritten)
    assert plan["dollars"] == "API-list-price equivalent"
    limits = plan["rate_limits"]
    assert limits["estimate"] is True and "ESTIMATE" in limits["how"]
    assert set(limits["windows"]) == {"primary", "secondary"}
    # The fake's readings rise by `step` points per answer (the summarizer's answers too).
    primary = limits["windows"]["primary"]
    answered = account.answers.n
    assert primary["used_percent"] == pytest.approx(account.step * (answered - 1))
    assert primary["not_spent_percent"] is not None and primary["not_spent_percent"] != 0

    # The bearer went where it must (every turn, every summarizer call) and is kept nowhere.
    assert_nowhere(account.access_token, everything(proxy, tmp_path / "proxy", flows))
    assert json.dumps(stats).find(account.account_id) < 0
