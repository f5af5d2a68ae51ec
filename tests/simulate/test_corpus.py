"""The simulator's corpus generator: deterministic, turn-shaped like Claude Code's traffic."""

from __future__ import annotations

import itertools
import json
import uuid

from bench import codex
from bench.sessions import (
    Spec,
    capture_messages,
    codex_requests,
    generated,
    requests,
    turn_bounds,
)
from cg.retention.facts import KINDS, transcript_facts
from cg.state.facts import FactsCache
from cg.state.session import session_of
from cg.state.tokens import TokenCounter
from cg.wire.body import index_body
from cg.wire.dialects import RESPONSES

SMALL = Spec("t", "claude-sonnet-4-5", False, 12, 800, 5, cold_gap_p=0.5)


def test_the_capture_is_cut_into_its_16_requests_each_a_prefix_of_the_next() -> None:
    msgs = capture_messages()
    reqs = list(requests(msgs, None, 0, 0.0))
    assert len(reqs) == 16
    bodies = [json.loads(b) for _, b in reqs]
    assert [len(b["messages"]) for b in bodies] == turn_bounds(msgs)
    assert bodies[-1]["messages"] == msgs  # the last request is the capture itself
    for a, b in itertools.pairwise(bodies):
        n = len(a["messages"])
        text = json.dumps(a["messages"])
        assert n < len(b["messages"]) and b["messages"][n]["role"] == "assistant"
        assert text.count("cache_control") == 1  # one breakpoint, on the last message
    times = [t for t, _ in reqs]
    assert times == sorted(times) and len(set(times)) == 16


def test_generated_sessions_are_deterministic_and_sized() -> None:
    facts = FactsCache(TokenCounter())
    a = list(requests(generated(SMALL, facts), SMALL.model, SMALL.seed, SMALL.cold_gap_p))
    b = list(requests(generated(SMALL, facts), SMALL.model, SMALL.seed, SMALL.cold_gap_p))
    assert a == b
    last = json.loads(a[-1][1])
    assert last["model"] == "claude-sonnet-4-5"
    rounds = sum(1 for m in last["messages"] if m["role"] == "assistant")
    assert 10 <= rounds <= 16
    gaps = [y[0] - x[0] for x, y in itertools.pairwise(a)]
    assert any(g > 300 for g in gaps) and any(g < 300 for g in gaps)  # some past the TTL


def test_every_fact_kind_occurs_all_through_a_generated_session() -> None:
    """Human constraints, failing runs, edits and commands mid-session, not only at its start:
    what the simulator's retention needs to measure anything."""
    spec = Spec("f", "claude-sonnet-4-5", False, 60, 600, 3)
    msgs = generated(spec, FactsCache(TokenCounter()))
    found = [f for f in transcript_facts("anthropic", msgs) if f.text]
    n = len(msgs)
    for kind in KINDS:
        at = [f.at for f in found if f.kind == kind]
        assert any(n // 3 <= a < 2 * n // 3 for a in at), kind  # in the middle third
        assert any(a >= 2 * n // 3 for a in at), kind  # and the last
        assert len({f.text for f in found if f.kind == kind}) >= 3, kind  # varied
    assert any(a > 0 for a in (f.at for f in found if f.kind == "user"))  # not only the first
    errors = [f.text for f in found if f.kind == "error"]
    assert any(e.startswith("FAILED tests/") for e in errors)
    assert any(e.startswith("error[E") for e in errors)
    assert any(" ERROR app." in e for e in errors)  # the log line of a traceback
    users = [f.text for f in found if f.kind == "user" and f.at > 0]
    assert all(u[0].isupper() and u.endswith(".") for u in users)
    tools = {b["name"] for m in msgs if m["role"] == "assistant" for b in m["content"]
             if b.get("type") == "tool_use"}  # fmt: skip
    assert {"Edit", "Write", "Bash"} <= tools


def test_codex_sessions_are_responses_requests_each_a_prefix_of_the_next() -> None:
    spec = Spec("c", "gpt-6.1-sol", False, 60, 300, 7, dialect="responses")
    items = generated(spec, FactsCache(TokenCounter()))
    reqs = list(codex_requests(items, spec))
    bodies = [json.loads(b) for _, b in reqs]
    assert len(bodies) >= 25 and bodies[-1]["input"] == items
    for a, b in itertools.pairwise(bodies):
        n = len(a["input"])
        assert b["input"][:n] == a["input"] and b["input"][n]["type"] == "reasoning"
        assert a["model"] == "gpt-6.1-sol" and a["store"] is False
    sid = str(uuid.UUID(int=7, version=4))
    assert bodies[0]["prompt_cache_key"] == sid and codex.headers(7)["session-id"] == sid
    found = [f for f in transcript_facts("responses", items) if f.text]
    assert {f.kind for f in found if f.at > codex.HEAD_ITEMS} == set(KINDS)  # mid-session
    assert {f.kind for f in found if f.at >= len(items) // 2} >= {"file", "command", "error"}
    assert any(f.kind == "file" and f.tool == "exec_command" for f in found)  # apply_patch
    index = index_body(reqs[-1][1].encode(), RESPONSES)
    assert session_of(codex.headers(7), index).id == sid  # one session, as the addon tells
