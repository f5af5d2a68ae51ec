"""The `summarize` component through a real `mitmdump -s cg_addon.py`, driven by the official SDKs.

Every proxy here runs the `summarize` (or `summarizer1509`) preset with a `cg_config` file that
lowers the triggers so a short transcript qualifies, and its own `cg_db` under the test's tmp
directory. The summarizer's requests (`x-context-guru: summarize`) reach a fake provider — the
agent's own (`incoming`) or a second instance posing as a dedicated cheap model (`config`) —
whose summarizer replies are scripted apart from the agent's.

Waiting for a summary is a condition: poll `/_cg/stats` until a counter moves, with a deadline.
Every assertion of reuse is preceded by one that the summary was actually spliced.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import pytest

from cg.summarize.prompt import MAX_TOKENS
from tests.e2e.harness import (
    Proxy,
    assert_forwarded_unchanged,
    by_id,
    header_pairs,
    low,
    message_sources,
    received,
    start_summarize,
)
from tests.e2e.sdk_sessions import Exchange, SdkClient, anthropic_messages, openai_messages
from tests.support.fakeprovider import (
    DEFAULT_TEXT,
    FakeProvider,
    Recorded,
    Reply,
    anthropic_error,
    openai_error,
)
from tests.support.shared_request import split_shared

pytestmark = pytest.mark.e2e

HEADER = "=== History Summary ==="
MARKER = re.compile(r"<<cg:([0-9a-f]+)>>")
AGENT_KEY = "sk-agent-e2e-0001"
CHEAP_KEY = "sk-cheap-e2e-0002"
# Triggers low enough for a dozen short messages; reuse until 200 new tokens pile up.
LOW = low(resummarize_tokens=200)
NEVER = {**LOW, "model": {"share_cache": "never"}}


# -- an agent -----------------------------------------------------------------------------------


class Agent(SdkClient):
    """An agent with its own key whose system prompt carries a cache breakpoint, as agents that
    want the prompt cache set one: the shared-cache summarizer (`share_cache: auto`) shares only
    a cache that was written."""

    def __init__(self, proxy: Proxy, dialect: str, session: str | None = None) -> None:
        super().__init__(proxy, dialect, key=AGENT_KEY, session=session, breakpoint=True)


# -- proxies -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sproxy(provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    """The summarize preset, incoming model source, triggers lowered."""
    with start_summarize(provider.url, tmp_path_factory.mktemp("proxy-summarize"), LOW) as p:
        yield p


@pytest.fixture(scope="module")
def nproxy(provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    """As `sproxy`, with `model.share_cache: never`: the standalone prompt only."""
    with start_summarize(provider.url, tmp_path_factory.mktemp("proxy-never"), NEVER) as p:
        yield p


@pytest.fixture(scope="module")
def cheap() -> Iterator[FakeProvider]:
    """A second fake provider: the dedicated cheap model of `model.source: config`."""
    with FakeProvider() as p:
        yield p


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- what the provider got -----------------------------------------------------------------------


def about(tag: str) -> Callable[[Recorded], bool]:
    """A summarizer request about the conversation tagged `tag`: its standalone prompt quotes
    the task, and a shared-cache request carries the task message itself."""
    return lambda r: r.is_summarizer and f"Task {tag}:".encode() in r.body


def summaries_of(fake: FakeProvider, tag: str) -> list[Recorded]:
    return [r for r in fake.requests if about(tag)(r)]


def spliced(turn: Exchange, got: Recorded, head: int, cut: int) -> bytes:
    """Assert the provider got [client head, one new message, client tail from `cut`] with every
    byte outside the new message as the client sent it; return the new message's bytes."""
    spre, sent, spost = message_sources(turn.request.content)
    gpre, recv, gpost = message_sources(got.body)
    assert gpre == spre, "bytes before `messages` changed"
    assert gpost == spost, "bytes after `messages` changed"
    assert len(recv) == head + 1 + len(sent) - cut, (len(recv), head, cut, len(sent))
    assert recv[:head] == sent[:head], "a head message is not byte-identical"
    assert recv[head + 1 :] == sent[cut:], "a tail message is not byte-identical"
    summary = recv[head]
    assert summary not in sent
    return summary


def summary_parts(summary: bytes) -> tuple[str, str]:
    """(text, key) of a summary message, after checking its shape."""
    msg = json.loads(summary)
    assert set(msg) == {"role", "content"}
    assert msg["role"] == "user"
    text = msg["content"]
    assert isinstance(text, str)
    assert text.startswith(HEADER + "\n<summary>\n"), text
    m = MARKER.search(text)
    assert m is not None, text
    assert "context_guru_expand" in text
    return text, m.group(1)


def same_headers_but_length(sent: httpx.Request, got: Recorded) -> None:
    """The addon adds, drops and changes no header of an agent request (but content-length)."""
    skip = {"host", "content-length"}
    assert header_pairs(got.headers, skip) == header_pairs(sent.headers.multi_items(), skip)


def component(cg: dict[str, Any]) -> dict[str, Any]:
    (comp,) = cg["components"]
    assert comp["component"] == "summarize"
    return dict(comp)


# -- the life of a session: commission, splice, reuse, roll forward ---------------------------------


@pytest.mark.parametrize("path", ["shared", "standalone"])
def test_commission_splice_reuse_and_roll_forward(path, sproxy, nproxy, provider):
    """The default (`share_cache: auto`) summarizes with the shared-cache request; `never` with
    the standalone prompt. Everything else about the session's life is the same."""
    sproxy = sproxy if path == "shared" else nproxy
    with Agent(sproxy, "anthropic") as agent:
        tag = agent.session
        c0 = sproxy.counts()

        # Turn 1 qualifies: it forwards untouched and commissions a summary of [1, 4).
        t1 = agent.turn(anthropic_messages(tag, 7))
        assert t1.text == DEFAULT_TEXT
        got1 = received(provider, t1.eid)
        assert_forwarded_unchanged(t1.request, got1)
        assert got1.header("x-context-guru") is None
        cg1 = sproxy.records.cg(t1.eid)
        assert cg1["outcome"] == "passed_through"
        assert cg1["session"] == tag
        assert component(cg1)["commission"] == "trigger fired"
        assert component(cg1)["span"] == [1, 4]
        c1 = sproxy.wait_count(c0, "completed")
        assert c1["commissioned"] == c0["commissioned"] + 1
        assert (c1["failed"], c1["timed_out"]) == (c0["failed"], c0["timed_out"])
        assert c1[path] == c0[path] + 1

        # The summarizer call: the client's model, endpoint and key; nothing else of its headers.
        (job,) = summaries_of(provider, tag)
        assert job.path == "/v1/messages"
        assert job.header("x-context-guru") == "summarize"
        assert job.header("x-api-key") == AGENT_KEY
        assert job.header("anthropic-version") == "2023-06-01"
        for private in ("x-context-guru-session", "x-e2e-id", "x-stainless-lang"):
            assert job.header(private) is None, private
        body = job.json()
        assert body["model"] == "claude-test"
        assert "stream" not in body
        if path == "shared":
            # The forwarded request byte for byte, one instruction appended, a summary's
            # output budget instead of the agent's 64 tokens.
            ask, changed = split_shared(got1.body, job.body, "anthropic")
            assert changed == {"max_tokens": MAX_TOKENS["concise"]}  # the preset's level
            prompt = ask["content"]
            assert "after the first message and before the last 3 messages" in prompt
            assert "messages 2 to 4 of the 7" in prompt
            assert "ends with: [assistant] Step 3: I read parser.py" in prompt  # the span
        else:
            prompt = body["messages"][0]["content"]
            assert "Step 3: I read parser.py" in prompt  # the span
            assert "Note 4" not in prompt.split("<conversation>")[1]  # the tail is not summarized

        # Turn 2 splices: [m0, summary, m4 …] with every retained byte as the client sent it.
        t2 = agent.turn(anthropic_messages(tag, 9))
        assert t2.text == DEFAULT_TEXT
        got2 = received(provider, t2.eid)
        summary = spliced(t2, got2, head=1, cut=4)
        text, key = summary_parts(summary)
        assert "Fake summary #" in text
        same_headers_but_length(t2.request, got2)
        cg2 = sproxy.records.cg(t2.eid)
        assert cg2["outcome"] == "rewritten"
        assert component(cg2)["checkpoint"] == {"covered": [1, 4], "key": key}
        assert (cg2["messages_in"], cg2["messages_out"]) == (9, 7)
        c2 = sproxy.counts()
        assert c2["reused"] == c1["reused"] + 1
        assert c2["rewritten"] == c1["rewritten"] + 1
        assert c2["tokens_before"] > c1["tokens_before"]

        # Turn 3 (streamed) re-emits the byte-identical summary, with no model call.
        t3 = agent.turn(anthropic_messages(tag, 11), stream=True)
        assert t3.text == DEFAULT_TEXT
        got3 = received(provider, t3.eid)
        assert got3.json()["stream"] is True
        assert spliced(t3, got3, head=1, cut=4) == summary
        assert len(summaries_of(provider, tag)) == 1
        assert sproxy.records.cg(t3.eid)["outcome"] == "rewritten"

        # Turn 4: 300+ new tokens in the middle roll the checkpoint forward, off the hot path;
        # the old summary keeps serving this very turn.
        t4 = agent.turn(anthropic_messages(tag, 13, big_at=9))
        got4 = received(provider, t4.eid)
        assert spliced(t4, got4, head=1, cut=4) == summary
        comp4 = component(sproxy.records.cg(t4.eid))
        assert comp4["commission"].startswith("rolling forward")
        assert comp4["middle_tokens"] > LOW["resummarize_tokens"]
        c4 = sproxy.wait_count(c2, "completed")
        roll = summaries_of(provider, tag)
        assert len(roll) == 2
        old = text.split("<summary>\n")[1].split("\n</summary>")[0]
        if path == "shared":
            # Built on turn 4 as forwarded: [m0, the old summary, m4 … m12]; the span runs from
            # the old summary to m9, before the last 3 messages.
            ask, changed = split_shared(got4.body, roll[1].body, "anthropic")
            assert changed == {"max_tokens": MAX_TOKENS["concise"]}  # the preset's level
            roll_prompt = ask["content"]
            assert "messages 2 to 8 of the 11" in roll_prompt
            assert "begins with: [user] === History Summary ===" in roll_prompt
            assert "ends with: [assistant] Step 9" in roll_prompt
            assert "includes an earlier summary" in roll_prompt
            assert old.encode() in roll[1].body  # in the cached prefix, not in the instruction
        else:
            roll_prompt = roll[1].json()["messages"][0]["content"]
            assert "<previous_summary>" in roll_prompt
            assert old in roll_prompt
            conversation = roll_prompt.split("<conversation>")[1]
            assert "Step 9" in conversation
            assert "Step 3: I read" not in conversation  # only what the old summary did not cover

        # Turn 5 splices the new summary, now covering [1, 10).
        t5 = agent.turn(anthropic_messages(tag, 15, big_at=9))
        got5 = received(provider, t5.eid)
        summary2 = spliced(t5, got5, head=1, cut=10)
        _, key2 = summary_parts(summary2)
        assert summary2 != summary
        assert key2 != key
        assert component(sproxy.records.cg(t5.eid))["checkpoint"]["covered"] == [1, 10]
        assert len(summaries_of(provider, tag)) == 2
        assert sproxy.counts()["commissioned"] == c4["commissioned"]


def test_two_sessions_never_share_a_checkpoint(sproxy, provider):
    tag = uuid.uuid4().hex  # the same transcript in both sessions: only the header differs
    with Agent(sproxy, "anthropic") as a, Agent(sproxy, "anthropic") as b:
        c0 = sproxy.counts()
        provider.script_summarizer(Reply(text="<summary>Only session A's summary.</summary>"))
        ta = a.turn(anthropic_messages(tag, 7))
        c1 = sproxy.wait_count(c0, "completed")

        provider.script_summarizer(Reply(text="<summary>Only session B's summary.</summary>"))
        tb = b.turn(anthropic_messages(tag, 7))
        assert tb.request.content == ta.request.content
        assert_forwarded_unchanged(tb.request, received(provider, tb.eid))
        cgb = sproxy.records.cg(tb.eid)
        assert cgb["outcome"] == "passed_through"
        assert cgb["session"] == b.session != sproxy.records.cg(ta.eid)["session"]
        assert component(cgb)["commission"] == "trigger fired"
        sproxy.wait_count(c1, "completed")
        assert len(summaries_of(provider, tag)) == 2

        for agent, own, other in ((a, "A", "B"), (b, "B", "A"), (a, "A", "B")):
            t = agent.turn(anthropic_messages(tag, 9))
            text, _ = summary_parts(spliced(t, received(provider, t.eid), head=1, cut=4))
            assert f"Only session {own}'s summary." in text
            assert f"session {other}'s" not in text
        assert len(summaries_of(provider, tag)) == 2


# -- the 400 safety net ------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_400_to_the_rewrite_resends_the_original_once(sproxy, provider, stream):
    with Agent(sproxy, "anthropic") as agent:
        tag = agent.session
        c0 = sproxy.counts()
        agent.turn(anthropic_messages(tag, 7))
        c1 = sproxy.wait_count(c0, "completed")

        refusal = "messages.1: fake shape refusal of the rewrite"
        provider.script(anthropic_error(400, "invalid_request_error", refusal))
        t2 = agent.turn(anthropic_messages(tag, 9), stream=stream)
        assert t2.text == DEFAULT_TEXT  # the answer to the re-sent original

        first, second = provider.wait_for(2, where=by_id(t2.eid))
        summary_parts(spliced(t2, first, head=1, cut=4))  # the rewrite was really sent
        assert second.body == t2.request.content  # then the client's exact bytes
        hop = {"host", "content-length", "connection"}
        assert header_pairs(second.headers, hop) == header_pairs(
            t2.request.headers.multi_items(), hop
        )
        cg = sproxy.records.cg(t2.eid)
        assert cg["outcome"] == "retried_original"
        assert cg["provider_400"] == refusal
        # The re-sent original's answer is booked, as a turn sent unchanged (the 400 had none).
        assert cg["ledger"]["session"] == tag and cg["ledger"]["rounds"] == 1
        assert sproxy.sessions()[tag]["savings"]["rewritten_turns"] == 0
        c2 = sproxy.counts()
        assert c2["retried_original"] == c1["retried_original"] + 1
        assert len(provider.wait_for(2, where=by_id(t2.eid))) == 2  # re-sent once, no more


def test_a_400_to_an_untouched_request_is_not_retried(sproxy, provider):
    with Agent(sproxy, "anthropic") as agent:
        c0 = sproxy.counts()
        provider.script(anthropic_error(400, "invalid_request_error", "the client's own bug"))
        with pytest.raises(anthropic.BadRequestError, match="the client's own bug"):
            agent.turn(anthropic_messages(agent.session, 3))
        eid = agent.capture.sent[-1].headers["x-e2e-id"]
        assert len(provider.wait_for(1, where=by_id(eid))) == 1
        assert sproxy.records.cg(eid)["outcome"] == "passed_through"
        assert sproxy.counts()["retried_original"] == c0["retried_original"]


# -- a failing summarizer is a counted no-op ----------------------------------------------------


def test_summarizer_500s_are_retried_then_counted_failed(sproxy, provider):
    gate = threading.Event()
    err = openai_error(500, "server_error", "fake overload")
    first = Reply(500, body=err.body, headers=err.headers, hold=gate)
    provider.script_summarizer(first, Reply.json(503, {}), Reply.json(500, {}))
    with Agent(sproxy, "anthropic") as agent:
        tag = agent.session
        c0 = sproxy.counts()
        try:
            t1 = agent.turn(anthropic_messages(tag, 7))
            provider.wait_for(1, where=about(tag))
            assert not first.answered.is_set()  # the turn did not wait for the summarizer
            assert t1.text == DEFAULT_TEXT
            assert_forwarded_unchanged(t1.request, received(provider, t1.eid))
        finally:
            gate.set()
        c1 = sproxy.wait_count(c0, "failed")
        assert len(summaries_of(provider, tag)) == 3  # retried, under one deadline
        assert (c1["completed"], c1["timed_out"]) == (c0["completed"], c0["timed_out"])

        t2 = agent.turn(anthropic_messages(tag, 9))  # no checkpoint: nothing to splice
        assert_forwarded_unchanged(t2.request, received(provider, t2.eid))
        sproxy.wait_count(c1, "completed")  # it commissions afresh, and that one succeeds


def test_a_blank_summary_is_counted_failed_and_never_spliced(sproxy, provider):
    # The shared answer holds no <summary>: one fallback to the standalone prompt, blank too.
    provider.script_summarizer(Reply(text="  "), Reply(text="  "))
    with Agent(sproxy, "anthropic") as agent:
        tag = agent.session
        c0 = sproxy.counts()
        t1 = agent.turn(anthropic_messages(tag, 7))
        assert t1.text == DEFAULT_TEXT
        c1 = sproxy.wait_count(c0, "failed")
        assert c1["completed"] == c0["completed"]
        assert c1["fallback"] == c0["fallback"] + 1
        assert len(summaries_of(provider, tag)) == 2  # once shared, once standalone: no more
        t2 = agent.turn(anthropic_messages(tag, 9))
        assert_forwarded_unchanged(t2.request, received(provider, t2.eid))
        assert sproxy.records.cg(t2.eid)["outcome"] == "passed_through"
        sproxy.wait_count(c1, "completed")
        t3 = agent.turn(anthropic_messages(tag, 11))  # the next, good summary is spliced
        text, _ = summary_parts(spliced(t3, received(provider, t3.eid), head=1, cut=6))
        assert "Fake summary #" in text


def test_a_hanging_summarizer_times_out_without_holding_a_turn(provider, tmp_path, proxies):
    proxy = proxies(
        start_summarize(provider.url, tmp_path, LOW, env={"CONTEXT_GURU_SUMMARIZE_TIMEOUT": "1"})
    )
    gate = threading.Event()
    held = Reply(hold=gate, hold_timeout=15.0)
    provider.script_summarizer(held)
    with Agent(proxy, "anthropic") as agent:
        tag = agent.session
        try:
            t1 = agent.turn(anthropic_messages(tag, 7))
            after_t1 = proxy.counts()
            provider.wait_for(1, where=about(tag))
            t2 = agent.turn(anthropic_messages(tag, 9))
            assert not held.answered.is_set(), "a turn waited for the summarizer"
            for t in (t1, t2):
                assert t.text == DEFAULT_TEXT
                assert_forwarded_unchanged(t.request, received(provider, t.eid))
            assert t1.seconds < 1.0  # less than the summarizer's deadline
            assert after_t1["timed_out"] == 0  # turn 1 was answered before the deadline
            c = proxy.wait_count(after_t1, "timed_out")
            assert not held.answered.is_set()  # the proxy gave up on its own
            assert (c["failed"], c["completed"]) == (0, 0)
        finally:
            gate.set()
        assert held.answered.wait(10)


def test_an_unreachable_summarizer_is_counted_failed(provider, tmp_path, proxies):
    model = {"source": "config", "provider": "anthropic", "model": "cheap-1"}
    model["base_url"] = f"http://127.0.0.1:{closed_port()}"
    proxy = proxies(start_summarize(provider.url, tmp_path, {**LOW, "model": model}))
    with Agent(proxy, "anthropic") as agent:
        t1 = agent.turn(anthropic_messages(agent.session, 7))
        assert t1.text == DEFAULT_TEXT
        assert_forwarded_unchanged(t1.request, received(provider, t1.eid))
        c = proxy.wait_count({"failed": 0}, "failed")
        assert (c["commissioned"], c["completed"], c["timed_out"]) == (1, 0, 0)
        t2 = agent.turn(anthropic_messages(agent.session, 9))
        assert_forwarded_unchanged(t2.request, received(provider, t2.eid))
    assert summaries_of(provider, agent.session) == []


def test_a_credential_httpx_cannot_send_is_counted_failed(provider, cheap, tmp_path, proxies):
    """A key with a non-ASCII character fails inside httpx (UnicodeEncodeError): still a no-op."""
    env = {
        "CHEAP_MODEL": "cheap-1",
        "CHEAP_MODEL_BASE_URL": cheap.url,
        "CHEAP_MODEL_API_KEY": "sk-cheap\u2013pasted",
    }
    proxy = proxies(
        start_summarize(provider.url, tmp_path, {**LOW, "model": {"source": "config"}}, env=env)
    )
    with Agent(proxy, "anthropic") as agent:
        t1 = agent.turn(anthropic_messages(agent.session, 7))
        assert t1.text == DEFAULT_TEXT
        c = proxy.wait_count({"failed": 0}, "failed")
        assert (c["completed"], c["timed_out"]) == (0, 0)
    assert not any("pasted" in line for line in proxy.log)
    assert summaries_of(cheap, agent.session) == []


# -- a restart on the same SQLite file -------------------------------------------------------------


def test_a_restarted_proxy_splices_the_stored_summary_with_no_model_call(
    provider, tmp_path, proxies
):
    db = tmp_path / "shared.sqlite3"
    first = proxies(start_summarize(provider.url, tmp_path / "a", LOW, db=db))
    session = uuid.uuid4().hex
    with Agent(first, "anthropic", session=session) as agent:
        agent.turn(anthropic_messages(session, 7))
        first.wait_count({"completed": 0}, "completed")
        t2 = agent.turn(anthropic_messages(session, 9))
        summary = spliced(t2, received(provider, t2.eid), head=1, cut=4)
        summary_parts(summary)
    first.stop()

    second = proxies(start_summarize(provider.url, tmp_path / "b", LOW, db=db))
    assert second.port != 0
    with Agent(second, "anthropic", session=session) as agent:
        t3 = agent.turn(anthropic_messages(session, 11))
        assert spliced(t3, received(provider, t3.eid), head=1, cut=4) == summary
        assert second.records.cg(t3.eid)["outcome"] == "rewritten"
    c = second.counts()
    assert (c["commissioned"], c["reused"]) == (0, 1)
    assert len(summaries_of(provider, session)) == 1


# -- model sources -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    name: str
    agent: str  # the agent's dialect
    model: dict[str, Any]  # the `model:` block
    env: dict[str, str]
    base: str  # appended to the cheap endpoint's URL to make `base_url`
    path: str  # where the cheap endpoint is called
    auth: tuple[str, str]  # the credential header it must receive
    absent: str  # the auth header it must not receive


SOURCES = [
    Source(
        "block-anthropic-x-api-key",
        "openai",
        {"source": "config", "provider": "anthropic", "model": "cheap-a", "api_key": CHEAP_KEY},
        {},
        "",
        "/v1/messages",
        ("x-api-key", CHEAP_KEY),
        "authorization",
    ),
    Source(
        "block-openai-v1-bearer",
        "anthropic",
        {"source": "config", "provider": "openai", "model": "cheap-o", "api_key": CHEAP_KEY},
        {},
        "/v1",
        "/v1/chat/completions",
        ("authorization", f"Bearer {CHEAP_KEY}"),
        "x-api-key",
    ),
    Source(
        "env-anthropic-bearer",
        "anthropic",
        {"source": "config"},
        {
            "CHEAP_MODEL": "cheap-a",
            "CHEAP_MODEL_PROVIDER": "anthropic",
            "CHEAP_MODEL_API_KEY": CHEAP_KEY,
            "CHEAP_MODEL_AUTH": "bearer",
        },
        "/v1/",
        "/v1/messages",
        ("authorization", f"Bearer {CHEAP_KEY}"),
        "x-api-key",
    ),
    Source(
        "env-openai-key-from-OPENAI_API_KEY",
        "openai",
        {"source": "config"},
        {"CHEAP_MODEL": "cheap-o", "CHEAP_MODEL_PROVIDER": "openai", "OPENAI_API_KEY": CHEAP_KEY},
        "",
        "/v1/chat/completions",
        ("authorization", f"Bearer {CHEAP_KEY}"),
        "x-api-key",
    ),
]


@pytest.mark.parametrize("src", SOURCES, ids=[s.name for s in SOURCES])
def test_config_source_summarizes_with_the_cheap_endpoint(provider, cheap, tmp_path, proxies, src):
    model = dict(src.model)
    env = dict(src.env)
    base = cheap.url + src.base
    if model.get("provider"):
        model["base_url"] = base
    else:
        env["CHEAP_MODEL_BASE_URL"] = base
    proxy = proxies(start_summarize(provider.url, tmp_path, {**LOW, "model": model}, env=env))
    with Agent(proxy, src.agent) as agent:
        tag = agent.session
        make = anthropic_messages if src.agent == "anthropic" else openai_messages
        n, head, cut = (7, 1, 4) if src.agent == "anthropic" else (8, 1, 5)
        t1 = agent.turn(make(tag, n))
        assert_forwarded_unchanged(t1.request, received(provider, t1.eid))
        proxy.wait_count({"completed": 0}, "completed")

        (job,) = summaries_of(cheap, tag)
        assert job.path == src.path
        assert job.header("x-context-guru") == "summarize"
        assert job.header(src.auth[0]) == src.auth[1]
        assert job.header(src.absent) is None
        assert AGENT_KEY not in json.dumps(job.headers)  # never the agent's credential
        assert job.json()["model"] == (model.get("model") or env["CHEAP_MODEL"])
        assert (job.header("anthropic-version") is not None) == (src.path == "/v1/messages")
        assert summaries_of(provider, tag) == []

        t2 = agent.turn(make(tag, n + 2))
        text, _ = summary_parts(spliced(t2, received(provider, t2.eid), head=head, cut=cut))
        assert "Fake summary #" in text
        assert proxy.records.cg(t2.eid)["outcome"] == "rewritten"

    # Neither credential is written anywhere: log, decision records, the SQLite files.
    written = [proxy.log_text().encode(), proxy.records.path.read_bytes()]
    written += [f.read_bytes() for f in tmp_path.glob("cg.sqlite3*")]
    assert len(written) >= 3
    assert any(tag.encode() in w for w in written[2:])  # the store did record this session
    for w in written:
        assert CHEAP_KEY.encode() not in w
        assert AGENT_KEY.encode() not in w


def test_a_bad_summarize_timeout_refuses_to_start_naming_the_variable(provider, tmp_path):
    with pytest.raises(RuntimeError) as e:
        start_summarize(provider.url, tmp_path, LOW, env={"CONTEXT_GURU_SUMMARIZE_TIMEOUT": "soon"})
    assert "CONTEXT_GURU_SUMMARIZE_TIMEOUT: not a number of seconds (got 'soon')" in str(e.value)


# -- summarizer1509: no reuse, a fresh summary every eligible turn ---------------------------------


def test_summarizer1509_on_openai_summarizes_every_turn_and_keeps_system_and_task(
    provider, tmp_path, proxies
):
    proxy = proxies(start_summarize(provider.url, tmp_path, low(), preset="summarizer1509"))
    with Agent(proxy, "openai") as agent:
        tag = agent.session
        t1 = agent.turn(openai_messages(tag, 8))
        assert_forwarded_unchanged(t1.request, received(provider, t1.eid))
        assert component(proxy.records.cg(t1.eid))["span"] == [2, 5]
        c = proxy.wait_count({"completed": 0}, "completed")

        summaries: list[bytes] = []
        for turn, n in enumerate((10, 12, 14), start=2):
            t = agent.turn(openai_messages(tag, n))
            # Spliced from the previous turn's summary, which covered up to its tail.
            got = received(provider, t.eid)
            summary = spliced(t, got, head=2, cut=n - 5)
            summary_parts(summary)
            _, recv, _ = message_sources(got.body)
            assert json.loads(recv[0])["role"] == "system"
            assert json.loads(recv[1])["content"].startswith(f"Task {tag}:")
            summaries.append(summary)
            comp = component(proxy.records.cg(t.eid))
            assert comp["commission"].startswith("no reuse")
            c = proxy.wait_count(c, "completed")
            assert len(summaries_of(provider, tag)) == turn  # a model call every eligible turn
        assert len(set(summaries)) == 3, "the summary bytes did not change from turn to turn"

        (job, *_) = summaries_of(provider, tag)
        assert job.path == "/v1/chat/completions"
        assert job.header("authorization") == f"Bearer {AGENT_KEY}"  # incoming: the agent's own
        assert job.json()["model"] == "gpt-test"
