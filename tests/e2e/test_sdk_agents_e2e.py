"""Agents on the official SDKs — anthropic and openai, sync and async clients, streaming and not —
through `mitmdump -s cg_addon.py` in reverse mode (base URL at the proxy), for a whole session.

The same scripted model as Claude Code's (tests/support/agent_script.py) drives each agent loop
(tests/e2e/sdk_agent.py) through eight steps of tool calls; triggers are lowered so the session
is summarized: every request is checked against the bytes the SDK sent (tests/e2e/agents.py),
the summary is spliced on a later turn and reused byte-identically, and the model's one
`context_guru_expand` call is answered by the proxy and never reaches the SDK.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.agents import LOW, assert_expanded_once, assert_summarized, start_proxy
from tests.e2e.sdk_agent import SdkAgent, run_scripted
from tests.support.fakeprovider import FakeProvider

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STEPS = 8
CASES = [
    (dialect, is_async, stream)
    for dialect in ("anthropic", "openai")
    for is_async in (False, True)
    for stream in (False, True)
]


def case_id(case: tuple[str, bool, bool]) -> str:
    dialect, is_async, stream = case
    return f"{dialect}-{'async' if is_async else 'sync'}-{'stream' if stream else 'json'}"


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeProvider]:
    with FakeProvider() as p:
        yield p


@pytest.mark.parametrize(("dialect", "is_async", "stream"), CASES, ids=map(case_id, CASES))
async def test_sdk_agent_session_is_summarized_reused_and_expanded_unseen(
    fake, tmp_path, proxies, dialect, is_async, stream
):
    proxy = proxies(start_proxy(fake.url, tmp_path, "summarize", LOW))
    agent = SdkAgent(dialect, is_async=is_async, stream=stream, base_url=proxy.url)
    script, turns = await run_scripted(fake, proxy, tmp_path, agent, STEPS)
    assert all(t.sent.body.startswith(b"{") for t in turns)
    assert all((b'"stream":true' in t.sent.body) == stream for t in turns)
    assert_summarized(turns, proxy, head=1 if dialect == "anthropic" else 2)
    assert_expanded_once(turns, script, proxy)
