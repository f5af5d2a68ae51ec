"""Claude Code itself (pinned, tests/e2e/claude_code.py) on Vertex AI (`CLAUDE_CODE_USE_VERTEX=1`)
through `mitmdump -s cg_addon.py` in reverse mode: its turns go to
`…/publishers/anthropic/models/MODEL:streamRawPredict`, the model in the path and
`anthropic_version` in the body, and are summarized like any Anthropic session, the summarizer
calling back on the same route (`CLAUDE_CODE_SKIP_VERTEX_AUTH=1`: offline, no Google token).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.agents import assert_summarized, drive_claude, start_proxy
from tests.e2e.harness import low
from tests.support.fakeprovider import FakeProvider

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SIDE: set[tuple[str, str]] = set()
LOW = low(min_messages=6, resummarize_tokens=1_000_000)
ROUTE = "/publishers/anthropic/models/"


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeProvider]:
    with FakeProvider() as p:
        yield p


@pytest.mark.parametrize("share", ["always", "never"])
def test_claude_code_on_vertex_is_summarized_on_its_vertex_route(
    claude_code, fake, tmp_path, proxies, share
):
    config = {**LOW, "model": {"share_cache": share}}
    proxy = proxies(start_proxy(fake.url, tmp_path, "summarize", config))
    before = len(fake.requests)
    env = {
        "CLAUDE_CODE_USE_VERTEX": "1",
        "CLAUDE_CODE_SKIP_VERTEX_AUTH": "1",
        "ANTHROPIC_VERTEX_BASE_URL": f"{proxy.url}/v1",
        "ANTHROPIC_VERTEX_PROJECT_ID": "cg-test",
        "CLOUD_ML_REGION": "us-east5",
    }
    s = drive_claude(claude_code, fake, proxy, tmp_path, 10, env, SIDE, settle=True)

    rewritten = assert_summarized(s.turns, proxy, head=1)
    assert rewritten
    turns = [r for r in fake.requests[before:] if not r.is_summarizer and r.method == "POST"]
    assert turns and all(ROUTE in r.path and r.path.endswith("RawPredict") for r in turns), [
        r.path for r in turns
    ]
    for r in turns:  # Vertex's form: no model in the body, its API version there instead
        body = r.json()
        assert "model" not in body and body["anthropic_version"].startswith("vertex-")
    calls = [r for r in fake.requests[before:] if r.is_summarizer]
    assert calls, "no summarizer call reached the provider"
    for call in calls:
        assert ROUTE in call.path and "model" not in call.json()
        if share == "never":
            assert call.path.endswith(":rawPredict")
