"""Codex never stops to compact its own history behind the `codex` preset; and when it does
compact, its compaction request passes through untouched.

Codex 0.169.0 sizes its context from the usage of the previous answer (`total_tokens`) plus its
estimate of the items added since, and compacts when that reaches its limit: the smaller of
`model_auto_compact_token_limit` and 90% of the model's context window (docs/codex.md). With
`model_context_window = 50000` that is 45,000 tokens, which a scripted session of `seq` outputs
passes in under twenty steps. The fake provider reports usage as the body it received would bill
it (bytes / 4), like the measurements in docs/codex.md.

The proxy runs `cg_preset=codex` with the same window for the model (`model_windows`), so its
ceiling fires at a fraction of the window as it would on a real one. The control run, with
`cg_preset=off`, shows Codex compacting on the same session — the guard that the first test is
not passing vacuously.

These need the `responses` dialect and its `codex` preset.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.agents import start_proxy
from tests.e2e.codex_sessions import (
    NEEDS_CODEX_PRESET,
    NEEDS_RESPONSES,
    CodexSession,
    drive_codex,
)
from tests.e2e.harness import Proxy, low
from tests.support.codex_script import CodexScript, request_kind, session
from tests.support.fakeprovider import FakeProvider

pytestmark = [pytest.mark.e2e, pytest.mark.slow, NEEDS_RESPONSES, NEEDS_CODEX_PRESET]

WINDOW = 50_000  # Codex's `model_context_window`, and the proxy's window for the model
THRESHOLD = 45_000  # where Codex compacts: 90% of the window, in the fake's bytes / 4
STEPS = 20
STEP = 2_500  # what one step adds to the history, and a little more, in the fake's tokens
MODEL = "my-local-model"


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with FakeProvider() as p:
        yield p


def start(fake: FakeProvider, workdir: Path, preset: str, summarize: Any = None) -> Proxy:
    config: dict[str, Any] = {"model_windows": {MODEL: WINDOW}}
    if summarize is not None:
        config["components"] = {"summarize": summarize}
    path = workdir / "windows.yaml"
    workdir.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return start_proxy(fake.url, workdir, preset, options=[f"cg_config={path}"])


def drive(
    codex: Path, fake: FakeProvider, proxy: Proxy, workdir: Path, config: dict[str, Any]
) -> CodexSession:
    script = CodexScript(f"CG-{workdir.name}", session(STEPS, command=heavy))
    s = drive_codex(
        codex, fake, proxy, workdir / "codex", script, config=config, settle=True, timeout=100
    )
    assert s.run.final_message == script.final_text
    assert [a.step for a in script.answers][-1] == STEPS
    return s


def heavy(k: int) -> str:
    """A command printing ~6.5 KB (~1.6k tokens as the fake bills it)."""
    return f"echo step {k}; seq 1 1500"


def test_codex_never_compacts_behind_the_codex_preset(codex, fake, tmp_path, proxies):
    proxy = proxies(start(fake, tmp_path / "proxy", "codex"))
    s = drive(codex, fake, proxy, tmp_path, {"model_context_window": WINDOW})

    assert s.script.compactions == []
    assert not any(t.compaction for t in s.turns)
    assert {request_kind(t.got) for t in s.turns} == {"turn"}
    # Codex's own history grew past its threshold: without the proxy it would have compacted
    # (the control test below shows it does) ...
    assert max(len(x.body) // 4 for x in s.sent) > THRESHOLD
    # ... but every context it was told about (the usage of what the provider got) stayed below.
    assert len(s.sent) == STEPS + 1
    assert max(len(t.got.body) // 4 for t in s.turns) < THRESHOLD
    outcomes = [t.outcome for t in s.turns]
    assert outcomes.count("rewritten") >= 3, outcomes
    assert {t.cg.get("preset") for t in s.turns} == {"codex"}
    stats = proxy.stats()
    assert stats["summaries"]["completed"] >= 1
    assert (stats["failed_open"], stats["retried_original"]) == (0, 0)


def test_control_the_same_session_without_the_proxy_acting_makes_codex_compact(
    codex, fake, tmp_path, proxies
):
    proxy = proxies(start(fake, tmp_path / "proxy", "off"))
    s = drive(codex, fake, proxy, tmp_path, {"model_context_window": WINDOW})

    assert s.script.compactions, "Codex never compacted: the first test proves nothing"
    at = next(i for i, t in enumerate(s.turns) if t.compaction)
    assert request_kind(s.turns[at].got) == "compaction"
    # It compacted once its context (the last answer's usage and its estimate of the output it
    # just got) reached the threshold: within a step (~2.2k tokens) of it; Codex counts text,
    # the fake bills JSON bytes, so the turn that crossed it may be a little over.
    before = len(s.turns[at - 1].got.body) // 4
    assert THRESHOLD - STEP < before < THRESHOLD + STEP, before
    assert len(s.turns[at - 2].got.body) // 4 < THRESHOLD
    assert all(t.outcome == "passed_through" for t in s.turns)


def test_codex_compaction_request_passes_through_untouched_and_drops_the_checkpoint(
    codex, fake, tmp_path, proxies
):
    """Codex's limit lowered below what the preset keeps it under: Codex compacts while a
    checkpoint is being spliced. Its compaction request reaches the provider byte-identical,
    and no later turn carries the summary of the history it replaced."""
    summarize = low(min_messages=6, resummarize_tokens=1_000_000)
    proxy = proxies(start(fake, tmp_path / "proxy", "codex", summarize))
    config = {"model_context_window": WINDOW, "model_auto_compact_token_limit": 22_000}
    s = drive(codex, fake, proxy, tmp_path, config)

    compactions = [i for i, t in enumerate(s.turns) if t.compaction]
    assert compactions, "Codex never compacted"
    first = compactions[0]
    spliced = [t.summary for t in s.turns[:first] if t.outcome == "rewritten"]
    assert spliced, "no checkpoint was spliced before Codex compacted"
    for i in compactions:
        t = s.turns[i]
        assert t.outcome == "passed_through", t.cg  # the audit checked the bytes
        assert t.got.body == t.sent.body
        assert json.loads(t.got.body)["tools"] == []
    assert not any(t.summary in spliced for t in s.turns[first:]), "a stale summary was spliced"
    stats = proxy.stats()
    assert (stats["failed_open"], stats["retried_original"]) == (0, 0)
