"""Tenancy (issue 29, docs/behaviour.md#tenancy) through a real `mitmdump -s cg_addon.py`, driven by
the official anthropic SDK: state is bound to who sends a request (the fingerprint of its API key),
not to the session header it names.

- **cross-credential expand**: user one (key K1, session A) is summarized and stashed; user two
  (key K2) names session A (`x-context-guru-session` or `x-claude-code-session-id`) and carries
  A's summary with its marker. The tool is not offered for it; offered anyway
  (`cg_expand_inject=always`), the model's call with A's id is answered "no longer available".
  No K2 request the provider receives ever holds A's stashed text; user one still expands it.
- **head-hash collision**: two keys, no session header, one system prompt and first message,
  alternating turns: each keeps its own checkpoint, re-emitted byte for byte every turn (one
  summary each, where they used to destroy each other's every turn).
- **eviction flood**: session B stashes far more than the store's stash budget (`max_mb: 1`);
  session A's live checkpoint still resolves its stash (its summary never says "expired") and
  A's marker still expands.

The "model" is the fake provider's responder: it calls `context_guru_expand` with the marker in
the request when the tool is offered, and answers once it has its result.
"""

from __future__ import annotations

import json
import re
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import closing
from typing import Any

import pytest

from cg.expand.tool import TOOL_NAME
from cg.state.session import HEADER_CG, HEADER_CLAUDE_CODE
from tests.e2e.harness import Proxy, by_id, low, message_sources, start_summarize
from tests.e2e.sdk_sessions import (
    Exchange,
    SdkClient,
    answer,
    anthropic_messages,
    provider_message,
    sdk_client,
)
from tests.support.fakeprovider import FakeProvider, Recorded, Reply

pytestmark = pytest.mark.e2e

K1, K2 = "sk-ant-e2e-tenant-one-0001", "sk-ant-e2e-tenant-two-0002"
MARKER = re.compile(r"<<cg:([0-9a-f]{24})>>")
HEADER = "=== History Summary ==="
FINAL = "Final answer after the expansion."
GONE = "is no longer available"
TOOLS = [
    {
        "name": "Bash",
        "description": "Run a shell command.",
        "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    }
]


# -- the users and the model -----------------------------------------------------------------------


class User(SdkClient):
    """An anthropic agent with its own key that names `session` with `header` (None: no session
    header at all, so the head hash is its session) and declares a tool of its own."""

    def __init__(
        self, proxy: Proxy, key: str, session: str | None = None, header: str | None = HEADER_CG
    ) -> None:
        super().__init__(proxy, "anthropic", key=key, session=session)
        self.key = key
        headers = {header: self.session} if header is not None else None
        self.sdk = sdk_client("anthropic", proxy, self.http, key=key, headers=headers)

    def send(self, msgs: list[Any], *, stream: bool = False) -> Exchange:
        return self.turn(msgs, stream=stream, tools=TOOLS)


def offered(body: dict[str, Any]) -> bool:
    return TOOL_NAME in [t.get("name") for t in body.get("tools") or []]


def results(body: dict[str, Any]) -> list[str]:
    """The texts of the tool results at the end of the request (our tool's answers)."""
    last = body["messages"][-1]
    if last["role"] != "user" or not isinstance(last["content"], list):
        return []
    return [b["content"] for b in last["content"] if b.get("type") == "tool_result"]


class Expander:
    """Calls the expand tool with the request's marker when offered it; answers FINAL once it
    has the tool's result. A request without our tool (or without a marker) gets the default."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, rec: Recorded) -> Reply | None:
        body = rec.json()
        if not offered(body):
            return None
        if results(body):
            return answer(rec, provider_message("anthropic", 99, FINAL, [], (900, 5)), "anthropic")
        m = MARKER.search(json.dumps(body["messages"], ensure_ascii=False))
        if m is None:
            return None
        self.calls += 1
        call = (f"toolu_t{self.calls}", TOOL_NAME, {"id": m.group(1)})
        msg = provider_message("anthropic", self.calls, "Let me look.", [call], (800, 4))
        return answer(rec, msg, "anthropic")


@pytest.fixture
def model(provider: FakeProvider) -> Iterator[Expander]:
    m = Expander()
    provider.responder = m
    yield m
    provider.responder = None


# -- proxies -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def auto(provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    with start_summarize(provider.url, tmp_path_factory.mktemp("proxy-tenancy"), low()) as p:
        yield p


@pytest.fixture(scope="module")
def always(provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    with start_summarize(
        provider.url,
        tmp_path_factory.mktemp("proxy-tenancy-always"),
        low(),
        options=["cg_expand_inject=always"],
    ) as p:
        yield p


# -- helpers -------------------------------------------------------------------------------------


def stashed_text(tag: str) -> str:
    """What turn 1 of `anthropic_messages(tag, 7)` stashes and no other message says: its step 3
    (the span is messages 1 to 3)."""
    text = anthropic_messages(tag, 7)[3]["content"]
    assert isinstance(text, str) and text.startswith("Step 3:")
    return text


def requests_of(provider: FakeProvider, t: Exchange, n: int = 1) -> list[Recorded]:
    """The requests the provider received for one send (the rewritten one, then each expand
    round's), waiting for `n` of them."""
    return provider.wait_for(n, where=by_id(t.eid))


def summary_of(body: bytes) -> bytes:
    """The one summary message in a body the provider received."""
    _, msgs, _ = message_sources(body)
    found = [m for m in msgs if HEADER.encode() in m]
    assert len(found) == 1, found
    return found[0]


def from_key(provider: FakeProvider, key: str) -> list[Recorded]:
    """Every request the provider received under API key `key` (summarizer calls included)."""
    return [r for r in provider.requests if r.header("x-api-key") == key]


def summarized(proxy: Proxy, provider: FakeProvider, one: User) -> tuple[str, bytes, str]:
    """User one's session summarized (turn 1 commissions, the summary is stored), then turn 2
    spliced and expanded by the model. (The stash key, the summary message as the provider
    received it, the text turn 2's expansion brought back.)"""
    before = proxy.counts()
    t1 = one.send(anthropic_messages(one.session, 7))
    assert proxy.records.cg(t1.eid)["components"][0]["commission"] == "trigger fired"
    proxy.wait_count(before, "completed")
    t2 = one.send(anthropic_messages(one.session, 9))
    assert FINAL in t2.text
    first, cont = requests_of(provider, t2, 2)
    summary = summary_of(first.body)
    m = MARKER.search(summary.decode())
    assert m is not None
    (text,) = results(cont.json())
    return m.group(1), summary, text


def intruder(summary: bytes) -> list[Any]:
    """User two's transcript: a task of its own, then A's summary message (marker and all)."""
    return [
        {"role": "user", "content": "Task of another user: what did session A do?"},
        json.loads(summary),
        {"role": "assistant", "content": "I will look at the summary."},
        {"role": "user", "content": "Expand it, please."},
    ]


# -- cross-credential expand ------------------------------------------------------------------


@pytest.mark.parametrize("header", [HEADER_CG, HEADER_CLAUDE_CODE])
def test_another_key_naming_the_session_is_not_offered_the_tool_for_its_marker(
    auto, provider, model, header
):
    session = uuid.uuid4().hex
    secret = stashed_text(session)
    with User(auto, K1, session) as one, User(auto, K2, session, header) as two:
        key, summary, expanded = summarized(auto, provider, one)
        assert secret in expanded  # vacuity: user one's marker resolves and expands
        calls = model.calls
        t = two.send(intruder(summary))
        assert from_key(provider, K2)  # vacuity: user two's requests did reach the provider
        for rec in from_key(provider, K2):
            assert secret.encode() not in rec.body, "A's stash went upstream under K2"
        got = requests_of(provider, t)  # (the SDK call returned: every round has arrived)
        assert not offered(got[0].json()) and len(got) == 1 and model.calls == calls
        assert MARKER.search(got[0].body.decode()).group(1) == key  # type: ignore[union-attr]
        cg = auto.records.cg(t.eid)
        assert cg["session"] == session
        assert cg["expand"] == {"injected": False, "reason": "no resolvable marker"}
        assert cg["tenant"] == "bound"


@pytest.mark.parametrize(
    ("stream", "header"), [(False, HEADER_CG), (True, HEADER_CLAUDE_CODE)], ids=["json", "sse"]
)
def test_an_expand_call_under_another_key_is_answered_no_longer_available(
    always, provider, model, stream, header
):
    """The tool offered to everyone (`always`): user two's model calls it with A's id, and the
    continuation the proxy sends upstream under K2 says the id is not available (JSON: the
    response hook's loop; SSE: the relay's). User one's own call still gets the span."""
    session = uuid.uuid4().hex
    secret = stashed_text(session)
    with User(always, K1, session) as one, User(always, K2, session, header) as two:
        key, summary, expanded = summarized(always, provider, one)
        assert secret in expanded
        calls = model.calls

        t = two.send(intruder(summary), stream=stream)
        assert FINAL in t.text
        first, cont = requests_of(provider, t, 2)
        assert offered(first.json()) and model.calls == calls + 1  # the call was made
        assert cont.header("x-api-key") == K2
        (text,) = results(cont.json())
        assert GONE in text and key in text
        assert always.records.cg(t.eid)["expand"]["rounds"] == 1
        for rec in from_key(provider, K2):
            assert secret.encode() not in rec.body

        # User one still expands its own id, on the same proxy, after the intrusion.
        t3 = one.send(anthropic_messages(session, 11), stream=stream)
        assert FINAL in t3.text
        _, back = requests_of(provider, t3, 2)
        (mine,) = results(back.json())
        assert secret in mine and GONE not in mine


# -- the head-hash collision ---------------------------------------------------------------------


def own_steps(user: str, n: int, shared: str) -> list[Any]:
    """A transcript opening with `shared`'s first message (and the same system prompt), every
    later step the user's own."""
    msgs = anthropic_messages(shared, n)
    for m in msgs[3:]:
        m["content"] = f"{m['content']} ({user})"
    return msgs


def test_two_keys_with_one_opening_and_no_session_header_keep_their_own_checkpoints(auto, provider):
    shared = uuid.uuid4().hex

    def summaries() -> int:
        return len([r for r in provider.summarizer_requests if shared.encode() in r.body])

    with User(auto, K1, header=None) as one, User(auto, K2, header=None) as two:
        users = {"one": one, "two": two}
        sessions = {}
        for name, user in users.items():
            before = auto.counts()
            t1 = user.send(own_steps(name, 7, shared))
            cg = auto.records.cg(t1.eid)
            assert cg["session"].startswith("h:")
            assert cg["components"][0]["commission"] == "trigger fired"
            sessions[name] = cg["session"]
            auto.wait_count(before, "completed")
        assert summaries() == 2
        kept: dict[str, bytes] = {}
        for n in (9, 11, 13, 15):  # alternating turns
            for name, user in users.items():
                t = user.send(own_steps(name, n, shared))
                cg = auto.records.cg(t.eid)
                assert cg["outcome"] == "rewritten", cg
                assert cg["session"] == sessions[name]
                summary = summary_of(requests_of(provider, t)[0].body)
                assert kept.setdefault(name, summary) == summary  # byte for byte, every turn
        assert kept["one"] != kept["two"]
        assert summaries() == 2  # none re-made: each checkpoint lived through the other's turns
        assert sessions["one"] != sessions["two"]
        assert cg["tenant"] == "bound"


# -- the eviction flood ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small(provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    """A store held to 1 MB: the stashes get at most half of it."""
    with start_summarize(
        provider.url, tmp_path_factory.mktemp("proxy-tenancy-small"), low(), store={"max_mb": 1}
    ) as p:
        yield p


def flood(tag: str) -> list[Any]:
    """A 7-message conversation whose stashed span holds a ~100 KB step (under the bound of
    one stash: a quarter of the stashes' half of `max_mb: 1`, 128 KiB)."""
    msgs = anthropic_messages(tag, 7)
    msgs[3]["content"] = f"Step 3 of {tag}: " + "log line " * 11_000
    return msgs


def stash_rows(proxy: Proxy, session: str) -> int:
    db = proxy.records.path.parent / "cg.sqlite3"
    with closing(sqlite3.connect(db)) as conn:
        row = conn.execute("SELECT COUNT(*) FROM stashes WHERE session = ?", (session,))
        return int(row.fetchone()[0])


def test_another_sessions_flood_never_evicts_a_live_checkpoints_stash(small, provider, model):
    a, b = uuid.uuid4().hex, uuid.uuid4().hex
    secret = stashed_text(a)
    with User(small, K1, a) as one, User(small, K1, b) as other:
        key, summary, expanded = summarized(small, provider, one)
        assert secret in expanded and stash_rows(small, a) == 1
        conversations = 12  # ~1.2 MB of stashes, more than twice what the stashes may hold
        for i in range(conversations):
            before = small.counts()
            other.send(flood(f"{b}-{i}"))
            small.wait_count(before, "completed", timeout=30)
        assert stash_rows(small, b) < conversations  # vacuity: the bound evicted B's stashes
        assert stash_rows(small, a) == 1

        t = one.send(anthropic_messages(a, 11))
        assert FINAL in t.text
        first, cont = requests_of(provider, t, 2)
        kept = summary_of(first.body)
        assert kept == summary and b"expired" not in kept  # the marker is still live
        cg = small.records.cg(t.eid)
        (comp,) = cg["components"]
        assert "stash" not in comp and comp["checkpoint"]["key"] == key
        assert cg["expand"]["injected"] is True
        (text,) = results(cont.json())
        assert secret in text  # A's marker still expands


# -- a credential that changes mid-session ----------------------------------------------------------


def test_a_refreshed_key_takes_its_session_over_without_a_new_summary(auto, provider, model):
    """An OAuth token refreshes (Claude Code on a subscription: about every 8 hours), so the
    session's next turn comes under a new tenant. That turn repeats every message the summary
    was made from: it is sent with the same summary bytes (not forwarded whole, not summarized
    again), and its marker expands for the new key. Before: a new tenant found nothing, so the
    turn went upstream whole and the session was summarized afresh."""
    a = uuid.uuid4().hex
    refreshed = "sk-ant-e2e-tenant-one-refreshed-0003"
    with User(auto, K1, a) as before, User(auto, refreshed, a) as after:
        _, summary, _ = summarized(auto, provider, before)
        counts = auto.counts()
        t = after.send(anthropic_messages(a, 11))
        assert FINAL in t.text
        first, cont = requests_of(provider, t, 2)
        assert first.header("x-api-key") == refreshed
        assert summary_of(first.body) == summary  # the same bytes: the provider's cache holds
        cg = auto.records.cg(t.eid)
        (comp,) = cg["components"]
        assert "handover" in comp and comp["reused"] is True, comp
        assert cg["expand"]["injected"] is True
        (text,) = results(cont.json())
        assert stashed_text(a) in text  # its marker expands for the new key
        assert auto.counts()["commissioned"] == counts["commissioned"]  # no summary made again
