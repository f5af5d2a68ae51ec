"""cg.pipeline.rewrite: index -> pipeline -> splice -> validate, failing open on anything at all."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given

from cg.pipeline.contract import RequestContext, Step
from cg.pipeline.rewrite import rewrite_body
from cg.pipeline.runner import run_pipeline
from cg.wire.body import BodyIndex, index_body
from cg.wire.dialects import ANTHROPIC, DIALECTS, OPENAI, Dialect
from cg.wire.shape import validate_shape
from cg.wire.splice import Insert, Keep, Plan
from tests.support.strategies import SETTINGS, Sample, bodies


@dataclass
class Toy:
    """A component from a function of (index, plan) -> plan | None."""

    name: str
    fn: Callable[[BodyIndex, Plan], Plan | None]
    calls: int = 0

    def apply(self, req: RequestContext, plan: Plan) -> Step:
        index = req.index
        self.calls += 1
        new = self.fn(index, plan)
        return Step(new, "acted" if new is not None else "skipped", {"seen": len(plan)})


SUMMARY = {"role": "user", "content": "=== History Summary === the story so far <<cg:k1>>"}


def summarize_middle(keep_last: int = 2, role: str = "user") -> Toy:
    def fn(index: BodyIndex, plan: Plan) -> Plan | None:
        n = len(index.messages)
        if n < keep_last + 2:
            return None
        summary = Insert.message({**SUMMARY, "role": role}, index.dialect)
        return [Keep(0), summary, *(Keep(i) for i in range(n - keep_last, n))]

    return Toy("summarize", fn)


def raiser() -> Toy:
    def fn(index: BodyIndex, plan: Plan) -> Plan | None:
        raise RuntimeError("boom")

    return Toy("raiser", fn)


def body(msgs: list[Any], **extra: Any) -> bytes:
    return json.dumps({"model": "m", "messages": msgs, **extra}, indent=1).encode()


CHAT = [
    {"role": "user", "content": "task"},
    {"role": "assistant", "content": "a1"},
    {"role": "user", "content": "u2"},
    {"role": "assistant", "content": "a3"},
    {"role": "user", "content": "u4"},
    {"role": "assistant", "content": "a5"},
    {"role": "user", "content": "u6 ☃"},
]


def test_a_component_that_cuts_the_middle_and_inserts_a_summary() -> None:
    raw = body(CHAT, system="sys", max_tokens=5)
    r = rewrite_body(raw, ANTHROPIC, [summarize_middle()])
    assert r.outcome == "rewritten" and r.body is not None
    out = json.loads(r.body)
    assert out["messages"] == [CHAT[0], SUMMARY, CHAT[5], CHAT[6]]
    assert {k: v for k, v in out.items() if k != "messages"} == {
        "model": "m",
        "system": "sys",
        "max_tokens": 5,
    }
    src = index_body(raw, ANTHROPIC)
    new = index_body(r.body, ANTHROPIC)
    assert new.source(0) == src.source(0)
    assert new.source(2) == src.source(5) and new.source(3) == src.source(6)
    rec = r.record
    assert (rec["messages_in"], rec["messages_out"], rec["reason"]) == (7, 4, "rewritten")
    assert rec["components"] == [
        {"component": "summarize", "acted": True, "reason": "acted", "seen": 7}
    ]
    assert "input_violations" not in rec and "violations" not in rec
    assert set(rec["timings_ms"]) >= {"index", "pipeline", "splice", "validate", "total"}


def test_a_raising_component_is_reverted_alone() -> None:
    first, boom, last = summarize_middle(), raiser(), Toy("noop", lambda i, p: None)
    r = rewrite_body(body(CHAT), ANTHROPIC, [first, boom, last])
    assert boom.calls == 1 and last.calls == 1  # the pipeline went on after the error
    assert r.outcome == "rewritten"
    assert r.body is not None and len(json.loads(r.body)["messages"]) == 4
    assert r.record["components"][1] == {
        "component": "raiser",
        "acted": False,
        "error": "RuntimeError: boom",
    }
    assert r.record["components"][2]["seen"] == 4  # the later one saw the first one's plan


def test_only_a_raising_component_passes_through() -> None:
    r = rewrite_body(body(CHAT), OPENAI, [raiser()])
    assert (r.outcome, r.body, r.record["reason"]) == ("passed_through", None, "no component acted")


def test_a_component_returning_the_identity_plan_did_not_act() -> None:
    toy = Toy("same", lambda i, p: list(p))
    r = rewrite_body(body(CHAT), ANTHROPIC, [toy])
    assert toy.calls == 1
    assert (r.outcome, r.body) == ("passed_through", None)
    assert r.record["components"][0]["acted"] is True


def test_a_rewrite_that_introduces_a_violation_fails_open() -> None:
    r = rewrite_body(body(CHAT), ANTHROPIC, [summarize_middle(keep_last=1, role="system")])
    assert r.outcome == "failed_open" and r.body is None
    assert r.record["violations"] == [
        {
            "index": 1,
            "rule": "system-position",
            "message": "messages.1: role 'system' must precede an 'assistant' message or end the array",
        }
    ]
    assert r.record["reason"].startswith("rewrite introduced system-position: messages.1")


@pytest.mark.parametrize("dialect", [ANTHROPIC, OPENAI])
def test_cutting_a_tool_call_but_keeping_its_result_fails_open(dialect: Dialect) -> None:
    call: dict[str, Any]
    result: dict[str, Any]
    if dialect is ANTHROPIC:
        call = {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "x", "input": {}}],
        }
        result = {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "r"}],
        }
    else:
        call = {"role": "assistant", "content": None, "tool_calls": [{"id": "t1", "function": {}}]}
        result = {"role": "tool", "tool_call_id": "t1", "content": "r"}
    msgs = [
        *CHAT[:3],
        call,
        result,
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "u"},
    ]
    r = rewrite_body(body(msgs), dialect, [summarize_middle(keep_last=3)])
    assert r.outcome == "failed_open"
    assert [v["rule"] for v in r.record["violations"]] == ["paired-tool-result"]
    assert r.record["violations"][0]["index"] == 2
    assert "input_violations" not in r.record


def test_a_tool_role_sent_to_anthropic_fails_open_on_the_bytes() -> None:
    def fn(index: BodyIndex, plan: Plan) -> Plan:
        bad = Insert.message({"role": "tool", "tool_call_id": "x", "content": "r"}, ANTHROPIC)
        return [*plan, bad]

    r = rewrite_body(body(CHAT), ANTHROPIC, [Toy("tool-role", fn)])
    assert r.outcome == "failed_open" and r.body is None
    assert [(v["index"], v["rule"]) for v in r.record["violations"]] == [(7, "wire-role")]


def test_an_exception_in_the_splice_fails_open() -> None:
    r = rewrite_body(body(CHAT), ANTHROPIC, [Toy("bad-index", lambda i, p: [Keep(0), Keep(99)])])
    assert r.outcome == "failed_open" and r.body is None
    assert r.record["reason"].startswith("internal error: IndexError")


def test_a_preexisting_violation_is_recorded_not_refused() -> None:
    msgs = [*CHAT[:2], {"role": "system", "content": "s"}, *CHAT[2:]]  # system before a user
    noop = rewrite_body(body(msgs), ANTHROPIC, [])
    assert noop.outcome == "passed_through"
    expected = [
        {
            "index": 2,
            "rule": "system-position",
            "message": noop.record["input_violations"][0]["message"],
        }
    ]
    assert noop.record["input_violations"] == expected

    keeps_it = Toy("keep-violation", lambda i, p: [Keep(0), Keep(1), Keep(2), Keep(7)])
    r = rewrite_body(body(msgs), ANTHROPIC, [keeps_it])
    assert r.outcome == "rewritten" and r.body is not None
    assert r.record["input_violations"] == expected
    assert json.loads(r.body)["messages"] == [msgs[0], msgs[1], msgs[2], msgs[7]]


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"", "empty body"),
        (b"{not json", "malformed JSON"),
        (b'{"messages": [1,]}', "malformed JSON"),
        (b"[]", "not a JSON object"),
        (b"null", "not a JSON object"),
        (b'{"messages": "hi"}', "not an array"),
        (b'{"messages": [1]}', "not an object"),
        (b'{"messages": [{"role": "user", "content": "\xe9t\xe9"}]}', "not UTF-8"),
        (b'{"messages": [{"role": "wizard", "content": "x"}]}', "unknown role 'wizard'"),
        (
            b'{"messages": [{"role": "user", "content": 7}]}',
            "'content' is not a string or an array (got int)",
        ),
        (b'{"model": "m"}', "no 'messages' field"),
    ],
)
@pytest.mark.parametrize("dialect", [ANTHROPIC, OPENAI])
def test_bad_input_passes_through_with_a_reason(
    raw: bytes, fragment: str, dialect: Dialect
) -> None:
    toy = summarize_middle(keep_last=0)
    r = rewrite_body(raw, dialect, [toy])
    assert r.outcome == "passed_through" and r.body is None
    assert fragment in r.record["reason"]
    assert toy.calls == 0  # never reached the pipeline


@pytest.mark.parametrize("at", [0, 3, 6], ids=["head", "span", "tail"])
def test_an_unknown_block_type_anywhere_passes_the_request_through(at: int) -> None:
    """Issue 12: `{"type": "mystery_block"}` in the head, the span or the tail: the request is
    forwarded byte-identical and the record names the block, where it sat in the middle of a
    transcript the same pipeline does summarize without it."""
    msgs: list[Any] = [
        *CHAT[:5],
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "t"},
    ]
    raw = json.dumps({"messages": msgs}, ensure_ascii=True).encode()
    assert rewrite_body(raw, ANTHROPIC, [summarize_middle()]).outcome == "rewritten"  # guard
    msgs[at] = {
        "role": msgs[at]["role"],
        "content": [{"type": "mystery_block", "v": "\u2603"}, {"type": "text", "text": "t"}],
    }
    raw = json.dumps({"messages": msgs}, ensure_ascii=True).encode()
    r = rewrite_body(raw, ANTHROPIC, [summarize_middle()])
    assert r.outcome == "passed_through" and r.body is None
    assert r.record["reason"] == f"messages[{at}]: unknown content block type 'mystery_block'"


@SETTINGS
@given(bodies(min_turns=1))
def test_rewrite_of_any_generated_body_is_valid_or_fails_open(s: Sample) -> None:
    """Generated input is valid, so the outcome is decided by the expected output's shape."""
    d = DIALECTS[s.dialect]
    r = rewrite_body(s.raw, d, [summarize_middle(keep_last=2)])
    n = len(s.messages)
    if n < 4:
        assert (r.outcome, r.body) == ("passed_through", None)
        return
    expected = [s.messages[0], SUMMARY, *s.messages[-2:]]
    problems = validate_shape(expected, d)
    if problems:
        assert (r.outcome, r.body) == ("failed_open", None)
        assert [v["rule"] for v in r.record["violations"]] == [v.rule for v in problems]
        return
    assert r.outcome == "rewritten" and r.body is not None
    out = json.loads(r.body)
    assert out == {**s.body, "messages": expected}
    tail = s.text[index_body(s.raw, d).array.end :]
    assert r.body.decode().endswith(tail)


def test_run_pipeline_records_each_component() -> None:
    idx = index_body(body(CHAT), ANTHROPIC)
    skip = Toy("skip", lambda i, p: None)
    res = run_pipeline([skip, raiser(), summarize_middle()], RequestContext(idx))
    assert [r["component"] for r in res.records] == ["skip", "raiser", "summarize"]
    assert [r["acted"] for r in res.records] == [False, False, True]
    assert res.records[0]["reason"] == "skipped"
    assert len(res.plan) == 4


# --------------------------------------------------------------------------------------------
# The runner's contract: lossy-but-reversible must stay reversible
# --------------------------------------------------------------------------------------------


@dataclass
class Stashing:
    """Cuts the middle and declares which dropped messages it stashed."""

    name: str
    stashed: frozenset[int]

    def apply(self, req: RequestContext, plan: Plan) -> Step:
        n = len(req.index.messages)
        summary = Insert.message(SUMMARY, req.index.dialect)
        new: Plan = [Keep(0), summary, Keep(n - 1)]
        return Step(new, "cut", stash_required=True, stashed=self.stashed)


def test_a_step_that_drops_messages_it_did_not_stash_is_reverted() -> None:
    raw = body(CHAT)
    n = len(json.loads(raw)["messages"])
    assert n >= 4, "vacuity: the cut must drop messages"
    half = frozenset(range(1, n // 2))
    r = rewrite_body(raw, OPENAI, [Stashing("lossy", half)])
    assert r.outcome == "passed_through" and r.body is None
    rec = r.record["components"][0]
    assert rec["acted"] is False and "without stashing" in rec["reverted"]


def test_a_step_that_stashed_everything_it_dropped_is_kept() -> None:
    raw = body(CHAT)
    n = len(json.loads(raw)["messages"])
    r = rewrite_body(raw, OPENAI, [Stashing("reversible", frozenset(range(1, n - 1)))])
    assert r.outcome == "rewritten", r.record
    assert len(json.loads(r.body or b"")["messages"]) == 3
