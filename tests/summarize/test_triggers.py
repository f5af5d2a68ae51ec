"""cg.summarize.triggers: the request gates, windows, the hard triggers and the cache state
(docs/behaviour.md#summarize-triggers), unit by unit and through the component with an injected
clock."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cg.state.sqlite import SqliteStore
from cg.state.tokens import TokenCounter
from cg.summarize import component
from cg.summarize.triggers import (
    CACHE_TTL_1H,
    CACHE_TTL_DEFAULT,
    ONE_MILLION,
    RequestFacts,
    WindowTable,
    cache_ttl,
    evaluate,
    resolve_window,
    shipped_windows,
)
from cg.wire.body import MessageCache
from tests.support.transcripts import CC16, CC_TOOL_USE, config, fixture_body, grow, make, record

NOW = 1_000_000.0

FACTS = RequestFacts(
    messages=40,
    request_tokens=50_000,
    output_tokens=20_000,
    max_output_tokens=3_000,
    window=100_000,
    last_request=NOW - 10_000,  # long ago: cold
    now=NOW,
    ttl=CACHE_TTL_DEFAULT,
)


def cfg(**trigger: Any) -> Any:
    """cache_state any and every gate open, with `trigger` set."""
    return config(trigger=trigger)


# --------------------------------------------------------------------------------------------
# The gates
# --------------------------------------------------------------------------------------------


def test_with_every_gate_open_the_trigger_fires() -> None:
    r = evaluate(cfg(), FACTS)
    assert (r.fire, r.hard, r.blocked) == (True, None, [])


@pytest.mark.parametrize(
    ("gate", "passes", "blocks"),
    [
        ("min_messages", 40, 41),
        ("min_request_tokens", 50_000, 50_001),
        ("min_output_tokens", 20_000, 20_001),
        ("min_request_frac", 0.5, 0.51),
        ("min_output_frac", 0.2, 0.21),
    ],
)
def test_each_gate_blocks_below_and_passes_at_its_threshold(
    gate: str, passes: float, blocks: float
) -> None:
    ok = evaluate(cfg(**{gate: passes}), FACTS)
    assert ok.fire and ok.blocked == []
    no = evaluate(cfg(**{gate: blocks}), FACTS)
    assert not no.fire and no.hard is None
    assert len(no.blocked) == 1 and no.blocked[0].startswith(f"{gate}: ")


def test_gates_are_anded_and_every_blocker_is_reported() -> None:
    r = evaluate(cfg(min_messages=41, min_request_tokens=60_000, min_output_tokens=1), FACTS)
    assert not r.fire
    assert [b.split(":")[0] for b in r.blocked] == ["min_messages", "min_request_tokens"]


def test_a_zero_gate_imposes_nothing() -> None:
    empty = replace(FACTS, messages=0, request_tokens=0, output_tokens=0, max_output_tokens=0)
    assert evaluate(cfg(min_request_frac=0, min_messages=0), empty).fire


def test_the_legacy_start_from_message_gates_like_min_messages() -> None:
    c = config(start_from_message=41, trigger={"min_messages": None})
    assert c.min_messages == 41
    assert evaluate(c, FACTS).blocked == ["min_messages: 40 < 41"]


def test_an_unknown_window_makes_a_fraction_gate_unresolvable() -> None:
    r = evaluate(cfg(min_request_frac=0.1), replace(FACTS, window=None))
    assert not r.fire
    assert r.blocked == ["min_request_frac: window unknown, fraction not resolvable"]
    r = evaluate(cfg(min_output_frac=0.1), replace(FACTS, window=None))
    assert r.blocked == ["min_output_frac: window unknown, fraction not resolvable"]
    # a fraction gate set to 0 needs no window
    assert evaluate(cfg(min_request_frac=0), replace(FACTS, window=None)).fire


def test_the_default_fraction_gate_is_0_9_of_the_window() -> None:
    c = config(trigger={"min_request_frac": 0.9})
    assert not evaluate(c, replace(FACTS, request_tokens=89_999)).fire
    assert evaluate(c, replace(FACTS, request_tokens=90_000)).fire


# --------------------------------------------------------------------------------------------
# Hard triggers
# --------------------------------------------------------------------------------------------

WARM = replace(FACTS, last_request=NOW - 1)
BLOCKING = {"min_messages": 10_000, "min_request_tokens": 10**9}


def test_huge_output_frac_fires_regardless_of_gates_and_cache() -> None:
    c = config(cache_state="cold", trigger={**BLOCKING, "huge_output_frac": 0.03})
    r = evaluate(c, WARM)  # 3000 >= 0.03 x 100000
    assert r.fire and r.hard is not None and r.hard.startswith("huge_output_frac")
    assert r.cache == "warm" and len(r.blocked) == 2  # the gates still say they were not met
    assert not evaluate(c, replace(WARM, max_output_tokens=2_999)).fire


def test_ceiling_frac_moves_the_ceiling_and_zero_turns_it_off() -> None:
    c = config(cache_state="cold", trigger={**BLOCKING, "ceiling_frac": 0.8})
    warm = replace(FACTS, last_request=NOW - 1, request_tokens=80_000)
    r = evaluate(c, warm)
    assert r.fire and r.hard == "ceiling: 80000 tokens >= ceiling_frac 0.8 x 100000"
    assert r.cache == "warm"
    assert not evaluate(c, replace(warm, request_tokens=79_999)).fire
    off = config(cache_state="cold", trigger={**BLOCKING, "ceiling_frac": 0})
    assert not evaluate(off, replace(warm, request_tokens=99_999)).fire


def test_huge_output_frac_needs_a_known_window() -> None:
    c = config(trigger={"huge_output_frac": 0.01, "min_request_frac": 0})
    r = evaluate(c, replace(FACTS, window=None, messages=0))
    assert r.hard is None


def test_the_ceiling_fires_regardless_of_gates_and_cache() -> None:
    c = config(cache_state="cold", trigger=BLOCKING)
    first_sight = replace(FACTS, last_request=None, request_tokens=95_000)
    r = evaluate(c, first_sight)
    assert r.fire and r.hard is not None and r.hard.startswith("ceiling")
    assert r.cache == "unknown"
    assert not evaluate(c, replace(first_sight, request_tokens=94_999)).fire


# --------------------------------------------------------------------------------------------
# Cache state
# --------------------------------------------------------------------------------------------


def test_cache_state_cold_acts_only_on_a_cold_cache() -> None:
    c = config(cache_state="cold")
    first = evaluate(c, replace(FACTS, last_request=None))
    assert (first.fire, first.cache) == (False, "unknown")
    assert first.blocked == ["cache_state: cold, but the session's cache is unknown"]
    warm = evaluate(c, replace(FACTS, last_request=NOW - CACHE_TTL_DEFAULT))  # exactly the TTL
    assert (warm.fire, warm.cache) == (False, "warm")
    cold = evaluate(c, replace(FACTS, last_request=NOW - CACHE_TTL_DEFAULT - 0.001))
    assert (cold.fire, cold.cache) == (True, "cold")


def test_cache_state_any_ignores_the_cache() -> None:
    r = evaluate(config(cache_state="any"), replace(FACTS, last_request=NOW - 1))
    assert r.fire and r.cache == "warm"


def test_cache_ttl_is_5_minutes_or_1_hour_when_asked() -> None:
    assert (CACHE_TTL_DEFAULT, CACHE_TTL_1H) == (300.0, 3600.0)
    assert cache_ttl('{"cache_control":{"type":"ephemeral"}}') == 300.0
    assert cache_ttl('{"cache_control":{"type":"ephemeral","ttl":"1h"}}') == 3600.0
    assert cache_ttl('{"cache_control": {"type": "ephemeral", "ttl" : "1h"}}') == 3600.0
    assert cache_ttl('{"cache_control":{"type":"ephemeral","ttl":"5m"}}') == 300.0


# --------------------------------------------------------------------------------------------
# Windows
# --------------------------------------------------------------------------------------------

TABLE = shipped_windows()


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("claude-sonnet-4-5-20250929", 200_000),
        ("claude-opus-4-8", 200_000),
        ("gpt-4o-mini", 128_000),
        ("gpt-4.1-nano", 1_047_576),
        ("aws/claude-sonnet-5", 1_000_000),  # a gateway's prefix, dropped
        ("m/x", None),
        ("", None),
        (None, None),
        (42, None),
    ],
)
def test_windows_come_from_the_shipped_table_by_longest_prefix(
    model: Any, window: int | None
) -> None:
    assert resolve_window(model, "", {}, TABLE) == window


def test_context_1m_raises_a_model_that_supports_it() -> None:
    beta = "claude-code-20250219,context-1m-2025-08-07,interleaved-thinking-2025-05-14"
    assert resolve_window("claude-sonnet-4-5", beta, {}, TABLE) == ONE_MILLION
    assert resolve_window("claude-opus-4-8", beta, {}, TABLE) == ONE_MILLION
    assert resolve_window("claude-opus-4-1", beta, {}, TABLE) == 200_000  # not 1M-capable
    assert resolve_window("claude-3-5-haiku", beta, {}, TABLE) == 200_000
    assert resolve_window("claude-sonnet-4-5", "interleaved-thinking", {}, TABLE) == 200_000


def test_model_windows_override_the_table() -> None:
    user = {"claude-sonnet-4-5": 50_000, "my-local": 32_768}
    assert resolve_window("claude-sonnet-4-5", "context-1m-2025-08-07", user, TABLE) == 50_000
    assert resolve_window("my-local-model-v2", "", user, TABLE) == 32_768
    assert resolve_window("claude-sonnet-4-0", "", user, TABLE) == 200_000


def test_a_custom_table() -> None:
    t = WindowTable({"m": 10, "mod": 20}, ("mod",))
    assert resolve_window("model", "", {}, t) == 20
    assert resolve_window("model", "context-1m", {}, t) == ONE_MILLION
    assert resolve_window("mx", "context-1m", {}, t) == 10


def test_the_component_remembers_each_models_window_as_resolve_window_gives_it(
    tmp_path: Path,
) -> None:
    """`Summarize.window` is `resolve_window` under the component's tables, asked once per
    model and 1M beta: the same answers in any order, again and again, and past its bound."""
    user = {"claude-sonnet-4-5": 50_000, "my-local": 32_768}
    comp = component.Summarize(
        config(), SqliteStore(tmp_path / "w.db"), TokenCounter(), user, TABLE
    )
    betas = ["", "context-1m-2025-08-07", "claude-code-20250219,context-1m-2025-08-07"]
    models: list[Any] = ["claude-sonnet-4-5", "claude-opus-4-8", "my-local-model-v2", "m/x", "",
                         None, 42, ["gpt-4o"], "gpt-4.1-nano"]  # fmt: skip
    for _ in range(2):
        for m in models:
            for b in betas:
                assert comp.window(m, b) == resolve_window(m, b, user, TABLE), (m, b)
    assert ("claude-sonnet-4-5", True) in comp._windows  # remembered: the vacuity guard
    for i in range(component.WINDOWS_MAX + 5):
        assert comp.window(f"gpt-4o-{i}", "") == resolve_window(f"gpt-4o-{i}", "", user, TABLE)
    assert len(comp._windows) <= component.WINDOWS_MAX


# --------------------------------------------------------------------------------------------
# Through the component, with an injected clock
# --------------------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(tmp_path / "cg.sqlite3")
    yield s
    s.close()


def test_cold_cache_first_sight_is_warm_then_expiry_commissions(store: SqliteStore) -> None:
    turns = grow(fixture_body(CC16), 4, output_words=30)
    d = make(config(cache_state="cold"), store)
    t0 = d.now
    r = d.send(turns[0])
    assert record(r)["trigger"]["cache"] == "unknown" and not d.pending
    d.now = t0 + 60
    r = d.send(turns[1])
    assert record(r)["trigger"]["cache"] == "warm" and not d.pending
    d.now = t0 + 60 + 300  # exactly the TTL since the last request: still warm
    r = d.send(turns[1])
    assert record(r)["trigger"]["cache"] == "warm" and not d.pending
    d.now += 301  # the agent paused for over five minutes
    r = d.send(turns[2])
    assert record(r)["trigger"]["cache"] == "cold" and record(r)["trigger"]["fire"]
    assert r.outcome == "passed_through" and len(d.pending) == 1
    assert d.drain() == ["completed"]
    r = d.send(turns[3])  # warm again, and the checkpoint splices
    assert r.outcome == "rewritten" and record(r)["trigger"]["cache"] == "warm"


def test_a_1h_ttl_keeps_the_cache_warm_for_an_hour(store: SqliteStore) -> None:
    turns = grow(fixture_body(CC16), 3, output_words=30)
    for body in turns:
        body["messages"][-1]["content"][-1]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    d = make(config(cache_state="cold"), store)
    d.send(turns[0])
    d.now += 6 * 60  # past five minutes, within the hour
    r = d.send(turns[1])
    assert record(r)["trigger"]["cache"] == "warm" and not d.pending
    d.now += 61 * 60
    r = d.send(turns[2])
    assert record(r)["trigger"]["cache"] == "cold" and len(d.pending) == 1


def test_a_1h_ttl_outside_the_messages_is_read_again_only_when_that_text_changes(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The TTL asked outside the transcript array (a top-level `cache_control`) is memoised on
    the warm index, which a next turn inherits only when every byte outside the array repeats."""
    turns = grow(fixture_body(CC16), 4, output_words=30)
    for body in turns[1:3]:
        body["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    searched: list[str] = []

    def counted(text: str) -> float:
        searched.append(text)
        return cache_ttl(text)

    monkeypatch.setattr(component, "cache_ttl", counted)
    cache = MessageCache()
    d = make(config(), store, cache=cache)
    ttls = []
    for body in turns:
        d.send(body)
        rec = store.get_session("sess-1")
        assert rec is not None
        ttls.append(rec.cache_ttl)
    assert ttls == [300.0, 3600.0, 3600.0, 300.0]
    assert len(searched) == 3  # turn 3 inherited turn 2's answer
    assert cache.prefix_hits == 1  # vacuity: turn 3 was built on turn 2 (the others differ outside)


def test_the_ceiling_commissions_at_first_sight_with_a_cold_cache_state(store: SqliteStore) -> None:
    body = fixture_body(CC16)
    d = make(config(cache_state="cold", trigger={"min_messages": 10_000}), store)
    probe = record(d.send(body))
    tokens = probe["tokens"]
    assert probe["trigger"]["cache"] == "unknown" and not d.pending
    d2 = make(
        config(cache_state="cold", trigger={"min_messages": 10_000}),
        store,
        session="sess-ceiling",
        model_windows={"claude-opus-4-8": int(tokens / 0.96)},
    )
    r = d2.send(body)
    rec = record(r)
    assert rec["window"] == int(tokens / 0.96)
    assert rec["trigger"]["hard"].startswith("ceiling") and rec["trigger"]["cache"] == "unknown"
    assert len(d2.pending) == 1


def test_a_huge_tool_output_commissions_regardless(store: SqliteStore) -> None:
    body = fixture_body(CC16)
    body["messages"][5]["content"][0]["content"] = "word " * 12_000
    d = make(
        config(cache_state="cold", trigger={"min_messages": 10_000, "huge_output_frac": 0.05}),
        store,
    )
    r = d.send(body)  # 12000 tokens >= 0.05 x 200000, at first sight
    rec = record(r)
    assert rec["trigger"]["hard"].startswith("huge_output_frac")
    assert len(d.pending) == 1


def test_the_fraction_gate_on_real_traffic(store: SqliteStore) -> None:
    body = fixture_body(CC16)
    d = make(config(trigger={"min_request_frac": 0.9}), store)
    rec = record(d.send(body))
    assert rec["window"] == 200_000
    assert rec["trigger"]["blocked"] == [f"min_request_frac: {rec['tokens']} < 0.9 x 200000"]
    assert not d.pending
    beta = {"anthropic-beta": "claude-code-20250219,context-1m-2025-08-07"}
    rec = record(d.send(body, **beta))
    assert rec["window"] == ONE_MILLION
    unknown = make(config(trigger={"min_request_frac": 0.9}), store, session="sess-unknown")
    named = fixture_body(CC_TOOL_USE)
    assert named["model"] == "aws/claude-sonnet-5"  # vacuity guard: the model renamed below
    rec = record(unknown.send({**named, "model": "aws/model-nobody-knows"}))
    assert rec["window"] is None
    assert rec["trigger"]["blocked"] == [
        "min_request_frac: window unknown, fraction not resolvable"
    ]
    assert not unknown.pending


def test_model_windows_reach_the_component(store: SqliteStore) -> None:
    d = make(config(), store, model_windows={"aws/claude-sonnet-5": 64_000})
    assert record(d.send(fixture_body(CC_TOOL_USE)))["window"] == 64_000


def test_request_tokens_count_the_system_prompt_and_tools(store: SqliteStore) -> None:
    body = fixture_body(CC16)
    d = make(config(), store)
    with_all = record(d.send(body))["tokens"]
    bare = dict(body)
    del bare["system"], bare["tools"]
    d2 = make(config(), store, session="sess-bare")
    without = record(d2.send(bare))["tokens"]
    assert with_all > without > 0
    assert json.dumps(body["tools"])  # the fixture does carry tools
