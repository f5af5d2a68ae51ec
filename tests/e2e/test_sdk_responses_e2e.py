"""The official `openai` SDK's `client.responses.create` and `client.responses.stream` (sync and
async) through a real `mitmdump -s cg_addon.py`, against the fake provider speaking the Responses
API.

With the `off` preset every request reaches the provider byte-identical and every answer — JSON
or the event stream, or the provider's 400 — reaches the SDK intact. With lowered triggers a
session is summarized: turn 1 commissions and forwards untouched, turn 2 is sent as
`[system prompt, task, one summary item, tail]` with every retained item byte-identical, later
turns re-send the byte-identical summary item, a `context_guru_expand` call is answered by the
proxy (the client sees only the final answer), and every answer's usage is in the ledger.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from cg.expand.tool import TOOL_JSON, TOOL_NAME
from cg.wire.answers import Reply as Answer
from cg.wire.answers import render_sse
from tests.e2e.harness import (
    Capture,
    Proxy,
    assert_forwarded_unchanged,
    low,
    new_id,
    received,
    start_summarize,
)
from tests.e2e.sdk_sessions import SdkClient, answer, provider_message, responses_items, sdk_client
from tests.support.fakeprovider import DEFAULT_TEXT, FakeProvider, Recorded, Reply

pytestmark = pytest.mark.e2e

HEADER = "=== History Summary ==="
MARKER = re.compile(r"<<cg:([0-9a-f]{24})>>")
KEY = "sk-resp-e2e-0003"
FINAL = "Final answer: test_nested fails on a nested bracket ✓"
TOOLS = [
    {
        "type": "function",
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    }
]
# Triggers low enough for a dozen short items; keep [developer, task], then the span.
LOW = low(resummarize_tokens=100_000, keep_first=1, keep_last=3)
ITEMS: list[Any] = responses_items("passthrough", 8)


def item_sources(body: bytes) -> tuple[bytes, list[bytes], bytes]:
    """(bytes before the top-level `input` array, each item's bytes, bytes after it), read
    with `json.JSONDecoder.raw_decode` apart from the code under test."""
    s = body.decode("utf-8")
    dec = json.JSONDecoder()
    doc = json.loads(s)
    assert isinstance(doc.get("input"), list)
    key = s.index('"input"')
    start = s.index("[", key + len('"input"'))
    i = start + 1
    items: list[bytes] = []
    while True:
        while s[i] in " \t\r\n,":
            i += 1
        if s[i] == "]":
            break
        _, j = dec.raw_decode(s, i)
        items.append(s[i:j].encode("utf-8"))
        i = j
    return s[:start].encode("utf-8"), items, s[i + 1 :].encode("utf-8")


# -- pass-through: the `off` preset ---------------------------------------------------------------


def _passed(proxy: Proxy, provider: FakeProvider, capture: Capture, eid: str) -> dict[str, Any]:
    assert_forwarded_unchanged(capture.only(), received(provider, eid))
    cg = proxy.records.cg(eid)
    assert (cg["dialect"], cg["outcome"]) == ("responses", "passed_through")
    assert cg["reason"] == "no components in the pipeline"
    return cg


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_sync_responses_reach_the_provider_byte_identical(
    proxy: Proxy, provider: FakeProvider, stream: bool
) -> None:
    capture, eid = Capture(), new_id()
    with httpx.Client(trust_env=False, event_hooks=capture.hooks()) as http:
        client = sdk_client("responses", proxy, http, key="sk-test")
        kw: dict[str, Any] = {
            "model": "gpt-test",
            "input": ITEMS,
            "tools": TOOLS,
            "store": False,
            "extra_headers": {"x-e2e-id": eid},
        }
        if stream:
            with client.responses.stream(**kw) as s:
                kinds = [e.type for e in s]
                final = s.get_final_response()
            assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
            assert "response.output_text.delta" in kinds
        else:
            final = client.responses.create(**kw)
    assert final.output_text == DEFAULT_TEXT and final.status == "completed"
    assert final.usage is not None and final.usage.output_tokens > 0
    cg = _passed(proxy, provider, capture, eid)
    assert cg["messages_in"] == len(ITEMS)
    assert cg["stream"] is stream


async def test_async_create_and_stream_byte_identical(proxy: Proxy, provider: FakeProvider) -> None:
    for stream in (False, True):
        capture, eid = Capture(), new_id()
        async with httpx.AsyncClient(trust_env=False, event_hooks=capture.async_hooks()) as http:
            client = sdk_client("responses", proxy, http, key="sk-test")
            kw: dict[str, Any] = {
                "model": "gpt-test",
                "input": ITEMS,
                "extra_headers": {"x-e2e-id": eid},
            }
            if stream:
                async with client.responses.stream(**kw) as s:
                    deltas = [e.delta async for e in s if e.type == "response.output_text.delta"]
                    final = await s.get_final_response()
                assert "".join(deltas) == DEFAULT_TEXT
            else:
                final = await client.responses.create(**kw)
        assert final.output_text == DEFAULT_TEXT
        _passed(proxy, provider, capture, eid)


def test_the_providers_400_reaches_the_sdk_unchanged(proxy: Proxy, provider: FakeProvider) -> None:
    """An unanswered call: the provider refuses it in its own words, the SDK raises them."""
    capture, eid = Capture(), new_id()
    broken = [*ITEMS, {"type": "function_call", "name": "bash", "arguments": "{}", "call_id": "c9"}]
    with httpx.Client(trust_env=False, event_hooks=capture.hooks()) as http:
        client = sdk_client("responses", proxy, http, key="sk-test")
        with pytest.raises(
            openai.BadRequestError, match=r"No tool output found for function call c9\."
        ):
            client.responses.create(model="gpt-test", input=broken, extra_headers={"x-e2e-id": eid})
    assert_forwarded_unchanged(capture.only(), received(provider, eid))
    assert proxy.records.wait(eid)["status"] == 400


def test_the_event_stream_reaches_the_client_before_the_provider_finishes(
    proxy: Proxy, provider: FakeProvider
) -> None:
    gate = threading.Event()
    reply = Reply(gate=gate)
    provider.script(reply)
    eid = new_id()
    body = json.dumps({"model": "m", "input": ITEMS, "stream": True}).encode()
    with (
        proxy.client() as c,
        c.stream("POST", "/v1/responses", content=body, headers={"x-e2e-id": eid}) as r,
    ):
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("event: response.output_text.delta"):
                gate.set()
    assert gate.is_set() and not reply.gate_timed_out
    assert received(provider, eid).body == body


def test_a_truncated_event_stream_reaches_the_client_as_sent_and_is_counted(
    proxy: Proxy, provider: FakeProvider
) -> None:
    """The provider's stream ends before `response.completed`: the client gets exactly the
    events sent (the SDK then says the stream was cut), and the answer's missing usage is
    counted, never invented."""
    whole = render_sse(Answer("responses", provider_message("responses", 5, "partial", [], (9, 1))))
    cut = whole[: whole.index(b"event: response.output_item.done")]
    frames = [f + b"\n\n" for f in cut.split(b"\n\n") if f]
    provider.script(Reply(frames=frames))
    before = proxy.stats()["usage_reads"]
    eid = new_id()
    body = json.dumps({"model": "m", "input": ITEMS, "stream": True}).encode()
    with proxy.client() as c:
        r = c.post("/v1/responses", content=body, headers={"x-e2e-id": eid})
    assert r.content == b"".join(frames)
    assert proxy.records.cg(eid)["outcome"] == "passed_through"
    after = proxy.wait_stats(lambda s: s["usage_reads"]["missing"] > before["missing"])
    assert after["usage_reads"]["read"] == before["read"]


# -- a summarized session --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rproxy(provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    with start_summarize(provider.url, tmp_path_factory.mktemp("proxy-responses"), LOW) as p:
        yield p


def spliced(sent: bytes, got: bytes, head: int, cut: int) -> bytes:
    """Assert the provider got [the client's first `head` items, one new item, the client's
    items from `cut`] with every byte outside the new item as sent (but the expand tool
    appended to `tools`, when it was); the new item's bytes."""
    spre, sitems, spost = item_sources(sent)
    gpre, gitems, gpost = item_sources(got)
    gpost = gpost.replace(b"," + TOOL_JSON["responses"].encode(), b"", 1)
    assert (gpre, gpost) == (spre, spost), "bytes outside `input` changed"
    assert len(gitems) == head + 1 + len(sitems) - cut
    assert gitems[:head] == sitems[:head] and gitems[head + 1 :] == sitems[cut:]
    return gitems[head]


def summary_key(item: bytes) -> str:
    doc = json.loads(item)
    assert set(doc) == {"type", "role", "content"}
    assert (doc["type"], doc["role"]) == ("message", "user")
    (part,) = doc["content"]
    assert part["type"] == "input_text" and part["text"].startswith(HEADER + "\n<summary>\n")
    m = MARKER.search(part["text"])
    assert m is not None
    return m.group(1)


def prime(
    proxy: Proxy, provider: FakeProvider, agent: SdkClient, **extra: Any
) -> tuple[bytes, str]:
    """Turn 1 commissions (forwarded untouched), the summary completes, turn 2 is spliced:
    [developer, task, summary, items 7 …]. The summary item's bytes and its stash key."""
    tag = agent.session
    before = proxy.counts()
    t1 = agent.turn(responses_items(tag, 10), **extra)
    assert_forwarded_unchanged(t1.request, received(provider, t1.eid))
    cg1 = proxy.records.cg(t1.eid)
    assert (cg1["dialect"], cg1["outcome"]) == ("responses", "passed_through")
    (comp,) = cg1["components"]
    assert comp["span"] == [2, 7] and comp["commission"] == "trigger fired"
    after = proxy.wait_count(before, "completed")
    assert after["failed"] == before["failed"]
    t2 = agent.turn(responses_items(tag, 12), **extra)
    assert proxy.records.cg(t2.eid)["outcome"] == "rewritten"
    summary = spliced(t2.request.content, received(provider, t2.eid).body, head=2, cut=7)
    return summary, summary_key(summary)


@pytest.fixture(autouse=True)
def _no_responder(provider: FakeProvider) -> Iterator[None]:
    yield
    provider.responder = None


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_a_session_is_summarized_and_the_summary_item_reused(
    rproxy: Proxy, provider: FakeProvider, stream: bool
) -> None:
    with SdkClient(rproxy, "responses", key=KEY) as agent:
        summary, key = prime(rproxy, provider, agent, stream=stream)
        # The summarizer call: the agent's endpoint and key, the Responses path, the forwarded
        # request plus one user item (the shared-cache call: OpenAI caches by itself).
        (job,) = [r for r in provider.summarizer_requests if agent.session[:8].encode() in r.body]
        assert job.path == "/v1/responses"
        assert job.header("authorization") == f"Bearer {KEY}"
        assert json.loads(job.body)["input"][-1]["role"] == "user"
        for n in (14, 16):
            t = agent.turn(responses_items(agent.session, n), stream=stream)
            assert t.text == DEFAULT_TEXT
            got = received(provider, t.eid)
            assert spliced(t.request.content, got.body, head=2, cut=7) == summary
            cg = rproxy.records.cg(t.eid)
            assert cg["outcome"] == "rewritten" and cg["messages_out"] == n - 4
        # The stash restores the span, verbatim.
        with rproxy.client() as c:
            stash = c.get("/_cg/expand", params={"id": key}).json()
        assert stash["dialect"] == "responses"
        assert stash["messages"] == responses_items(agent.session, 12)[2:7]


async def test_an_async_client_gets_the_same_summary_item(
    rproxy: Proxy, provider: FakeProvider
) -> None:
    """Primed on the sync SDK, the session's next turns on `AsyncOpenAI` (create, then stream)
    carry the byte-identical summary item."""
    with SdkClient(rproxy, "responses", key=KEY) as agent:
        summary, _ = prime(rproxy, provider, agent)
        session = agent.session
    headers = {"x-context-guru-session": session}
    for n, stream in ((14, False), (16, True)):
        capture, eid = Capture(), new_id()
        async with httpx.AsyncClient(trust_env=False, event_hooks=capture.async_hooks()) as http:
            client = sdk_client("responses", rproxy, http, key=KEY, headers=headers)
            kw: dict[str, Any] = {
                "model": "gpt-test",
                "input": responses_items(session, n),
                "store": False,
                "extra_headers": {"x-e2e-id": eid},
            }
            if stream:
                async with client.responses.stream(**kw) as s:
                    final = await s.get_final_response()
            else:
                final = await client.responses.create(**kw)
        assert final.output_text == DEFAULT_TEXT
        got = received(provider, eid)
        assert spliced(capture.only().content, got.body, head=2, cut=7) == summary
        assert rproxy.records.cg(eid)["outcome"] == "rewritten"


@dataclass
class Model:
    """The scripted model: when `context_guru_expand` is offered and not yet answered, it calls
    it with the id in the summary's marker (after a reasoning item); then it answers FINAL."""

    calls: int = 0

    def __call__(self, rec: Recorded) -> Reply | None:
        if rec.is_summarizer or not rec.path.endswith("/v1/responses"):
            return None
        body = rec.json()
        if TOOL_NAME not in [t.get("name") for t in body.get("tools") or []]:
            return None
        last = body["input"][-1]
        if last.get("type") == "function_call_output":
            return answer(
                rec, provider_message("responses", 99, FINAL, [], (2000, 11)), "responses"
            )
        m = MARKER.search(json.dumps(body["input"], ensure_ascii=False))
        assert m is not None, "the tool was offered without a marker"
        self.calls += 1
        calls = [(f"call_x{self.calls}", TOOL_NAME, {"id": m.group(1)})]
        msg = provider_message("responses", self.calls, None, calls, (1000, 7))
        return answer(rec, msg, "responses")


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_the_models_expand_call_is_answered_by_the_proxy(
    rproxy: Proxy, provider: FakeProvider, stream: bool
) -> None:
    with SdkClient(rproxy, "responses", key=KEY) as agent:
        _, key = prime(rproxy, provider, agent, tools=TOOLS)
        model = Model()
        provider.responder = model
        t = agent.turn(responses_items(agent.session, 14), stream=stream, tools=TOOLS)
        # The client sees only the final answer: no call to a tool it never declared.
        assert t.text == FINAL
        # Streamed too: the reasoning item right before our call is held with it (the client
        # would re-send it without its successor), so it never reaches the client.
        assert [i["type"] for i in t.result["output"]] == ["message"]
        assert not any(TOOL_NAME in json.dumps(c) for c in t.chunks)
        assert t.result["usage"]["output_tokens"] == 7 + 11
        assert t.result["usage"]["input_tokens"] == 2000
        # The provider got the turn with our tool appended, then the continuation.
        first, again = provider.wait_for(2, where=lambda r: r.header("x-e2e-id") == t.eid)
        tools = first.json()["tools"]
        assert (
            tools[:-1] == TOOLS
            and json.dumps(tools[-1], separators=(",", ":")) == TOOL_JSON["responses"]
        )
        assert first.body.count(TOOL_JSON["responses"].encode()) == 1
        added = again.json()["input"][len(first.json()["input"]) :]
        assert [i["type"] for i in added] == ["reasoning", "function_call", "function_call_output"]
        assert added[0]["encrypted_content"] == "gAAAAenc1"
        assert added[2]["call_id"] == "call_x1"
        assert f"<<cg:{key}>> replaced, verbatim" in added[2]["output"]
        assert "Step 6: I read parser.py" in added[2]["output"]
        fpre, fitems, fpost = item_sources(first.body)
        apre, aitems, apost = item_sources(again.body)
        assert (apre, apost) == (fpre, fpost) and aitems[: len(fitems)] == fitems
        cg = rproxy.records.cg(t.eid)
        assert cg["expand"]["injected"] is True and cg["expand"]["rounds"] == 1
        assert model.calls == 1


def test_every_answers_usage_is_in_the_sessions_ledger(
    rproxy: Proxy, provider: FakeProvider
) -> None:
    with SdkClient(rproxy, "responses", key=KEY) as agent:
        prime(rproxy, provider, agent)
        sent = [agent.turn(responses_items(agent.session, 14), stream=s) for s in (False, True)]
        told = [t.result["usage"] for t in sent]
        row = rproxy.sessions()[agent.session]
        agent_usage = row["usage"]["agent"]
        assert agent_usage["requests"] == 4  # two priming turns and these two
        assert row["usage"]["summarizer"]["requests"] == 1
        billed = [
            b.bill
            for b in provider.billed
            if not b.request.is_summarizer
            and b.request.header("x-context-guru-session") == agent.session
        ]
        assert len(billed) == 4
        assert agent_usage["cache_read_tokens"] == sum(b.read for b in billed)
        assert agent_usage["input_tokens"] == sum(b.input_tokens for b in billed)
        assert told[-1]["input_tokens_details"]["cached_tokens"] == billed[-1].read
        assert agent_usage["output_tokens"] > 0
