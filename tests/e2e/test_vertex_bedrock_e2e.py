"""Claude on Vertex AI and on Bedrock through a real `mitmdump -s cg_addon.py`.

Vertex (`…/publishers/anthropic/models/MODEL:rawPredict`, `:streamRawPredict`) is the Messages
API with the model in the path and `anthropic_version` in the body: driven by the official SDK's
`AnthropicVertex`, its session is summarized like any Anthropic one, the shared summarizer calls
back on the same Vertex route with the agent's bearer, and the standalone one on `:rawPredict`
with the body Vertex takes (no `model`, its API version). Bedrock's runtime signs the body
(SigV4): a request there passes through untouched, and its record says why.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from cg.wire.dialects import BEDROCK_REASON
from tests.e2e.harness import Proxy, by_id, low, new_id, start_summarize
from tests.support.fakeprovider import FakeProvider, Recorded

pytestmark = pytest.mark.e2e

TOKEN = "ya29.fake-vertex-access-token"
MODEL = "claude-sonnet-4-5@20250929"
HEADER = "=== History Summary ==="


def messages(rounds: int, tag: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "user", "content": f"Task {tag}: fix the failing test."}]
    for n in range(rounds):
        out.append(
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": f"t{n}",
                        "name": "Bash",
                        "input": {"cmd": f"cat f{n}"},
                    }
                ],
            }
        )
        out.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": f"t{n}",
                        "content": f"value_{n} = {n}\n" * 8,
                    }
                ],
            }
        )
    return out


def vertex(proxy: Proxy, e2e: str) -> anthropic.AnthropicVertex:
    return anthropic.AnthropicVertex(
        region="us-east5",
        project_id="cg-test",
        access_token=TOKEN,
        base_url=f"{proxy.url}/v1",
        default_headers={"x-e2e-id": e2e},
    )


def mine(fake: FakeProvider, e2e: str) -> list[Recorded]:
    return [r for r in fake.requests if by_id(e2e)(r)]


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeProvider]:
    with FakeProvider() as p:
        yield p


@pytest.mark.parametrize("share", ["auto", "never"])
def test_a_claude_session_on_vertex_is_summarized_and_the_summarizer_keeps_its_route(
    fake: FakeProvider, tmp_path: Path, share: str
) -> None:
    config = low(resummarize_tokens=100_000, model={"share_cache": share})
    with start_summarize(fake.url, tmp_path, config) as p:
        e2e = new_id()
        client, again = vertex(p, e2e), vertex(p, spliced := new_id())
        before = p.counts()
        client.messages.create(model=MODEL, max_tokens=256, messages=messages(8, share))  # type: ignore[arg-type]
        p.wait_count(before, "completed")
        # (the same session under another id: a session is named by its head)
        with again.messages.stream(
            model=MODEL,
            max_tokens=256,
            messages=messages(9, share),  # type: ignore[arg-type]
        ) as s:
            assert s.get_final_text()
        client.close()  # (both before the proxy stops: no connection left open)
        again.close()
        record = p.records.wait(spliced)
        assert (record["cg"]["dialect"], record["cg"]["outcome"]) == ("anthropic", "rewritten")
        assert record["cg"]["stream"] is True
    got = [r for r in mine(fake, e2e) if not r.is_summarizer]
    (last,) = mine(fake, spliced)
    assert last.path.endswith(f"/publishers/anthropic/models/{MODEL}:streamRawPredict")
    body = last.json()
    assert "model" not in body and body["anthropic_version"] == "vertex-2023-10-16"
    texts = [
        m["content"] if isinstance(m["content"], str) else m["content"][0].get("text", "")
        for m in body["messages"]
    ]
    assert any(t.startswith(HEADER) for t in texts), "no summary was spliced"
    (summarizer,) = [
        r for r in fake.requests if r.is_summarizer and f"Task {share}:".encode() in r.body
    ]
    assert summarizer.header("authorization") == f"Bearer {TOKEN}"
    assert summarizer.header("x-api-key") is None
    sent = summarizer.json()
    if share == "never":  # the standalone prompt, as Vertex takes it
        assert summarizer.path.endswith(f"/publishers/anthropic/models/{MODEL}:rawPredict")
        assert "model" not in sent and sent["anthropic_version"] == "vertex-2023-10-16"
    else:  # the agent's own request, on its own route
        assert summarizer.path == got[0].path
        assert "model" not in sent


def test_a_bedrock_request_passes_through_untouched_and_says_why(
    fake: FakeProvider, tmp_path: Path
) -> None:
    with start_summarize(fake.url, tmp_path, low()) as p:
        e2e = new_id()
        body = json.dumps(
            {
                "anthropic_version": "bedrock-2023-05-31",
                "max_tokens": 64,
                "messages": messages(8, "b"),
            }
        ).encode()
        path = "/model/anthropic.claude-sonnet-4-5-20250929-v1:0/invoke"
        headers = {
            "x-e2e-id": e2e,
            "authorization": "AWS4-HMAC-SHA256 Credential=AKIAFAKE/20261202/us-east-1/bedrock/aws4_request",
            "content-type": "application/json",
        }
        with httpx.Client(base_url=p.url, trust_env=False, timeout=30) as h:
            h.post(path, content=body, headers=headers)
        record = p.records.wait(e2e)
        assert p.counts()["passed_through"] >= 1
    (got,) = mine(fake, e2e)
    assert got.body == body and got.header("authorization") == headers["authorization"]
    assert record["cg"]["outcome"] == "passed_through"
    assert record["cg"]["reason"] == BEDROCK_REASON
