"""The `gemini-cli` preset and `cg_preset: auto` picking it from Gemini CLI's own headers
(docs/gemini-cli.md).

Gemini CLI 0.61.0 compresses its history once the last answer's `promptTokenCount` reaches
`model.compressionThreshold` (0.5 by default) of the 1,048,576 tokens it assumes for every Gemini
model. The preset's ceiling, 40% of the window, fires before that.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from cg.proxy.agents import claude_code, codex, gemini_cli, opencode
from cg.settings import AUTO, load_config, load_presets
from cg.summarize.config import parse_summarize
from tests.support.transcripts import fixture_headers

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from mitmproxy.test import taddons, tflow, tutils

from cg.proxy.addon import META, ContextGuru

HEADERS = "gemini_cli_0.61.0_turn.json"  # its .headers.json: a real turn, as the tap saw it
CLI_LIMIT = 1_048_576  # Gemini CLI's tokenLimit() for every Gemini model
CLI_THRESHOLD = 0.5  # its DEFAULT_COMPRESSION_TOKEN_THRESHOLD


def test_the_real_headers_are_gemini_clis() -> None:
    headers = fixture_headers(HEADERS)
    assert headers["User-Agent"].startswith("GeminiCLI-tui/0.61.0/")  # vacuity guard
    assert gemini_cli(headers) == "user-agent: GeminiCLI"
    assert (claude_code(headers), codex(headers, "gemini"), opencode(headers)) == (None,) * 3
    assert gemini_cli({"user-agent": "GeminiCLI/0.61.0/gemini-2.5-pro (linux; x64)"}) is not None
    assert gemini_cli({"user-agent": "google-genai-sdk/1.30.0 gl-python/3.12"}) is None
    assert gemini_cli({"user-agent": "opencode/1.18.33 ai-sdk/provider-utils/4.0.46"}) is None


def test_the_ceiling_is_below_where_gemini_cli_compresses() -> None:
    cfg = load_config("gemini-cli", None, ["summarize"])
    s = parse_summarize(cfg.components["summarize"], env={})
    assert (s.cache_state, s.resummarize_tokens, s.summary_level) == ("any", 40_000, "concise")
    assert (s.trigger.min_request_tokens, s.keep_artifact_tokens) == (40_000, 16_000)
    for model, window in cfg.model_windows.items():
        assert window == CLI_LIMIT, model
        assert s.trigger.ceiling_frac * window < CLI_THRESHOLD * CLI_LIMIT
    assert {"gemini-2.5-pro", "gemini-2.5-flash", "gemini-3-pro-preview"} <= set(cfg.model_windows)


def test_auto_loads_gemini_cli() -> None:
    assert "gemini-cli" in load_presets(AUTO, None, ["summarize"])


def _flow(headers: dict[str, str]) -> Any:
    doc = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    req = tutils.treq(
        method=b"POST",
        path=b"/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
        host="generativelanguage.googleapis.com",
        content=json.dumps(doc).encode(),
    )
    for k, v in headers.items():
        req.headers[k] = v
    f = tflow.tflow(req=req)
    f.client_conn.peername = ("127.0.0.1", 50000)
    return f


async def test_auto_picks_gemini_cli_from_its_real_headers(tmp_path: Path) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        tctx.configure(cg, cg_db=str(tmp_path / "cg.sqlite3"))
        assert tctx.options.cg_preset == AUTO
        f = _flow(fixture_headers(HEADERS))
        cg.request(f)
        rec = f.metadata[META]
        assert (rec["preset"], rec["preset_reason"]) == (
            "gemini-cli",
            "auto: user-agent: GeminiCLI",
        )
        assert rec["outcome"] == "passed_through"  # one message: nothing to do
        cg.done()
