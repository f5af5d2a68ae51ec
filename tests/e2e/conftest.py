"""Fixtures for end-to-end tests: one fake provider and one `off`-preset mitmdump per session,
and the pinned Claude Code, Codex, opencode and Gemini CLI binaries (installed on first use,
tests/e2e/claude_code.py, tests/e2e/codex.py, tests/e2e/opencode.py, tests/e2e/gemini_cli.py).

Tests that need another preset or options start their own with `Proxy.start(...)` and stop it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e import codex as codex_cli
from tests.e2e import gemini_cli
from tests.e2e import opencode as opencode_cli
from tests.e2e.claude_code import ClaudeCodeUnavailable, install
from tests.e2e.harness import Proxy
from tests.support.fakeprovider import FakeProvider


@pytest.fixture(scope="session")
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as p:
        yield p


@pytest.fixture(autouse=True)
def _unscripted(provider: FakeProvider) -> Iterator[None]:
    """A reply a test scripted but never used must not leak into the next test."""
    yield
    provider.clear_script()


@pytest.fixture(scope="session")
def proxy(provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    with Proxy.start(provider.url, tmp_path_factory.mktemp("proxy-off")) as p:
        yield p


@pytest.fixture(scope="session")
def claude_code() -> Path:
    """The pinned Claude Code binary; a test run that cannot install it fails, saying why."""
    try:
        return install()
    except ClaudeCodeUnavailable as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="session")
def codex() -> Path:
    """The pinned Codex binary; a test run that cannot install it fails, saying why."""
    try:
        return codex_cli.install()
    except codex_cli.CodexUnavailable as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="session")
def opencode() -> Path:
    """The pinned opencode binary; a test run that cannot install it fails, saying why."""
    try:
        return opencode_cli.install()
    except opencode_cli.OpencodeUnavailable as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="session")
def gemini() -> Path:
    """The pinned Gemini CLI; a test run that cannot install it fails, saying why."""
    try:
        return gemini_cli.install()
    except gemini_cli.GeminiCliUnavailable as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture
def proxies() -> Iterator[Callable[[Proxy], Proxy]]:
    """Register a proxy a test started (and get it back): stopped (by PID) at the end, its log
    free of errors."""
    started: list[Proxy] = []

    def keep(p: Proxy) -> Proxy:
        started.append(p)
        return p

    yield keep
    for p in started:
        p.stop()
    for p in started:
        assert not p.addon_errors(), p.log_text()
