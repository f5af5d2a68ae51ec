"""cg.pipeline.rewrite's `Decision`: the decision record made once, frozen, and its JSON form in
the key order the record was always written in (`-w` files, mitmweb's view and the e2e tests
read it)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from cg.pipeline.rewrite import Decision, ExpandPolicy, rewrite_body
from cg.wire.dialects import ANTHROPIC
from tests.pipeline.test_rewrite import body, summarize_middle

MSGS = [
    {"role": "user", "content": "task"},
    {"role": "assistant", "content": "a1"},
    {"role": "user", "content": "u2"},
    {"role": "assistant", "content": "a3"},
    {"role": "user", "content": "now"},
]


def test_a_rewritten_record_has_its_keys_in_the_order_they_were_written() -> None:
    out = rewrite_body(
        body(MSGS), ANTHROPIC, [summarize_middle()], expand=ExpandPolicy("never", None)
    )
    assert out.outcome == "rewritten" and out.body is not None  # the guard: it acted
    assert list(out.record) == [
        "dialect",
        "timings_ms",
        "messages_in",
        "stream",
        "session",
        "tenant",
        "components",
        "messages_out",
        "expand",
        "outcome",
        "reason",
    ]
    assert out.record == out.decision.to_json()
    json.dumps(out.record)  # a JSON object, whole


def test_a_record_of_a_body_over_a_bound_names_the_bound_before_the_outcome() -> None:
    out = rewrite_body(body(MSGS), ANTHROPIC, [summarize_middle()], max_messages=2)
    assert list(out.record) == ["dialect", "timings_ms", "bound", "outcome", "reason"]
    assert out.decision.bound == "cg_max_messages"


def test_the_decision_is_frozen_and_its_json_is_a_fresh_object_each_time() -> None:
    out = rewrite_body(body(MSGS), ANTHROPIC, [summarize_middle()])
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.decision.outcome = "failed_open"  # type: ignore[misc]
    out.record["timings_ms"]["hook"] = 1.0  # what the proxy adds to the flow's copy
    out.record["outcome"] = "retried_original"
    again = out.decision.to_json()
    assert "hook" not in again["timings_ms"] and again["outcome"] == "rewritten"
    assert isinstance(out.decision, Decision)


def test_a_draft_fills_every_field_of_the_decision_but_its_outcome_and_reason() -> None:
    from cg.pipeline.rewrite import _DECIDED, _DRAFTED

    assert _DECIDED[:-2] == _DRAFTED and _DECIDED[-2:] == ("outcome", "reason")
