"""cg.wire.shape: the four list rules of docs/behaviour.md#shape-rules, the role check on the bytes,
and `introduced`."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

from cg.wire.body import index_body
from cg.wire.dialects import ANTHROPIC, DIALECTS, OPENAI
from cg.wire.shape import Violation, check_wire_roles, introduced, validate_shape
from cg.wire.splice import Insert, Keep, Piece, plan_sources, plan_views, splice
from tests.support.strategies import DIALECT_NAMES, SETTINGS, messages, mutated_messages

Msgs = list[dict[str, Any]]


def rules(msgs: Msgs, dialect: str) -> set[tuple[int, str]]:
    return {(v.index, v.rule) for v in validate_shape(msgs, dialect)}


# -- building blocks -------------------------------------------------------------------------


def u(content: Any = "hi") -> dict[str, Any]:
    return {"role": "user", "content": content}


def a(content: Any = "ok") -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def sys(content: Any = "be brief", role: str = "system") -> dict[str, Any]:
    return {"role": role, "content": content}


def tool_use(*ids: str, text: str | None = None) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    blocks += [{"type": "tool_use", "id": i, "name": "bash", "input": {"cmd": "ls"}} for i in ids]
    return a(blocks)


def tool_result(*ids: str) -> dict[str, Any]:
    return u([{"type": "tool_result", "tool_use_id": i, "content": "out"} for i in ids])


def calls(*ids: str, content: Any = None) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids
        ],
    }


def tool(i: str, content: Any = "out") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": i, "content": content}


# -- 1. system-position ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dialect", "msgs"),
    [
        ("anthropic", [sys(), u(), a()]),  # index 0: anything may follow
        ("anthropic", [u(), sys(), a(), u()]),  # mid-array, followed by an assistant turn
        ("anthropic", [u(), a(), sys()]),  # ends the array
        (
            "anthropic",
            [u(), sys([{"type": "text", "text": "reminder"}]), tool_use("t1"), tool_result("t1")],
        ),
        ("openai", [sys(), u(), a()]),
        ("openai", [sys(role="developer"), u(), sys(role="developer"), a(), u()]),
        ("openai", [sys(), u(), sys()]),
        ("openai", [sys(), u(), sys(), calls("c1"), tool("c1")]),
    ],
)
def test_system_position_allowed(dialect: str, msgs: Msgs) -> None:
    assert rules(msgs, dialect) == set()


@pytest.mark.parametrize(
    ("dialect", "msgs", "bad"),
    [
        ("anthropic", [u(), sys(), u()], {1}),
        ("anthropic", [u(), a(), sys(), sys(), a()], {2}),  # a system before a system
        ("anthropic", [sys(), sys(), u()], {1}),
        ("openai", [sys(), u(), sys(role="developer"), u()], {2}),
        ("openai", [sys(), sys(), u()], {1}),
        ("openai", [sys(), u(), calls("c1"), tool("c1"), sys(), tool("c1")], {4}),
    ],
)
def test_system_position_violated(dialect: str, msgs: Msgs, bad: set[int]) -> None:
    got = [v for v in validate_shape(msgs, dialect) if v.rule == "system-position"]
    assert {v.index for v in got} == bad
    for v in got:
        assert v.message == (
            f"messages.{v.index}: role 'system' must precede an 'assistant' message or end the array"
        )


# -- 2. answered-tool-use --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dialect", "msgs"),
    [
        ("anthropic", [u(), tool_use("t1"), tool_result("t1")]),
        ("anthropic", [u(), tool_use("t1", "t2", "t3"), tool_result("t3", "t1", "t2"), a()]),
        (
            "anthropic",
            [
                u(),
                tool_use("t1", text="let me look"),
                tool_result("t1"),
                tool_use("t2"),
                tool_result("t2"),
            ],
        ),
        ("openai", [u(), calls("c1"), tool("c1")]),
        ("openai", [u(), calls("c1", "c2", "c3"), tool("c2"), tool("c3"), tool("c1"), u()]),
        (
            "openai",
            [u(), calls("c1", content=""), tool("c1"), calls("c2", content="looking"), tool("c2")],
        ),
    ],
)
def test_answered_tool_use_allowed(dialect: str, msgs: Msgs) -> None:
    assert rules(msgs, dialect) == set()


@pytest.mark.parametrize(
    ("dialect", "msgs", "index", "missing"),
    [
        ("anthropic", [u(), tool_use("t1", "t2"), tool_result("t1")], 1, ("t2",)),  # partial
        ("anthropic", [u(), tool_use("t1")], 1, ("t1",)),  # call ends the array
        ("anthropic", [u(), tool_use("t1"), u("later"), tool_result("t1")], 1, ("t1",)),
        ("anthropic", [u(), tool_use("t1"), a(), tool_result("t1")], 1, ("t1",)),
        ("anthropic", [u(), tool_use("t1", "t2"), u("no results")], 1, ("t1", "t2")),
        ("openai", [u(), calls("c1", "c2"), tool("c2"), u()], 1, ("c1",)),  # partial
        ("openai", [u(), calls("c1")], 1, ("c1",)),
        ("openai", [u(), calls("c1", "c2"), tool("c1"), u(), tool("c2")], 1, ("c2",)),
        ("openai", [u(), calls("c1"), sys(), tool("c1")], 1, ("c1",)),
    ],
)
def test_answered_tool_use_violated(
    dialect: str, msgs: Msgs, index: int, missing: tuple[str, ...]
) -> None:
    got = [v for v in validate_shape(msgs, dialect) if v.rule == "answered-tool-use"]
    assert [(v.index, v.ids) for v in got] == [(index, missing)]
    for tid in missing:
        assert tid in got[0].message
    if dialect == "anthropic":
        assert (
            "tool_use` ids were found without `tool_result` blocks immediately after"
            in got[0].message
        )
    else:
        assert "must be followed by tool messages" in got[0].message


# -- 3. paired-tool-result -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dialect", "msgs", "index", "unpaired"),
    [
        ("anthropic", [tool_result("t1"), a()], 0, ("t1",)),
        # a call only counts from an assistant, even if another role carries a tool_use block
        ("anthropic", [u(tool_use("t1")["content"]), tool_result("t1")], 1, ("t1",)),
        ("anthropic", [u(), tool_use("t1"), tool_result("t1", "t9")], 2, ("t9",)),
        ("anthropic", [u(), tool_use("t1"), tool_result("t1"), a(), tool_result("t1")], 4, ("t1",)),
        ("anthropic", [u(), tool_use("t1"), tool_result("t1"), tool_result("t1")], 3, ("t1",)),
        ("openai", [sys(), tool("c1"), u()], 1, ("c1",)),
        ("openai", [u(), calls("c1"), tool("c1"), tool("c9")], 3, ("c9",)),
        ("openai", [u(), calls("c1"), tool("c1"), u(), tool("c1")], 4, ("c1",)),
        ("openai", [u(), a(), tool("c1")], 2, ("c1",)),
    ],
)
def test_paired_tool_result_violated(
    dialect: str, msgs: Msgs, index: int, unpaired: tuple[str, ...]
) -> None:
    got = [v for v in validate_shape(msgs, dialect) if v.rule == "paired-tool-result"]
    assert [(v.index, v.ids) for v in got] == [(index, unpaired)]
    if dialect == "anthropic":
        assert f"messages.{index}.content: unexpected `tool_use_id`" in got[0].message
        assert unpaired[0] in got[0].message
    else:
        assert f"messages.[{index}].role" in got[0].message
        assert "must be a response to a preceeding message with 'tool_calls'" in got[0].message


def test_paired_tool_result_allowed_across_a_long_openai_run() -> None:
    msgs = [u(), calls(*[f"c{i}" for i in range(6)])] + [tool(f"c{i}") for i in (5, 3, 1, 0, 2, 4)]
    assert rules(msgs, "openai") == set()


# -- 4. no-blank-content ---------------------------------------------------------------------

_ANTHROPIC_BLANKS = [
    "",
    "   ",
    "\n\t",
    "\u00a0\u2028",
    [],
    [{"type": "text", "text": ""}],
    [{"type": "text", "text": " \n "}],
    [{"type": "text"}],
    [{"type": "text", "text": "fine"}, {"type": "text", "text": " "}],
    [{"type": "thinking", "thinking": "", "signature": "sig"}],
    [{"type": "thinking", "signature": "sig"}, {"type": "text", "text": "answer"}],
    None,
]


@pytest.mark.parametrize("content", _ANTHROPIC_BLANKS)
@pytest.mark.parametrize("role", ["user", "assistant"])
def test_anthropic_blank_content_violated(content: Any, role: str) -> None:
    msgs = [u(), {"role": role, "content": content}, u("tail")]
    got = [v for v in validate_shape(msgs, "anthropic") if v.rule == "no-blank-content"]
    assert [v.index for v in got] == [1]
    assert got[0].message.startswith("messages.1: all messages must have non-empty content")


def test_anthropic_missing_content_is_blank() -> None:
    assert (1, "no-blank-content") in rules([u(), {"role": "assistant"}, u()], "anthropic")


@pytest.mark.parametrize("content", ["", []])
def test_anthropic_empty_final_assistant_is_allowed(content: Any) -> None:
    assert rules([u(), {"role": "assistant", "content": content}], "anthropic") == set()


@pytest.mark.parametrize(
    "msgs",
    [
        [u(), a("   ")],  # whitespace is not an empty prefill
        [u(), a([{"type": "text", "text": ""}])],  # nor is a blank block
        [u(), a(""), u()],  # only the final message may be empty
        [u(), a(), u("")],  # a final user message may not
        [u(), a(None)],
    ],
)
def test_anthropic_empty_assistant_exception_is_narrow(msgs: Msgs) -> None:
    assert any(r == "no-blank-content" for _, r in rules(msgs, "anthropic"))


@pytest.mark.parametrize(
    "content",
    [
        [
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
            }
        ],
        [{"type": "redacted_thinking", "data": "xx"}, {"type": "text", "text": "k"}],
        [{"type": "thinking", "thinking": "hmm", "signature": "s"}, {"type": "text", "text": "k"}],
        [{"type": "container_upload", "file_id": "file_1"}],
        [{"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "d"}}],
    ],
)
def test_anthropic_non_text_blocks_are_not_blank(content: Any) -> None:
    assert rules([u(), a(content), u()], "anthropic") == set()


def test_anthropic_empty_tool_result_content_is_not_blank() -> None:
    result = u([{"type": "tool_result", "tool_use_id": "t1", "content": ""}])
    bare = u([{"type": "tool_result", "tool_use_id": "t2"}])
    msgs = [u(), tool_use("t1"), result, tool_use("t2"), bare]
    assert rules(msgs, "anthropic") == set()


@pytest.mark.parametrize("content", ["", "  ", "\n", [], [{"type": "text", "text": "\t"}], None])
@pytest.mark.parametrize("role", ["system", "developer", "user", "assistant"])
def test_openai_blank_content_violated(content: Any, role: str) -> None:
    msgs = [u(), {"role": role, "content": content}, a() if role != "assistant" else u()]
    got = [v for v in validate_shape(msgs, "openai") if v.rule == "no-blank-content"]
    assert [v.index for v in got] == [1]
    assert got[0].message == (
        "messages.[1].content: Invalid value: content must be a non-empty string or array."
    )


def test_openai_blank_tool_message_and_refusal() -> None:
    msgs = [u(), calls("c1"), tool("c1", "")]
    assert rules(msgs, "openai") == {(2, "no-blank-content")}
    assert rules([u(), a([{"type": "refusal", "refusal": " "}])], "openai") == {
        (1, "no-blank-content")
    }


@pytest.mark.parametrize("content", [None, "", "calling", "missing"])
def test_openai_assistant_with_tool_calls_may_have_no_content(content: Any) -> None:
    msg = calls("c1", content=content)
    if content == "missing":
        del msg["content"]
    assert rules([u(), msg, tool("c1")], "openai") == set()


def test_openai_legacy_function_call_may_have_null_content() -> None:
    msgs = [
        u(),
        {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}},
        {"role": "function", "name": "f", "content": "42"},
    ]
    assert rules(msgs, "openai") == set()


@pytest.mark.parametrize(
    "msg",
    [
        {**calls("c1"), "content": "   "},  # only null or "" are excused
        {**calls("c1"), "content": []},
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "assistant", "content": None},
    ],
)
def test_openai_tool_call_exception_is_narrow(msg: dict[str, Any]) -> None:
    msgs = [u(), msg, tool("c1")] if msg.get("tool_calls") else [u(), msg]
    assert (1, "no-blank-content") in rules(msgs, "openai")


def test_openai_has_no_empty_final_assistant_exception() -> None:
    assert rules([u(), a("")], "openai") == {(1, "no-blank-content")}


# -- consecutive same roles: deliberately not a rule -----------------------------------------


@pytest.mark.parametrize("dialect", ["anthropic", "openai"])
def test_consecutive_same_roles_are_fine(dialect: str) -> None:
    assert rules([u(), u("summary"), u(), a(), a()], dialect) == set()


# -- the four historical failures (seeds/summarize-component.md) -----------------------------


def _body(msgs: Msgs) -> bytes:
    return json.dumps({"model": "m", "messages": msgs, "max_tokens": 10}, indent=2).encode()


def _summary(role: str = "user") -> dict[str, Any]:
    return {"role": role, "content": "=== History Summary === ... <<cg:abc>>"}


def test_history_system_summary_before_a_kept_user_tail() -> None:
    msgs = [u("task"), a("a1"), u("u2"), a("a3"), u("u4")]
    idx = index_body(_body(msgs), ANTHROPIC)
    plan: list[Piece] = [Keep(0), Insert.message(_summary("system"), ANTHROPIC), Keep(4)]
    got = validate_shape(plan_views(idx, plan), ANTHROPIC)
    assert [(v.index, v.rule) for v in got] == [(1, "system-position")]
    assert got[0].message == (
        "messages.1: role 'system' must precede an 'assistant' message or end the array"
    )
    # the same summary as a user message is correct output: consecutive users are legal
    plan[1] = Insert.message(_summary("user"), ANTHROPIC)
    assert validate_shape(plan_views(idx, plan), ANTHROPIC) == []


@pytest.mark.parametrize("dialect", ["anthropic", "openai"])
def test_history_kept_result_whose_call_was_cut(dialect: str) -> None:
    if dialect == "anthropic":
        msgs = [u("task"), tool_use("t1"), tool_result("t1"), a("done"), u("next")]
    else:
        msgs = [u("task"), calls("t1"), tool("t1"), a("done"), u("next")]
    d = DIALECTS[dialect]
    idx = index_body(_body(msgs), d)
    assert validate_shape(idx.views, d) == []
    plan: list[Piece] = [Keep(0), Insert.message(_summary(), d), Keep(2), Keep(3), Keep(4)]
    got = validate_shape(plan_views(idx, plan), d)
    assert [(v.index, v.rule, v.ids) for v in got] == [(2, "paired-tool-result", ("t1",))]


@pytest.mark.parametrize("dialect", ["anthropic", "openai"])
def test_history_kept_call_whose_results_were_cut(dialect: str) -> None:
    if dialect == "anthropic":
        msgs = [u("task"), tool_use("t1", "t2"), tool_result("t1", "t2"), a("done"), u("next")]
    else:
        msgs = [u("task"), calls("t1", "t2"), tool("t1"), tool("t2"), a("done"), u("next")]
    d = DIALECTS[dialect]
    idx = index_body(_body(msgs), d)
    n = len(msgs)
    plan: list[Piece] = [Keep(0), Keep(1), Insert.message(_summary(), d), Keep(n - 2), Keep(n - 1)]
    got = validate_shape(plan_views(idx, plan), d)
    assert [(v.index, v.rule, v.ids) for v in got] == [(1, "answered-tool-use", ("t1", "t2"))]


@pytest.mark.parametrize("n", [0, 1, 2])
@pytest.mark.parametrize("dialect", ["anthropic", "openai"])
def test_history_transcript_shorter_than_keep_last(n: int, dialect: str) -> None:
    d = DIALECTS[dialect]
    msgs = [u("task"), a("reply")][:n]
    idx = index_body(_body(msgs), d)
    assert validate_shape(idx.views, d) == []
    keep_last = 3
    tail = [Keep(i) for i in range(max(0, n - keep_last), n)]
    for plan in (tail, [Keep(i) for i in range(min(n, 1))] + tail[1:], []):
        out = splice(idx, plan)
        assert json.loads(out)["messages"] == [msgs[p.index] for p in plan]
        assert validate_shape(plan_views(idx, plan), d) == []
    assert validate_shape([], d) == []


# -- the oracle ------------------------------------------------------------------------------

_SYSTEMISH = {"system", "developer"}
_NO_CONTENT = object()


def _calls_of(m: dict[str, Any], dialect: str) -> set[Any]:
    if m.get("role") != "assistant":
        return set()
    if dialect == "anthropic":
        c = m.get("content")
        return (
            {b.get("id") for b in c if b.get("type") == "tool_use"}
            if isinstance(c, list)
            else set()
        )
    return {c.get("id") for c in (m.get("tool_calls") or [])}


def _results_of(m: dict[str, Any], dialect: str) -> set[Any]:
    if dialect == "anthropic":
        c = m.get("content")
        if not isinstance(c, list):
            return set()
        return {b.get("tool_use_id") for b in c if b.get("type") == "tool_result"}
    return {m.get("tool_call_id")} if m.get("role") == "tool" else set()


def _blank_str(s: Any) -> bool:
    return not isinstance(s, str) or s.strip() == ""


def _is_blank(m: dict[str, Any], dialect: str, last: bool) -> bool:
    role = m.get("role")
    c = m.get("content", _NO_CONTENT)
    if dialect == "anthropic":
        if c is _NO_CONTENT or c is None:
            return True
        if isinstance(c, str):
            return _blank_str(c) and not (last and role == "assistant" and c == "")
        if not c:
            return not (last and role == "assistant")
        fields = {"text": "text", "thinking": "thinking"}
        return any(b["type"] in fields and _blank_str(b.get(fields[b["type"]])) for b in c)
    has_calls = bool(m.get("tool_calls")) or isinstance(m.get("function_call"), dict)
    excused = role == "assistant" and has_calls
    if c is _NO_CONTENT or c is None:
        return not excused
    if isinstance(c, str):
        return _blank_str(c) and not (excused and c == "")
    fields = {"text": "text", "refusal": "refusal"}
    return not c or any(p["type"] in fields and _blank_str(p.get(fields[p["type"]])) for p in c)


def oracle(msgs: Msgs, dialect: str) -> set[tuple[int, str]]:
    """docs/behaviour.md#shape-rules, written independently: find each message's run owner first,
    then the sets."""
    n = len(msgs)
    roles = [m.get("role") for m in msgs]
    out: set[tuple[int, str]] = set()
    out |= {
        (i, "system-position")
        for i in range(1, n - 1)
        if roles[i] in _SYSTEMISH and roles[i + 1] != "assistant"
    }
    # owner[j]: the assistant message whose tool results message j may carry, if any
    owner: list[int | None] = [None] * n
    if dialect == "anthropic":
        for j in range(1, n):
            if roles[j] == "user" and roles[j - 1] == "assistant":
                owner[j] = j - 1
    else:
        current: int | None = None
        for j in range(n):
            if roles[j] == "tool":
                owner[j] = current
            else:
                current = j if roles[j] == "assistant" else None
    required = {i: _calls_of(m, dialect) for i, m in enumerate(msgs)}
    answered: dict[int, set[Any]] = defaultdict(set)
    for j in range(n):
        o = owner[j]
        if o is not None:
            answered[o] |= _results_of(msgs[j], dialect)
    out |= {(i, "answered-tool-use") for i, req in required.items() if req - answered[i]}
    for j in range(n):
        res = _results_of(msgs[j], dialect)
        o = owner[j]
        if res and (o is None or res - required[o]):
            out.add((j, "paired-tool-result"))
    out |= {
        (i, "no-blank-content") for i, m in enumerate(msgs) if _is_blank(m, dialect, i == n - 1)
    }
    return out


@SETTINGS
@given(st.sampled_from(DIALECT_NAMES).flatmap(lambda d: st.tuples(st.just(d), messages(d))))
def test_valid_transcripts_have_no_violations(case: tuple[str, Msgs]) -> None:
    dialect, msgs = case
    assert oracle(msgs, dialect) == set()
    assert validate_shape(msgs, dialect) == []


@SETTINGS
@given(st.sampled_from(DIALECT_NAMES).flatmap(lambda d: st.tuples(st.just(d), mutated_messages(d))))
def test_validate_shape_agrees_with_the_oracle(case: tuple[str, Msgs]) -> None:
    dialect, msgs = case
    d = DIALECTS[dialect]
    got = validate_shape(msgs, dialect)
    assert {(v.index, v.rule) for v in got} == oracle(msgs, dialect)
    assert validate_shape([d.view(m) for m in msgs], d) == got  # views or dicts alike


@pytest.mark.parametrize("dialect", ["anthropic", "openai"])
@pytest.mark.parametrize(
    "rule", ["system-position", "answered-tool-use", "paired-tool-result", "no-blank-content"]
)
def test_the_mutations_reach_every_rule(dialect: str, rule: str) -> None:
    """Vacuity guard for the oracle test: broken transcripts break each rule somewhere."""
    found = find(
        mutated_messages(dialect),  # type: ignore[arg-type]
        lambda m: any(r == rule for _, r in oracle(m, dialect)),
        settings=settings(SETTINGS, max_examples=2000, phases=[Phase.generate], database=None),
    )
    assert any(v.rule == rule for v in validate_shape(found, dialect))


# -- role legality on the bytes --------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b'{"messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}]}',
        b'{"messages": [{"role": "user", "content": "a"}, {"rol\\u0065": "tool", "content": "b"}]}',
        b'{"messages": [{"role": "user", "content": "a"}, {"role": "t\\u006fol", "content": "b"}]}',
        b'{"messag\\u0065s": [{"role":"user","content":"a"},{"role":"tool","content":"b"}]}',
    ],
)
def test_anthropic_tool_role_on_the_wire_is_caught(raw: bytes) -> None:
    got = check_wire_roles(raw, "anthropic")
    assert [(v.index, v.rule, v.ids) for v in got] == [(1, "wire-role", ("tool",))]
    assert got[0].message == "messages.1.role: Input should be 'assistant' or 'system' or 'user'"


def test_anthropic_other_foreign_roles_and_non_objects() -> None:
    raw = json.dumps(
        {"messages": [u(), {"role": "developer", "content": "x"}, {"content": "r"}, "s", a()]}
    ).encode()
    got = check_wire_roles(raw, ANTHROPIC)
    assert [(v.index, v.ids) for v in got] == [(1, ("developer",)), (2, ("None",)), (3, ("None",))]


def test_openai_tool_role_is_legal_on_the_wire() -> None:
    raw = json.dumps({"messages": [sys(role="developer"), u(), calls("c"), tool("c")]}).encode()
    assert check_wire_roles(raw, OPENAI) == []
    bad = json.dumps({"messages": [u(), {"role": "robot", "content": "x"}]}).encode()
    assert [v.index for v in check_wire_roles(bad, OPENAI)] == [1]


@pytest.mark.parametrize(
    "raw", [b"{not json", b"[]", b'{"model": "m"}', b'{"messages": {}}', b"\xff\xfe"]
)
def test_unreadable_bytes_are_a_violation(raw: bytes) -> None:
    got = check_wire_roles(raw, "anthropic")
    assert [(v.index, v.rule) for v in got] == [(-1, "wire-json")]


# -- introduced ------------------------------------------------------------------------------


def _v(index: int, rule: str, ids: tuple[str, ...] = ()) -> Violation:
    return Violation(index, rule, "msg", ids)


def test_introduced_ignores_what_the_client_already_sent() -> None:
    before = [_v(3, "system-position"), _v(5, "answered-tool-use", ("t1",))]
    # output: m0, new#0, m3, m5 -> the same violations at new indices are not the rewrite's
    after = [_v(2, "system-position"), _v(3, "answered-tool-use", ("t1",))]
    assert introduced(before, after, ["m0", "new#0", "m3", "m5"]) == []


def test_introduced_reports_new_rules_new_messages_and_new_ids() -> None:
    before = [_v(3, "system-position"), _v(5, "answered-tool-use", ("t1",))]
    sources = ["m0", "new#0", "m3", "m5", "m6"]
    new_rule_same_msg = _v(2, "no-blank-content")
    on_insert = _v(1, "system-position")
    other_ids = _v(3, "answered-tool-use", ("t1", "t2"))
    other_msg = _v(4, "paired-tool-result", ("t1",))
    wire = _v(-1, "wire-json")
    after = [new_rule_same_msg, on_insert, other_ids, other_msg, wire]
    assert introduced(before, after, sources) == after


def test_introduced_with_a_real_rewrite() -> None:
    msgs = [u("task"), sys(), u("oops: client's own violation"), a(), u(), a(), u("tail")]
    idx = index_body(_body(msgs), ANTHROPIC)
    before = validate_shape(idx.views, ANTHROPIC)
    assert [(v.index, v.rule) for v in before] == [(1, "system-position")]
    # keep the client's violation, cut the middle, insert a system summary at a bad place
    plan: list[Piece] = [
        Keep(0),
        Keep(1),
        Keep(2),
        Insert.message(_summary("system"), ANTHROPIC),
        Keep(6),
    ]
    after = validate_shape(plan_views(idx, plan), ANTHROPIC)
    assert {(v.index, v.rule) for v in after} == {(1, "system-position"), (3, "system-position")}
    got = introduced(before, after, plan_sources(plan))
    assert [(v.index, v.rule) for v in got] == [(3, "system-position")]
