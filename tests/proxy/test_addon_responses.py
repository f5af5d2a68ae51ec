"""The addon's request hook on Responses traffic: the real Codex requests get the `codex` preset
under `cg_preset: auto`, Codex's own compaction request passes through untouched with its reason,
an OpenAI SDK app gets `summarize`, and what cannot be read passes through byte-identical."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mitmproxy.test import taddons, tflow, tutils

from cg.proxy.addon import META, ContextGuru
from tests.wire.test_responses import FIXTURES


def codex_flow(name: str, **over: Any) -> Any:
    doc = json.loads((FIXTURES / f"{name}.json").read_text())
    req = tutils.treq(
        method=b"POST",
        path=doc["path"].encode(),
        host="api.openai.com",
        content=doc["body"].encode(),
    )
    for k, v in doc["headers"]:
        if k.lower() not in ("host", "content-length", "authorization"):
            req.headers[k] = v
    for k, v in over.items():
        req.headers[k] = v
    f = tflow.tflow(req=req)
    f.client_conn.peername = ("127.0.0.1", 50000)
    return f


def run(tmp_path: Path, f: Any, **opts: Any) -> dict[str, Any]:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        tctx.configure(cg, cg_db=str(tmp_path / "cg.sqlite3"), **opts)
        raw = f.request.raw_content
        cg.request(f)
        rec: dict[str, Any] = f.metadata[META]
        if rec["outcome"] != "rewritten":
            assert f.request.raw_content == raw  # not one byte changed
        cg.done()
    return rec


@pytest.mark.parametrize(
    "name", ["first", "middle", "resumed_last", "default_model_additional_tools"]
)
async def test_codexs_requests_get_the_codex_preset_under_auto(tmp_path: Path, name: str) -> None:
    rec = run(tmp_path, codex_flow(name))
    assert rec["dialect"] == "responses"
    assert (rec["preset"], rec["preset_reason"]) == ("codex", "auto: originator: codex_")
    assert (
        rec["session"]
        == json.loads(json.loads((FIXTURES / f"{name}.json").read_text())["body"])[
            "prompt_cache_key"
        ]
    )
    assert rec["outcome"] == "passed_through"  # far below the trigger: nothing to do


async def test_codexs_own_compaction_request_passes_through_with_its_reason(tmp_path: Path) -> None:
    rec = run(tmp_path, codex_flow("own_compaction_call"))
    assert rec["outcome"] == "passed_through"
    assert rec["reason"].startswith("Codex's own compaction request (x-codex-turn-metadata")
    assert "components" not in rec  # no component ran on it
    assert rec["invalidated"] == []  # nothing to invalidate in a fresh store


async def test_the_compaction_request_passes_through_under_every_preset(tmp_path: Path) -> None:
    for preset in ("off", "summarize", "codex"):
        rec = run(tmp_path / preset, codex_flow("own_compaction_call"), cg_preset=preset)
        assert rec["outcome"] == "passed_through", preset
        assert rec["reason"].startswith("Codex's own compaction request"), preset


async def test_an_sdk_app_on_the_responses_api_gets_summarize(tmp_path: Path) -> None:
    body = {"model": "gpt-5", "input": [{"role": "user", "content": "hi"}], "store": False}
    req = tutils.treq(
        method=b"POST",
        path=b"/v1/responses",
        host="api.openai.com",
        content=json.dumps(body).encode(),
    )
    req.headers["user-agent"] = "OpenAI/Python 2.54.0"
    f = tflow.tflow(req=req)
    f.client_conn.peername = ("127.0.0.1", 50000)
    rec = run(tmp_path, f)
    assert (rec["preset"], rec["preset_reason"]) == (
        "summarize",
        "auto: neither Claude Code, Codex, opencode nor Gemini CLI",
    )


@pytest.mark.parametrize(
    "body,why",
    [
        ({"model": "m", "input": "one turn"}, "'input' is a string: a single user turn"),
        (
            {"model": "m", "input": [], "previous_response_id": "resp_1"},
            "previous_response_id is set",
        ),
        ({"model": "m", "input": [{"type": "frobnicate"}]}, "unknown item type 'frobnicate'"),
    ],
)
async def test_unreadable_requests_pass_through_byte_identical(
    tmp_path: Path, body: Any, why: str
) -> None:
    req = tutils.treq(
        method=b"POST",
        path=b"/v1/responses",
        host="api.openai.com",
        content=json.dumps(body).encode(),
    )
    f = tflow.tflow(req=req)
    f.client_conn.peername = ("127.0.0.1", 50000)
    rec = run(tmp_path, f)
    assert rec["outcome"] == "passed_through" and why in rec["reason"]
