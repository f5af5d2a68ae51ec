"""cg.retention.measure.of_plan: which of the client's facts a planned request still shows — a
plan that keeps every message keeps them all, a new message (the summary) shows what its text
names, and a kept message shows a fact of the span its text quotes, however a JSON encoder
spelled it."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cg.expand.tool import SUMMARY_HEADER
from cg.retention.facts import Fact
from cg.retention.measure import Retention, of_plan, request_facts, unread
from cg.wire.body import BodyIndex, MessageCache, index_body
from cg.wire.dialects import DIALECTS
from cg.wire.splice import Insert, Keep, Piece

ANTHROPIC = DIALECTS["anthropic"]
ASK = "Please make the parser accept trailing commas"


def call(i: int, command: str) -> dict[str, Any]:
    block = {"type": "tool_use", "id": f"toolu_{i}", "name": "Bash", "input": {"command": command}}
    return {"role": "assistant", "content": [block]}


def result(i: int, out: str) -> dict[str, Any]:
    block = {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": out}
    return {"role": "user", "content": [block]}


def indexed(messages: list[dict[str, Any]], ascii_only: bool = True) -> BodyIndex:
    doc = {"model": "m", "max_tokens": 1, "messages": messages}
    return index_body(json.dumps(doc, ensure_ascii=ascii_only).encode(), ANTHROPIC)


def session(command: str, quoted_later: str = "done") -> list[dict[str, Any]]:
    """[ask | the command and its output | an output quoting `quoted_later`, the last ask]:
    a plan keeping 0 and 3–5 summarizes messages 1–2, where the command was run."""
    return [
        {"role": "user", "content": ASK},
        call(1, command),
        result(1, "ok"),
        call(2, "git diff --stat"),
        result(2, quoted_later),
        {"role": "user", "content": "Good, now add a test for that case"},
    ]


def summary(text: str) -> Insert:
    return Insert.message({"role": "user", "content": f"{SUMMARY_HEADER}\n{text}"}, ANTHROPIC)


def summarized(index: BodyIndex, text: str = "<summary>worked on it</summary>") -> list[Piece]:
    return [Keep(0), summary(text), *(Keep(i) for i in range(3, len(index.messages)))]


def test_a_plan_that_keeps_every_message_keeps_every_fact() -> None:
    index = indexed(session("make test"))
    r = of_plan(index, [Keep(i) for i in range(len(index.messages))])
    assert r.ratio == 1.0 and r.lost == []
    assert r.facts == 4 == len(request_facts(index))  # vacuity: 2 user texts, 2 commands
    assert r.total["user"] == 2 and r.total["command"] == 2


def test_what_the_summary_names_is_visible_and_the_rest_lost() -> None:
    index = indexed(session("pytest -q tests/test_parser.py"))
    lost = of_plan(index, summarized(index))
    assert lost.lost == [Fact("command", "pytest -q tests/test_parser.py")]
    assert (lost.visible["command"], lost.total["command"]) == (1, 2)
    kept = of_plan(
        index, summarized(index, "<summary>ran pytest -q tests/test_parser.py</summary>")
    )
    assert kept.ratio == 1.0 and kept.lost == []


def test_a_fact_quoted_in_a_kept_tool_output_is_visible() -> None:
    index = indexed(session("cargo build --release", "the log of cargo build --release: ok"))
    r = of_plan(index, summarized(index))
    assert r.lost == [] and r.visible["command"] == 2


@given(
    command=st.text(
        st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), min_size=1, max_size=40
    ).filter(lambda t: t == t.strip()),
    ascii_only=st.booleans(),
)
def test_a_quoted_fact_is_found_however_the_client_escaped_it(
    command: str, ascii_only: bool
) -> None:
    """A quote, a backslash, a non-ASCII character: the kept message's bytes hold the fact as
    a JSON encoder wrote it (with or without ASCII escapes), and it is found all the same."""
    index = indexed(session(command, f"ran «{command}» twice"), ascii_only)
    r = of_plan(index, summarized(index))
    assert Fact("command", command) not in r.lost
    assert r.visible["command"] == r.total["command"] == 2 - (command == "git diff --stat")


def test_a_quote_and_an_accent_in_both_spellings() -> None:
    command = 'grep -n "naïve" src/parser.py'
    for ascii_only in (True, False):
        index = indexed(session(command, f"output of {command}"), ascii_only)
        raw = index.raw.decode()
        assert ("\\u00ef" in raw) is ascii_only and '\\"' in raw  # vacuity: really escaped
        r = of_plan(index, summarized(index))
        assert r.lost == [] and r.ratio == 1.0


def test_the_facts_are_read_once_and_a_next_turn_reads_its_new_messages() -> None:
    index = indexed(session("make test"))
    assert unread(index) == (6, index.messages[-1].end - index.messages[0].start)
    of_plan(index, summarized(index))
    assert unread(index) == (0, 0)


def test_json_of_a_turn() -> None:
    r = Retention()
    r.total["user"], r.visible["user"] = 2, 1
    r.lost.append(Fact("user", "x" * 300))
    doc = r.to_json()
    assert doc["ratio"] == 0.5 and doc["by_kind"] == {"user": {"visible": 1, "facts": 2}}
    assert r.kind_ratio("user") == 0.5 and r.kind_ratio("file") is None
    assert doc["lost"] == [{"kind": "user", "text": "x" * 120}]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 5), min_size=4, max_size=12),
    st.integers(1, 3),
    st.booleans(),
)
def test_a_turn_measured_on_an_inherited_index_measures_as_a_fresh_one(
    outputs: list[int], grow: int, quote: bool
) -> None:
    outputs = [9, *outputs[1:]]  # a command of the span that no kept message repeats as a fact
    """The kept text's search is memoised on the index across turns (`Memo.searched`): what a
    next turn finds with the memo it inherited is what a fresh index of it finds."""
    msgs: list[dict[str, Any]] = [{"role": "user", "content": ASK}]
    for i, k in enumerate(outputs):
        msgs += [
            call(i, f"make step{k}"),
            result(i, f"step{k} quoted: make step{i}" if quote else "ok"),
        ]
    cache = MessageCache()

    def turn(messages: list[dict[str, Any]]) -> tuple[BodyIndex, list[Piece]]:
        doc = {"model": "m", "max_tokens": 1, "messages": messages}
        index = index_body(json.dumps(doc).encode(), ANTHROPIC, cache)
        n = len(index.messages)
        summary = Insert.message(ANTHROPIC.user_message(f"{SUMMARY_HEADER}\nnothing"), ANTHROPIC)
        return index, [Keep(0), summary, *(Keep(i) for i in range(5, n))]

    first, plan = turn(msgs)
    of_plan(first, plan)
    searched = bool(first.memo.searched[1])  # the kept text was searched for a lost fact
    for g in range(grow):
        msgs += [call(100 + g, f"make more{g}"), result(100 + g, f"make step{g} again")]
        warm, plan = turn(msgs)
        inherited = warm.memo.searched[1]
        assert searched and inherited and inherited[-1] is not None  # the memo came along
        got = of_plan(warm, plan)
        doc = {"model": "m", "max_tokens": 1, "messages": msgs}
        fresh = of_plan(index_body(json.dumps(doc).encode(), ANTHROPIC), plan)
        assert (got.visible, got.total) == (fresh.visible, fresh.total)
        assert got.facts > 0  # vacuity guard: there were facts to find or lose
