"""The `opencode` preset and `cg_preset: auto` picking it from opencode's own headers
(docs/opencode.md).

opencode 1.18.33 compacts once the last answer's tokens reach the model's context limit less
min(its output limit, 32,000). The preset has claude-code's thresholds: its ceiling, 60% of the
window, fires long before that on any window.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from cg.proxy.agents import codex, opencode
from cg.settings import AUTO, load_config, load_presets
from cg.summarize.config import parse_summarize
from tests.support.transcripts import fixture_headers

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from mitmproxy.test import taddons, tflow, tutils

from cg.proxy.addon import META, ContextGuru

HEADERS = "opencode_1.18.33_turn.json"  # its .headers.json: a real turn, as the tap saw it
RESPONSES_HEADERS = "opencode_1.18.33_responses_turn.json"  # a turn on its openai provider
OPENCODE_RESERVE = 32_000  # opencode compacts at the window less min(output limit, this)


def test_the_real_headers_are_opencodes() -> None:
    headers = fixture_headers(HEADERS)
    assert headers["user-agent"].startswith("opencode/1.18.33 ")  # vacuity guard: the capture
    assert opencode(headers) == "user-agent: opencode/"
    # Its openai provider's Responses requests carry Codex's generic `session-id` too.
    responses = fixture_headers(RESPONSES_HEADERS)
    assert responses["originator"] == "opencode" and responses["session-id"].startswith("ses_")
    assert opencode(responses) == "user-agent: opencode/"
    assert codex(responses, "responses") == "session-id"  # hence auto asks about opencode first
    assert opencode({"user-agent": "claude-cli/2.1.328 (external, sdk-cli)"}) is None
    assert opencode({"user-agent": "OpenAI/Python 1.0", "x-session-id": "ses_1"}) is None


@pytest.mark.parametrize(
    ("window", "output"), [(200_000, 64_000), (50_000, 8_000), (1_000_000, 128_000)]
)
def test_the_ceiling_is_below_where_opencode_compacts(window: int, output: int) -> None:
    cfg = load_config("opencode", None, ["summarize"])
    s = parse_summarize(cfg.components["summarize"], env={})
    assert (s.cache_state, s.resummarize_tokens, s.summary_level) == ("any", 40_000, "concise")
    assert (s.trigger.min_request_tokens, s.keep_artifact_tokens) == (40_000, 16_000)
    assert s.trigger.ceiling_frac * window < window - min(output, OPENCODE_RESERVE)


def test_auto_loads_opencode() -> None:
    assert "opencode" in load_presets(AUTO, None, ["summarize"])


def _flow(headers: dict[str, str], responses: bool = False) -> Any:
    if responses:
        doc: dict[str, Any] = {"model": "gpt-5.5", "input": [{"role": "user", "content": "hi"}]}
        path, host = b"/v1/responses", "api.openai.com"
    else:
        doc = {
            "model": "claude-haiku-4-5",
            "max_tokens": 9,
            "messages": [{"role": "user", "content": "hi"}],
        }
        path, host = b"/v1/messages", "api.anthropic.com"
    req = tutils.treq(method=b"POST", path=path, host=host, content=json.dumps(doc).encode())
    for k, v in headers.items():
        req.headers[k] = v
    f = tflow.tflow(req=req)
    f.client_conn.peername = ("127.0.0.1", 50000)
    return f


@pytest.mark.parametrize("name", [HEADERS, RESPONSES_HEADERS])
async def test_auto_picks_opencode_from_its_real_headers(tmp_path: Path, name: str) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        tctx.configure(cg, cg_db=str(tmp_path / "cg.sqlite3"))
        assert tctx.options.cg_preset == AUTO
        f = _flow(fixture_headers(name), responses=name == RESPONSES_HEADERS)
        cg.request(f)
        rec = f.metadata[META]
        assert (rec["preset"], rec["preset_reason"]) == ("opencode", "auto: user-agent: opencode/")
        assert rec["outcome"] == "passed_through"  # one message: nothing to do
        cg.done()
