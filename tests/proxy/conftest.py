"""The addon in mitmproxy's test context, with the real `summarize` component and a real SQLite
store; only the summarizer is an in-process fake (`SharedFake`), so a test sees what each job
was handed and when it ran. The turn it is sent: `tests.support.summarizing`."""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from mitmproxy.test import taddons

from cg.proxy.addon import ContextGuru
from tests.support.transcripts import ACTING, SharedFake


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> SharedFake:
    f = SharedFake()
    monkeypatch.setattr("cg.proxy.runtime.SummarizerClient", lambda *a, **k: f)
    return f


@pytest.fixture
async def guru(
    tmp_path: Path, fake: SharedFake, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[ContextGuru, Any]]:
    """The addon and its test context. Async, so that the addon lives on the test's own loop."""
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = tmp_path / "cg.yaml"
    cfg.write_text(yaml.safe_dump({"components": {"summarize": ACTING}}), encoding="utf-8")
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        tctx.configure(cg, cg_preset="summarize", cg_config=str(cfg), cg_db=str(tmp_path / "db"))
        yield cg, tctx
        cg.done()
