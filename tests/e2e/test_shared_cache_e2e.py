"""The summarizer call that shares the prompt cache
(docs/behaviour.md#summarize-the-summarizer-call), through a real mitmdump.

A fake provider that bills the prompt cache as Anthropic and OpenAI do (tests/support/promptcache.py,
on a hand-driven clock) sits behind the proxy; the official SDKs (and Claude Code's own captured
bytes) are the clients. What is proved here:

- the summarizer request is the commissioning request as the provider received it, byte for
  byte, plus one instruction (and, where the contract allows, another `max_tokens`/`stream`);
- it is sent once the commissioning answer has begun, never before its headers;
- an answer with only tool calls falls back once to the standalone prompt;
- on a session grown large, the fake's own accounting shows the shared call reading >= 90% of
  its input from the cache in both dialects, and the standalone call (`share_cache: never`)
  reading almost none of it (the vacuity guard).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.harness import Proxy, low, new_id, received, start_summarize
from tests.e2e.sdk_sessions import EPHEMERAL, SYSTEM, SdkClient, provider_message
from tests.support.fakeprovider import FakeProvider, Recorded, Reply
from tests.support.promptcache import Bill, Clock
from tests.support.shared_request import split_shared
from tests.support.transcripts import (
    CC16,
    cc_dumps,
    fixture_body,
    fixture_headers,
    grow,
    openai_transcript,
)

pytestmark = pytest.mark.e2e

KEY = "sk-shared-e2e-0001"
WAIT = 15.0
# `regular` (4,096 output tokens): the level whose budget the cases below see raised past the
# agent's own max_tokens (the summarize preset's concise one is 2,048).
LOW = low(resummarize_tokens=1_000_000, summary_level="regular")


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeProvider]:
    """This module's own provider: its billing ledger and cache belong to these tests alone."""
    with FakeProvider(clock=Clock()) as p:
        yield p


@pytest.fixture(autouse=True)
def _unscripted(fake: FakeProvider) -> Iterator[None]:
    yield
    fake.clear_script()


def summarizer_calls(fake: FakeProvider, marker: str) -> list[Recorded]:
    return [r for r in fake.requests if r.is_summarizer and marker.encode() in r.body]


def wait_summaries(proxy: Proxy, n: int = 1) -> dict[str, Any]:
    """Wait until n summary jobs have ended (any outcome); the `summaries` counters."""
    doc = proxy.wait_stats(
        lambda s: s["summaries"]["completed"] + s["summaries"]["failed"] >= n, WAIT
    )
    summaries: dict[str, Any] = doc["summaries"]
    return summaries


def anthropic_request(tag: str, n: int = 9) -> dict[str, Any]:
    """An agent turn with every field the cache is keyed on: system and tools with breakpoints,
    thinking, tool_choice, and the moving breakpoint on the last message."""
    msgs: list[Any] = [{"role": "user", "content": f"Task {tag}: fix the parser. Ünïcödé ✓"}]
    for i in range(1, n):
        role = "assistant" if i % 2 else "user"
        # ~260 tokens each: the prefix passes the provider's 1,024-token minimum.
        text = f"{role} turn {i}: parser.py line {10 * i}. " + "detail " * 150
        msgs.append({"role": role, "content": text})
    msgs[-1] = {
        "role": "user",
        "content": [{"type": "text", "text": msgs[-1]["content"], "cache_control": EPHEMERAL}],
    }
    return {
        "model": "claude-test",
        "max_tokens": 2048,
        "system": [{"type": "text", "text": SYSTEM, "cache_control": EPHEMERAL}],
        "tools": [
            {
                "name": "Bash",
                "description": "Run a command.",
                "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}},
                "cache_control": EPHEMERAL,
            }
        ],
        "tool_choice": {"type": "auto"},
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": msgs,
    }


def openai_request(tag: str, exchanges: int = 3) -> dict[str, Any]:
    return {
        "model": "gpt-test",
        "messages": openai_transcript(exchanges, task=f"Task {tag}: port the parser."),
        "tools": [
            {
                "type": "function",
                "function": {"name": "shell", "parameters": {"type": "object", "properties": {}}},
            }
        ],
        "tool_choice": "auto",
    }


# -- the request ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dialect", "stream", "options", "changed"),
    [
        # thinking on, max_tokens 2048: raised to a summary's 4096 (still > budget_tokens)
        ("anthropic", False, {}, {"max_tokens": 4096}),
        ("anthropic", True, {}, {"max_tokens": 4096}),  # an Anthropic stream stays a stream
        ("openai", False, {}, {}),
        # streamed without stream_options: no usage would come back, so not streamed
        ("openai", True, {}, {"stream": False}),
        ("openai", True, {"stream_options": {"include_usage": True}}, {}),
    ],
)
def test_the_summarizer_request_is_the_forwarded_request_plus_one_instruction(
    fake, tmp_path, proxies, dialect, stream, options, changed
):
    proxy = proxies(
        start_summarize(
            fake.url, tmp_path, {**LOW, "keep_first": 1 if dialect == "anthropic" else 2}
        )
    )
    with SdkClient(proxy, dialect, key=KEY) as client:
        tag = client.session
        body = anthropic_request(tag) if dialect == "anthropic" else openai_request(tag)
        eid = client.call(stream=stream, **body, **options).eid
        forwarded = received(fake, eid)
        summaries = wait_summaries(proxy)
        assert (summaries["completed"], summaries["shared"]) == (1, 1)
    (call,) = summarizer_calls(fake, f"Task {tag}:")
    assert call.path == forwarded.path
    assert call.header("x-context-guru") == "summarize"
    if dialect == "anthropic":
        assert call.header("x-api-key") == KEY
        assert call.header("anthropic-version") == forwarded.header("anthropic-version")
    else:
        assert call.header("authorization") == f"Bearer {KEY}"
    for private in ("x-context-guru-session", "x-e2e-id", "x-stainless-lang"):
        assert call.header(private) is None, private
    ask, got = split_shared(forwarded.body, call.body, dialect)
    assert got == changed
    assert ask["role"] == "user" and "<summary>" in ask["content"]
    sent = forwarded.json()
    for key in ("model", "system", "tools", "tool_choice", "thinking"):
        assert call.json().get(key) == sent.get(key), key
    assert call.body.count(b"cache_control") == forwarded.body.count(b"cache_control")
    # The answer was read whichever form it came in (SSE for a stream), and the summary it held
    # is the one spliced next.
    assert fake.bill_of(call).prompt_tokens > fake.bill_of(forwarded).prompt_tokens


def tool_calls_only(dialect: str) -> Reply:
    """A summarizer's answer with one tool call and nothing else (no text, no thinking)."""
    call = ("toolu_x", "Bash", {"cmd": "ls"}) if dialect == "anthropic" else ("call_x", "shell", {})
    return Reply.json(200, provider_message(dialect, 0, None, [call], (10, 5), thinking=False))


@pytest.mark.parametrize("dialect", ["anthropic", "openai"])
def test_an_answer_with_only_tool_calls_falls_back_once_to_the_standalone_prompt(
    fake, tmp_path, proxies, dialect
):
    proxy = proxies(
        start_summarize(
            fake.url, tmp_path, {**LOW, "keep_first": 1 if dialect == "anthropic" else 2}
        )
    )
    fake.script_summarizer(tool_calls_only(dialect))
    with SdkClient(proxy, dialect, key=KEY) as client:
        tag = client.session
        body = anthropic_request(tag) if dialect == "anthropic" else openai_request(tag)
        forwarded = received(fake, client.call(**body).eid)
        summaries = wait_summaries(proxy)
        assert (summaries["completed"], summaries["fallback"], summaries["shared"]) == (1, 1, 0)
        # The next turn splices the fallback's summary.
        body["messages"] = [*body["messages"], {"role": "assistant", "content": "ok"}]
        body["messages"].append({"role": "user", "content": "go on"})
        spliced = received(fake, client.call(**body).eid)
    shared, standalone = summarizer_calls(fake, f"Task {tag}:")
    split_shared(forwarded.body, shared.body, dialect)
    prompt = standalone.json()["messages"][0]["content"]
    assert "<conversation>" in prompt and "Task" in prompt
    assert len(standalone.json()["messages"]) == 1
    assert b"=== History Summary ===" in spliced.body and b"Fake summary #" in spliced.body
    assert any("via fallback" in line for line in proxy.log), proxy.log_text()


@pytest.mark.parametrize(
    ("model", "path"),
    [({"share_cache": "never"}, "standalone"), ({"share_cache": "always"}, "shared")],
)
def test_share_cache_option_chooses_the_request(fake, tmp_path, proxies, model, path):
    proxy = proxies(start_summarize(fake.url, tmp_path, {**LOW, "model": model}))
    with SdkClient(proxy, "anthropic", key=KEY) as client:
        tag = client.session
        client.call(**anthropic_request(tag))
        summaries = wait_summaries(proxy)
    assert (summaries["completed"], summaries[path]) == (1, 1)
    (call,) = summarizer_calls(fake, f"Task {tag}:")
    assert (len(call.json()["messages"]) == 1) is (path == "standalone")


def test_share_cache_always_with_a_config_model_refuses_to_start(fake, tmp_path):
    model = {"source": "config", "model": "cheap", "share_cache": "always"}
    with pytest.raises(RuntimeError) as e:
        start_summarize(fake.url, tmp_path, {**LOW, "model": model})
    assert "model.share_cache" in str(e.value) and "source: incoming" in str(e.value)


# -- when: once the commissioning answer has begun -------------------------------------------------


def test_the_call_goes_once_the_answer_has_begun_while_it_still_streams(fake, tmp_path, proxies):
    proxy = proxies(start_summarize(fake.url, tmp_path, LOW))
    gate = threading.Event()
    reply = Reply(gate=gate)
    fake.script(reply)
    with SdkClient(proxy, "anthropic", key=KEY) as client:
        tag = client.session
        done = threading.Thread(
            target=client.call, kwargs={"stream": True, **anthropic_request(tag)}, daemon=True
        )
        done.start()
        try:
            # The agent's answer is held mid-stream; the summarizer call arrives meanwhile.
            (call,) = fake.wait_for(
                1, WAIT, where=lambda r: r.is_summarizer and tag.encode() in r.body
            )
            assert not gate.is_set() and not reply.answered.is_set()
        finally:
            gate.set()
        done.join(WAIT)
        assert not done.is_alive() and not reply.gate_timed_out
    assert reply.began is not None and call.seq > reply.began
    assert fake.bill_of(call).read > 0  # the entry existed: it was written when the answer began


def test_no_summarizer_request_reaches_the_provider_before_the_answers_headers(
    fake, tmp_path, proxies
):
    proxy = proxies(start_summarize(fake.url, tmp_path, LOW))
    hold = threading.Event()  # never set: the reply is held for hold_timeout, a slow server
    reply = Reply(hold=hold, hold_timeout=1.0)
    fake.script(reply)
    with SdkClient(proxy, "anthropic", key=KEY) as client:
        tag = client.session
        client.call(**anthropic_request(tag))
        wait_summaries(proxy)
    assert reply.hold_timed_out  # vacuity: the answer really was held, headers and all
    (call,) = summarizer_calls(fake, f"Task {tag}:")
    assert reply.began is not None and call.seq > reply.began
    assert fake.bill_of(call).read_share > 0.5


# -- what it costs: the cache read, from the fake's own accounting ---------------------------------


def claude_code_session(key: str) -> tuple[bytes, dict[str, str]]:
    """A Claude Code request grown from a real capture (~30k tokens, tools, thinking, three
    breakpoints), with Claude Code's own headers."""
    body = grow(fixture_body(CC16), 12, output_words=150)[-1]
    body["metadata"] = {"user_id": json.dumps({"session_id": uuid.uuid4().hex})}
    headers = {**fixture_headers(CC16), "x-api-key": key, "x-e2e-id": new_id()}
    headers.pop("content-length", None)
    headers.pop("host", None)
    return cc_dumps(body), headers


def shared_bills(fake: FakeProvider, proxy: Proxy, dialect: str, key: str) -> tuple[Bill, Bill]:
    """(the agent's commissioning request's bill, the summarizer's) for one session."""
    if dialect == "anthropic":
        raw, headers = claude_code_session(key)
        with httpx.Client(trust_env=False, timeout=30) as c:
            r = c.post(f"{proxy.url}/v1/messages?beta=true", content=raw, headers=headers)
        assert r.status_code == 200
        agent = received(fake, headers["x-e2e-id"])
    else:
        with SdkClient(proxy, "openai", key=key) as client:
            body = openai_request(client.session, exchanges=150)
            agent = received(fake, client.call(**body).eid)
    assert wait_summaries(proxy)["completed"] == 1
    (call,) = [
        r
        for r in fake.requests
        if r.is_summarizer
        and (r.header("x-api-key") == key or key in (r.header("authorization") or ""))
    ]
    return fake.bill_of(agent), fake.bill_of(call)


@pytest.mark.parametrize("dialect", ["anthropic", "openai"])
def test_the_shared_call_reads_at_least_90_percent_of_its_input_from_the_cache(
    fake, tmp_path, proxies, dialect
):
    keep = {"keep_first": 1 if dialect == "anthropic" else 2}
    shared = proxies(start_summarize(fake.url, tmp_path / "auto", {**LOW, **keep}))
    agent, call = shared_bills(fake, shared, dialect, f"sk-auto-{dialect}")
    assert agent.prompt_tokens > 10_000  # a session grown large: the cache matters
    assert call.read_share >= 0.90, call
    assert call.read >= agent.prompt_tokens * 0.9  # it is the agent's transcript that was read

    # Vacuity guard: the standalone prompt, on the same session, reads (almost) none of it.
    never = proxies(
        start_summarize(
            fake.url, tmp_path / "never", {**LOW, **keep, "model": {"share_cache": "never"}}
        )
    )
    agent2, standalone = shared_bills(fake, never, dialect, f"sk-never-{dialect}")
    assert agent2.prompt_tokens == agent.prompt_tokens
    assert standalone.read_share <= 0.05, standalone
    print(
        f"{dialect}: shared call read {call.read}/{call.prompt_tokens} "
        f"({call.read_share:.1%}) from the cache; standalone {standalone.read}/"
        f"{standalone.prompt_tokens} ({standalone.read_share:.1%})"
    )
