"""cg.summarize.span: `[head | span | tail]` (docs/behaviour.md#summarize-the-span) and orphan
repair (docs/behaviour.md#summarize-orphaned-tool-results).

The seed's four `keep_first` cases run through the real two-turn path (turn 1 commissions and
forwards untouched, `complete()` runs the fake summarizer, turn 2 splices); `two_turns` asserts
that each of them really reached the acting path, so none passes vacuously.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cg.state.sqlite import SqliteStore
from cg.summarize.span import Span, repair_orphans, select_span
from cg.wire.body import index_body
from cg.wire.dialects import ANTHROPIC, DIALECTS, OPENAI
from cg.wire.shape import validate_shape
from cg.wire.splice import Cut, Insert, Keep, Plan, splice
from tests.support.strategies import DIALECT_NAMES, SETTINGS, messages
from tests.support.transcripts import (
    CC16,
    MARKER_RE,
    cc_dumps,
    config,
    fixture_body,
    make,
    openai_transcript,
    out_messages,
    record,
    sources,
    summary_of,
    two_turns,
)

Json = Any


# --------------------------------------------------------------------------------------------
# Message builders
# --------------------------------------------------------------------------------------------


def a_user(text: str) -> Json:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def a_call(*ids: str, text: str | None = None) -> Json:
    blocks: list[Json] = [{"type": "text", "text": text}] if text else []
    blocks += [{"type": "tool_use", "id": i, "name": "Bash", "input": {"c": i}} for i in ids]
    return {"role": "assistant", "content": blocks}


def a_results(*ids: str, text: str | None = None) -> Json:
    blocks: list[Json] = [
        {"type": "tool_result", "tool_use_id": i, "content": f"output of {i}"} for i in ids
    ]
    if text:
        blocks.append({"type": "text", "text": text})
    return {"role": "user", "content": blocks}


def a_text(text: str) -> Json:
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


def o_call(*ids: str) -> Json:
    calls = [
        {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids
    ]
    return {"role": "assistant", "content": None, "tool_calls": calls}


def o_tool(i: str) -> Json:
    return {"role": "tool", "tool_call_id": i, "content": f"output of {i}"}


def o(role: str, text: str) -> Json:
    return {"role": role, "content": text}


def views(msgs: list[Json], dialect: str) -> list[Any]:
    d = DIALECTS[dialect]
    return [d.view(m) for m in msgs]


def span(msgs: list[Json], dialect: str, keep_first: int, keep_last: int) -> Span | str:
    return select_span(views(msgs, dialect), keep_first, keep_last)


def openai_body(msgs: list[Json]) -> bytes:
    return json.dumps({"model": "gpt-4o", "messages": msgs}, indent=1).encode()


def anthropic_body(msgs: list[Json]) -> bytes:
    return json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 9, "messages": msgs}).encode()


# --------------------------------------------------------------------------------------------
# select_span, unit level
# --------------------------------------------------------------------------------------------

CHAT_A = [a_user("task"), a_text("a1"), a_user("u2"), a_text("a3"), a_user("u4"), a_text("a5")]


def test_plain_span_is_between_keep_first_and_keep_last() -> None:
    assert span(CHAT_A, "anthropic", 1, 3) == Span(1, 3)
    assert span(CHAT_A, "anthropic", 2, 2) == Span(2, 4)
    assert span(CHAT_A, "anthropic", 0, 0) == Span(0, 6)


@pytest.mark.parametrize(("keep_first", "keep_last"), [(1, 3), (3, 3), (6, 0), (0, 6), (4, 5)])
def test_a_transcript_within_keep_first_plus_keep_last_is_a_no_op(
    keep_first: int, keep_last: int
) -> None:
    msgs = CHAT_A[: keep_first + keep_last]
    assert isinstance(span(msgs, "anthropic", keep_first, keep_last), str)


@pytest.mark.parametrize("n", [0, 1, 2])
def test_tiny_transcripts_never_raise(n: int) -> None:
    for kf in range(4):
        for kl in range(4):
            s = span(CHAT_A[:n], "anthropic", kf, kl)
            assert isinstance(s, str) if kf + kl >= n else s == Span(kf, n - kl)


def test_negative_keeps_raise_rather_than_clamp() -> None:
    with pytest.raises(ValueError):
        span(CHAT_A, "anthropic", -1, 3)
    with pytest.raises(ValueError):
        span(CHAT_A, "anthropic", 1, -1)


def test_at_keep_first_1_a_tool_calling_first_message_drops_the_head() -> None:
    msgs = [a_call("t1"), a_results("t1"), *CHAT_A[1:]]
    assert span(msgs, "anthropic", 1, 2) == Span(0, len(msgs) - 2)


def test_at_keep_first_2_a_call_result_head_is_kept_whole() -> None:
    msgs = [a_call("t1"), a_results("t1"), *CHAT_A[1:]]
    assert span(msgs, "anthropic", 2, 2) == Span(2, len(msgs) - 2)


def test_the_head_retreat_is_a_loop_over_consecutive_tool_calls() -> None:
    msgs = [a_user("task"), a_call("t1"), a_call("t2"), a_results("t1", "t2"), *CHAT_A[1:]]
    assert span(msgs, "anthropic", 3, 2) == Span(1, len(msgs) - 2)
    o_msgs = [o("system", "s"), o("user", "task"), o_call("c1"), o_call("c2"), o_tool("c1")]
    o_msgs += [o_tool("c2"), o("assistant", "x"), o("user", "y"), o("assistant", "z")]
    assert span(o_msgs, "openai", 4, 2) == Span(2, len(o_msgs) - 2)


def test_the_head_retreats_off_a_mid_array_system_message() -> None:
    msgs = [a_user("task"), {"role": "system", "content": "reminder"}, *CHAT_A[1:]]
    assert span(msgs, "anthropic", 2, 2) == Span(1, len(msgs) - 2)
    # ... past a tool call and then a system message, in one loop
    msgs = [a_user("task"), {"role": "system", "content": "r"}, a_call("t1"), a_results("t1")]
    msgs += CHAT_A[1:]
    assert span(msgs, "anthropic", 3, 2) == Span(1, len(msgs) - 2)


def test_a_system_message_at_index_0_stays_in_the_head() -> None:
    msgs = [o("system", "s"), o("user", "task"), o("assistant", "a"), o("user", "b")]
    msgs += [o("assistant", "c"), o("user", "d")]
    assert span(msgs, "openai", 1, 2) == Span(1, 4)


def test_the_head_does_not_end_inside_a_run_of_parallel_tool_results() -> None:
    # keep_first 4 would keep [system, task, call(c1, c2), tool c1] and summarize tool c2:
    # c2 would go unanswered. The head retreats past the whole exchange.
    msgs = [o("system", "s"), o("user", "task"), o_call("c1", "c2"), o_tool("c1"), o_tool("c2")]
    msgs += [o("assistant", "a"), o("user", "u"), o("assistant", "b"), o("user", "v")]
    assert span(msgs, "openai", 4, 2) == Span(2, 7)
    assert span(msgs, "openai", 5, 2) == Span(5, 7)  # ending after the run is fine


def test_the_tail_advances_past_tool_results_it_would_begin_with() -> None:
    msgs = [*CHAT_A[:3], a_call("t1"), a_results("t1"), a_text("done"), a_user("next")]
    assert span(msgs, "anthropic", 1, 3) == Span(1, 5)
    o_msgs = [o("system", "s"), o("user", "task"), o("assistant", "a"), o("user", "b")]
    o_msgs += [o_call("c1", "c2", "c3"), o_tool("c1"), o_tool("c2"), o_tool("c3")]
    o_msgs += [o("assistant", "done"), o("user", "next")]
    # keep_last 4 starts the tail at tool c2: it advances past c2 and c3
    assert span(o_msgs, "openai", 2, 4) == Span(2, 8)


def test_when_advancing_would_empty_the_tail_the_latest_exchange_is_kept_whole() -> None:
    msgs = [*CHAT_A, a_call("t1"), a_results("t1")]
    assert span(msgs, "anthropic", 1, 1) == Span(1, 6)  # tail = [call, result]
    o_msgs = [o("system", "s"), o("user", "task"), o("assistant", "a"), o("user", "b")]
    o_msgs += [o_call("c1", "c2"), o_tool("c1"), o_tool("c2")]
    assert span(o_msgs, "openai", 2, 1) == Span(2, 4)
    assert span(o_msgs, "openai", 2, 2) == Span(2, 4)


def test_keep_last_0_summarizes_to_the_end() -> None:
    msgs = [*CHAT_A, a_call("t1"), a_results("t1")]
    assert span(msgs, "anthropic", 1, 0) == Span(1, len(msgs))


def test_an_empty_span_after_the_moves_is_a_no_op() -> None:
    # head 1, tail would start at the result, advancing empties it, retreating reaches the head
    msgs = [a_user("task"), a_call("t1"), a_results("t1")]
    assert isinstance(span(msgs, "anthropic", 1, 1), str)
    assert isinstance(span([o("user", "t"), o_call("c"), o_tool("c")], "openai", 1, 1), str)


@SETTINGS
@given(
    st.sampled_from(DIALECT_NAMES).flatmap(lambda d: st.tuples(st.just(d), messages(d, 0, 8))),
    st.integers(0, 6),
    st.integers(0, 6),
)
def test_select_span_never_raises_and_respects_its_bounds(
    dm: tuple[str, list[Json]], keep_first: int, keep_last: int
) -> None:
    dialect, msgs = dm
    vs = views(msgs, dialect)
    s = select_span(vs, keep_first, keep_last)
    if isinstance(s, str):
        return
    n = len(vs)
    assert 0 <= s.head <= keep_first and s.head < s.end <= n
    # no boundary splits an exchange: the span never starts or ends inside a result run
    results = [bool(v.tool_result_ids) for v in vs]
    assert not results[s.head] or s.head == 0
    assert s.end == n or not results[s.end]
    assert s.head == 0 or not vs[s.head - 1].calls_tools
    assert s.head <= 1 or not vs[s.head - 1].is_system


# --------------------------------------------------------------------------------------------
# The seed's four keep_first cases, through the real two-turn path
# --------------------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(tmp_path / "cg.sqlite3")
    yield s
    s.close()


TASK = "TASK: port the parser to Rust."


def test_a_default_keep_first_folds_the_openai_task_into_the_summary(store: SqliteStore) -> None:
    """(a) The historical shape: [system, summary, tail…] — the task's message is summarized
    away (it is still the grounding of the prompt, the stash holds it verbatim, and the
    summary's floor quotes it)."""
    msgs = openai_transcript(6, TASK)
    raw = openai_body(msgs)
    d = make(config(), store, "openai")
    r = two_turns(d, raw)
    src, out = sources(raw, OPENAI), sources(r.body or b"", OPENAI)
    i, summary = summary_of(r)
    assert i == 1 and out[0] == src[0]
    assert out[2:] == src[-2:]  # keep_last 3 began at a tool result: the tail advanced past it
    assert all(TASK not in s for n, s in enumerate(out) if n != i)
    text = json.loads(summary)["content"]
    assert "<user_messages>\nThe user's own messages" in text and f"\n{TASK}\n" in text
    prompt = d.summarizer.calls[0][0]
    assert f"<first_user_turn>\n{TASK}\n</first_user_turn>" in prompt
    m = MARKER_RE.search(summary)
    assert m is not None
    stash = store.get_stash(m.group(1))
    assert stash is not None and stash.sources()[0] == src[1]  # the task, verbatim


def test_keep_first_2_keeps_system_and_task_byte_identical(store: SqliteStore) -> None:
    """(b) keep_first: 2 retains [system, task]."""
    msgs = openai_transcript(6, TASK)
    raw = openai_body(msgs)
    r = two_turns(make(config(keep_first=2), store, "openai"), raw)
    src, out = sources(raw, OPENAI), sources(r.body or b"", OPENAI)
    assert out[:2] == src[:2]
    assert summary_of(r)[0] == 2
    assert out[3:] == src[-2:]
    assert out_messages(r)[2]["role"] == "user"


def test_a_dangling_tool_call_in_the_head_retreats(store: SqliteStore) -> None:
    """(c) keep_first: 2 on [system, call, result, …]: keeping the call would emit an unanswered
    call, so the head retreats to [system]."""
    msgs = [o("system", "s"), *openai_transcript(6, TASK)[2:]]
    assert msgs[1].get("tool_calls")
    raw = openai_body(msgs)
    r = two_turns(make(config(keep_first=2), store, "openai"), raw)
    src, out = sources(raw, OPENAI), sources(r.body or b"", OPENAI)
    assert out[0] == src[0] and summary_of(r)[0] == 1
    assert validate_shape(out_messages(r), "openai") == []


@pytest.mark.parametrize("dialect", ["anthropic", "openai"])
def test_two_consecutive_tool_calls_in_the_head_retreat_past_both(
    store: SqliteStore, dialect: str
) -> None:
    """(c) Malformed input (a call answered by nothing, then another call): one decrement would
    keep the first call; the loop retreats past both."""
    if dialect == "anthropic":
        head = [a_user(TASK), a_call("t1"), a_call("t2"), a_results("t1", "t2")]
        rest = [a_text(f"a{k} " * 80) if k % 2 else a_user(f"u{k} " * 80) for k in range(7)]
        raw, keep_first = anthropic_body(head + rest), 3
    else:
        head = [o("system", "s"), o("user", TASK), o_call("c1"), o_call("c2")]
        head += [o_tool("c1"), o_tool("c2")]
        rest = [o("assistant" if k % 2 else "user", f"m{k} " * 80) for k in range(7)]
        raw, keep_first = openai_body(head + rest), 4
    dia = DIALECTS[dialect]
    assert validate_shape(index_body(raw, dia).views, dia) != []  # the input is malformed
    r = two_turns(make(config(keep_first=keep_first), store, dialect), raw)
    src, out = sources(raw, dia), sources(r.body or b"", dia)
    kept = keep_first - 2  # both calls left the head
    assert out[:kept] == src[:kept]
    assert summary_of(r)[0] == kept
    assert all("tool_use" not in s and "tool_calls" not in s for s in out[:kept])


def test_keep_first_0_is_honoured(store: SqliteStore) -> None:
    """(d) keep_first: 0 summarizes from the first message: the summary opens the array."""
    msgs = openai_transcript(6, TASK)
    raw = openai_body(msgs)
    r = two_turns(make(config(keep_first=0), store, "openai"), raw)
    out = sources(r.body or b"", OPENAI)
    assert summary_of(r)[0] == 0
    assert out[1:] == sources(raw, OPENAI)[-2:]


def test_negative_keep_first_is_refused_before_anything_runs() -> None:
    with pytest.raises(ValueError, match="keep_first"):
        config(keep_first=-1)


# --------------------------------------------------------------------------------------------
# Claude Code traffic: [user, system, assistant…]
# --------------------------------------------------------------------------------------------


def test_keep_first_2_on_claude_code_retreats_off_its_system_message(store: SqliteStore) -> None:
    body = fixture_body(CC16)
    raw = cc_dumps(body)
    assert [m["role"] for m in body["messages"][:3]] == ["user", "system", "assistant"]
    d = make(config(keep_first=2), store)
    r = two_turns(d, raw)
    assert record(r)["span"][0] == 1
    out, src = out_messages(r), sources(raw, ANTHROPIC)
    assert sources(r.body or b"", ANTHROPIC)[0] == src[0]
    assert summary_of(r)[0] == 1 and out[1]["role"] == "user"
    assert validate_shape(out, "anthropic") == []


@pytest.mark.parametrize("keep_first", [1, 2, 3])
def test_the_summary_is_never_a_system_message(store: SqliteStore, keep_first: int) -> None:
    raw = cc_dumps(fixture_body(CC16))
    r = two_turns(make(config(keep_first=keep_first), store), raw)
    i, _ = summary_of(r)
    out = out_messages(r)
    assert out[i]["role"] == "user" and isinstance(out[i]["content"], str)
    # no system-role message precedes anything but an assistant turn
    assert all(
        out[j + 1]["role"] == "assistant"
        for j in range(1, len(out) - 1)
        if out[j]["role"] == "system"
    )


@pytest.mark.parametrize(("keep_last", "tail_roles"), [
    (1, ["assistant", "user"]),  # advancing would empty the tail: the last exchange, whole
    (3, ["system", "assistant", "user"]),
    (4, ["system", "assistant", "user"]),  # starts at a result: advances to the system message
])  # fmt: skip
def test_the_tail_on_claude_code_never_starts_with_a_tool_result(
    store: SqliteStore, keep_last: int, tail_roles: list[str]
) -> None:
    raw = cc_dumps(fixture_body(CC16))
    r = two_turns(make(config(keep_last=keep_last), store), raw)
    out = out_messages(r)
    i, _ = summary_of(r)
    assert [m["role"] for m in out[i + 1 :]] == tail_roles
    assert sources(r.body or b"", ANTHROPIC)[i + 1 :] == sources(raw, ANTHROPIC)[-len(tail_roles) :]
    assert validate_shape(out, "anthropic") == []


def test_a_transcript_too_short_for_a_span_passes_through(store: SqliteStore) -> None:
    d = make(config(keep_first=2, keep_last=3), store, "openai")
    for n in range(6):
        r = d.send(openai_body(openai_transcript(4)[:n]))
        assert r.outcome == "passed_through" and not r.commissions


# --------------------------------------------------------------------------------------------
# Orphan repair
# --------------------------------------------------------------------------------------------

SUMMARY = {"role": "user", "content": "=== History Summary ===\n<summary>\nS\n</summary>"}


def test_anthropic_orphan_results_are_cut_block_by_block() -> None:
    msgs = [
        a_user("task"),
        a_call("t1", "t2"),
        a_results("t1", "t2", text="and a note the user typed"),
        a_call("t3"),
        a_results("t3"),
    ]
    raw = cc_dumps({"model": "m", "messages": msgs})
    index = index_body(raw, ANTHROPIC)
    summary = Insert.message(SUMMARY, ANTHROPIC)
    plan: Plan = [Keep(0), summary, Keep(2), Keep(3), Keep(4)]  # message 1, the call, is gone
    fixed = repair_orphans(index, plan)
    assert fixed == [Keep(0), summary, Cut(2, frozenset({0, 1})), Keep(3), Keep(4)]
    out = sources(splice(index, fixed), ANTHROPIC)
    expect = cc_dumps(a_user("and a note the user typed")).decode()
    assert out[2] == expect  # the rest of the message's bytes, as sent
    assert out[3:] == [index.source(3), index.source(4)]


def test_anthropic_a_message_of_nothing_but_orphans_is_dropped_whole() -> None:
    msgs = [a_user("task"), a_call("t1"), a_results("t1"), a_text("ok"), a_user("next")]
    index = index_body(cc_dumps({"model": "m", "messages": msgs}), ANTHROPIC)
    summary = Insert.message(SUMMARY, ANTHROPIC)
    fixed = repair_orphans(index, [Keep(0), summary, Keep(2), Keep(3), Keep(4)])
    assert fixed == [Keep(0), summary, Keep(3), Keep(4)]


def test_anthropic_only_the_orphan_block_goes_when_some_results_are_answered() -> None:
    # t9 answers nothing; t1 answers the call right before it
    msgs = [a_user("task"), a_call("t1"), a_results("t1", "t9"), a_text("ok")]
    index = index_body(cc_dumps({"model": "m", "messages": msgs}), ANTHROPIC)
    fixed = repair_orphans(index, [Keep(0), Keep(1), Keep(2), Keep(3)])
    assert fixed == [Keep(0), Keep(1), Cut(2, frozenset({1})), Keep(3)]
    out = splice(index, fixed)
    assert validate_shape(json.loads(out)["messages"], "anthropic") == []


def test_anthropic_repair_extends_an_earlier_cut() -> None:
    msgs = [a_user("task"), a_call("t1"), a_results("t1", text="x"), a_text("ok")]
    msgs[2]["content"].append({"type": "text", "text": "y"})
    index = index_body(cc_dumps({"model": "m", "messages": msgs}), ANTHROPIC)
    fixed = repair_orphans(index, [Keep(0), Cut(2, frozenset({1})), Keep(3)])
    assert fixed == [Keep(0), Cut(2, frozenset({0, 1})), Keep(3)]


def test_openai_orphan_tool_messages_are_dropped() -> None:
    msgs = [o("system", "s"), o("user", "task"), o_call("c1", "c2"), o_tool("c1"), o_tool("c2")]
    msgs += [o_call("c3"), o_tool("c3"), o("assistant", "a"), o("user", "b")]
    index = index_body(openai_body(msgs), OPENAI)
    summary = Insert.message(SUMMARY, OPENAI)
    plan: Plan = [Keep(0), Keep(1), summary, Keep(4), Keep(5), Keep(6), Keep(7), Keep(8)]
    fixed = repair_orphans(index, plan)
    assert fixed == [Keep(0), Keep(1), summary, Keep(5), Keep(6), Keep(7), Keep(8)]


def test_repair_never_synthesises_anything() -> None:
    msgs = [a_user("task"), a_call("t1"), a_results("t1"), a_call("t2"), a_results("t2")]
    index = index_body(cc_dumps({"model": "m", "messages": msgs}), ANTHROPIC)
    plan: Plan = [Keep(0), Keep(2), Keep(4)]  # both calls gone
    fixed = repair_orphans(index, plan)
    assert fixed == [Keep(0)]
    assert not any(isinstance(p, Insert) for p in fixed)


def test_a_valid_plan_is_left_alone() -> None:
    msgs = [a_user("task"), a_call("t1"), a_results("t1"), a_text("ok")]
    index = index_body(cc_dumps({"model": "m", "messages": msgs}), ANTHROPIC)
    plan: Plan = [Keep(0), Keep(1), Keep(2), Keep(3)]
    assert repair_orphans(index, plan) == plan


def test_repair_acts_on_the_real_path_when_history_after_the_checkpoint_changed(
    store: SqliteStore,
) -> None:
    """The checkpoint covers up to a tool call whose result the client later inserts right
    after it (history edited past the covered prefix): the result's block is cut from the
    first tail message, the note beside it stays byte for byte."""
    big = [a_text("x " * 200) if k % 2 else a_user("y " * 200) for k in range(1, 7)]
    msgs = [a_user(TASK), *big, a_call("t1"), a_user("plain"), a_text("b"), a_user("c")]
    d = make(config(keep_last=3), store)
    r1 = d.send(cc_dumps({"model": "m", "messages": msgs}))
    assert len(d.pending) == 1 and d.pending[0].end == 8  # covers up to and with the call
    assert d.drain() == ["completed"]
    edited = [*msgs[:8], a_results("t1", text="plain"), *msgs[9:]]
    raw = cc_dumps({"model": "m", "messages": edited})
    r2 = d.send(raw)
    assert r1.body is None and r2.outcome == "rewritten", r2.record
    out = sources(r2.body or b"", ANTHROPIC)
    assert out[2] == cc_dumps(a_user("plain")).decode()
    assert out[3:] == sources(raw, ANTHROPIC)[9:]
