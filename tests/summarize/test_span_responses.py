"""The span over Responses `input` items: the system prompt kept, `keep_first` counted after it,
no cut between a call and its output (parallel calls included) or a reasoning item and its
successor, an `additional_tools` item never summarized; and orphan repair by call id."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cg.summarize.span import Span, crossings, leading_system, repair_orphans, select_span
from cg.wire.body import index_body
from cg.wire.dialects import RESPONSES
from cg.wire.shape import separated, validate_shape
from cg.wire.splice import Insert, Keep, Plan, plan_sources, plan_views
from tests.support.strategies import SETTINGS, r_message, responses_items
from tests.wire.test_responses import call, fixture, out, reasoning

DEV = r_message("developer", "system prompt")
TOOLS = {"type": "additional_tools", "role": "developer", "tools": [{"type": "function"}]}


def u(t: str) -> dict[str, Any]:
    return r_message("user", t)


def a(t: str) -> dict[str, Any]:
    return r_message("assistant", t)


def span(items: list[Any], keep_first: int, keep_last: int) -> Span | str:
    idx = index_body(json.dumps({"input": items}).encode(), RESPONSES)
    return select_span(idx.views, keep_first, keep_last, "id")


def spliced(items: list[Any], s: Span) -> tuple[Any, Plan]:
    idx = index_body(json.dumps({"input": items}).encode(), RESPONSES)
    summary = Insert.message(RESPONSES.user_message("=== History Summary ==="), RESPONSES)
    plan: Plan = [Keep(i) for i in range(s.head)]
    plan.append(summary)
    plan += [Keep(i) for i in range(s.end, len(items))]
    return idx, plan


def test_keep_first_counts_after_the_leading_system_items() -> None:
    items = [DEV, DEV, u("env"), u("task"), a("1"), u("2"), a("3"), u("4"), a("5"), u("6")]
    assert span(items, 2, 3) == Span(4, 7)
    assert span(items, 0, 3) == Span(2, 7)  # keep_first 0 still keeps the system prompt


def test_an_additional_tools_item_among_the_system_items_is_kept() -> None:
    items = [TOOLS, DEV, u("task"), a("1"), u("2"), a("3"), u("4")]
    idx = index_body(json.dumps({"input": items}).encode(), RESPONSES)
    assert leading_system(idx.views) == 2
    assert span(items, 1, 2) == Span(3, 5)


def test_an_additional_tools_item_in_the_span_refuses_it() -> None:
    items = [DEV, u("task"), a("1"), TOOLS, u("2"), a("3"), u("4"), a("5"), u("6")]
    got = span(items, 1, 2)
    assert got == "input[3] (additional_tools) lies in the span: it is never summarized"


def test_the_real_codex_transcripts_keep_system_prompt_environment_and_task() -> None:
    for name, head in (("middle", 4), ("resumed_last", 4), ("default_model_additional_tools", 7)):
        idx = index_body(fixture(name), RESPONSES)
        s = select_span(idx.views, 2, 3, "id")
        assert isinstance(s, Span) and s.head == head, name
        assert idx.views[head - 1].role == "user" and "Run a few" in idx.views[head - 1].text
        assert not crossings(idx.views)[s.head] and not crossings(idx.views)[s.end]


def test_the_head_retreats_off_a_call_whose_output_follows() -> None:
    items = [u("task"), call("c1"), out("c1"), a("1"), u("2"), a("3"), u("4")]
    assert span(items, 2, 2) == Span(1, 5)  # not [task, call | output ...]
    assert span(items, 3, 2) == Span(3, 5)  # [task, call, output] kept whole


def test_the_head_retreats_off_a_reasoning_item() -> None:
    items = [u("task"), reasoning(), a("1"), u("2"), a("3"), u("4"), a("5")]
    assert span(items, 2, 2) == Span(1, 5)


def test_parallel_calls_and_their_outputs_stay_together_at_the_tail() -> None:
    items = [u("task"), a("1"), u("2"), reasoning(), call("c1"), call("c2"), out("c2"), out("c1")]
    for keep_last in (1, 2, 3, 4):
        s = span(items, 1, keep_last)
        assert s == Span(1, 3), keep_last  # the tail starts at the reasoning item
    assert span(items, 1, 5) == Span(1, 3)


def test_when_advancing_would_empty_the_tail_the_exchange_is_kept_whole() -> None:
    items = [u("task"), a("1"), u("2"), a("3"), call("c1"), out("c1")]
    assert span(items, 1, 1) == Span(1, 4)


def test_too_short_is_a_no_op_counting_the_system_items() -> None:
    assert span([DEV, DEV, u("t"), a("1"), u("2")], 1, 2) == (
        "transcript of 5 items is within its 2 leading system items + keep_first + keep_last"
    )


def test_orphan_outputs_are_dropped_whole_by_call_id() -> None:
    items = [u("task"), call("c1"), out("c1"), a("x"), u("y")]
    idx = index_body(json.dumps({"input": items}).encode(), RESPONSES)
    summary = Insert.message(RESPONSES.user_message("S"), RESPONSES)
    plan: Plan = [Keep(0), summary, Keep(2), Keep(3), Keep(4)]  # the call cut, its output kept
    assert repair_orphans(idx, plan) == [Keep(0), summary, Keep(3), Keep(4)]
    whole: Plan = [Keep(i) for i in range(5)]
    assert repair_orphans(idx, whole) == whole


@SETTINGS
@given(responses_items(min_turns=0, max_turns=8), st.integers(0, 4), st.integers(0, 6))
def test_a_summary_at_the_span_never_breaks_a_rule(
    items: list[Any], keep_first: int, keep_last: int
) -> None:
    """Whatever the transcript and the keeps: either no span (with a reason), or one whose
    splice `[head, summary, tail]` keeps the system prompt and passes every shape rule,
    `separated` included."""
    s = span(items, keep_first, keep_last)
    if isinstance(s, str):
        assert s
        return
    idx, plan = spliced(items, s)
    views = idx.views
    lead = leading_system(views)
    assert lead <= s.head < s.end <= len(items)
    assert s.head <= lead + keep_first
    assert not any(v.pinned for v in views[s.head : s.end])
    assert validate_shape(plan_views(idx, plan), RESPONSES) == []
    assert separated(views, plan_sources(plan), RESPONSES) == []
    assert repair_orphans(idx, plan) == plan  # nothing for the safety net to do


@SETTINGS
@given(responses_items(min_turns=1, max_turns=6), st.data())
def test_crossings_agree_with_a_brute_force_reading(items: list[Any], data: st.DataObject) -> None:
    idx = index_body(json.dumps({"input": items}).encode(), RESPONSES)
    views = idx.views
    got = crossings(views)
    p = data.draw(st.integers(0, len(items)))
    before = {t for v in views[:p] for t in v.tool_call_ids}
    after = {t for v in views[p:] for t in v.tool_result_ids}
    split_pair = bool(before & after)
    split_reasoning = p > 0 and views[p - 1].binds_next
    assert got[p] == (split_pair or split_reasoning)


@pytest.mark.parametrize("keep_last", [0, 1, 3])
def test_keep_last_0_and_small_tails_on_a_codex_transcript(keep_last: int) -> None:
    idx = index_body(fixture("resumed_last"), RESPONSES)
    s = select_span(idx.views, 2, keep_last, "id")
    assert isinstance(s, Span)
    assert s.end == len(idx.views) or not crossings(idx.views)[s.end]
