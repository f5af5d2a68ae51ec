"""cg.wire.body: one decode of the body, the exact span and view of every message, or a reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cg.wire.body import BodyIndex, BodyRejected, Deferred, MessageCache, OverBound, index_body
from cg.wire.dialects import ANTHROPIC, DIALECTS, OPENAI, Dialect
from cg.wire.shape import validate_index, validate_shape
from cg.wire.splice import Cut, Keep, splice
from tests.support.strategies import SETTINGS, Sample, bodies, dumps, styles

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "claude_code_2.1.197_turn16.json"


@SETTINGS
@given(bodies(allow_empty=True))
def test_every_message_span_parses_to_the_message(s: Sample) -> None:
    d = DIALECTS[s.dialect]
    idx = index_body(s.raw, d)
    assert idx.raw is s.raw or idx.raw == s.raw
    assert idx.text == s.text
    assert idx.dialect is d
    assert len(idx.messages) == len(s.messages)
    for n, (m, expected) in enumerate(zip(idx.messages, s.messages, strict=True)):
        assert json.loads(s.text[m.start : m.end]) == expected
        assert idx.source(n) == s.text[m.start : m.end]
        assert m.value == expected
        assert m.view == d.view(expected)
    assert idx.views == [m.view for m in idx.messages]
    # the messages array and every other top-level field, by exact span
    assert json.loads(s.text[idx.array.start : idx.array.end]) == s.messages
    assert list(idx.members) == list(s.body)
    for key, member in idx.members.items():
        assert json.loads(s.text[member.start : member.end]) == s.body[key]


@SETTINGS
@given(bodies())
def test_content_array_spans_parse_to_the_blocks(s: Sample) -> None:
    idx = index_body(s.raw, DIALECTS[s.dialect])
    saw_blocks = False
    for n, msg in enumerate(s.messages):
        arr = idx.content_array(n)
        assert idx.content_array(n) is arr  # cached
        content = msg.get("content")
        if not isinstance(content, list):
            assert arr is None
            continue
        saw_blocks = True
        assert arr is not None
        assert idx.messages[n].start < arr.start < arr.end < idx.messages[n].end
        assert [json.loads(s.text[e.start : e.end]) for e in arr.elements] == content
    if any(isinstance(m.get("content"), list) for m in s.messages):
        assert saw_blocks  # vacuity guard


def test_escaped_messages_key_and_nested_decoy() -> None:
    raw = (
        b'{"metadata": {"messages": [{"role": "tool"}]}, "messag\\u0065s": '
        b'[{"role": "user", "content": "hi"}], "model": "m"}'
    )
    idx = index_body(raw, ANTHROPIC)
    assert [m.value for m in idx.messages] == [{"role": "user", "content": "hi"}]
    assert idx.source(0) == '{"role": "user", "content": "hi"}'
    assert set(idx.members) == {"metadata", "messages", "model"}


def test_empty_messages_array() -> None:
    idx = index_body(b'{"messages": [ ], "model": "m"}', OPENAI)
    assert idx.messages == [] and idx.views == []


def test_whitespace_around_the_document_is_fine() -> None:
    idx = index_body(b' \r\n\t{"messages":[{"role":"user","content":"x"}]}\n\n', OPENAI)
    assert len(idx.messages) == 1


@pytest.mark.parametrize(
    ("raw", "dialect", "fragment"),
    [
        (b"", ANTHROPIC, "empty body"),
        (b'{"messages": [{"role": "user", "content": "\xff"}]}', ANTHROPIC, "not UTF-8"),
        (b'{"messages": "\xc3("}', OPENAI, "not UTF-8"),
        ('\ufeff{"messages": []}'.encode(), ANTHROPIC, "byte-order mark"),
        (b"[]", ANTHROPIC, "not a JSON object"),
        (b'"messages"', ANTHROPIC, "not a JSON object"),
        (b"42", OPENAI, "not a JSON object"),
        (b"   ", OPENAI, "not a JSON object"),
        (b'{"messages": [}', ANTHROPIC, "malformed JSON"),
        (b'{"messages": []} trailing', ANTHROPIC, "malformed JSON"),
        (b'{"messages": [], "model": "a", "model": "b"}', ANTHROPIC, "duplicate top-level key"),
        (b'{"model": "m"}', ANTHROPIC, "no 'messages' field"),
        (b'{"messages": {"role": "user"}}', ANTHROPIC, "is a dict, not an array"),
        (b'{"messages": null}', OPENAI, "is a NoneType, not an array"),
        (b'{"messages": ["hi"]}', ANTHROPIC, "messages[0] is not an object (got str)"),
        (
            b'{"messages": [{"role": "user", "content": "a"}, 7]}',
            OPENAI,
            "messages[1] is not an object (got int)",
        ),
        (b'{"messages": [{"content": "a"}]}', ANTHROPIC, "messages[0]: a message has no string"),
        (b'{"messages": [{"role": 1, "content": "a"}]}', OPENAI, "no string 'role'"),
        (b'{"messages": [{"role": "tool", "content": "a"}]}', ANTHROPIC, "unknown role 'tool'"),
        (b'{"messages": [{"role": "developer", "content": "a"}]}', ANTHROPIC, "unknown role"),
        (b'{"messages": [{"role": "robot", "content": "a"}]}', OPENAI, "unknown role 'robot'"),
        (
            b'{"messages": [{"role": "user", "content": 5}]}',
            ANTHROPIC,
            "'content' is not a string or an array (got int)",
        ),
        (
            b'{"messages": [{"role": "user", "content": {}}]}',
            OPENAI,
            "'content' is not a string or an array (got dict)",
        ),
        (b'{"messages": [{"role": "user", "content": ["x"]}]}', ANTHROPIC, "content block"),
        (b'{"messages": [{"role": "user", "content": [{"text": "x"}]}]}', OPENAI, "content part"),
        (b'{"messages": [{"role": "assistant", "tool_calls": {}}]}', OPENAI, "'tool_calls'"),
        (b'{"messages": [{"role": "assistant", "tool_calls": [1]}]}', OPENAI, "a tool call"),
    ],
)
def test_rejections_say_why(raw: bytes, dialect: Dialect, fragment: str) -> None:
    with pytest.raises(BodyRejected) as e:
        index_body(raw, dialect)
    assert fragment in str(e.value)


def test_deeply_nested_body_is_rejected_not_crashed() -> None:
    deep = b"[" * 200_000 + b"]" * 200_000
    raw = b'{"messages": [{"role": "user", "content": "x", "extra": ' + deep + b"}]}"
    with pytest.raises(BodyRejected, match="malformed JSON"):
        index_body(raw, ANTHROPIC)


@pytest.mark.parametrize(
    "dialect,body,where",
    [
        (
            ANTHROPIC,
            {
                "messages": [
                    {"role": "user", "content": "task"},
                    {"role": "assistant", "content": [{"type": "mystery_block"}]},
                    {"role": "user", "content": "go on"},
                ]
            },
            "messages[1]: unknown content block type 'mystery_block'",
        ),
        (
            OPENAI,
            {
                "messages": [
                    {"role": "user", "content": [{"type": "x_new", "x": 1}]},
                    {"role": "assistant", "content": "ok"},
                ]
            },
            "messages[0]: unknown content part type 'x_new'",
        ),
        (
            ANTHROPIC,
            {"messages": [{"role": "user", "content": "t"}, {"role": "narrator", "content": "x"}]},
            "messages[1] has unknown role 'narrator'",
        ),
    ],
)
def test_unknown_content_anywhere_rejects_the_body_with_the_reason(
    dialect: Any, body: Any, where: str
) -> None:
    """docs/behaviour.md#errors-and-bad-input / issue 12: a block type, part type or role the addon
    does not know may carry a rule of its own, so the whole request passes through; the reason names
    it."""
    with pytest.raises(BodyRejected) as e:
        index_body(json.dumps(body).encode(), dialect)
    assert str(e.value) == where


# --------------------------------------------------------------------------------------------
# MessageCache: the next turn reuses the previous turn's parsed messages, and nothing changes
# --------------------------------------------------------------------------------------------


def _byte_ends(b: BodyIndex) -> list[int]:
    """Each message's end, and the array's, as byte offsets in the body read whole."""
    text = b.text
    return [len(text[:p].encode()) for p in [m.end for m in b.messages] + [b.array.end]]


def _same_index(a: BodyIndex, b: BodyIndex) -> None:
    assert a.byte_ends() == _byte_ends(b)  # (a warm index's inherited over its prefix)
    assert [(m.start, m.end) for m in a.messages] == [(m.start, m.end) for m in b.messages]
    assert [m.value for m in a.messages] == [m.value for m in b.messages]
    assert len(a.chars) == len(b.text) and a.chars.slice(0, len(a.chars)) == b.text
    assert [a.source(i) for i in range(len(a.messages))] == [
        b.source(i) for i in range(len(b.messages))
    ]
    assert a.views == b.views == [m.view for m in b.messages]
    assert a.views is a.views  # built once, shared by every reader
    assert (a.array.start, a.array.end) == (b.array.start, b.array.end)
    assert list(a.members) == list(b.members)
    for name, m in a.members.items():  # every member's span and value, the array's too
        n = b.members[name]
        assert (m.start, m.end, m.value) == (n.start, n.end, n.value), name


@SETTINGS
@given(bodies(min_turns=1), st.data())
def test_cached_index_equals_a_fresh_one_on_grown_edited_and_reserialised_turns(
    s: Sample, data: st.DataObject
) -> None:
    d = DIALECTS[s.dialect]
    cache = MessageCache()
    first = index_body(s.raw, d, cache)
    _same_index(first, index_body(s.raw, d))
    assert validate_index(first) == validate_shape(first.views, d)

    # the next turn: the same messages (maybe one edited, maybe re-serialised) plus new ones
    msgs = list(s.messages)
    edit: bool = data.draw(st.booleans(), label="edit")
    if msgs and edit:
        k = data.draw(st.integers(0, len(msgs) - 1), label="edited")
        msgs[k] = {"role": "user", "content": "edited history"}
    msgs += [{"role": "user", "content": "one more turn ✓"}]
    style = s.style if data.draw(st.booleans(), label="same style") else data.draw(styles)
    body = {**s.body, "messages": msgs}
    raw = dumps(body, style).encode()
    hits = cache.hits
    cached = index_body(raw, d, cache)
    _same_index(cached, index_body(raw, d))
    # The input's violations, carried over the shared prefix, are exactly a full check's.
    assert validate_index(cached) == validate_shape(cached.views, d)
    if style == s.style and msgs[: len(s.messages)] == s.messages:
        assert cache.hits - hits == len(s.messages), "the repeated prefix was not reused"


@SETTINGS
@given(
    bodies(min_turns=1),
    st.lists(st.tuples(st.integers(1, 3), st.text(max_size=6)), min_size=1, max_size=40),
)
def test_a_long_session_indexed_warm_reads_the_same_as_each_body_read_whole(
    s: Sample, turns: list[tuple[int, str]]
) -> None:
    """Every turn appends messages to the last: its text is the previous turn's segments and
    its new middle (`cg.wire.chars`), joined now and then; every span, source, content array
    and splice reads what the body read whole reads."""
    d = DIALECTS[s.dialect]
    cache = MessageCache()
    raw = s.raw
    whole = index_body(raw, d, cache)
    warm = 0
    for n, (new, words) in enumerate(turns):
        added = [
            {"role": "user", "content": [{"type": "text", "text": f"{words} ✓ {n}.{j}"}]}
            if d.name == "anthropic"
            else {"role": "user", "content": f"{words} é {n}.{j}"}
            for j in range(new)
        ]
        # appended after the last message, every other byte as it was (as an agent sends it)
        at = len(whole.text[: whole.messages[-1].end].encode())
        more = "".join("," + json.dumps(m, ensure_ascii=False) for m in added)
        raw = raw[:at] + more.encode() + raw[at:]
        before = cache.prefix_hits
        cached = index_body(raw, d, cache)
        warm += cache.prefix_hits - before
        whole = index_body(raw, d)
        _same_index(cached, whole)
        last = len(whole.messages) - 1
        if d.name == "anthropic":
            a, b = cached.content_array(last), whole.content_array(last)
            assert a is not None and b is not None
            assert (a.start, a.end, [(e.start, e.end) for e in a.elements]) == (
                b.start,
                b.end,
                [(e.start, e.end) for e in b.elements],
            )
        plan = [Keep(0), Keep(last)] if last else [Keep(0)]
        assert splice(cached, plan) == splice(whole, plan)
        if d.name == "anthropic":  # a block cut from a message in the newest segment
            cut: list[Keep | Cut] = [Cut(last, frozenset({0}))]
            assert splice(cached, cut) == splice(whole, cut)
    assert warm == len(turns)  # vacuity: every turn after the first was read warm


def test_cache_reuses_the_previous_turn_of_the_claude_code_fixture() -> None:
    raw = FIXTURE.read_bytes()
    cache = MessageCache()
    index_body(raw, ANTHROPIC, cache)
    doc = json.loads(raw)
    doc["messages"].append({"role": "user", "content": "next"})
    grown = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
    before = cache.hits
    cached = index_body(grown, ANTHROPIC, cache)
    assert cache.hits - before > 0, "vacuity: the fixture's messages were not found in the cache"
    _same_index(cached, index_body(grown, ANTHROPIC))


def test_cache_is_bounded() -> None:
    cache = MessageCache(max_lists=2)
    for n in range(5):
        index_body(f'{{"messages":[{{"role":"user","content":"{n}"}}]}}'.encode(), OPENAI, cache)
    assert len(cache._lists) == 2


def test_a_resized_cache_keeps_the_most_recently_used_bodies() -> None:
    """`cg_warm_sessions`: shrinking drops the least recently used; a kept one stays warm."""
    cache = MessageCache(max_lists=4)
    bodies = [f'{{"messages":[{{"role":"user","content":"{n}"}}]}}'.encode() for n in range(4)]
    for raw in bodies:
        index_body(raw, OPENAI, cache)
    index_body(bodies[0], OPENAI, cache)  # used again: now the most recent
    cache.resize(2)
    assert [k[1] for k in cache._lists] == [
        '{"role":"user","content":"3"}',
        '{"role":"user","content":"0"}',
    ]
    before = cache.prefix_hits
    index_body(bodies[0][:-2] + b',{"role":"assistant","content":"a"}]}', OPENAI, cache)
    assert cache.prefix_hits == before + 1  # still warm
    cache.resize(8)
    for n in range(4, 10):
        index_body(f'{{"messages":[{{"role":"user","content":"{n}"}}]}}'.encode(), OPENAI, cache)
    assert len(cache._lists) == 8


@pytest.mark.parametrize("mark", ["", "é"], ids=["ascii", "not-ascii"])
def test_byte_ends_of_a_warm_chain_are_the_bodys_byte_offsets(mark: str) -> None:
    """Each warm turn's message ends in bytes, inherited over its shared prefix and found for
    the rest: the same as counted in the body read whole, for a text that is all ASCII (a
    character a byte) and one that is not."""
    d = ANTHROPIC
    cache = MessageCache()
    msgs: list[dict[str, Any]] = [{"role": "user", "content": f"start{mark}"}]
    warm = 0
    for n in range(6):
        raw = json.dumps({"model": "m", "messages": msgs, "max_tokens": 9}, ensure_ascii=False)
        before = cache.prefix_hits
        index = index_body(raw.encode(), d, cache)
        warm += cache.prefix_hits - before
        assert index.chars.ascii is (mark == "")  # the path under test
        assert index.byte_ends() == _byte_ends(index_body(raw.encode(), d))
        role = "assistant" if n % 2 == 0 else "user"
        msgs = [*msgs, {"role": role, "content": f"turn {n}{mark}"}]
    assert warm == 5  # every turn after the first was read warm


# -- bounded (docs/behaviour.md#bounded-work-and-shared-use) ---------------------------------------


def _tiny(n: int) -> bytes:
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(n)]
    return json.dumps({"model": "m", "messages": msgs}).encode()


def test_a_transcript_over_max_messages_is_refused_naming_the_bound():
    assert len(index_body(_tiny(50), ANTHROPIC, max_messages=50).messages) == 50
    with pytest.raises(OverBound) as e:
        index_body(_tiny(51), ANTHROPIC, max_messages=50)
    assert e.value.bound == "cg_max_messages" and "more than 50" in str(e.value)


def test_a_warm_turn_over_max_messages_is_refused_too():
    """The bound holds where a turn is read on its predecessor: the shared messages count."""
    cache = MessageCache()
    index_body(_tiny(49), ANTHROPIC, cache, max_messages=50)
    first = json.loads(_tiny(49))
    grown = dict(first, messages=[*first["messages"], {"role": "assistant", "content": "x"}])
    body50 = json.dumps(grown).encode()
    assert body50.startswith(_tiny(49)[: len(_tiny(49)) - 3])  # (shares the prefix: warm)
    assert index_body(body50, ANTHROPIC, cache, max_messages=50).shared == 49
    grown["messages"].append({"role": "user", "content": "y"})
    with pytest.raises(OverBound):
        index_body(json.dumps(grown).encode(), ANTHROPIC, cache, max_messages=50)


def test_a_body_over_the_inline_limits_is_deferred_unread():
    """Cold, a body longer than the inline limit (or holding more objects) is deferred; warm,
    only the part no remembered turn repeats is measured, so a long session's next turn is
    read where it came."""
    raw = _tiny(300)
    with pytest.raises(Deferred, match="new bytes"):
        index_body(raw, ANTHROPIC, inline=(len(raw) - 1, 10_000))
    with pytest.raises(Deferred, match="new objects"):
        index_body(raw, ANTHROPIC, inline=(len(raw), 299))
    cache = MessageCache()
    index_body(raw, ANTHROPIC, cache)  # the previous turn, remembered
    first = json.loads(raw)
    grown = json.dumps(dict(first, messages=[*first["messages"], {"role": "user", "content": "z"}]))
    warm = index_body(grown.encode(), ANTHROPIC, cache, inline=(200, 5))
    assert warm.shared == 300 and len(warm.messages) == 301
    assert cache.shared(grown.encode(), ANTHROPIC) > len(raw) - 10
