"""cg.wire.splice: a plan of Keep/Cut/Insert pieces -> a new body, every untouched byte identical."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from cg.wire import shape
from cg.wire.body import BodyIndex, MessageCache, index_body
from cg.wire.dialects import ANTHROPIC, DIALECTS, OPENAI
from cg.wire.jsonspan import punctuation
from cg.wire.shape import Violation, check_wire_array, check_wire_roles
from cg.wire.splice import (
    Cut,
    Insert,
    Keep,
    Piece,
    apply_edits,
    array_messages,
    cut_source,
    cut_value,
    identity,
    is_identity,
    plan_sources,
    plan_views,
    splice,
    splice_array_bytes,
)
from tests.support.strategies import SETTINGS, Sample, Style, bodies, dumps, text


def _index(s: Sample) -> BodyIndex:
    return index_body(s.raw, DIALECTS[s.dialect])


def _summary(dialect: str, body: str) -> dict[str, Any]:
    return {
        "role": "user",
        "content": [{"type": "text", "text": "=== History Summary ===\n" + body}],
    }


def _check_outside_messages(idx: BodyIndex, out: bytes) -> str:
    """Everything before and after the messages array is the client's own text, unchanged."""
    out_text = out.decode("utf-8")
    head = idx.text[: idx.array.start]
    tail = idx.text[idx.array.end :]
    assert out_text.startswith(head)
    assert out_text.endswith(tail)
    assert len(out_text) >= len(head) + len(tail)
    return out_text


def _check_output(idx: BodyIndex, plan: list[Piece], out: bytes, expected_msgs: list[Any]) -> None:
    out_text = _check_outside_messages(idx, out)
    expected = dict(json.loads(idx.text))
    expected["messages"] = expected_msgs
    assert json.loads(out) == expected
    out_idx = index_body(out, idx.dialect)
    assert len(out_idx.messages) == len(plan)
    for k, p in enumerate(plan):
        if isinstance(p, Keep):
            assert out_idx.source(k) == idx.source(p.index)  # byte-identical
        elif isinstance(p, Insert):
            assert out_idx.source(k) == p.json
    for key, m in idx.members.items():
        if key != "messages":
            om = out_idx.members[key]
            assert out_text[om.start : om.end] == idx.text[m.start : m.end]
    assert plan_views(idx, plan) == out_idx.views


# -- identity --------------------------------------------------------------------------------


@SETTINGS
@given(bodies(allow_empty=True))
def test_identity_plan_returns_the_original_bytes_object(s: Sample) -> None:
    idx = _index(s)
    raw = idx.raw
    out = splice(idx, identity(len(idx.messages)))
    assert out is raw
    assert is_identity(identity(len(idx.messages)), len(idx.messages))


# -- subsequences and inserts ----------------------------------------------------------------


@SETTINGS
@given(bodies(), st.data())
def test_cutting_a_contiguous_span_and_inserting_at_the_cut(s: Sample, data: Any) -> None:
    idx = _index(s)
    n = len(idx.messages)
    a = data.draw(st.integers(0, n))
    b = data.draw(st.integers(a, n))
    insert = data.draw(st.booleans())
    summary = Insert.message(_summary(s.dialect, data.draw(text)), idx.dialect)
    plan: list[Piece] = [Keep(i) for i in range(a)]
    expected = list(s.messages[:a])
    if insert:
        plan.append(summary)
        expected.append(json.loads(summary.json))
    plan += [Keep(i) for i in range(b, n)]
    expected += s.messages[b:]
    out = splice(idx, plan)
    if a == b and not insert:
        assert out is idx.raw
    _check_output(idx, plan, out, expected)


@SETTINGS
@given(bodies(), st.data())
def test_any_subsequence_with_inserts_anywhere(s: Sample, data: Any) -> None:
    idx = _index(s)
    n = len(idx.messages)
    kept = sorted(data.draw(st.sets(st.integers(0, n - 1), max_size=n)))
    plan: list[Piece] = [Keep(i) for i in kept]
    expected: list[Any] = [s.messages[i] for i in kept]
    for _ in range(data.draw(st.integers(0, 3))):
        at = data.draw(st.integers(0, len(plan)))
        new = Insert.message(_summary(s.dialect, data.draw(text)), idx.dialect)
        plan.insert(at, new)
        expected.insert(at, json.loads(new.json))
    out = splice(idx, plan)
    _check_output(idx, plan, out, expected)
    names = plan_sources(plan)
    inserted = [p for p in plan if isinstance(p, Insert)]
    assert [n for n in names if n.startswith("new#")] == [f"new#{k}" for k in range(len(inserted))]
    assert [n for n in names if n.startswith("m")] == [f"m{i}" for i in kept]


def test_empty_plan_empties_the_array_and_nothing_else() -> None:
    raw = b'{"model": "m",\n "messages": [ {"role": "user", "content": "a"} ],\n "stream": true}'
    idx = index_body(raw, ANTHROPIC)
    assert splice(idx, []) == b'{"model": "m",\n "messages": [],\n "stream": true}'


def test_insert_into_an_empty_array() -> None:
    idx = index_body(b'{"messages":[ ], "model":"m"}', OPENAI)
    new = Insert.message({"role": "user", "content": "hi"}, OPENAI)
    assert splice(idx, [new, new]) == (
        b'{"messages":[{"role":"user","content":"hi"},{"role":"user","content":"hi"}], "model":"m"}'
    )


def test_pretty_printed_array_stays_pretty_and_kept_bytes_stay_put() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "é</"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
        ],
    }
    raw = json.dumps(body, indent=2).encode()
    idx = index_body(raw, ANTHROPIC)
    new = Insert.message({"role": "user", "content": "S"}, ANTHROPIC)
    out = splice(idx, [Keep(0), new, Keep(2)])
    assert out.decode() == (
        "{\n"
        '  "model": "m",\n'
        '  "messages": [\n'
        "    {\n"
        '      "role": "user",\n'
        '      "content": "\\u00e9</"\n'
        "    },\n"
        '    {"role":"user","content":"S"},\n'
        "    {\n"
        '      "role": "user",\n'
        '      "content": "c"\n'
        "    }\n"
        "  ]\n"
        "}"
    )


# -- Insert ----------------------------------------------------------------------------------


def test_insert_message_is_deterministic_compact_and_unescaped() -> None:
    obj = {"role": "user", "content": [{"type": "text", "text": '日本 😀 </x> "q"'}]}
    a = Insert.message(obj, ANTHROPIC)
    b = Insert.message(json.loads(json.dumps(obj)), ANTHROPIC)
    assert a == b
    assert a.json == '{"role":"user","content":[{"type":"text","text":"日本 😀 </x> \\"q\\""}]}'
    assert a.view == ANTHROPIC.view(obj)


# -- Cut -------------------------------------------------------------------------------------

_A, _B, _C = (json.dumps({"type": "text", "text": t}) for t in "abc")
PRETTY = (
    "{\n"
    '  "model": "m",\n'
    '  "messages": [\n'
    "    {\n"
    '      "role": "user",\n'
    f'      "content": [\n        {_A},\n        {_B},\n        {_C}\n      ],\n'
    '      "x": 1\n'
    "    }\n"
    "  ]\n"
    "}"
)
COMPACT = (
    '{"model":"m","messages":[{"role":"user","content":['
    + ",".join(json.dumps({"type": "text", "text": t}, separators=(",", ":")) for t in "abc")
    + '],"x":1}]}'
)
_CA, _CB, _CC = (json.dumps({"type": "text", "text": t}, separators=(",", ":")) for t in "abc")


@pytest.mark.parametrize(
    ("raw", "drop", "expected"),
    [
        (PRETTY, {0}, PRETTY.replace(f"{_A},\n        ", "")),
        (PRETTY, {1}, PRETTY.replace(f",\n        {_B}", "")),
        (PRETTY, {2}, PRETTY.replace(f",\n        {_C}", "")),
        (PRETTY, {0, 2}, PRETTY.replace(f"{_A},\n        ", "").replace(f",\n        {_C}", "")),
        (
            PRETTY,
            {0, 1, 2},
            PRETTY.replace(f"[\n        {_A},\n        {_B},\n        {_C}\n      ]", "[]"),
        ),
        (PRETTY, set(), PRETTY),
        (COMPACT, {0}, COMPACT.replace(f"{_CA},", "")),
        (COMPACT, {1}, COMPACT.replace(f",{_CB}", "")),
        (COMPACT, {2}, COMPACT.replace(f",{_CC}", "")),
        (COMPACT, {1, 2}, COMPACT.replace(f",{_CB},{_CC}", "")),
        (COMPACT, {0, 1, 2}, COMPACT.replace(f"{_CA},{_CB},{_CC}", "")),
    ],
)
def test_cut_removes_exactly_the_block_and_its_separator(
    raw: str, drop: set[int], expected: str
) -> None:
    assert expected != raw or not drop  # the replace above really matched
    idx = index_body(raw.encode(), ANTHROPIC)
    out = splice(idx, [Cut(0, frozenset(drop))])
    assert out.decode() == expected
    assert json.loads(out)["messages"][0] == cut_value(idx, 0, frozenset(drop))


def _expected_cut(idx: BodyIndex, i: int, drop: frozenset[int]) -> str:
    """Message i's source minus each dropped block and one separator next to it."""
    arr = idx.content_array(i)
    assert arr is not None
    t = idx.text
    els = arr.elements
    keep = [n for n in range(len(els)) if n not in drop]
    m = idx.messages[i]
    if not keep:
        new = "[]"
    else:
        parts = [t[arr.start : els[0].start]]
        for a, n in enumerate(keep):
            parts.append(t[els[n].start : els[n].end])
            if a + 1 < len(keep):
                parts.append(t[els[n].end : els[n + 1].start])
        parts.append(t[els[-1].end : arr.end])
        new = "".join(parts)
    return t[m.start : arr.start] + new + t[arr.end : m.end]


@SETTINGS
@given(bodies(min_turns=1), st.data())
def test_cut_leaves_the_rest_of_the_message_as_it_came(s: Sample, data: Any) -> None:
    idx = _index(s)
    with_blocks = [i for i, m in enumerate(s.messages) if isinstance(m.get("content"), list)]
    assume(with_blocks)
    i = data.draw(st.sampled_from(with_blocks))
    k = len(s.messages[i]["content"])
    drop = frozenset(data.draw(st.sets(st.integers(0, max(k - 1, 0)), max_size=k)) if k else ())
    plan: list[Piece] = [Keep(j) for j in range(len(idx.messages))]
    plan[i] = Cut(i, drop)
    out = splice(idx, plan)
    out_idx = index_body(out, idx.dialect)
    assert out_idx.source(i) == cut_source(idx, i, drop) == _expected_cut(idx, i, drop)
    expected_msg = dict(s.messages[i])
    expected_msg["content"] = [b for n, b in enumerate(s.messages[i]["content"]) if n not in drop]
    assert cut_value(idx, i, drop) == expected_msg
    _check_output(idx, plan, out, [expected_msg if j == i else m for j, m in enumerate(s.messages)])


@pytest.mark.parametrize("layout", ["compact", "spaced", "indent", "odd"])
def test_cut_on_openai_content_parts(layout: str) -> None:
    body = {
        "messages": [
            {"role": "system", "content": "s"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
        ],
        "model": "gpt",
    }
    raw = dumps(body, Style(layout=layout, seed=7)).encode()  # type: ignore[arg-type]
    idx = index_body(raw, OPENAI)
    out = splice(idx, [Keep(0), Cut(1, frozenset({0}))])
    assert json.loads(out)["messages"][1] == {
        "role": "user",
        "content": [{"type": "text", "text": "b"}],
    }
    assert index_body(out, OPENAI).source(0) == idx.source(0)


def test_cut_of_string_content_is_refused() -> None:
    idx = index_body(b'{"messages": [{"role": "user", "content": "x"}]}', ANTHROPIC)
    with pytest.raises(ValueError, match="no content block array"):
        splice(idx, [Cut(0, frozenset({0}))])


# -- plan helpers ----------------------------------------------------------------------------


def test_is_identity() -> None:
    assert is_identity([], 0)
    assert is_identity([Keep(0), Keep(1)], 2)
    assert not is_identity([Keep(0)], 2)
    assert not is_identity([Keep(1), Keep(0)], 2)
    assert not is_identity([Keep(0), Cut(1, frozenset())], 2)
    new = Insert.message({"role": "user", "content": "x"}, ANTHROPIC)
    assert not is_identity([Keep(0), new], 1)


def test_plan_sources_name_inputs_and_new_messages() -> None:
    new = Insert.message({"role": "user", "content": "x"}, ANTHROPIC)
    plan: list[Piece] = [Keep(0), new, Cut(3, frozenset({1})), new, Keep(4)]
    assert plan_sources(plan) == ["m0", "new#0", "m3", "new#1", "m4"]


# -- the byte path equals the text path ------------------------------------------------------


def splice_text(index: BodyIndex, plan: list[Piece]) -> str:
    """The splice done on text, the way it was before `splice_array_bytes` (the oracle): each
    output message's source text, the array rebuilt in its punctuation (two messages that were
    neighbours with the text that lay between them), the text around it."""
    pieces: list[str] = []
    for p in plan:
        if isinstance(p, Keep):
            pieces.append(index.source(p.index))
        elif isinstance(p, Cut):
            pieces.append(cut_source(index, p.index, p.drop))
        else:
            pieces.append(p.json)
    arr, chars = index.array, index.chars
    if not pieces:
        return chars.slice(0, arr.start) + "[]" + chars.slice(arr.end, len(chars))
    lead, sep, trail = punctuation(chars, arr)
    msgs = index.messages
    joined = [pieces[0]]
    for n in range(1, len(plan)):
        a, b = plan[n - 1], plan[n]
        if not isinstance(a, Insert) and not isinstance(b, Insert) and b.index == a.index + 1:
            joined.append(chars.slice(msgs[a.index].end, msgs[b.index].start))
        else:
            joined.append(sep)
        joined.append(pieces[n])
    return (
        chars.slice(0, arr.start)
        + "["
        + lead
        + "".join(joined)
        + trail
        + "]"
        + chars.slice(arr.end, len(chars))
    )


def _random_plan(idx: BodyIndex, dialect: str, data: Any) -> list[Piece]:
    """Any subsequence of the messages, some cut (where they have blocks), some inserts."""
    n = len(idx.messages)
    kept = sorted(data.draw(st.sets(st.integers(0, max(n - 1, 0)), max_size=n))) if n else []
    plan: list[Piece] = []
    for i in kept:
        arr = idx.content_array(i)
        if arr is not None and arr.elements and data.draw(st.booleans()):
            drop = data.draw(st.sets(st.integers(0, len(arr.elements) - 1), max_size=2))
            plan.append(Cut(i, frozenset(drop)))
        else:
            plan.append(Keep(i))
    for _ in range(data.draw(st.integers(0, 2))):
        at = data.draw(st.integers(0, len(plan)))
        plan.insert(at, Insert.message(_summary(dialect, data.draw(text)), idx.dialect))
    return plan


@SETTINGS
@given(bodies(), st.data())
def test_the_byte_splice_is_the_text_splice_encoded(s: Sample, data: Any) -> None:
    """`splice` slices kept messages out of `raw` by byte offsets (`splice_array_bytes`); its
    output is, byte for byte, the text path's (`splice_text`) encoded, on a body read whole
    and on a warm body whose text is segments shared with an earlier turn (non-ASCII, escapes,
    every layout)."""
    dialect = DIALECTS[s.dialect]
    cache = MessageCache()
    warm = data.draw(st.booleans())
    if warm:
        # An earlier turn: some of the messages, the same members; the body is then read on it.
        body = dict(s.body)
        k = data.draw(st.integers(1, max(1, len(s.messages))))
        body["messages"] = s.messages[:k]
        index_body(dumps(body, s.style).encode(), dialect, cache)
    idx = index_body(s.raw, dialect, cache)
    plan = _random_plan(idx, s.dialect, data)
    expected = splice_text(idx, plan).encode("utf-8")
    start, end, parts = splice_array_bytes(idx, plan)
    assert idx.raw[:start] + b"".join(parts) + idx.raw[end:] == expected
    assert len(array_messages(parts)) == len(plan)
    if not is_identity(plan, len(idx.messages)):
        assert splice(idx, plan) == expected


def test_the_byte_splice_reads_offsets_past_non_ascii_text() -> None:
    """Vacuity guard for the property above: a body whose characters are not its bytes (an
    emoji before the array, non-ASCII in kept messages and after the array) splices the same
    both ways, and the byte offsets really differ from the character positions."""
    body = {
        "model": "m",
        "system": "naïve 🎉 prompt",
        "messages": [
            {"role": "user", "content": "héllo 🎉"},
            {"role": "assistant", "content": "ça va"},
            {"role": "user", "content": "日本語"},
        ],
        "tools": [{"name": "t", "description": "🎉 tool", "input_schema": {}}],
    }
    cache = MessageCache()
    earlier = dict(body, messages=body["messages"][:2])
    index_body(json.dumps(earlier, ensure_ascii=False).encode(), ANTHROPIC, cache)
    raw = json.dumps(body, ensure_ascii=False).encode()
    summary = Insert.message(_summary("anthropic", "résumé ✓"), ANTHROPIC)
    plan: list[Piece] = [Keep(0), summary, Keep(2)]
    for idx in (index_body(raw, ANTHROPIC), index_body(raw, ANTHROPIC, cache)):
        assert not idx.chars.ascii and idx.byte_offset(idx.array.start) != idx.array.start
        out = splice(idx, plan)
        assert out == splice_text(idx, plan).encode("utf-8")
        msgs = json.loads(out)["messages"]
        assert msgs == [body["messages"][0], json.loads(summary.json), body["messages"][2]]
        assert json.loads(out)["tools"] == body["tools"]
    assert idx.shared == 2 and idx.chars.segments > 1  # the warm one: segments, shared bytes


def _roles_oracle(idx: BodyIndex, parts: list[Any]) -> list[Violation]:
    """`check_wire_roles` on the rebuilt array joined and read whole, the way it was checked
    before `check_wire_array` read it message by message."""
    key = idx.dialect.array_key.encode()
    return check_wire_roles(b'{"' + key + b'":' + b"".join(parts) + b"}", idx.dialect)


def _stranger(idx: BodyIndex) -> Insert:
    """A new message with a role no provider accepts: what a rewrite bug would send."""
    return Insert.message({"role": "narrator", "content": "x"}, idx.dialect)


@SETTINGS
@given(bodies(), st.data())
def test_the_array_role_check_is_the_whole_array_read(s: Sample, data: Any) -> None:
    """`check_wire_array` reads each message alone and skips a kept message a turn before it
    read clean (`memo.wire_ok`, inherited over the shared prefix); over two turns, cold and
    warm, with inserts of a refused role, it reports what reading the joined array reports."""
    dialect = DIALECTS[s.dialect]
    cache = MessageCache()
    body = dict(s.body)
    k = data.draw(st.integers(1, max(1, len(s.messages))))
    body["messages"] = s.messages[:k]
    turns = [dumps(body, s.style).encode(), s.raw]
    for raw in turns:
        idx = index_body(raw, dialect, cache)
        plan = _random_plan(idx, s.dialect, data)
        if data.draw(st.booleans()):
            plan.insert(data.draw(st.integers(0, len(plan))), _stranger(idx))
        _, _, parts = splice_array_bytes(idx, plan)
        assert check_wire_array(idx, plan, parts) == _roles_oracle(idx, parts)
        # And again on the same index, every kept message it read clean now remembered.
        assert check_wire_array(idx, plan, parts) == _roles_oracle(idx, parts)


def test_the_array_role_check_reads_a_kept_message_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Vacuity guard for the property above: on a warm turn, a kept message an earlier turn
    read clean is not read again, a new one is compared with the source its index read it from
    (not decoded a second time), and one the rewrite made is read every time."""
    msgs = [
        {"role": "system", "content": "s" * 500},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    cache = MessageCache()
    first = index_body(json.dumps({"model": "m", "messages": msgs}).encode(), OPENAI, cache)
    summary = Insert.message({"role": "user", "content": "summary"}, OPENAI)
    plan: list[Piece] = [Keep(0), summary, Keep(3)]
    _, _, parts = splice_array_bytes(first, plan)
    assert check_wire_array(first, plan, parts) == []
    assert first.memo.wire_ok[1] == [True, False, False, True]
    more = [*msgs, {"role": "assistant", "content": "d"}, {"role": "user", "content": "e"}]
    warm = index_body(json.dumps({"model": "m", "messages": more}).encode(), OPENAI, cache)
    assert warm.shared == 4 and warm.memo.wire_ok[1] == [True, False, False, True]
    plan = [Keep(0), summary, Keep(3), Keep(4), Keep(5)]
    _, _, parts = splice_array_bytes(warm, plan)
    read: list[str] = []
    real = shape._DECODER.raw_decode

    def counted(text: str, idx: int = 0) -> tuple[Any, int]:
        read.append(text)
        return real(text, idx)

    monkeypatch.setattr(shape._DECODER, "raw_decode", counted)
    assert check_wire_array(warm, plan, parts) == []
    assert [json.loads(t) for t in read] == [json.loads(summary.json)]
    assert warm.memo.wire_ok[1] == [True, False, False, True, True, True]


def test_the_array_role_check_refuses_a_slice_off_by_a_byte() -> None:
    """The check is on the bytes: a kept message sliced one byte off, or punctuation that is
    not JSON's, is a `wire-json` violation, and a refused role a `wire-role` one at its place."""
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    idx = index_body(json.dumps({"model": "m", "messages": msgs}).encode(), ANTHROPIC)
    plan: list[Piece] = [Keep(0), Keep(1)]
    _, _, parts = splice_array_bytes(idx, plan)
    assert check_wire_array(idx, plan, parts) == []
    shifted = list(parts)
    shifted[2] = idx.raw[idx.raw.index(b'{"role"') + 1 : idx.raw.index(b"}, ") + 2]
    (v,) = check_wire_array(index_body(idx.raw, ANTHROPIC), plan, shifted)
    assert v.rule == "wire-json"
    semi = list(parts)
    semi[3] = b";"
    (v,) = check_wire_array(index_body(idx.raw, ANTHROPIC), plan, semi)
    assert v.rule == "wire-json"
    odd: list[Piece] = [Keep(0), _stranger(idx), Keep(1)]
    _, _, parts = splice_array_bytes(idx, odd)
    (v,) = check_wire_array(idx, odd, parts)
    assert (v.rule, v.index, v.ids) == ("wire-role", 1, ("narrator",))


def test_apply_edits_refuses_overlapping_edits() -> None:
    assert apply_edits(b"abcdef", [(1, 2, (b"X",)), (4, 4, (b"Y", b"Z"))]) == b"aXcdYZef"
    with pytest.raises(ValueError):
        apply_edits(b"abcdef", [(2, 4, (b"X",)), (3, 5, (b"Y",))])
