"""The `claude-code` preset and `cg_preset: auto` (docs/behaviour.md#summarize-presets).

Claude Code compacts its own transcript at 83.5% of a 200k window (96.7% of 1M). The preset must
have a checkpoint made and spliced before a request reaches 80% of the window, whatever the
cache state, so the context Claude Code sees stays below its threshold and it never stops to
compact. These tests grow a Claude Code-shaped session (the real capture, then tool turns) to 85%
of the window, one request per turn as Claude Code sends them, completing every commissioned
summary before the next turn (the live timing: a summary is ready a turn after it is asked for).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cg.settings import AUTO, load_config, load_presets
from cg.state.sqlite import SqliteStore
from cg.summarize.config import parse_summarize
from tests.support.transcripts import CC16, Driver, fixture_body, fixture_headers, grow, make

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from mitmproxy.test import taddons, tflow, tutils

from cg.proxy.addon import META, ContextGuru

WINDOW_200K = 200_000
CLAUDE_CODE_THRESHOLD = 0.835


def preset_driver(name: str, store: SqliteStore, **kw: Any) -> Driver:
    cfg = load_config(name, None, ["summarize"])
    comp = parse_summarize(cfg.components.get("summarize") or {}, env={})
    return make(comp, store, **kw)


def tool_heavy(base: dict[str, Any]) -> list[dict[str, Any]]:
    """Claude Code's next 60 requests after `base`, one tool turn of ~5.5k tokens each: past 85%
    of a 200k window in ~30 requests (`run` stops there)."""
    return grow(base, 60, output_words=1200)


def run(driver: Driver, bodies: list[dict[str, Any]], stop_tokens: int) -> list[dict[str, Any]]:
    """Each body through the driver, completing commissions between turns; one row per turn:
    the component's count of the original request, of what was sent, and the outcome."""
    rows = []
    for body in bodies:
        r = driver.send(body)
        rec = r.record["components"][0]
        tokens = rec["tokens"]
        sent = rec.get("tokens_after", tokens) if r.outcome == "rewritten" else tokens
        rows.append({"tokens": tokens, "sent": sent, "outcome": r.outcome, "rec": rec})
        driver.drain()
        if tokens >= stop_tokens:
            break
    return rows


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    with SqliteStore(tmp_path / "cg.sqlite3") as s:
        yield s


def test_claude_code_preset_splices_before_80_percent_of_a_200k_window(store: SqliteStore) -> None:
    base = fixture_body(CC16)
    assert base["model"].startswith("claude-opus-4")  # a 200k window without the 1M beta
    bodies = tool_heavy(base)
    d = preset_driver("claude-code", store, headers=fixture_headers(CC16) | {"anthropic-beta": ""})
    rows = run(d, bodies, int(0.85 * WINDOW_200K))
    assert rows[-1]["tokens"] >= 0.85 * WINDOW_200K, "the session never grew to 85%: vacuous"
    first = next(i for i, r in enumerate(rows) if r["outcome"] == "rewritten")
    assert rows[first]["tokens"] < 0.8 * WINDOW_200K, rows[first]
    # From then on every request sent is far below Claude Code's own threshold.
    assert all(r["outcome"] == "rewritten" for r in rows[first:]), [r["outcome"] for r in rows]
    worst = max(r["sent"] for r in rows)
    assert worst < 0.8 * WINDOW_200K, worst
    assert max(r["sent"] for r in rows[first:]) < 0.5 * WINDOW_200K
    assert rows[first]["rec"]["trigger"]["cache"] in ("warm", "unknown")  # whatever the cache


def test_on_claude_codes_1m_window_the_preset_acts_at_its_token_trigger(store: SqliteStore) -> None:
    """Claude Code asks for claude-opus-4-8 with the context-1m beta: a 1M window, which a
    fraction trigger would leave untouched until 800k tokens. The token trigger acts at 40k."""
    headers = fixture_headers(CC16)
    assert "context-1m" in headers["anthropic-beta"]
    d = preset_driver("claude-code", store, headers=headers)
    rows = run(d, tool_heavy(fixture_body(CC16)), 150_000)
    assert rows[0]["rec"]["window"] == 1_000_000
    first = next(i for i, r in enumerate(rows) if r["outcome"] == "rewritten")
    assert rows[first]["tokens"] < 0.1 * 1_000_000
    assert max(r["sent"] for r in rows) < 0.1 * 1_000_000 < rows[-1]["tokens"]


def test_the_spec_defaults_would_not_have_acted_before_claude_code_compacts(
    store: SqliteStore,
) -> None:
    """Why the preset exists, and why the defaults moved: the first design's `summarize` defaults
    wait for 90% of the window and a cold cache, and Claude Code compacts at 83.5%."""
    spec = {
        "cache_state": "cold",
        "resummarize_tokens": 6000,
        "trigger": {"min_request_frac": 0.9, "min_request_tokens": 0},
    }
    d = make(parse_summarize(spec, env={}), store, headers={"anthropic-beta": ""})
    rows = run(d, tool_heavy(fixture_body(CC16)), int(0.85 * WINDOW_200K))
    assert rows[-1]["tokens"] >= 0.85 * WINDOW_200K
    assert all(r["outcome"] == "passed_through" for r in rows)
    assert max(r["sent"] for r in rows) >= CLAUDE_CODE_THRESHOLD * WINDOW_200K


def test_the_summarize_preset_now_acts_in_time_too(store: SqliteStore) -> None:
    d = preset_driver("summarize", store, headers={"anthropic-beta": ""})
    rows = run(d, tool_heavy(fixture_body(CC16)), int(0.85 * WINDOW_200K))
    first = next(i for i, r in enumerate(rows) if r["outcome"] == "rewritten")
    assert rows[first]["tokens"] < 0.5 * WINDOW_200K
    assert max(r["sent"] for r in rows) < 0.5 * WINDOW_200K


# -- cg_preset: auto -----------------------------------------------------------------------------


def test_auto_loads_claude_code_codex_and_summarize() -> None:
    configs = load_presets(AUTO, None, ["summarize"])
    assert list(configs) == ["claude-code", "codex", "opencode", "gemini-cli", "summarize"]
    assert configs["claude-code"] != configs["summarize"]


def _flow(headers: dict[str, str]) -> Any:
    body = json.dumps(
        {
            "model": "claude-opus-4-8",
            "max_tokens": 9,
            "messages": [{"role": "user", "content": "hi"}],
        }
    ).encode()
    req = tutils.treq(method=b"POST", path=b"/v1/messages", host="api.anthropic.com", content=body)
    for k, v in headers.items():
        req.headers[k] = v
    f = tflow.tflow(req=req)
    f.client_conn.peername = ("127.0.0.1", 50000)
    return f


@pytest.mark.parametrize(
    ("preset", "headers", "applied", "why"),
    [
        (None, fixture_headers(CC16), "claude-code", "auto: x-claude-code-session-id"),
        (
            None,
            {"user-agent": "claude-cli/2.1.197 (external, sdk-py)"},
            "claude-code",
            "auto: user-agent: claude-cli/",
        ),
        (
            None,
            {"user-agent": "Anthropic/Python 0.40.0"},
            "summarize",
            "auto: neither Claude Code, Codex, opencode nor Gemini CLI",
        ),
        ("summarize", fixture_headers(CC16), "summarize", "cg_preset"),
        ("claude-code", {}, "claude-code", "cg_preset"),
    ],
)
async def test_the_decision_record_says_which_preset_applied(
    tmp_path: Path, preset: str | None, headers: dict[str, str], applied: str, why: str
) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        opts: dict[str, Any] = {"cg_db": str(tmp_path / "cg.sqlite3")}
        if preset is not None:
            opts["cg_preset"] = preset
        tctx.configure(cg, **opts)
        assert tctx.options.cg_preset == (preset or AUTO)
        f = _flow(headers)
        cg.request(f)
        rec = f.metadata[META]
        assert (rec["preset"], rec["preset_reason"]) == (applied, why)
        assert rec["outcome"] == "passed_through"  # one message: nothing to do, either way
        cg.done()
