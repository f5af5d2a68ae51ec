"""cg.proxy.addon: the shared-cache summarizer gets the body as forwarded upstream and waits for its
commissioning flow's answer to begin (`responseheaders`), or for the flow's `error`, bounded.

The addon runs in mitmproxy's test context with the real `summarize` component; only the
summarizer is an in-process fake, so the test sees what the job was handed and when it ran.
"""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import pytest
from mitmproxy import http

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from mitmproxy.test import tflow, tutils

from cg.proxy.addon import META, ContextGuru
from cg.summarize.component import Summarize
from tests.support.shared_request import split_shared
from tests.support.summarizing import RAW, provider_flow
from tests.support.transcripts import CC16, cc_dumps, fixture_body, grow


@pytest.fixture
def addon(guru: tuple[ContextGuru, Any]) -> ContextGuru:
    return guru[0]


def flow(raw: bytes = RAW) -> http.HTTPFlow:
    return provider_flow(raw)


def commissioned(cg: ContextGuru, f: http.HTTPFlow) -> tuple[str, asyncio.Task[str]]:
    cg.request(f)
    assert cg.stats.summaries.commissioned == 1, f.metadata[META]
    session = f.metadata[META]["session"]
    return session, cg.tasks[session]


async def until_blocked(task: asyncio.Task[Any]) -> None:
    """Let the loop run the job until it blocks (yields only: no time passes)."""
    for _ in range(20):
        await asyncio.sleep(0)
    assert not task.done()


async def test_the_job_waits_for_responseheaders_then_sends_the_forwarded_body(addon, fake):
    f = flow()
    session, task = commissioned(addon, f)
    assert f.id in addon.awaiting
    await until_blocked(task)
    assert fake.shared_calls == [], "the summarizer call went before the answer began"
    f.response = tutils.tresp(status_code=200)
    addon.responseheaders(f)
    assert await addon.wait_for_summary(session) == "completed"
    assert fake.seen == [True]
    ((body, job),) = fake.shared_calls
    split_shared(f.request.get_content() or b"", body, "anthropic")  # built on what went upstream
    assert job.forwarded is None and job.origin is None  # dropped with the job
    assert addon.awaiting == {}
    s = addon.stats.summaries
    assert (s.completed, s.shared, s.fallback, s.standalone) == (1, 1, 0, 0)


async def test_a_failed_flow_releases_the_job_to_the_standalone_path(addon, fake):
    f = flow()
    session, task = commissioned(addon, f)
    await until_blocked(task)
    f.error = tflow.terr()
    addon.error(f)
    assert await addon.wait_for_summary(session) == "completed"
    assert fake.shared_calls == [] and len(fake.calls) == 1
    assert (addon.stats.summaries.standalone, addon.stats.summaries.shared) == (1, 0)
    assert addon.awaiting == {}


async def test_a_flow_that_never_answers_cannot_hold_the_job(addon, fake):
    (comp,) = addon.components
    assert isinstance(comp, Summarize)
    comp.answer_wait = 0.0  # the bound, reached at once
    f = flow()
    session, _ = commissioned(addon, f)
    assert await addon.wait_for_summary(session) == "completed"
    assert len(fake.calls) == 1 and addon.stats.summaries.standalone == 1
    assert addon.awaiting == {}  # the job ended: its entry went with it
    f.response = tutils.tresp(status_code=200)
    addon.responseheaders(f)  # a late answer finds nothing to release


async def test_a_rewritten_turn_hands_over_the_rewritten_body(addon, fake):
    """Turn 2 splices the checkpoint and, past resummarize_tokens, commissions a roll-forward:
    the job gets the spliced body (what the provider caches), not the client's."""
    turns = grow(fixture_body(CC16), 12, output_words=200)
    (comp,) = addon.components
    assert isinstance(comp, Summarize)
    comp.cfg.resummarize_tokens = 500
    f1 = flow(cc_dumps(turns[0]))
    session, _ = commissioned(addon, f1)
    f1.response = tutils.tresp(status_code=200)
    addon.responseheaders(f1)
    assert await addon.wait_for_summary(session) == "completed"
    f2 = flow(cc_dumps(turns[-1]))
    addon.request(f2)
    assert f2.metadata[META]["outcome"] == "rewritten"
    assert addon.stats.summaries.commissioned == 2
    f2.response = tutils.tresp(status_code=200)
    addon.responseheaders(f2)
    assert await addon.wait_for_summary(session) == "completed"
    body, _ = fake.shared_calls[-1]
    ask, changed = split_shared(f2.request.get_content() or b"", body, "anthropic")
    assert changed == {}
    assert "includes an earlier summary" in ask["content"]
    assert addon.stats.summaries.shared == 2
