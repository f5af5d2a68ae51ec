"""cg.summarize.component: which request writes a summary
(docs/behaviour.md#summarize-the-summarizer-call) — the shared-cache call, its one fallback to the
standalone prompt, or the standalone prompt alone — and when the shared call may go (once the
commissioning answer has begun).

Jobs come from the real hot path (`rewrite_body` with the component, over grown Claude Code
captures); the summarizer is an in-process fake with both requests, so each test can see which
one ran, with what, and in what order.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cg.state.sqlite import SqliteStore
from cg.summarize.component import (
    Commission,
    SharedSummarizer,
    SummarizerError,
    SummarizerRefused,
    SummarizerTimeout,
)
from tests.support.shared_request import split_shared
from tests.support.transcripts import (
    CC16,
    FakeSummarizer,
    SharedFake,
    cc_dumps,
    config,
    fixture_body,
    grow,
    make,
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(tmp_path / "cg.sqlite3")
    yield s
    s.close()


RAW = cc_dumps(grow(fixture_body(CC16), 3)[-1])


def job_for(
    store: SqliteStore, fake: SharedFake, raw: bytes = RAW, **cfg: Any
) -> tuple[Any, Commission]:
    """(driver, its one commission) with the forwarded body handed over as the addon does."""
    d = make(config(**cfg), store, summarizer=fake, session=uuid.uuid4().hex)
    d.send(raw)
    assert len(d.pending) == 1, "the trigger did not fire"
    job = d.pending.pop()
    job.forwarded = raw
    return d, job


def run(d: Any, job: Commission) -> str:
    return str(asyncio.run(d.component.complete(job, d.summarizer)))


def test_the_fake_is_a_shared_summarizer_and_the_plain_one_is_not():
    assert isinstance(SharedFake(), SharedSummarizer)
    assert not isinstance(FakeSummarizer(), SharedSummarizer)


def test_auto_with_incoming_takes_the_shared_path(store):
    fake = SharedFake()
    d, job = job_for(store, fake)
    assert run(d, job) == "completed"
    assert job.path == "shared" and job.note == ""
    assert fake.calls == []  # no standalone prompt at all
    ((body, _),) = fake.shared_calls
    ask, changed = split_shared(RAW, body, "anthropic")
    assert changed == {} and "<summary>" in ask["content"]
    assert store.get_checkpoint(job.conversation).summary == "the shared summary"
    assert job.forwarded is None and job.origin is None  # dropped when the job ends


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (None, "held no <summary>"),  # e.g. only tool calls
        ("I will run the tests first.", "held no <summary>"),
        (SummarizerRefused("HTTP 400"), "refused the shared request: HTTP 400"),
    ],
)
def test_no_summary_in_the_shared_answer_falls_back_once(store, answer, why):
    fake = SharedFake(shared_answer=answer)
    d, job = job_for(store, fake)
    assert run(d, job) == "completed"
    assert (job.path, len(fake.shared_calls), len(fake.calls)) == ("fallback", 1, 1)
    assert why in job.note
    assert "<conversation>" in fake.calls[0][0]  # the standalone prompt
    assert store.get_checkpoint(job.conversation).summary.startswith("summary #1")


def test_a_blank_fallback_is_a_blank_no_op_not_a_second_fallback(store):
    fake = SharedFake(answer=None, shared_answer=None)
    d, job = job_for(store, fake)
    assert run(d, job) == "blank"
    assert (job.path, len(fake.shared_calls), len(fake.calls)) == ("fallback", 1, 1)
    assert store.get_checkpoint(job.conversation) is None


@pytest.mark.parametrize(
    ("error", "outcome"),
    [(SummarizerError("HTTP 503"), "failed"), (SummarizerTimeout("90 s"), "timed_out")],
)
def test_a_failing_shared_call_is_counted_like_any_summarizer_failure(store, error, outcome):
    fake = SharedFake(shared_answer=error)
    d, job = job_for(store, fake)
    assert run(d, job) == outcome
    assert job.path == "shared" and fake.calls == []  # no second call on a 5xx or a timeout


@pytest.mark.parametrize(
    ("model", "why"),
    [
        ({"share_cache": "never"}, "share_cache: never"),
        ({"source": "config", "model": "cheap"}, "model.source: config"),
        ({"model": "another-model"}, "model.model names another model"),
    ],
)
def test_the_standalone_path(store, model, why):
    fake = SharedFake()
    d, job = job_for(store, fake, model=model)
    assert run(d, job) == "completed"
    assert job.path == "standalone" and why in job.note
    assert fake.shared_calls == [] and len(fake.calls) == 1


def test_the_standalone_path_without_a_forwarded_body_or_a_shared_summarizer(store):
    fake = SharedFake()
    d, job = job_for(store, fake)
    job.forwarded = None
    assert run(d, job) == "completed" and job.path == "standalone"
    plain = FakeSummarizer()
    d, job = job_for(store, SharedFake())
    assert str(asyncio.run(d.component.complete(job, plain))) == "completed"
    assert job.path == "standalone" and len(plain.calls) == 1


def test_model_model_naming_the_requests_own_model_still_shares(store):
    fake = SharedFake()
    d, job = job_for(store, fake, model={"model": json.loads(RAW)["model"]})
    assert run(d, job) == "completed" and job.path == "shared"


# -- when: once the commissioning answer has begun ----------------------------------------------


async def _until_blocked(task: asyncio.Task[Any]) -> None:
    """Let the loop run the job until it blocks (yields only: no time passes)."""
    for _ in range(20):
        await asyncio.sleep(0)
    assert not task.done()


def test_the_shared_call_waits_for_the_commissioning_answer_to_begin(store):
    fake = SharedFake()
    d, job = job_for(store, fake)

    async def scenario() -> str:
        job.began = asyncio.Event()
        task = asyncio.create_task(d.component.complete(job, fake))
        await _until_blocked(task)
        assert fake.shared_calls == [], "the shared call went before the answer began"
        job.answer_began(200)
        return str(await task)

    assert asyncio.run(scenario()) == "completed"
    assert fake.seen == [True] and job.path == "shared"


@pytest.mark.parametrize(
    ("status", "why"),
    [(500, "answer was 500"), (None, "answer was an error"), ("never", "did not begin within 0s")],
)
def test_auto_takes_the_standalone_path_when_nothing_was_cached(store, status, why):
    fake = SharedFake()
    d, job = job_for(store, fake)
    d.component.answer_wait = 0.0
    job.began = asyncio.Event()
    if status != "never":
        job.answer_began(status)
    assert run(d, job) == "completed"
    assert job.path == "standalone" and why in job.note
    assert fake.shared_calls == []


@pytest.mark.parametrize("status", [500, None, "never"])
def test_always_shares_even_when_nothing_was_cached(store, status):
    fake = SharedFake()
    d, job = job_for(store, fake, model={"share_cache": "always"})
    d.component.answer_wait = 0.0
    job.began = asyncio.Event()
    if status != "never":
        job.answer_began(status)
    assert run(d, job) == "completed"
    assert job.path == "shared" and len(fake.shared_calls) == 1


def test_an_anthropic_request_without_a_breakpoint_is_standalone_under_auto(store):
    """Nothing was cached: the shared call would pay the whole transcript at full price."""
    raw = RAW.replace(b',"cache_control":{"type":"ephemeral"}', b"")
    assert b"cache_control" not in raw and b"cache_control" in RAW
    fake = SharedFake()
    d, job = job_for(store, fake, raw)
    assert run(d, job) == "completed"
    assert job.path == "standalone" and "no cache_control" in job.note
    fake = SharedFake()
    d, job = job_for(store, fake, raw, model={"share_cache": "always"})
    assert run(d, job) == "completed" and job.path == "shared"


def test_a_forced_tool_choice_is_standalone_under_auto_and_shared_under_always(store):
    body = grow(fixture_body(CC16), 3)[-1]
    body["tool_choice"] = {"type": "any"}
    raw = cc_dumps(body)
    fake = SharedFake()
    d, job = job_for(store, fake, raw)
    assert run(d, job) == "completed"
    assert job.path == "standalone" and "tool_choice forces" in job.note
    fake = SharedFake()
    d, job = job_for(store, fake, raw, model={"share_cache": "always"})
    assert run(d, job) == "completed" and job.path == "shared"
