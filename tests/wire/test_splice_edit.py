"""cg.wire.splice's Edit piece: a client's message re-emitted as its own source with values
replaced where they lie, and every reader of a plan handling it (views, sources, the runner's
dropped set, the wire check, orphan repair, retention, the ledger's count)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cg.pipeline.runner import dropped
from cg.retention.measure import _piece_source
from cg.state.facts import FactsCache
from cg.summarize.span import repair_orphans
from cg.wire.body import index_body
from cg.wire.dialects import DIALECTS
from cg.wire.jsonspan import walk_object
from cg.wire.shape import check_wire_array
from cg.wire.splice import (
    Edit,
    Insert,
    Keep,
    Plan,
    cut_edit,
    edited,
    plan_sources,
    plan_views,
    splice,
    splice_array_bytes,
)
from tests.support.strategies import SETTINGS
from tests.support.transcripts import TOKENS

A = DIALECTS["anthropic"]


def body(messages: list[Any]) -> bytes:
    # Spaced and indented on purpose: an Edit keeps the client's whitespace.
    return json.dumps({"model": "m", "messages": messages}, indent=1).encode()


def exchange(n: int, *ids: str) -> list[Any]:
    calls = [{"type": "tool_use", "id": i, "name": "Bash", "input": {"command": i}} for i in ids]
    results = [{"type": "tool_result", "tool_use_id": i, "content": f"out {i} " * 5} for i in ids]
    return [
        {"role": "assistant", "content": [{"type": "text", "text": f"step {n}"}, *calls]},
        {"role": "user", "content": results},
    ]


MSGS = [
    {"role": "user", "content": "the task at hand"},
    *exchange(0, "t1", "t2"),
    *exchange(1, "t3"),
]


def content_span(src: str, block: int) -> tuple[int, int]:
    members, _ = walk_object(src, 0, arrays=("content",))
    arr = next(m.array for m in members if m.key == "content" and m.array is not None)
    inner, _ = walk_object(src, arr.elements[block].start)
    c = next(m for m in inner if m.key == "content")
    return c.start, c.end


def test_an_edit_replaces_one_value_and_keeps_every_other_byte() -> None:
    raw = body(MSGS)
    index = index_body(raw, A)
    start, end = content_span(index.source(2), 1)
    e = Edit.of(index, 2, [(start, end, '"stub"')])
    src = index.source(2)
    assert e.json == src[:start] + '"stub"' + src[end:]
    assert e.view.tool_result_ids == ("t1", "t2")
    plan: Plan = [Keep(0), Keep(1), e, Keep(3), Keep(4)]
    out = splice(index, plan)
    assert out == raw.replace(src[start:end].encode(), b'"stub"', 1)
    assert plan_sources(plan) == ["m0", "m1", "m2", "m3", "m4"]
    assert plan_views(index, plan)[2] is e.view
    assert dropped(plan, 5) == set()
    assert check_wire_array(index, plan, splice_array_bytes(index, plan)[2]) == []
    assert _piece_source(index, e) == e.json  # retention reads the edited text


def test_edits_that_overlap_or_leave_the_message_are_refused() -> None:
    with pytest.raises(ValueError, match="overlaps"):
        edited("0123456789", [(1, 5, "a"), (4, 6, "b")])
    with pytest.raises(ValueError, match="outside"):
        edited("0123", [(2, 9, "a")])


@SETTINGS
@given(st.text(max_size=40), st.lists(st.tuples(st.integers(0, 40), st.integers(0, 8)), max_size=4))
def test_edited_is_the_source_with_each_span_replaced(
    text: str, spans: list[tuple[int, int]]
) -> None:
    values = []
    at = 0
    for gap, length in spans:  # non-overlapping spans, left to right
        start = min(at + gap, len(text))
        end = min(start + length, len(text))
        values.append((start, end, f"<{start}>"))
        at = end
    expect, last = [], 0
    for start, end, t in values:
        expect += [text[last:start], t]
        last = end
    expect.append(text[last:])
    assert edited(text, list(reversed(values))) == "".join(expect)


def test_orphan_repair_cuts_an_orphaned_result_out_of_an_edited_message() -> None:
    """The call `t1` went into a summary: its result is cut from the masked user message, whose
    other (masked) result stays, edited as it was."""
    msgs = [
        MSGS[0],
        {"role": "assistant", "content": [{"type": "text", "text": "x"}, MSGS[1]["content"][2]]},
        MSGS[2],
    ]
    raw = body(msgs)
    index = index_body(raw, A)
    start, end = content_span(index.source(2), 1)
    e = Edit.of(index, 2, [(start, end, '"stub t2"')])
    fixed = repair_orphans(index, [Keep(0), Keep(1), e])
    assert fixed[:2] == [Keep(0), Keep(1)]
    cut = fixed[2]
    assert isinstance(cut, Edit) and cut.index == 2
    assert json.loads(cut.json)["content"] == [
        {"type": "tool_result", "tool_use_id": "t2", "content": "stub t2"}
    ]
    assert cut == cut_edit(e, frozenset({0}), A)
    # Nothing left but orphans: the edited message goes whole.
    alone: Plan = [Keep(0), Insert.message({"role": "user", "content": "summary"}, A), e]
    assert len(repair_orphans(index, alone)) == 2


def test_an_edited_messages_written_facts_are_the_sent_messages_the_ledger_counts() -> None:
    raw = body(MSGS)
    index = index_body(raw, A)
    start, end = content_span(index.source(4), 0)
    e = Edit.of(index, 4, [(start, end, '"short"')])
    facts = FactsCache(TOKENS)
    sent = index_body(splice(index, [Keep(0), Keep(1), Keep(2), Keep(3), e]), A)
    assert facts.written(e.json, e.view).tokens == facts.of(sent, 4).tokens
