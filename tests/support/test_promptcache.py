"""The fake provider's prompt-cache model (tests/support/promptcache.py) against hand-computed cases.

It is the oracle the shared-cache summarizer is measured with, so each case here is worked out
by hand from the measure (ceil(bytes / 4) of a unit's canonical JSON), not computed by the code
under test. Unit sizes are chosen to be round: a text of N characters in

    a system block     {"system":{"text":"…","type":"text"}}                 36 + N bytes
    a message block    {"block":{"text":"…","type":"text"},"role":"user"}    49 + N bytes
    an openai message  {"message":{"content":"…","role":"user"}}             40 + N bytes
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support.fakeprovider import FakeProvider, Reply
from tests.support.promptcache import (
    Bill,
    Clock,
    PromptCache,
    TooManyBreakpoints,
    anthropic_units,
    openai_units,
    size,
)

EPH = {"type": "ephemeral"}
EPH_1H = {"type": "ephemeral", "ttl": "1h"}


def system_block(tokens: int, cc: dict[str, str] | None = None) -> dict[str, Any]:
    b: dict[str, Any] = {"type": "text", "text": "s" * (tokens * 4 - 36)}
    if cc:
        b["cache_control"] = cc
    return b


def user(tokens: int, cc: dict[str, str] | None = None, ch: str = "u") -> dict[str, Any]:
    assert tokens * 4 >= 49, "the smallest message block is 13 tokens"
    block: dict[str, Any] = {"type": "text", "text": ch * (tokens * 4 - 49)}
    if cc:
        block["cache_control"] = cc
    return {"role": "user", "content": [block]}


def body(*messages: dict[str, Any], system: list[Any] | None = None, **kw: Any) -> dict[str, Any]:
    return {
        "model": "claude-x",
        "max_tokens": 8,
        "system": system or [],
        "messages": list(messages),
        **kw,
    }


def bill(dialect: str, input_tokens: int, w5: int = 0, w1: int = 0, read: int = 0) -> Bill:
    return Bill(dialect, input_tokens, w5, w1, read)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cache(clock: Clock) -> PromptCache:
    return PromptCache(clock)


def test_the_unit_sizes_are_the_hand_computed_ones():
    assert size({"system": system_block(1000)}) == 1000
    assert size({"block": user(500)["content"][0], "role": "user"}) == 500
    assert size({"message": {"role": "user", "content": "m" * (300 * 4 - 40)}}) == 300
    # ceil: one byte over a multiple of four is one more token
    assert size({"system": {"text": "s" * (4000 - 36 + 1), "type": "text"}}) == 1001
    r = anthropic_units(body(user(500, EPH), system=[system_block(1000, EPH)]))
    assert [u.tokens for u in r.units] == [1000, 500]
    assert [u.breakpoint for u in r.units] == ["5m", "5m"]


def test_anthropic_without_a_breakpoint_nothing_is_cached(cache):
    b = body(user(2000), system=[system_block(1000)])
    assert cache.bill("anthropic", b) == bill("anthropic", 3000)
    assert cache.bill("anthropic", b) == bill("anthropic", 3000)


def test_anthropic_a_breakpoint_writes_its_prefix_then_reads_it(cache):
    b = body(user(500), system=[system_block(2000, EPH)])
    assert cache.bill("anthropic", b) == bill("anthropic", 500, w5=2000)
    assert cache.bill("anthropic", b) == bill("anthropic", 500, read=2000)


def test_anthropic_a_moving_breakpoint_reads_the_previous_prefix_and_writes_the_rest(cache):
    sys = [system_block(1000, EPH)]
    t1 = body(user(500, EPH, "a"), system=sys)
    assert cache.bill("anthropic", t1) == bill("anthropic", 0, w5=1500)
    # The breakpoint leaves message 1 (its bytes change) and lands on message 2.
    t2 = body(user(500, None, "a"), user(300, EPH, "b"), system=sys)
    assert cache.bill("anthropic", t2) == bill("anthropic", 0, w5=300, read=1500)
    # An appended message after the last breakpoint is plain input: what the summarizer sends.
    t3 = body(user(500, None, "a"), user(300, EPH, "b"), user(200, None, "c"), system=sys)
    assert cache.bill("anthropic", t3) == bill("anthropic", 200, read=1800)


def test_anthropic_lookback_reaches_20_blocks_before_a_breakpoint_and_no_further(cache):
    sys = [system_block(1024)]
    base = [user(20, None, "a")]
    first = body(*base[:-1], user(20, EPH, "a"), system=sys)
    assert cache.bill("anthropic", first) == bill("anthropic", 0, w5=1044)
    later = [user(20, None, chr(ord("b") + i % 20)) for i in range(20)]
    within = body(*base, *later[:-1], user(20, EPH, later[-1]["content"][0]["text"][0]), system=sys)
    # 20 blocks after the cached one: found by the lookback.
    assert cache.bill("anthropic", within).read == 1044
    cache.clear()
    cache.bill("anthropic", first)
    beyond = body(*base, *later, user(20, EPH, "z"), system=sys)  # 21 blocks after it
    assert cache.bill("anthropic", beyond).read == 0


def test_anthropic_a_prefix_below_the_minimum_is_never_written(cache):
    b = body(user(100), system=[system_block(1000, EPH)])
    assert cache.bill("anthropic", b) == bill("anthropic", 1100)
    assert cache.bill("anthropic", b) == bill("anthropic", 1100)
    assert PromptCache(min_tokens=500).bill("anthropic", b) == bill("anthropic", 100, w5=1000)


def test_anthropic_ttl_runs_from_last_use(cache, clock):
    b = body(user(20), system=[system_block(2000, EPH)])
    cache.bill("anthropic", b)
    clock.advance(299)
    assert cache.bill("anthropic", b).read == 2000  # refreshed: 5 more minutes from now
    clock.advance(299)
    assert cache.bill("anthropic", b).read == 2000
    clock.advance(300)
    assert cache.bill("anthropic", b) == bill("anthropic", 20, w5=2000)  # expired: written again


def test_anthropic_1h_writes_are_reported_apart_and_live_an_hour(cache, clock):
    b = body(user(500, EPH), system=[system_block(2000, EPH_1H)])
    assert cache.bill("anthropic", b) == bill("anthropic", 0, w5=500, w1=2000)
    clock.advance(3000)  # the 5-minute entry is gone, the hour-long one is not
    assert cache.bill("anthropic", b) == bill("anthropic", 0, w5=500, read=2000)
    clock.advance(3599)  # the 1h read above refreshed it; the 5-minute one has gone again
    assert cache.bill("anthropic", b) == bill("anthropic", 0, w5=500, read=2000)
    clock.advance(3601)
    assert cache.bill("anthropic", b) == bill("anthropic", 0, w5=500, w1=2000)


@pytest.mark.parametrize(
    ("change", "read"),
    [
        ({"tool_choice": {"type": "any"}}, 2000),  # messages miss; system still hits
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, 2000),
        ({"model": "claude-y"}, 0),  # nothing hits
        ({"max_tokens": 4096, "stream": True}, 2500),  # not part of the prompt
    ],
)
def test_anthropic_what_keys_the_cache(cache, change, read):
    b = body(user(500, EPH), system=[system_block(2000, EPH)])
    cache.bill("anthropic", b)
    assert cache.bill("anthropic", {**b, **change}).read == read


def test_anthropic_tools_come_first_and_a_changed_tool_misses_everything(cache):
    tool = {"name": "t", "description": "d" * 4000, "input_schema": {}, "cache_control": EPH}
    b = body(user(500, EPH), system=[system_block(1000)], tools=[tool])
    first = cache.bill("anthropic", b)
    tool_tokens = size({"tool": {k: v for k, v in tool.items() if k != "cache_control"}})
    assert first == bill("anthropic", 0, w5=tool_tokens + 1500)
    assert cache.bill("anthropic", {**b, "tools": [{**tool, "description": "e"}]}).read == 0


def test_anthropic_more_than_four_breakpoints_is_refused(cache):
    msgs = [user(20, EPH, c) for c in "abcde"]
    with pytest.raises(TooManyBreakpoints, match="Found 5"):
        cache.bill("anthropic", body(*msgs))


def test_scopes_never_share_a_cache(cache):
    b = body(user(500), system=[system_block(2000, EPH)])
    cache.bill("anthropic", b, scope="org-a")
    assert cache.bill("anthropic", b, scope="org-b").read == 0
    assert cache.bill("anthropic", b, scope="org-a").read == 2000


def omsg(tokens: int, ch: str = "m") -> dict[str, Any]:
    return {"role": "user", "content": ch * (tokens * 4 - 40)}


def test_openai_caches_prefixes_of_1024_tokens_in_128_token_steps(cache):
    small = {"model": "gpt-x", "messages": [omsg(1000)]}
    assert cache.bill("openai", small) == bill("openai", 1000)
    assert cache.bill("openai", small) == bill("openai", 1000)  # too short to cache
    b = {"model": "gpt-x", "messages": [omsg(1000), omsg(300, "n")]}
    assert cache.bill("openai", b) == bill("openai", 1300)  # the first sight writes, no premium
    grown = {"model": "gpt-x", "messages": [*b["messages"], omsg(50, "o")]}
    # cached 1300 -> 1024 + 2 * 128 = 1280 read, the other 70 at full price
    assert cache.bill("openai", grown) == bill("openai", 70, read=1280)
    other = {"model": "gpt-y", "messages": grown["messages"]}
    assert cache.bill("openai", other).read == 0
    assert openai_units(grown).total == 1350


def test_openai_ttl(cache, clock):
    b = {"model": "gpt-x", "messages": [omsg(2000)]}
    cache.bill("openai", b)
    clock.advance(299)
    assert cache.bill("openai", b).read == 1920
    clock.advance(301)
    assert cache.bill("openai", b).read == 0


# -- the fake provider reports what it billed ---------------------------------------------------


def _post(p: FakeProvider, path: str, payload: dict[str, Any]) -> httpx.Response:
    with httpx.Client(trust_env=False) as c:
        return c.post(p.url + path, json=payload, headers={"x-api-key": "k1"})


def test_the_fake_reports_anthropic_cache_usage_in_json_and_sse():
    with FakeProvider(clock=Clock()) as p:
        b = body(user(500, EPH), system=[system_block(2000, EPH)])
        first = _post(p, "/v1/messages", b).json()["usage"]
        assert first["cache_creation_input_tokens"] == 2500
        assert first["cache_creation"] == {
            "ephemeral_5m_input_tokens": 2500,
            "ephemeral_1h_input_tokens": 0,
        }
        assert (first["input_tokens"], first["cache_read_input_tokens"]) == (0, 0)
        sse = _post(p, "/v1/messages", {**b, "stream": True}).text
        events = [json.loads(x[6:]) for x in sse.split("\n") if x.startswith("data: ")]
        start = events[0]["message"]["usage"]
        delta = next(e for e in events if e["type"] == "message_delta")["usage"]
        assert start["cache_read_input_tokens"] == delta["cache_read_input_tokens"] == 2500
        assert start["cache_creation_input_tokens"] == delta["cache_creation_input_tokens"] == 0
        assert delta["output_tokens"] >= 1
        billed = p.billed
        assert [x.bill.read for x in billed] == [0, 2500]
        assert p.bill_of(p.requests[1]) == billed[1].bill
        too_many = body(*[user(20, EPH, c) for c in "abcde"])
        r = _post(p, "/v1/messages", too_many)
        assert r.status_code == 400 and "maximum of 4" in r.json()["error"]["message"]
        assert len(p.billed) == 2


def test_the_fake_reports_openai_cached_tokens_in_json_and_sse():
    with FakeProvider(clock=Clock()) as p:
        b = {"model": "gpt-x", "messages": [omsg(2000)]}
        u1 = _post(p, "/v1/chat/completions", b).json()["usage"]
        assert (u1["prompt_tokens"], u1["prompt_tokens_details"]["cached_tokens"]) == (2000, 0)
        s = {**b, "stream": True, "stream_options": {"include_usage": True}}
        sse = _post(p, "/v1/chat/completions", s).text
        chunks = [json.loads(x[6:]) for x in sse.split("\n") if x.startswith("data: {")]
        u2 = chunks[-1]["usage"]
        assert (u2["prompt_tokens"], u2["prompt_tokens_details"]["cached_tokens"]) == (2000, 1920)
        assert u2["total_tokens"] == 2000 + u2["completion_tokens"]


def test_requests_and_answer_starts_share_one_sequence():
    with FakeProvider() as p:
        reply = Reply()
        p.script(reply)
        _post(p, "/v1/messages", body(user(20)))
        (rec,) = p.requests
        assert reply.began is not None and reply.began > rec.seq > 0
