"""Agents on the official SDKs — anthropic and openai, sync and async clients, streaming and not —
through `mitmdump -s cg_addon.py` in reverse mode (base URL at the proxy), for a whole session.

The same scripted model as Claude Code's (tests/agent_script.py) drives each agent loop
(tests/e2e/sdk_agent.py) through eight steps of tool calls; triggers are lowered so the session
is summarized: every request is checked against the bytes the SDK sent (tests/e2e/agents.py),
the summary is spliced on a later turn and reused byte-identically, and the model's one
`context_guru_expand` call is answered by the proxy and never reaches the SDK.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agent_script import EXPAND_TOOL, AgentScript, session
from tests.e2e.agents import (
    Turn,
    assert_expanded_once,
    assert_summarized,
    audit,
    start_proxy,
    wait_settled,
)
from tests.e2e.harness import Proxy
from tests.e2e.sdk_agent import SdkAgent
from tests.fakeprovider import FakeProvider

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STEPS = 8
# keep_first 2: [system, task] for openai; on anthropic the head retreats to [task] (its second
# message calls a tool). A single summary, reused to the end of the session.
LOW: dict[str, Any] = {
    "cache_state": "any",
    "keep_first": 2,
    "min_tokens": 10,
    "resummarize_tokens": 1_000_000,
    "trigger": {"min_request_frac": 0, "min_messages": 6},
}
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


async def run_session(
    fake: FakeProvider, proxy: Proxy, workdir: Path, agent: SdkAgent
) -> tuple[AgentScript, list[Turn]]:
    """One scripted session of the agent through `proxy`, audited turn by turn."""
    notes = workdir / "notes.txt"
    notes.write_text("the secret number is 4711\n")
    tag = f"CG-{workdir.name}"
    script = AgentScript(
        tag,
        session(STEPS, parallel_at=(3,), read_at={5: str(notes)}),
        expand=True,
        before=lambda step: wait_settled(proxy),
    )
    fake.responder = script
    try:
        text = await agent.run(f"{tag}: run the scripted steps.")
    finally:
        fake.responder = None
        await agent.close()
    assert text == script.final_text
    assert script.refusals == [], script.refusals
    assert set(agent.tool_names) == {"Bash", "Read"}, agent.tool_names  # never the expand tool
    assert "4711" in str(script.results.values())  # the loop really ran its tools
    sent = agent.sent
    assert len(sent) == STEPS + 1, f"the agent made {len(sent)} requests for {STEPS} steps"
    for s in sent:
        assert EXPAND_TOOL.encode() not in s.body  # it never learned of the tool
    return script, audit(sent, fake, proxy, agent.dialect)


@pytest.mark.parametrize(("dialect", "is_async", "stream"), CASES, ids=map(case_id, CASES))
async def test_sdk_agent_session_is_summarized_reused_and_expanded_unseen(
    fake, tmp_path, proxies, dialect, is_async, stream
):
    proxy = start_proxy(fake.url, tmp_path, "summarize", LOW)
    proxies(proxy)
    agent = SdkAgent(dialect, is_async=is_async, stream=stream, base_url=proxy.url)
    script, turns = await run_session(fake, proxy, tmp_path, agent)
    assert all(t.sent.body.startswith(b"{") for t in turns)
    assert all((b'"stream":true' in t.sent.body) == stream for t in turns)
    assert_summarized(turns, proxy, head=1 if dialect == "anthropic" else 2)
    assert_expanded_once(turns, script, proxy)
