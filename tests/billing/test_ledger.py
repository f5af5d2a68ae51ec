"""cg.billing.ledger and cg.billing.savings on a real SQLite store: the agent / summarizer split,
the without-rewrite estimate against hand-computed cases, unknown prices, a restart that does
not fake savings, and the v1 -> v2 migration of the store."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cg.billing.cache import PromptCache, chain, prompt_of
from cg.billing.ledger import STATE_ENTRIES, UNIDENTIFIED, Ledger, Round, Turn, _dump, _load
from cg.billing.listing import sessions_page
from cg.billing.prices import PriceTable
from cg.expand.tool import tool_insertion
from cg.settings import parse_prices
from cg.state import Store, memory
from cg.state.facts import FactsCache
from cg.state.policy import LEDGER_TTL_DAYS
from cg.state.records import Checkpoint, LedgerTurns
from cg.state.schema import SQLITE_V1, SQLITE_VERSION
from cg.state.sqlite import SqliteStore
from cg.state.tokens import TokenCounter
from cg.wire.body import BodyIndex, index_body
from cg.wire.dialects import ANTHROPIC, DIALECTS, OPENAI
from cg.wire.splice import (
    Insert,
    Keep,
    Piece,
    SentShape,
    apply_edits,
    is_identity,
    splice_array_bytes,
)
from cg.wire.usage import Usage
from tests.support.strategies import SETTINGS, Sample, bodies

M = 1_000_000
# Round prices, USD per million tokens, so every expected figure below is arithmetic by hand.
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PRICES = PriceTable(
    parse_prices(
        {
            "claude-test": {
                "input": 2.0,
                "cache_write_5m": 2.5,
                "cache_write_1h": 4.0,
                "cache_read": 0.2,
                "output": 10.0,
            },
            "cheap-summarizer": {
                "input": 1.0,
                "cache_write_5m": 1.25,
                "cache_write_1h": 2.0,
                "cache_read": 0.1,
                "output": 5.0,
            },
            "tiered": {
                "input": 1.0,
                "cache_write_5m": 1.25,
                "cache_write_1h": 2.0,
                "cache_read": 0.1,
                "output": 5.0,
                "long_prompt": {
                    "threshold_tokens": 1000,
                    "input": 3.0,
                    "cache_write_5m": 3.75,
                    "cache_write_1h": 6.0,
                    "cache_read": 0.3,
                    "output": 15.0,
                },
            },
        },
        "test",
    ),
    "2026-11-30",
)
H = {"x-context-guru-session": "s1"}


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """The ledger on both engines: an SQLite file, and a database on the suite's PostgreSQL
    server (skipped without one, unless CG_REQUIRE_POSTGRES=1)."""
    if request.param == "sqlite":
        with SqliteStore(tmp_path / "cg.sqlite3") as st:
            yield st
        return
    from cg.state.pgstore import PgStore

    with PgStore(request.getfixturevalue("pg_url")) as pg:
        yield pg


@pytest.fixture
def facts() -> FactsCache:
    return FactsCache(TokenCounter())


def body(n: int, breakpoint: bool = False, model: str = "claude-test", pad: int = 400) -> bytes:
    """An Anthropic request of `n` messages, each ~`pad` words (so prefixes pass the cache's
    1,024-token minimum), the last one marked `cache_control` when `breakpoint`."""
    msgs: list[dict[str, Any]] = []
    for i in range(n):
        text = f"message {i}: " + "lorem ipsum " * pad
        block: dict[str, Any] = {"type": "text", "text": text}
        if breakpoint and i == n - 1:
            block["cache_control"] = {"type": "ephemeral"}
        msgs.append({"role": "user" if i % 2 == 0 else "assistant", "content": [block]})
    return json.dumps({"model": model, "max_tokens": 10, "messages": msgs}).encode()


def turn(
    raw: bytes,
    rewritten: bool = False,
    at: float = 1000.0,
    session: str | None = "s1",
    dialect: str = "anthropic",
) -> Turn:
    d = ANTHROPIC if dialect == "anthropic" else OPENAI
    return Turn(dialect, session, index_body(raw, d), rewritten, at)


def cost(u: Usage, p: dict[str, float]) -> float:
    """Independent of PriceTable: the price arithmetic written out."""
    return (
        u.input_tokens * p["input"]
        + (u.cache_write_tokens - u.cache_write_1h_tokens) * p["w5"]
        + u.cache_write_1h_tokens * p["w1h"]
        + u.cache_read_tokens * p["read"]
        + u.output_tokens * p["output"]
    ) / M


CLAUDE = {"input": 2.0, "w5": 2.5, "w1h": 4.0, "read": 0.2, "output": 10.0}
CHEAP = {"input": 1.0, "w5": 1.25, "w1h": 2.0, "read": 0.1, "output": 5.0}


# -- the split and unchanged turns ----------------------------------------------------------------


def test_an_unchanged_turn_estimates_its_own_bill_and_the_summarizer_is_booked_apart(
    store: Store, facts: FactsCache
) -> None:
    ledger = Ledger(store, PRICES, facts)
    billed = Usage(
        input_tokens=100,
        cache_write_tokens=20000,
        cache_read_tokens=300000,
        output_tokens=500,
        requests=1,
    )
    assert ledger.agent_turn(turn(body(3)), [Round(billed, "claude-test")], H) == "s1"
    summ = Usage(input_tokens=9000, output_tokens=700, requests=1)
    ledger.summarizer_call("s1", "cheap-summarizer", summ)

    rep = ledger.report()
    assert rep["usage"] == {"agent": billed.to_json(), "summarizer": summ.to_json()}
    s = rep["savings"]
    agent_usd, summ_usd = cost(billed, CLAUDE), cost(summ, CHEAP)
    # 100×2 + 20000×2.5 + 300000×0.2 + 500×10 = 115,200 µ$; 9000×1 + 700×5 = 12,500 µ$
    assert agent_usd == pytest.approx(0.1152) and summ_usd == pytest.approx(0.0125)
    assert s["billed_agent_usd"] == pytest.approx(agent_usd)
    assert s["billed_summarizer_usd"] == pytest.approx(summ_usd)
    assert s["billed_usd"] == pytest.approx(agent_usd + summ_usd)
    assert s["without_rewrite_usd"] == pytest.approx(agent_usd)  # unchanged: its own bill
    assert s["saved_usd"] == pytest.approx(-summ_usd)  # nothing rewritten: the summary cost
    assert (s["turns"], s["rewritten_turns"], s["tokens_not_sent"]) == (1, 0, 0)
    assert s["saved_share"] == pytest.approx(-summ_usd / agent_usd, abs=1e-4)
    assert s["estimated"] == ["without_rewrite_usd", "saved_usd", "saved_share"]
    assert "ESTIMATES" in s["note"] and s["unpriced_models"] == []


def test_every_round_of_a_continuation_is_booked_once(store: Store, facts: FactsCache) -> None:
    ledger = Ledger(store, PRICES, facts)
    rounds = [Round(Usage(input_tokens=1000 * n, output_tokens=n, requests=1)) for n in (1, 2, 3)]
    ledger.agent_turn(turn(body(3)), rounds, H)
    agent = ledger.report()["usage"]["agent"]
    assert agent == {
        "input_tokens": 6000,
        "cache_write_tokens": 0,
        "cache_read_tokens": 0,
        "output_tokens": 6,
        "requests": 3,
    }
    # No model in the answers: the request's own model names the rows.
    assert {r.model for r in store.usage_rows("s1")} == {"claude-test"}


# -- rewritten turns: hand-computed estimates -----------------------------------------------------


def test_a_rewritten_turn_on_a_cold_cache_prices_the_original_in_provider_tokens(
    store: Store, facts: FactsCache
) -> None:
    """No breakpoint, no earlier turn: the original would have been sent at the full input
    price. The sent request is our count S tokens; the provider reported 2×S: k = 2."""
    original, sent = body(8), body(3)
    ours_orig = prompt_of(index_body(original, ANTHROPIC), facts).tokens
    ours_sent = prompt_of(index_body(sent, ANTHROPIC), facts).tokens
    billed = Usage(input_tokens=2 * ours_sent, output_tokens=300, requests=1)
    Ledger(store, PRICES, facts).agent_turn(
        turn(original, rewritten=True), [Round(billed, "claude-test")], H, sent
    )
    s = Ledger(store, PRICES, facts).report()["savings"]
    est = Usage(input_tokens=2 * ours_orig, output_tokens=300, requests=1)
    assert s["tokens_not_sent"] == ours_orig - ours_sent > 0
    assert (s["turns"], s["rewritten_turns"], s["estimate_skipped_turns"]) == (1, 1, 0)
    assert s["without_rewrite_usd"] == pytest.approx(cost(est, CLAUDE))
    assert s["saved_usd"] == pytest.approx(cost(est, CLAUDE) - cost(billed, CLAUDE))
    (row,) = [r for r in store.usage_rows() if r.kind == "estimate"]
    assert row.usage == est


def test_the_estimate_reads_what_the_earlier_original_wrote(
    store: Store, facts: FactsCache
) -> None:
    """Turn 1 (unchanged, breakpoint on its last message) writes its prefix P1 to the modelled
    cache. Turn 2 (rewritten, 60 s later) would have read P1 and written the rest up to its own
    last breakpoint; k = 1 (the provider counted what we counted)."""
    t1, t2, sent = body(4, breakpoint=True), body(6, breakpoint=True), body(2)
    p1 = prompt_of(index_body(t1, ANTHROPIC), facts).tokens
    p2 = prompt_of(index_body(t2, ANTHROPIC), facts).tokens
    s_tokens = prompt_of(index_body(sent, ANTHROPIC), facts).tokens
    ledger = Ledger(store, PRICES, facts)
    first = Usage(cache_write_tokens=p1, output_tokens=10, requests=1)
    ledger.agent_turn(turn(t1, at=1000.0), [Round(first)], H)
    billed2 = Usage(input_tokens=s_tokens, output_tokens=20, requests=1)
    ledger.agent_turn(turn(t2, rewritten=True, at=1060.0), [Round(billed2)], H, sent)

    est2 = Usage(cache_write_tokens=p2 - p1, cache_read_tokens=p1, output_tokens=20, requests=1)
    (row,) = [r.usage for r in store.usage_rows() if r.kind == "estimate"]  # one row, summed
    assert row == first + est2
    s = ledger.report()["savings"]
    without = cost(first, CLAUDE) + cost(est2, CLAUDE)
    assert s["without_rewrite_usd"] == pytest.approx(without)
    assert s["saved_usd"] == pytest.approx(without - cost(first, CLAUDE) - cost(billed2, CLAUDE))


def test_after_the_ttl_the_estimate_is_cold_again(store: Store, facts: FactsCache) -> None:
    t1, t2, sent = body(4, breakpoint=True), body(6, breakpoint=True), body(2)
    p2 = prompt_of(index_body(t2, ANTHROPIC), facts).tokens
    s_tokens = prompt_of(index_body(sent, ANTHROPIC), facts).tokens
    ledger = Ledger(store, PRICES, facts)
    ledger.agent_turn(turn(t1, at=1000.0), [Round(Usage(input_tokens=1, requests=1))], H)
    billed = Usage(input_tokens=s_tokens, requests=1)
    ledger.agent_turn(turn(t2, rewritten=True, at=1000.0 + 301), [Round(billed)], H, sent)
    (row,) = [r.usage for r in store.usage_rows() if r.kind == "estimate"]
    # Turn 1's own bill, plus turn 2's original written whole: its cache entry had expired.
    assert row == Usage(input_tokens=1, requests=1) + Usage(cache_write_tokens=p2, requests=1)


def test_a_restart_resumes_the_modelled_cache_instead_of_faking_savings(
    tmp_path: Path, facts: FactsCache
) -> None:
    """The same two turns, with and without a proxy restart between them (a new Ledger on the
    reopened file, nothing in memory): the estimate is the same. A cold model after a restart
    would price turn 2's original at the full write price: invented savings."""
    t1, t2, sent = body(4, breakpoint=True), body(6, breakpoint=True), body(2)
    billed = Usage(input_tokens=500, output_tokens=5, requests=1)

    def run(path: Path, restart: bool) -> Usage:
        st = SqliteStore(path)
        ledger = Ledger(st, PRICES, facts)
        ledger.agent_turn(turn(t1, at=1000.0), [Round(billed)], H)
        if restart:
            st.close()
            st = SqliteStore(path)
            ledger = Ledger(st, PRICES, FactsCache(TokenCounter()))
        ledger.agent_turn(turn(t2, rewritten=True, at=1060.0), [Round(billed)], H, sent)
        (row,) = [r.usage for r in st.usage_rows() if r.kind == "estimate"]
        st.close()
        return row

    kept, restarted = run(tmp_path / "a.sqlite3", False), run(tmp_path / "b.sqlite3", True)
    assert restarted == kept and restarted.cache_read_tokens > 0  # turn 2 read turn 1's prefix


def test_a_rewritten_turn_without_usage_is_counted_not_estimated(
    store: Store, facts: FactsCache
) -> None:
    ledger = Ledger(store, PRICES, facts)
    ledger.agent_turn(turn(body(5), rewritten=True), [], H, body(2))
    s = ledger.report()["savings"]
    assert (s["rewritten_turns"], s["estimate_skipped_turns"], s["turns"]) == (1, 1, 0)
    assert [r for r in store.usage_rows() if r.kind == "estimate"] == []


# -- prices: unknown, tiers -------------------------------------------------------------------------


def test_an_unpriced_model_makes_its_totals_unknown_not_zero(
    store: Store, facts: FactsCache
) -> None:
    ledger = Ledger(store, PRICES, facts)
    ledger.agent_turn(turn(body(2, model="mystery-1")), [Round(Usage(10, requests=1))], H)
    ledger.summarizer_call("s1", "cheap-summarizer", Usage(100, requests=1))
    s = ledger.report()["savings"]
    assert s["billed_agent_usd"] is None and s["billed_usd"] is None
    assert s["without_rewrite_usd"] is None and s["saved_usd"] is None
    assert s["billed_summarizer_usd"] == pytest.approx(100 / M)
    assert s["unpriced_models"] == ["mystery-1"]
    # Token sums need no price: still exact.
    assert ledger.report()["usage"]["agent"]["input_tokens"] == 10


def test_a_long_prompt_is_booked_in_its_tier_and_priced_at_it(
    store: Store, facts: FactsCache
) -> None:
    ledger = Ledger(store, PRICES, facts)
    short, long = Usage(900, output_tokens=10, requests=1), Usage(600, 0, 0, 600, 10, 1)
    ledger.agent_turn(turn(body(2, model="tiered")), [Round(short)], H)
    ledger.agent_turn(turn(body(2, model="tiered")), [Round(long)], H)
    tiers = {r.tier: r.usage for r in store.usage_rows() if r.kind == "agent"}
    assert tiers == {"": short, "long": long}
    expect = (900 * 1 + 10 * 5 + 600 * 3 + 600 * 0.3 + 10 * 15) / M
    assert ledger.report()["savings"]["billed_agent_usd"] == pytest.approx(expect)


# -- sessions ---------------------------------------------------------------------------------------


def test_the_session_page_splits_usage_per_session_with_its_checkpoint(
    store: Store, facts: FactsCache
) -> None:
    ledger = Ledger(store, PRICES, facts)
    ledger.agent_turn(turn(body(2), session="a"), [Round(Usage(7, requests=1))], H)
    ledger.agent_turn(turn(body(2), session="b"), [Round(Usage(9, requests=1))], H)
    ledger.summarizer_call("b", "cheap-summarizer", Usage(3, requests=1))
    msg = json.dumps({"role": "user", "content": "=== History Summary === five words of summary"})
    store.put_checkpoint(Checkpoint("b#abc", "s", 1, 40, "h", None, msg))
    page = sessions_page(store, PRICES, lambda t: len(t.split()))
    assert [r["id"] for r in page["sessions"]] == ["b", "a"] and page["next"] is None
    rows = {r["id"]: r for r in page["sessions"]}
    assert rows["b"]["checkpoint"]["conversations"] == 1
    assert rows["a"]["usage"]["agent"]["input_tokens"] == 7 and rows["a"]["checkpoint"] is None
    assert rows["b"]["usage"]["summarizer"]["input_tokens"] == 3
    assert rows["b"]["checkpoint"]["covered_messages"] == 40
    assert rows["b"]["checkpoint"]["summary_tokens"] == 8  # the message's words, by this counter
    assert rows["b"]["last_seen"] is not None
    assert rows["b"]["savings"]["billed_summarizer_usd"] == pytest.approx(3 / M)


def test_a_flow_with_no_readable_body_is_booked_by_its_header_or_as_unidentified(
    store: Store, facts: FactsCache
) -> None:
    ledger = Ledger(store, PRICES, facts)
    blind = Turn("anthropic", None, None, False, 0.0)
    assert ledger.agent_turn(blind, [Round(Usage(1, requests=1), "claude-test")], H) == "s1"
    assert ledger.agent_turn(blind, [Round(Usage(1, requests=1))], {}) == UNIDENTIFIED
    assert {r.model for r in store.usage_rows(UNIDENTIFIED)} == {"unknown"}


# -- the store: schema v2, migration, lifetime ------------------------------------------------------


def test_a_v1_store_is_migrated_to_v2_keeping_its_data(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript(SQLITE_V1)
    conn.execute("INSERT INTO sessions VALUES ('old', ?, NULL)", (time.time(),))
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    with SqliteStore(path) as st:
        assert st.get_session("old") is not None
        st.record_usage("old", [("agent", "m", "", Usage(5, requests=1))], LedgerTurns(turns=1))
        assert st.usage_rows("old")[0].usage == Usage(5, requests=1)
    conn = sqlite3.connect(path)
    assert (
        conn.execute("PRAGMA user_version").fetchone()[0] == SQLITE_VERSION
    )  # v2, and every later step
    conn.close()


def test_ledger_rows_outlive_the_stash_ttl_and_go_after_thirty_days(tmp_path: Path) -> None:
    class Clock:
        t = 1_000_000.0

        def __call__(self) -> float:
            return self.t

    clock = Clock()
    with SqliteStore(tmp_path / "cg.sqlite3", ttl_hours=1, now=clock, evict_interval=0) as st:
        st.record_usage("s", [("agent", "m", "", Usage(5, requests=1))], LedgerTurns(turns=1))
        st.touch_session("s")
        clock.t += 2 * 3600  # past the store TTL: the session clock goes, the ledger stays
        st.evict()
        assert st.get_session("s") is None and st.usage_rows("s") != []
        clock.t += LEDGER_TTL_DAYS * 86400
        st.evict()
        assert st.usage_rows("s") == [] and st.ledger_turns("s") == {}


def test_an_unknown_kind_is_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="unknown kind"):
        store.record_usage("s", [("bogus", "m", "", Usage())])


def test_a_turn_no_pipeline_ran_on_does_not_feed_the_model(store: Store, facts: FactsCache) -> None:
    """Under `off` nothing is rewritten: its turns are booked but shape nothing (a cold
    session's first shape costs a full tokenisation in the response hook)."""
    ledger = Ledger(store, PRICES, facts)
    t = Turn("anthropic", "s1", index_body(body(4, breakpoint=True), ANTHROPIC), False, 1.0, False)
    ledger.agent_turn(t, [Round(Usage(5, requests=1))], H)
    assert store.cache_state("s1") is None
    assert ledger.report()["savings"]["turns"] == 1


def test_the_chart_prices_each_turn_when_read(store: Store, facts: FactsCache) -> None:
    """The dashboard's points are kept unpriced and priced by `chart`: the same figures the
    ledger's report gives, the summarizer's cost on the turn after it."""
    ledger = Ledger(store, PRICES, facts)
    billed = Usage(input_tokens=100, cache_read_tokens=300000, output_tokens=500, requests=1)
    ledger.agent_turn(turn(body(3)), [Round(billed, "claude-test")], H)
    summ = Usage(input_tokens=9000, output_tokens=700, requests=1)
    ledger.summarizer_call("s1", "cheap-summarizer", summ)
    ledger.agent_turn(turn(body(5)), [Round(billed, "unpriced-model")], H)
    chart = ledger.chart()
    assert list(chart) == ["s1"] and ledger.chart("other") == {}
    first, second = chart["s1"]
    assert first["billed_usd"] == pytest.approx(cost(billed, CLAUDE))
    assert first["without_rewrite_usd"] == pytest.approx(cost(billed, CLAUDE))
    assert (first["summarizer_usd"], first["rewritten"]) == (0.0, False)
    assert second["summarizer_usd"] == pytest.approx(cost(summ, CHEAP))
    assert second["billed_usd"] is None and second["without_rewrite_usd"] is None  # unpriced
    assert ledger.chart("s1") == chart


def test_a_price_found_by_prefix_is_remembered_and_the_same() -> None:
    table = PriceTable(dict(PRICES.prices))
    assert table.lookup("claude-test-20991231") is PRICES.prices["claude-test"]
    assert table.lookup("claude-test-20991231") is PRICES.prices["claude-test"]
    assert table.lookup("nobody") is None and table.lookup("nobody") is None
    assert table._matched == {"claude-test-20991231": PRICES.prices["claude-test"], "nobody": None}
    assert table == PriceTable(dict(PRICES.prices))  # the memo is not part of the table


def _sent(
    idx: BodyIndex, plan: list[Piece], with_tool: bool
) -> tuple[bytes, tuple[int, bytes] | None]:
    """The body `rewrite_body` sends for `plan` (and the expand tool, when put in)."""
    edits: list[tuple[int, int, Sequence[bytes | memoryview]]] = []
    if not is_identity(plan, len(idx.messages)):
        start, end, parts = splice_array_bytes(idx, plan)
        edits.append((start, end, parts))
    tool = tool_insertion(idx) if with_tool else None
    if tool is not None:
        edits.append((tool[0], tool[0], (tool[1],)))
    return apply_edits(idx.raw, edits), tool


@SETTINGS
@given(bodies(), st.data())
def test_the_sent_bodys_tokens_are_counted_from_its_shape_as_from_its_bytes(
    s: Sample, data: st.DataObject
) -> None:
    """`Ledger._sent_tokens` counts the body that went upstream from the client's index and
    the rewrite's plan and tool (`SentShape`), not by indexing it: for any body, any plan of
    kept messages and summaries, with the tool put in or not (into `tools`, into an empty one,
    or as a new member), it is `_tokens` of the bytes sent."""
    with memory() as store:
        ledger = Ledger(store, PRICES, FactsCache(TokenCounter()))
        dialect = DIALECTS[s.dialect]
        idx = index_body(s.raw, dialect)
        n = len(idx.messages)
        plan: list[Piece] = (
            [Keep(i) for i in sorted(data.draw(st.sets(st.integers(0, n - 1))))] if n else []
        )
        for _ in range(data.draw(st.integers(0, 2))):
            words = data.draw(st.text(max_size=40))
            summary = Insert.message(dialect.user_message("summary: " + words), dialect)
            plan.insert(data.draw(st.integers(0, len(plan))), summary)
        sent, tool = _sent(idx, plan, data.draw(st.booleans()))
        turn = Turn(s.dialect, None, idx, True, 0.0, shape=SentShape(plan, tool))
        assert ledger._sent_tokens(turn, sent) == ledger._tokens(s.dialect, sent)


def test_a_claude_code_reuse_turn_is_counted_without_indexing_what_was_sent() -> None:
    """Vacuity guard for the property above, on a real Claude Code body (its ~30 KB of tools):
    head + summary + tail with the expand tool, counted from the shape as from the bytes, and
    the ledger's cache of sent bodies never asked; a turn with no shape still is."""
    with memory() as store:
        ledger = Ledger(store, PRICES, FactsCache(TokenCounter()))
        raw = (FIXTURES / "claude_code_2.1.197_turn16.json").read_bytes()
        idx = index_body(raw, ANTHROPIC)
        n = len(idx.messages)
        summary = Insert.message(ANTHROPIC.user_message("=== History Summary ===\nwork"), ANTHROPIC)
        plan: list[Piece] = [Keep(0), summary, *(Keep(i) for i in range(n - 4, n))]
        sent, tool = _sent(idx, plan, True)
        assert tool is not None and b"context_guru_expand" in sent
        turn = Turn("anthropic", None, idx, True, 0.0, shape=SentShape(plan, tool))
        got = ledger._sent_tokens(turn, sent)
        assert ledger._sent.prefix_hits == 0 and not ledger._sent._lists  # never indexed
        assert got == ledger._tokens("anthropic", sent) > ledger.facts.prelude(idx).tokens
        bare = Turn("anthropic", None, idx, True, 0.0)
        assert ledger._sent_tokens(bare, sent) == got and ledger._sent._lists  # indexed


@SETTINGS
@given(
    st.lists(st.tuples(st.sampled_from([10.0, 50.0, 300.0, 301.0, 3600.0]), st.booleans()),
             max_size=STATE_ENTRIES * 3),
    st.sampled_from([0.0, 100.0, 300.5]),
)  # fmt: skip
def test_the_stored_cache_state_keeps_the_newest_entries_in_their_order(
    entries: list[tuple[float, bool]], now: float
) -> None:
    """`_dump` keeps the `STATE_ENTRIES` live entries of latest expiry (among equals, the
    latest written), in the cache's order: what the sort it replaced kept, and `_load` reads
    them back (ties of expiry across the cut, long and short TTLs, expired ones)."""
    cache = PromptCache()
    for n, (exp, long) in enumerate(entries):
        cache.entries[chain(b"", b"%d" % n)] = (exp, 3600.0 if long else 300.0)
    live = [(k, e) for k, e in cache.entries.items() if e[0] > now]
    order = sorted(range(len(live)), key=lambda i: (live[i][1][0], i), reverse=True)
    expected = [live[i] for i in sorted(order[:STATE_ENTRIES])]
    assert list(_load(_dump(cache, now)).entries.items()) == expected
