"""Masking the bodies real agents sent: Codex CLI 0.169.0's (function calls, and custom tool
calls whose outputs are text parts, with the tools in an `additional_tools` item) and Claude
Code 2.1.197's (thinking blocks, system messages mid-array, `cache_control`). Their outputs are
short, so the floor is lowered; every other setting is the default's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cg.mask.component import Mask
from cg.mask.config import parse_mask
from cg.pipeline.rewrite import ExpandPolicy, rewrite_body
from cg.settings import StoreConfig
from cg.state import Store, open_store
from cg.wire.dialects import DIALECTS
from cg.wire.shape import validate_shape
from tests.support.masking import array_sources, replaced
from tests.support.transcripts import (
    CC16,
    FIXTURES,
    TOKENS,
    cc_dumps,
    fixture_body,
    fixture_headers,
)

CODEX = FIXTURES / "codex-0.169.0"
OPEN = {"min_output_tokens": 20, "remask_tokens": 0, "trigger": {"min_request_tokens": 0}}


def codex(name: str) -> tuple[bytes, dict[str, str]]:
    doc = json.loads((CODEX / f"{name}.json").read_text())
    headers = {k: v for k, v in doc["headers"] if k.lower() != "authorization"}
    return doc["body"].encode(), headers


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = open_store(StoreConfig(), str(tmp_path / "cg.sqlite3"))
    yield s
    s.close()


def run(store: Store, raw: bytes, dialect: str, headers: dict[str, str], **cfg: Any) -> Any:
    comp = Mask(parse_mask({**OPEN, **cfg}), store, TOKENS)
    return rewrite_body(
        raw, DIALECTS[dialect], [comp], headers=headers, expand=ExpandPolicy("auto", store)
    )


@pytest.mark.parametrize(
    ("name", "masked"), [("middle", 5), ("resumed_last", 10), ("default_model_additional_tools", 6)]
)
def test_codex_bodies(store: Store, name: str, masked: int) -> None:
    raw, headers = codex(name)
    r = run(store, raw, "responses", headers, keep_last_rounds=2)
    assert r.outcome == "rewritten", r.record
    assert r.body is not None
    pairs = replaced(raw, r.body)
    assert len(pairs) == masked
    for value, stub in pairs:
        text = value if isinstance(value, str) else "\n".join(p["text"] for p in value)
        assert f"→ {len(text):,} characters" in stub
    sent = json.loads(r.body)["input"]
    assert validate_shape(sent, "responses") == []
    client = json.loads(raw)["input"]
    assert [i.get("type") for i in sent] == [i.get("type") for i in client]
    # Codex declares its tools in an item there: the expand tool stays out of `tools`.
    if name == "default_model_additional_tools":
        assert r.record["expand"]["injected"] is False
    else:
        assert r.record["expand"]["injected"] is True


def test_claude_codes_body(store: Store) -> None:
    raw = cc_dumps(fixture_body(CC16))
    r = run(store, raw, "anthropic", fixture_headers(CC16), keep_last_rounds=3, min_output_tokens=1)
    assert r.outcome == "rewritten", r.record
    assert r.body is not None
    pairs = replaced(raw, r.body)
    assert pairs and all("Bash {" in stub for _, stub in pairs)
    assert validate_shape(json.loads(r.body)["messages"], "anthropic") == []
    # The last three rounds, and the breakpoint on the last message, as they came.
    client, sent = array_sources(raw, "messages"), array_sources(r.body, "messages")
    assert sent[-6:] == client[-6:]
    assert b"cache_control" in sent[-1]
