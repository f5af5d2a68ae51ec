"""What the proxy says (cg.proxy.turnlog, startup, configerrors, metrics, scope, and health):
the line per turn and its levels, the start-up block and its store line, a ConfigError's record
as one line, the `--set` values mitmproxy cannot convert, `/_cg/metrics` parsed by
prometheus-client, `/_cg/stats`' scope, and `/_cg/health` with a store that cannot open."""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from mitmproxy import exceptions, optmanager
from prometheus_client.parser import text_string_to_metric_families

from cg.proxy import configerrors, startup, turnlog
from cg.proxy.addon import ContextGuru
from tests.proxy.test_addon import make_flow

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from mitmproxy.test import taddons


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))


# -- the line per turn -------------------------------------------------------------------------


def rec(**kw: Any) -> dict[str, Any]:
    return {"dialect": "anthropic", "preset": "summarize", "session": "0123456789abcdef", **kw}


@pytest.mark.parametrize(
    ("record", "says"),
    [
        (rec(action="passed_through", reason="below the trigger"), "passed (below the trigger)"),
        (rec(action="commissioned", reason="x", rolling=False, summarizing=[2, 40]), "commissioned a summary of messages 2–40"),
        (rec(action="rewritten", tokens=[181204, 9012], messages=[212, 5]), "rewritten 181,204→9,012 tokens (212→5 messages)"),
        (rec(action="rewritten", tokens=[900, 300], messages=[12, 5], rolling=True, summarizing=[1, 4]), "rewritten 900→300 tokens (12→5 messages); commissioned a summary of messages 1–4"),
        (rec(action="bypassed", reason="x-context-guru-bypass: 1"), "bypassed (x-context-guru-bypass: 1)"),
        (rec(action="failed_open", reason="cannot re-encode body: boom"), "failed open: cannot re-encode body: boom"),
    ],
)  # fmt: skip
def test_a_turn_line_says_what_was_done(record: dict[str, Any], says: str) -> None:
    assert turnlog.line(record) == f"context-guru 01234567 anthropic summarize: {says}"


def test_a_long_reason_is_cut_and_a_missing_session_is_a_dash() -> None:
    text = turnlog.line({"action": "passed_through", "dialect": "openai", "reason": "x" * 500})
    assert text.startswith("context-guru - openai: passed (") and len(text) < 200


def test_quiet_silences_turn_lines_but_not_a_failed_open_one(caplog) -> None:
    caplog.set_level(logging.INFO, logger="context_guru")
    turnlog.turn(rec(action="passed_through"), quiet=True)
    turnlog.turn(rec(action="failed_open", reason="boom"), quiet=True)
    assert [(r.levelno, r.getMessage()[-10:]) for r in caplog.records] == [
        (logging.WARNING, "open: boom")
    ]
    caplog.clear()
    turnlog.turn(rec(action="passed_through"), quiet=False)
    assert [r.levelno for r in caplog.records] == [logging.INFO]


# -- the start-up block ----------------------------------------------------------------------


class _Store:
    persistent = True


def test_the_block_names_preset_store_address_and_dashboard() -> None:
    where = startup.listening_lines(["reverse:https://api.anthropic.com"], [("127.0.0.1", 8080)])
    store = startup.store_line("/home/me/cg.sqlite3", _Store(), None)
    lines = startup.block("auto", store, where)
    assert lines[0].endswith("preset auto (" + startup.AUTO_NOTE + ")")
    assert lines[1] == "  store      sqlite /home/me/cg.sqlite3"
    assert lines[2] == "  listening  127.0.0.1:8080, reverse to https://api.anthropic.com"
    assert lines[3].startswith("  dashboard  http://127.0.0.1:8080/_cg/ ")


def test_a_regular_proxy_points_at_the_reserved_name_and_wildcards_at_loopback() -> None:
    where, board = startup.listening_lines(["regular"], [("0.0.0.0", 8080), ("::", 8080)])
    assert where == "127.0.0.1:8080, [::1]:8080, regular mode"
    assert board.startswith("http://context-guru.test/_cg/ through the proxy")


def test_the_store_line_hides_a_password_and_says_unavailable_loudly() -> None:
    text, loud = startup.store_line("postgresql://me:s3cret@db:5432/cg", _Store(), None)
    assert "s3cret" not in text and text.startswith("postgresql postgresql://me:***@db")
    assert not loud
    text, loud = startup.store_line("/x", None, "cannot open the store /x: is a directory")
    assert loud and text.startswith("UNAVAILABLE: cannot open the store /x")


# -- config errors ---------------------------------------------------------------------------


def test_a_config_errors_record_loses_its_traceback() -> None:
    try:
        raise configerrors.ConfigError("cg_preset: unknown preset 'x'")
    except configerrors.ConfigError as e:
        record = logging.LogRecord("s", logging.ERROR, "f", 1, "error in script %s", ("a",), (type(e), e, e.__traceback__))  # fmt: skip
    assert configerrors.OneLine().filter(record)
    assert record.getMessage() == "context-guru: cg_preset: unknown preset 'x'"
    assert record.exc_info is None
    other = logging.LogRecord("s", logging.ERROR, "f", 1, "boom", (), None)
    assert configerrors.OneLine().filter(other) and other.getMessage() == "boom"


def test_a_value_mitmproxy_cannot_convert_is_named() -> None:
    opts = optmanager.OptManager()
    sets = ("cg_max_body_mb=lots", "cg_quiet=true", "cg_hosts=a", "cg_hosts=b", "cg_preset=a")
    opts.set(*sets, "cg_preset=b", "other=1", defer=True)  # (held: no option declared yet)
    opts.add_option("cg_max_body_mb", int, 32, "")
    opts.add_option("cg_quiet", bool, False, "")
    opts.add_option("cg_hosts", Sequence[str], [], "")
    opts.add_option("cg_preset", str, "auto", "")
    # Only the integer that is none: a good bool, a list given twice, and a single value given
    # twice (`repeated_options` says that one) are not this check's.
    [(name, value, why)] = configerrors.unconvertible(opts)
    assert (name, value) == ("cg_max_body_mb", "lots") and "Not an integer" in why


async def test_configure_raises_a_config_error_naming_the_key() -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        with pytest.raises(configerrors.ConfigError, match="cg_preset: unknown preset 'nope'"):
            tctx.configure(cg, cg_preset="nope")
        assert issubclass(configerrors.ConfigError, exceptions.OptionsError)


# -- health, stats and metrics ---------------------------------------------------------------


def _ask(cg: ContextGuru, path: str) -> tuple[int, bytes, str]:
    f = make_flow(path=path, method="GET")
    cg.request(f)
    assert f.response is not None
    return f.response.status_code, f.response.content or b"", f.response.headers["content-type"]


async def test_health_is_not_ok_but_serving_while_the_store_cannot_open(tmp_path: Path) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        tctx.configure(cg, cg_preset="summarize", cg_db=str(tmp_path))  # a directory
        status, body, _ = _ask(cg, "/_cg/health")
        doc = json.loads(body)
        assert status == 200 and doc["serving"] is True and doc["ok"] is False
        assert str(tmp_path) in doc["store"]["error"] and "passing every" in doc["error"]
        families = {f.name: f for f in text_string_to_metric_families(_ask(cg, "/_cg/metrics")[1].decode())}  # fmt: skip
        assert families["context_guru_store_up"].samples[0].value == 0.0


async def test_stats_say_their_scope_and_keep_the_ledger_apart(tmp_path: Path) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        tctx.configure(cg, cg_preset="off", cg_db=str(tmp_path / "cg.sqlite3"))
        doc = cg.stats_json()
        assert doc["scope"] == "since_start" and isinstance(doc["started"], float)
        assert doc["usage"]["agent"]["requests"] == 0
        assert set(doc["ledger"]) >= {"usage", "savings"}
        assert "saved_share" in doc["savings"]


async def test_metrics_parse_and_agree_with_the_counters(tmp_path: Path) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        tctx.configure(cg, cg_preset="off", cg_db=str(tmp_path / "cg.sqlite3"))
        cg.request(make_flow())  # one provider request, passed through
        status, body, ctype = _ask(cg, "/_cg/metrics")
        assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(body.decode())
            for s in f.samples
        }
        assert samples[("context_guru_requests_total", ())] == 1.0
        assert samples[("context_guru_turns_total", (("outcome", "passed_through"),))] == 1.0
        assert samples[("context_guru_store_up", ())] == 1.0
        assert samples[("context_guru_tokens_not_sent_total", ())] == 0.0
        assert ("context_guru_billed_usd_total", (("kind", "agent"),)) in samples
        assert ("context_guru_summaries_total", (("state", "completed"),)) in samples


def test_two_addons_keep_their_metrics_apart() -> None:
    a, b = ContextGuru(), ContextGuru()
    a.rt.stats.requests = 5
    ra = next(p for p in a.parts if hasattr(p, "metrics")).metrics.render().decode()
    rb = next(p for p in b.parts if hasattr(p, "metrics")).metrics.render().decode()
    assert "context_guru_requests_total 5.0" in ra and "context_guru_requests_total 0.0" in rb
