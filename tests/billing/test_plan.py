"""A subscription session's plan and rate-limit readings (cg.billing.plan), on real stores: the
label from the credential's kind, the readings kept across a window's reset, the figures of
`/_cg/stats`' `plans`, and an old store migrated with its rows."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from cg.billing.plan import (
    CHATGPT,
    CLAUDE,
    DOLLARS,
    PlanBook,
    merged,
    plan_of,
    plan_report,
    readings,
    session_limits,
)
from cg.state import LedgerTurns, UsageRow
from cg.state.schema import PG_MIGRATIONS, PG_VERSION, SQLITE_MIGRATIONS, SQLITE_VERSION
from cg.state.sqlite import SqliteStore
from cg.wire.usage import Usage
from tests.support.signin import ChatGPTAccount, ClaudeOAuth

OAT = "sk-ant-oat01-" + "a" * 40


@pytest.mark.parametrize(
    ("path", "headers", "plan"),
    [
        ("/v1/messages?beta=true", {"authorization": f"Bearer {OAT}"}, CLAUDE),
        ("/v1/messages", {"authorization": f"bearer  {OAT}"}, CLAUDE),
        ("/v1/messages", {"x-api-key": "sk-ant-api03-x"}, None),
        ("/v1/messages", {"authorization": "Bearer sk-ant-api03-x"}, None),
        # A key beside the bearer: the key is what bills.
        ("/v1/messages", {"authorization": f"Bearer {OAT}", "x-api-key": "k"}, None),
        ("/backend-api/codex/responses", {"authorization": "Bearer eyJ.x.y"}, CHATGPT),
        ("/backend-api/codex/responses/", {}, CHATGPT),
        ("/v1/responses", {"authorization": "Bearer sk-proj-x"}, None),
        ("/v1/chat/completions", {"authorization": "Bearer sk-x"}, None),
    ],
)
def test_the_plan_is_told_from_the_route_and_the_credentials_kind(path, headers, plan):
    assert plan_of(path, headers) == plan


def test_readings_of_both_providers_headers_are_percentages():
    codex = ChatGPTAccount(start_percent=40, step=2).answer_headers()
    claude = ClaudeOAuth(start=0.5, step=0.25).answer_headers()
    assert {k: v[0] for k, v in readings(codex).items()} == {"primary": 42.0, "secondary": 10.5}
    assert {k: v[0] for k, v in readings(claude).items()} == {"5h": 75.0, "7d": 15.0}
    assert readings({"x-codex-primary-used-percent": "nan"}) == {}
    assert readings({"x-codex-primary-used-percent": "-3"}) == {}
    assert readings({"content-type": "text/event-stream"}) == {}


def test_a_windows_reset_keeps_what_the_old_window_rose_by():
    doc = merged(None, {"primary": (10.0, "100")})
    doc = merged(doc, {"primary": (25.0, "100")})
    doc = merged(doc, {"primary": (3.0, "200")})  # the window rolled over
    doc = merged(doc, {"primary": (7.0, "200")})
    w = json.loads(doc)["windows"]["primary"]
    assert (w["spent"], w["first"], w["last"]) == (15.0, 3.0, 7.0)
    sent = [UsageRow("s", "agent", "m", "base", Usage(input_tokens=900, output_tokens=100))]
    est = [UsageRow("s", "estimate", "m", "base", Usage(input_tokens=1900, output_tokens=100))]
    assert session_limits(doc, sent + est) == {
        "primary": {"used_percent": 19.0, "not_spent_percent": 19.0}
    }
    assert merged("not json", {}) == json.dumps({"v": 1, "windows": {}}, sort_keys=True)


def _book(store: SqliteStore, book: PlanBook, session: str, headers: dict[str, str], n: int):
    acct = ChatGPTAccount(start_percent=10, step=5)
    for _ in range(n):
        row = [("agent", "m", "base", Usage(input_tokens=100, output_tokens=10, requests=1))]
        est = [("estimate", "m", "base", Usage(input_tokens=300, output_tokens=10, requests=1))]
        store.record_usage(session, row + est, LedgerTurns(turns=1, rewritten=1))
        book.book(session, "/backend-api/codex/responses", headers, acct.answer_headers())


def test_a_chatgpt_session_is_labelled_and_reported_and_an_api_key_session_is_not(tmp_path):
    with SqliteStore(tmp_path / "cg.sqlite3") as store:
        book = PlanBook(store)
        _book(store, book, "codex-1", {"authorization": "Bearer eyJ.a.b"}, 3)
        store.record_usage("api-1", [("agent", "m", "base", Usage(input_tokens=5))])
        assert book.book("api-1", "/v1/responses", {"authorization": "Bearer sk-x"}, {}) is None
        assert set(store.plans()) == {"codex-1"}
        report = plan_report(store)
    assert list(report) == [CHATGPT]
    p = report[CHATGPT]
    assert (p["sessions"], p["turns"], p["rewritten_turns"]) == (1, 3, 3)
    assert p["dollars"] == DOLLARS and p["rate_limits"]["estimate"] is True
    # Readings 15, 20, 25: 10 points used; (930 - 330) / 330 of them not spent.
    w = p["rate_limits"]["windows"]["primary"]
    assert w["used_percent"] == 10.0
    assert w["not_spent_percent"] == pytest.approx(10.0 * 600 / 330, abs=1e-3)


def test_the_label_survives_a_restart_and_no_header_value_is_stored(tmp_path):
    db = tmp_path / "cg.sqlite3"
    bearer = "Bearer eyJ.secret-access-token.sig"
    with SqliteStore(db) as store:
        _book(store, PlanBook(store), "codex-1", {"authorization": bearer}, 2)
    with SqliteStore(db) as store:  # a new process: the readings go on from the stored ones
        _book(store, PlanBook(store), "codex-1", {"authorization": bearer}, 1)
        w = plan_report(store)[CHATGPT]["rate_limits"]["windows"]["primary"]
    assert w["used_percent"] == 5.0  # 15, 20 stored; then a fresh account's 15: a new window
    assert b"secret-access-token" not in db.read_bytes()


def test_a_v4_sqlite_store_is_migrated_with_its_ledger_rows(tmp_path: Path):
    db = tmp_path / "v4.sqlite3"
    conn = sqlite3.connect(db, isolation_level=None)
    for version in (1, 2, 3, 4):
        conn.executescript(SQLITE_MIGRATIONS[version])
    conn.execute("PRAGMA user_version = 4")
    conn.execute("INSERT INTO ledger VALUES ('old', 3, 1, 40, 0, NULL, 5.0)")
    conn.close()
    with SqliteStore(db, evict=False) as store:
        assert store.ledger_turns("old")["old"].turns == 3
        assert store.plans() == {}
        store.record_plan("old", CLAUDE, None)
        assert store.plans() == {"old": (CLAUDE, None)}
        assert store.ledger_turns("old")["old"].tokens_not_sent == 40  # the counters kept
    conn = sqlite3.connect(db)
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    conn.close()
    assert version == SQLITE_VERSION == 5


def test_a_v3_postgresql_store_is_migrated_with_its_ledger_rows(pg_url: str):
    import psycopg

    from cg.state.pgstore import PgStore

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE cg_meta (k TEXT PRIMARY KEY, v BIGINT NOT NULL)")
        for version in (1, 2, 3):
            for stmt in PG_MIGRATIONS[version].split(";"):
                if stmt.strip():
                    conn.execute(stmt)
        conn.execute("INSERT INTO cg_meta VALUES ('schema', 3)")
        conn.execute("INSERT INTO cg_ledger VALUES ('old', 2, 1, 7, 0, NULL, 5.0)")
    with PgStore(pg_url, evict=False) as store:
        assert store.ledger_turns("old")["old"].turns == 2
        store.record_plan("old", CHATGPT, '{"v": 1, "windows": {}}')
        assert store.plans("old") == {"old": (CHATGPT, '{"v": 1, "windows": {}}')}
    with psycopg.connect(pg_url, autocommit=True) as conn:
        schema = conn.execute("SELECT v FROM cg_meta WHERE k = 'schema'").fetchone()
    assert schema == (PG_VERSION,) == (4,)


def test_the_session_list_names_each_sessions_plan(tmp_path):
    from cg.billing.listing import sessions_named, sessions_page
    from cg.billing.prices import price_table

    prices = price_table({})
    with SqliteStore(tmp_path / "cg.sqlite3") as store:
        _book(store, PlanBook(store), "codex-1", {"authorization": "Bearer eyJ.a.b"}, 2)
        store.record_usage("api-1", [("agent", "m", "base", Usage(input_tokens=5))],
                           LedgerTurns(turns=1))  # fmt: skip
        page = {e["id"]: e for e in sessions_page(store, prices, len)["sessions"]}
        (named,) = sessions_named(store, prices, len, ["codex-1"])
    assert page["api-1"]["plan"] is None and "dollars" not in page["api-1"]
    assert page["codex-1"]["plan"] == named["plan"] == CHATGPT
    assert page["codex-1"]["dollars"] == DOLLARS
    assert page["codex-1"]["rate_limits"]["primary"]["used_percent"] == 5.0
