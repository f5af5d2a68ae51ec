"""The `codex` preset: Codex CLI compacts its own history, blocking, at min(its
`model_auto_compact_token_limit`, 90% of its model's window) — 244,800 by default (docs/codex.md).
The preset must have a checkpoint spliced well before that, so the context Codex is told of
stays below its limit and it never stops to compact. These tests grow a Codex session (the real
capture, then tool rounds of reasoning, call and output, as Codex re-sends them) request by
request, completing every commissioned summary before the next turn."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cg.settings import load_config
from cg.state.sqlite import SqliteStore
from cg.summarize.config import parse_summarize
from cg.summarize.triggers import resolve_window, shipped_windows
from tests.summarize.test_component_responses import grow
from tests.support.transcripts import Driver, make

CODEX_LIMIT = 244_800  # 90% of Codex's 272,000-token window


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    with SqliteStore(tmp_path / "cg.sqlite3") as s:
        yield s


def codex_driver(store: SqliteStore, windows: dict[str, int] | None = None) -> Driver:
    cfg = load_config("codex", None, ["summarize"])
    comp = parse_summarize(cfg.components["summarize"], env={})
    return make(comp, store, "responses", model_windows={**cfg.model_windows, **(windows or {})})


def run(d: Driver, bodies: list[bytes], stop_tokens: int) -> list[dict[str, Any]]:
    rows = []
    for raw in bodies:
        r = d.send(raw)
        rec = r.record["components"][0]
        tokens = rec["tokens"]
        sent = rec.get("tokens_after", tokens) if r.outcome == "rewritten" else tokens
        rows.append({"tokens": tokens, "sent": sent, "outcome": r.outcome, "rec": rec})
        d.drain()
        if tokens >= stop_tokens:
            break
    return rows


def test_the_preset_values() -> None:
    cfg = load_config("codex", None, ["summarize"])
    s = parse_summarize(cfg.components["summarize"], env={})
    assert (s.keep_first, s.keep_last, s.cache_state, s.resummarize_tokens) == (2, 6, "any", 40_000)
    assert (s.trigger.min_request_tokens, s.trigger.min_request_frac) == (40_000, 0)
    assert (s.summary_level, s.keep_user_tokens, s.keep_artifact_tokens) == ("concise", 8000, 16000)
    assert s.trigger.ceiling_frac == 0.6


@pytest.mark.parametrize(
    "model,window",
    [
        ("gpt-5.5", 272_000),
        ("gpt-6.1-sol", 500_000),  # the API allows 1,050,000; Codex 0.171.0's catalogue 500,000
        ("gpt-6.1-terra", 500_000),
        ("gpt-6.2-sol", 500_000),
        ("gpt-6.2-astra", 272_000),
        ("my-local-model", 272_000),  # Codex's fallback for a model it does not know
    ],
)
def test_windows_are_codexs_own(model: str, window: int) -> None:
    cfg = load_config("codex", None, ["summarize"])
    assert resolve_window(model, "", cfg.model_windows, shipped_windows()) == window


def test_a_configured_window_for_the_model_wins(tmp_path: Path) -> None:
    extra = tmp_path / "cg.yaml"
    extra.write_text("model_windows: {my-local-model: 50000}\n")
    cfg = load_config("codex", str(extra), ["summarize"])
    assert resolve_window("my-local-model", "", cfg.model_windows, shipped_windows()) == 50_000
    assert resolve_window("gpt-5.5", "", cfg.model_windows, shipped_windows()) == 272_000


def test_the_preset_splices_long_before_codexs_limit(store: SqliteStore) -> None:
    bodies = grow("middle", 80, words=1200)  # ~5k tokens a round
    rows = run(codex_driver(store), bodies, int(0.95 * CODEX_LIMIT))
    assert rows[-1]["tokens"] >= 0.95 * CODEX_LIMIT, "the session never grew that far: vacuous"
    first = next(i for i, r in enumerate(rows) if r["outcome"] == "rewritten")
    assert 40_000 <= rows[first - 1]["tokens"] < 60_000  # commissioned at the token trigger
    assert all(r["outcome"] == "rewritten" for r in rows[first:]), [r["outcome"] for r in rows]
    assert max(r["sent"] for r in rows) < 0.5 * CODEX_LIMIT
    assert rows[first]["rec"]["window"] == 272_000


def test_with_a_small_window_the_ceiling_keeps_codex_under_its_limit(store: SqliteStore) -> None:
    """Codex told `model_context_window = 50000` compacts at 45,000 (near the 40k trigger):
    the proxy told the same window acts at its ceiling, 60% of it."""
    doc = json.loads(grow("middle", 1)[0])
    assert doc["model"] == "my-local-model"
    bodies = grow("middle", 60, words=400)  # ~1.7k tokens a round
    rows = run(codex_driver(store, {"my-local-model": 50_000}), bodies, 48_000)
    assert rows[-1]["tokens"] >= 48_000 > 45_000, "the session never passed Codex's limit"
    first = next(i for i, r in enumerate(rows) if r["outcome"] == "rewritten")
    assert rows[first - 1]["rec"]["trigger"]["hard"].startswith("ceiling")
    assert max(r["sent"] for r in rows) < 45_000
