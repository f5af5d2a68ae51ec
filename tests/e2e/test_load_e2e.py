"""Load, bounded for the default suite: 8 concurrent sessions x 12 turns through a real mitmdump
(the full 64 x 50 is `python -m tests.e2e.load`; its figures are in docs/reliability.md)."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.load import SESSION_HEADER, Result, check_isolation, run
from tests.support.fakeprovider import FakeProvider

pytestmark = pytest.mark.e2e


def test_concurrent_sessions_all_succeed_are_summarized_and_never_see_each_other(tmp_path):
    result = run(sessions=8, turns=12, workdir=tmp_path, seconds=120.0)
    assert result.problems() == [], result
    assert result.requests == 8 * 12 and result.failures == []
    s = result.summaries
    assert s["completed"] >= 8 * 2, s  # a first summary and a roll-forward, at least, each
    assert result.stashes_checked >= result.sessions  # every session's markers were resolved
    assert result.rss_mb["samples"] >= 2
    assert result.rss_per_session_mb < 4.0, result.rss_mb


def test_the_isolation_check_sees_a_leak():
    """Vacuity guard: a request carrying another session's tag is reported."""
    with FakeProvider() as fake:
        body = {"messages": [{"role": "user", "content": "Task S001-0000aaaa and S002-0000bbbb"}]}
        with httpx.Client(base_url=fake.url, trust_env=False) as c:
            c.post("/v1/messages", json=body, headers={SESSION_HEADER: "S001-0000aaaa"})
        result = Result(1, 1)
        check_isolation(fake, None, result)
    assert result.leaks and "S002-0000bbbb" in result.leaks[0]
