"""Claude Code itself (pinned, tests/e2e/claude_code.py) signed in with a Pro/Max subscription
(`CLAUDE_CODE_OAUTH_TOKEN`, an `sk-ant-oat01-…` token) through `mitmdump -s cg_addon.py` in
reverse mode, against a fake Anthropic that takes only that OAuth bearer with the
`oauth-2025-04-20` beta (tests/support/signin.py) and answers with the plan's
`anthropic-ratelimit-unified-*` headers.

Summarized through each summarizer form: the client's own credential on its own route (the
shared prompt-cache call, and the standalone prompt), where the call carries the bearer and the
oauth beta and never an `x-api-key`; and a configured summarizer (`model.source: config`), which
gets its own key and never the bearer. The session is labelled `claude-subscription`, and the
bearer is kept nowhere: not in the store, the proxy's log or a saved flow.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.agents import assert_summarized, drive_claude, start_proxy
from tests.e2e.harness import low
from tests.e2e.test_secrets_e2e import assert_nowhere, everything
from tests.support.fakeprovider import FakeProvider
from tests.support.signin import OAUTH_BETA, ClaudeOAuth

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# No preconnect `HEAD` when signed in with OAuth (2.1.328): its turns are all it sends.
SIDE: set[tuple[str, str]] = set()
LOW = low(min_messages=6, resummarize_tokens=1_000_000)
CHEAP_KEY = "sk-ant-api03-cheap-model-key"
FORMS = {
    "shared": {"share_cache": "always"},
    "standalone": {"share_cache": "never"},
}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeProvider]:
    with FakeProvider() as p:
        yield p


@pytest.fixture(scope="module")
def cheap() -> Iterator[FakeProvider]:
    """The configured summarizer's own endpoint (a plain API key provider)."""
    with FakeProvider() as p:
        yield p


def betas(value: str | None) -> set[str]:
    return {b.strip() for b in (value or "").split(",")}


@pytest.mark.parametrize("form", ["shared", "standalone", "config"])
def test_claude_code_on_a_subscription_is_summarized_with_its_oauth_bearer(
    claude_code, fake, cheap, tmp_path, proxies, form
):
    oauth = ClaudeOAuth()
    fake.claude_oauth = oauth
    model = FORMS.get(form) or {
        "source": "config",
        "provider": "anthropic",
        "base_url": cheap.url,
        "model": "claude-haiku-4-5",
        "api_key": CHEAP_KEY,
    }
    flows = tmp_path / "flows.mitm"
    options = [f"save_stream_file={flows}", "termlog_verbosity=debug"]
    proxy = proxies(start_proxy(fake.url, tmp_path, "summarize", {**LOW, "model": model},
                                options=options))  # fmt: skip
    before, cheap_before = len(fake.requests), len(cheap.requests)
    env = {"ANTHROPIC_BASE_URL": proxy.url, "CLAUDE_CODE_OAUTH_TOKEN": oauth.token}
    try:
        s = drive_claude(claude_code, fake, proxy, tmp_path, 10, env, SIDE, settle=True)
    finally:
        fake.claude_oauth = None

    rewritten = assert_summarized(s.turns, proxy, head=1)
    for sent in s.sent:  # Claude Code signed in: the bearer and the oauth beta, no key
        h = {k.lower(): v for k, v in sent.headers}
        assert h["authorization"] == f"Bearer {oauth.token}" and "x-api-key" not in h
        assert OAUTH_BETA in betas(h.get("anthropic-beta"))
    agent_beta = {k.lower(): v for k, v in s.sent[-1].headers}["anthropic-beta"]

    if form == "config":
        calls = [r for r in cheap.requests[cheap_before:] if r.is_summarizer]
        assert calls and not [r for r in fake.requests[before:] if r.is_summarizer]
        for call in calls:  # its own key; the subscription's bearer never leaves its route
            assert call.header("x-api-key") == CHEAP_KEY
            assert oauth.token not in repr(call.headers)
    else:
        calls = [r for r in fake.requests[before:] if r.is_summarizer]
        assert calls, "no summarizer call reached the provider"
        for call in calls:  # the fake refuses anything else with a 401
            assert call.header("authorization") == f"Bearer {oauth.token}"
            assert call.header("x-api-key") is None
            assert call.header("anthropic-beta") == agent_beta
            assert OAUTH_BETA in betas(call.header("anthropic-beta"))
        stats = proxy.stats()
        assert stats["summaries"]["shared"] == (len(calls) if form == "shared" else 0)
    stats = proxy.stats()
    assert stats["summaries"]["failed"] == 0 and stats["summaries"]["completed"] >= 1

    # Labelled: a subscription session, its dollars an API-list-price equivalent, the plan's
    # 5-hour and weekly readings from the answers' headers.
    plan = stats["ledger"]["plans"]["claude-subscription"]
    assert plan["sessions"] == 1 and plan["rewritten_turns"] == len(rewritten)
    assert plan["dollars"] == "API-list-price equivalent"
    windows = plan["rate_limits"]["windows"]
    assert set(windows) == {"5h", "7d"} and windows["5h"]["used_percent"] > 0
    assert windows["5h"]["not_spent_percent"] is not None

    assert_nowhere(oauth.token, everything(proxy, tmp_path, flows))
