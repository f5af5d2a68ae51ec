"""cg.billing.tally: this process's bookings summed per (kind, model, tier) and priced as the
ledger is, and fed by the ledger's every booking (agent turns and summarizer calls)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cg.billing.ledger import Ledger, Round, Turn
from cg.billing.prices import price_table
from cg.billing.tally import Tally
from cg.state import LedgerTurns, memory
from cg.state.facts import FactsCache
from cg.state.tokens import TokenCounter
from cg.wire.usage import Usage

PRICES = price_table({})
MODEL = "claude-sonnet-4-5"


def test_bookings_are_summed_per_kind_model_and_tier() -> None:
    t = Tally(now=100.0)
    t.add([("agent", MODEL, "", Usage(input_tokens=10, requests=1))], LedgerTurns(turns=1))
    t.add([("agent", MODEL, "", Usage(input_tokens=5, output_tokens=2, requests=1))])
    t.add([("summarizer", MODEL, "", Usage(output_tokens=7, requests=1))])
    rows, turns = t.rows()
    by = {(r.kind, r.model): r.usage for r in rows}
    assert by[("agent", MODEL)] == Usage(input_tokens=15, output_tokens=2, requests=2)
    assert by[("summarizer", MODEL)] == Usage(output_tokens=7, requests=1)
    assert turns.turns == 1 and t.started == 100.0
    rep = t.report(PRICES)
    assert rep["usage"]["agent"]["requests"] == 2
    assert rep["usage"]["summarizer"]["output_tokens"] == 7
    assert rep["savings"]["turns"] == 1 and rep["savings"]["billed_usd"] is not None


def test_an_empty_tally_reports_zeros_and_no_share() -> None:
    rep = Tally().report(PRICES)
    assert rep["usage"]["agent"]["requests"] == 0
    assert rep["savings"]["billed_usd"] == 0 and rep["savings"]["saved_share"] is None


def test_the_ledger_feeds_its_tally_what_it_books(tmp_path: Path) -> None:
    ledger = Ledger(memory(), PRICES, FactsCache(TokenCounter()))
    ledger.tally = tally = Tally()
    turn = Turn("anthropic", "s1", None, False, 1.0)
    ledger.agent_turn(turn, [Round(Usage(input_tokens=40, requests=1), MODEL)], {})
    ledger.summarizer_call("s1", MODEL, Usage(output_tokens=3, requests=1))
    mine, theirs = tally.report(PRICES), ledger.report()
    assert mine["usage"] == theirs["usage"]  # one process on a fresh store: the same figures
    assert mine["savings"]["turns"] == theirs["savings"]["turns"] == 1
    assert mine["savings"]["billed_usd"] == pytest.approx(theirs["savings"]["billed_usd"])
