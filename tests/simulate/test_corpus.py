"""The simulator's corpus generator: deterministic, turn-shaped like Claude Code's traffic."""

from __future__ import annotations

import itertools
import json

from bench.sessions import Spec, capture_messages, generated, requests, turn_bounds
from cg.state.facts import FactsCache
from cg.state.tokens import TokenCounter

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
