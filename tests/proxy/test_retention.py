"""cg.proxy.retained: a rewritten turn's retention, measured once its answer is done, in its
decision record, its view and `/_cg/stats` — through the real addon (the real `summarize`
component, a real SQLite store, a fake summarizer whose summary mentions what the test says),
on a transcript whose facts the test controls."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Awaitable
from typing import Any

import pytest
from mitmproxy import http
from mitmproxy.test import tflow, tutils

from cg.proxy import retained
from cg.proxy.addon import META, REDACTED, ContextGuru
from cg.proxy.view import RECORD
from cg.retention.measure import Retention, of_plan
from cg.summarize.component import Summarize
from tests.proxy.pending import finish
from tests.support.summarizing import provider_flow
from tests.support.transcripts import SharedFake

SESSION = "retention-test"
ASK = "Please fix the failing tests in this repository"  # a user fact (20+ characters)
LINT = "Now also check the lint configuration please"  # another, in the tail
SPAN_COMMANDS = ("git status", "pytest -q", "ls tests")  # summarized away
TAIL_COMMAND = "cat setup.cfg"  # kept byte for byte
SUMMARY = "<summary>We ran pytest -q and read the test list.</summary>"  # names one command


def call(i: int, command: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": f"toolu_{i}", "name": "Bash", "input": {"command": command}}
        ],
    }


def result(i: int, out: str) -> dict[str, Any]:
    return {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": out}],
    }


def transcript(
    *more: dict[str, Any], commands: tuple[str, ...] = SPAN_COMMANDS
) -> list[dict[str, Any]]:
    """[ask | 3 commands and their outputs | LINT, a command, its output]: with keep_first 1
    and keep_last 3 the span is messages 1–6."""
    msgs: list[dict[str, Any]] = [{"role": "user", "content": ASK}]
    for i, cmd in enumerate(commands):
        msgs += [call(i, cmd), result(i, f"output {i} " * 40)]
    msgs += [{"role": "user", "content": LINT}, call(9, TAIL_COMMAND), result(9, "[lint]")]
    return [*msgs, *more]


def body(messages: list[dict[str, Any]]) -> bytes:
    doc = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 1024,
        "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}],
        "messages": messages,
    }
    return json.dumps(doc).encode()


def turn(raw: bytes) -> http.HTTPFlow:
    f = provider_flow(raw)
    f.request.headers["x-context-guru-session"] = SESSION
    return f


def answer(status: int = 200) -> http.Response:
    usage = {"input_tokens": 10, "output_tokens": 2}
    doc = {"type": "message", "role": "assistant", "content": [], "usage": usage}
    return tutils.tresp(
        status_code=status,
        content=json.dumps(doc).encode(),
        headers=http.Headers(content_type="application/json"),
    )


async def answered(cg: ContextGuru, f: http.HTTPFlow, status: int = 200) -> None:
    f.response = answer(status)
    cg.responseheaders(f)
    await cg.response(f)


async def summarized(cg: ContextGuru, fake: SharedFake, raw: bytes | None = None) -> None:
    """Turn 1 commissions the summary (sent as it came: nothing measured), which completes."""
    fake.answer = fake.shared_answer = SUMMARY
    f = turn(raw or body(transcript()))
    cg.request(f)
    assert f.metadata[META]["outcome"] == "passed_through", f.metadata[META]
    await answered(cg, f)
    assert await cg.wait_for_summary(SESSION) == "completed"
    assert "retention" not in f.metadata[META]  # a passed-through turn has none
    assert "retention" not in f.metadata[RECORD]


@pytest.fixture
def addon(guru: tuple[ContextGuru, Any]) -> ContextGuru:
    """The addon whose summary message says only what the fake summarizer wrote: the floor
    (which quotes the span's facts in every summary, where this build has it) turned off, so
    what the span loses is the test's to say."""
    cg = guru[0]
    (comp,) = cg.components
    assert isinstance(comp, Summarize)
    for key in ("keep_user_tokens", "keep_artifact_tokens"):
        if key in type(comp.cfg).model_fields:
            setattr(comp.cfg, key, 0)
    return cg


async def test_a_rewritten_turn_records_what_it_kept(addon: ContextGuru, fake: SharedFake) -> None:
    await summarized(addon, fake)
    f = turn(body(transcript()))
    addon.request(f)
    rec = f.metadata[META]
    assert rec["outcome"] == "rewritten" and rec["reason"] == "rewritten", rec
    assert rec["components"][0]["checkpoint"]["covered"] == [1, 7]
    assert "retention" not in rec  # not on the request's path
    await answered(addon, f)
    got = rec["retention"]
    # user: both kept (head, tail); command: "pytest -q" in the summary, "cat setup.cfg" kept.
    assert got["by_kind"] == {
        "user": {"visible": 2, "facts": 2},
        "command": {"visible": 2, "facts": 4},
    }
    assert (got["facts"], got["visible"], got["ratio"]) == (6, 4, round(4 / 6, 4))
    assert sorted(x["text"] for x in got["lost"]) == ["git status", "ls tests"]
    assert {x["kind"] for x in got["lost"]} == {"command"}
    assert f.response is not None and f.response.status_code == 200


def rewritten(cg: ContextGuru, raw: bytes | None = None) -> http.HTTPFlow:
    f = turn(raw or body(transcript()))
    cg.request(f)
    assert f.metadata[META]["outcome"] == "rewritten", f.metadata[META]  # vacuity
    return f


def control(cg: ContextGuru, path: str) -> http.Response:
    req = tutils.treq(method=b"GET", path=path.encode(), host="proxy.test", content=b"")
    f = tflow.tflow(req=req)
    f.client_conn.peername = ("127.0.0.1", 50000)
    finish(cg.request(f))
    assert f.response is not None and f.response.status_code == 200
    return f.response


async def test_the_view_shows_it_per_kind_with_the_lost_facts(
    addon: ContextGuru, fake: SharedFake
) -> None:
    await summarized(addon, fake)
    f = rewritten(addon)
    view = addon.views[0]
    before = "\n".join(x for _, x in view_lines(view, f))
    assert "retention: measured once the answer is done" in before
    await answered(addon, f)
    rec = f.metadata[RECORD]
    assert rec["retention"] == {
        "ratio": round(4 / 6, 4),
        "facts": 6,
        "visible": 4,
        "by_kind": {"user": {"visible": 2, "facts": 2}, "command": {"visible": 2, "facts": 4}},
    }
    assert "lost" not in rec["retention"]  # the text's one copy is the decision record's
    assert f.comment.startswith("cg: rewritten 10→5 messages")
    assert "67% of 6 facts retained" in f.comment
    lines = view_lines(view, f)
    text = "\n".join(x for _, x in lines)
    assert lines[0][1] == f.comment
    assert "retention 67%: 4 of the client's 6 facts visible in the request sent" in text
    assert "(user 2/2, command 2/4)" in text
    assert "command: git status" in text and "command: ls tests" in text


def view_lines(view: Any, f: http.HTTPFlow) -> list[tuple[str, str]]:
    _, lines = view(f.request.content or b"", flow=f, http_message=f.request)
    return [(line[0][0], "".join(str(t) for _, t in line)) for line in lines]


async def test_stats_and_the_dashboard_aggregate_the_turns(
    addon: ContextGuru, fake: SharedFake
) -> None:
    await summarized(addon, fake)
    await answered(addon, rewritten(addon))  # 4 of 6
    more = [
        {"role": "assistant", "content": "Checked."},
        {"role": "user", "content": "Thanks, now run the whole suite once more"},
    ]
    f3 = rewritten(addon, body(transcript(*more)))
    await answered(addon, f3)
    assert f3.metadata[META]["retention"]["by_kind"]["user"] == {"visible": 3, "facts": 3}
    stats = json.loads(control(addon, "/_cg/stats").content or b"")
    first, second = 4 / 6, 5 / 7
    assert stats["retention"] == {
        "turns": 2,
        "mean": round((first + second) / 2, 4),
        "min": round(first, 4),
        "by_kind": {"user": 1.0, "file": None, "command": 0.5, "error": None},
        "failed": 0,
    }
    page = (control(addon, "/_cg/").content or b"").decode()
    shown = dict(re.findall(r'data-figure="(retention[^"]*)" data-value="([^"]*)"', page))
    assert shown == {
        "retention.turns": "2",
        "retention.mean": str(stats["retention"]["mean"]),
        "retention.min": str(stats["retention"]["min"]),
        "retention.by_kind.user": "1.0",
        "retention.by_kind.file": "",
        "retention.by_kind.command": "0.5",
        "retention.by_kind.error": "",
    }
    assert "66.7%" in page and "none" in page


async def test_a_failing_measurement_says_why_and_the_answer_goes_on(
    addon: ContextGuru, fake: SharedFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    await summarized(addon, fake)

    def broken(index: Any, plan: Any) -> Retention:
        raise RuntimeError("no facts today")

    monkeypatch.setattr(retained, "of_plan", broken)
    f = rewritten(addon)
    await answered(addon, f)
    assert f.metadata[META]["retention"] == {"error": "RuntimeError: no facts today"}
    assert f.response is not None and f.response.status_code == 200
    assert f.metadata[META]["ledger"]["rounds"] == 1  # the answer was booked all the same
    counts = addon.stats.retention.to_json()
    assert (counts["turns"], counts["failed"], counts["mean"]) == (0, 1, None)
    assert f.metadata[RECORD]["retention"] == {"error": "RuntimeError: no facts today"}
    text = "\n".join(x for _, x in view_lines(addon.views[0], f))
    assert "retention: not measured (RuntimeError: no facts today)" in text


async def test_an_error_status_and_a_failed_flow_are_measured_once(
    addon: ContextGuru, fake: SharedFake
) -> None:
    await summarized(addon, fake)
    f = rewritten(addon)
    await answered(addon, f, 529)  # the provider overloaded: the request still went
    assert f.metadata[META]["retention"]["visible"] == 4
    g = rewritten(addon)
    g.error = tflow.terr()
    assert addon.error(g) is None  # little to read: measured on the loop, at once
    assert g.metadata[META]["retention"]["visible"] == 4
    g.error = tflow.terr()
    assert addon.error(g) is None  # a second error finds the turn taken
    assert addon.stats.retention.turns == 2


async def test_the_measurement_runs_in_the_worker_while_the_answer_streams(
    addon: ContextGuru, fake: SharedFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the answer's headers on, in the worker thread, so the answer's hook finds it done
    (or waits for it); a flow that failed before any answer is measured by its error hook: on
    the loop within the loop's limits, past them in the worker (awaited)."""
    await summarized(addon, fake)
    threads: list[str] = []
    loop_thread = threading.current_thread().name

    def spy(index: Any, plan: Any) -> Retention:
        threads.append(threading.current_thread().name)
        return of_plan(index, plan)

    monkeypatch.setattr(retained, "of_plan", spy)
    f = rewritten(addon)
    f.response = answer(200)
    addon.responseheaders(f)
    st = addon.rt.flows.get(f.id)
    assert st is not None and st.retention is not None  # begun at the headers
    await st.retention
    assert "retention" not in f.metadata[META]  # recorded by the answer's hook
    await addon.response(f)
    assert f.metadata[META]["retention"]["visible"] == 4
    assert threads == ["cg-large-body_0"]
    g = rewritten(addon)
    g.error = tflow.terr()  # no answer: no headers
    assert addon.error(g) is None and g.metadata[META]["retention"]["visible"] == 4
    assert threads[-1] == loop_thread
    monkeypatch.setattr(retained, "INLINE", (-1, -1))  # every measurement past them
    h = rewritten(addon)
    h.error = tflow.terr()
    pending = addon.error(h)
    assert isinstance(pending, Awaitable) and "retention" not in h.metadata[META]
    await pending
    assert h.metadata[META]["retention"]["visible"] == 4
    assert threads[-1] == "cg-large-body_0"
    assert addon.stats.retention.turns == 3
    assert h.id not in addon.live  # the redactor's error hook ran after it


async def test_a_lost_fact_never_carries_a_credential(addon: ContextGuru, fake: SharedFake) -> None:
    key = "tenant-key-0123456789"
    commands = (
        f"curl -H 'x-api-key: {key}' https://example.test",
        "export OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuvwxyz0123",
        "ls tests",
    )
    raw = body(transcript(commands=commands))
    await summarized(addon, fake, raw)
    f = turn(raw)
    f.request.headers["x-api-key"] = key
    addon.request(f)
    assert f.metadata[META]["outcome"] == "rewritten"
    await answered(addon, f)
    lost = [x["text"] for x in f.metadata[META]["retention"]["lost"]]
    assert len(lost) == 3  # vacuity: the commands that quote a key were lost
    joined = json.dumps(f.metadata)
    assert key not in joined and "sk-proj-abcdefghijklmnop" not in joined
    assert f"curl -H 'x-api-key: {REDACTED}' https://example.test" in lost
    assert f"export OPENAI_API_KEY={REDACTED}" in lost


async def test_turns_that_keep_every_message_are_not_measured(
    guru: tuple[ContextGuru, Any], fake: SharedFake
) -> None:
    """Bypassed: sent as it came. The expand tool alone appended: `rewritten`, but every
    message kept (1 by construction), so neither is recorded nor counted."""
    addon, tctx = guru
    f = turn(body(transcript()))
    f.request.headers["x-context-guru-bypass"] = "1"
    addon.request(f)
    assert f.metadata[META]["outcome"] == "bypassed"
    await answered(addon, f)
    tctx.configure(addon, cg_expand_inject="always")
    g = turn(body(transcript()))
    addon.request(g)
    rec = g.metadata[META]
    assert (rec["outcome"], rec["reason"]) == ("rewritten", "expand tool injected"), rec
    await answered(addon, g)
    assert "ledger" in rec  # vacuity: the answer's hooks ran for it
    assert "retention" not in rec and "retention" not in f.metadata[META]
    assert addon.stats.retention.to_json()["turns"] == 0
