"""cg.proxy.runtime: `configure` remakes only what the changed options describe, a pipeline it
must rebuild keeps the summaries in flight, and the store's retry reopens the store without
going through `configure`.

The addon runs in mitmproxy's test context with the real `summarize` component and a real
SQLite store; only the summarizer is an in-process fake.
"""

from __future__ import annotations

import warnings

from mitmproxy import http

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from mitmproxy.test import tutils

from cg.proxy.addon import META, ContextGuru
from cg.proxy.runtime import Runtime
from cg.summarize.component import Summarize
from tests.support.summarizing import provider_flow


def flow() -> http.HTTPFlow:
    return provider_flow()


def in_flight(cg: ContextGuru) -> tuple[http.HTTPFlow, str, Summarize]:
    """A turn that commissioned a summary, still waiting for its answer to begin."""
    f = flow()
    cg.request(f)
    assert cg.stats.summaries.commissioned == 1, f.metadata[META]  # the guard: one in flight
    (comp,) = cg.components
    assert isinstance(comp, Summarize) and comp.inflight
    return f, f.metadata[META]["session"], comp


async def finish(cg: ContextGuru, f: http.HTTPFlow, session: str) -> None:
    f.response = tutils.tresp(status_code=200)
    cg.responseheaders(f)
    assert await cg.wait_for_summary(session) == "completed"


async def test_an_option_outside_the_pipeline_leaves_it_and_its_summary_in_flight(guru):
    cg, tctx = guru
    f, session, comp = in_flight(cg)
    held = set(comp.inflight)
    tctx.configure(
        cg, cg_hosts=["api.anthropic.com"], cg_redact_credentials=False, cg_max_messages=5000
    )
    assert cg.components[0] is comp and comp.inflight == held
    assert cg.rt.max_messages == 5000 and not cg.rt.redact and cg.rt.hosts
    await finish(cg, f, session)
    assert comp.inflight == set()


async def test_a_rebuilt_pipeline_keeps_the_summaries_in_flight(guru):
    cg, tctx = guru
    f, session, comp = in_flight(cg)
    held = set(comp.inflight)
    tctx.configure(cg, cg_shared=True)  # an option the pipeline is built with
    (new,) = cg.components
    assert new is not comp and isinstance(new, Summarize)
    assert new.inflight == held
    again = flow()
    cg.request(again)  # the same session's next turn: no second summary while one is in flight
    assert cg.stats.summaries.commissioned == 1
    assert again.metadata[META]["components"][0]["commission"] == (
        "a summary for this session is already in flight"
    )
    await finish(cg, f, session)
    assert new.inflight == set()  # the job, ended on the old component, freed the session


async def test_the_store_retry_reopens_the_store_and_not_through_configure(guru, monkeypatch):
    cg, _ = guru
    f, session, comp = in_flight(cg)
    held = set(comp.inflight)
    calls: list[set[str]] = []
    monkeypatch.setattr(Runtime, "configure", lambda self, updated: calls.append(updated))
    rt = cg.rt
    before = rt.store
    rt.store_error, rt._store_retry_at = "the file was locked", 0.0  # failed, due for a retry
    turn = flow()
    cg.request(turn)
    assert calls == []
    assert rt.store_error is None and rt.store is not before  # reopened
    (new,) = cg.components
    assert isinstance(new, Summarize) and new.store is rt.store  # rebuilt on the new store
    assert new.inflight == held
    assert "components" in turn.metadata[META], turn.metadata[META]  # the pipeline ran on it
    f.response = tutils.tresp(status_code=200)
    cg.responseheaders(f)
    # (the job writes to the store it began with, closed by the reopen: it fails, as it did)
    assert await cg.wait_for_summary(session) in ("completed", "failed")
    assert new.inflight == set()  # ended, whatever its outcome: the session is free again
