"""cg.wire.jsonspan: exact spans of JSON values in raw text, and rebuilding an array from pieces."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cg.wire.jsonspan import (
    ArraySpan,
    JsonSpanError,
    TooManyElements,
    extend_array,
    loads,
    rebuild_array,
    skip_ws,
    walk_array,
    walk_document,
    walk_object,
)
from tests.support.strategies import SETTINGS, Style, dumps, ident, small_json, styles

objects = st.dictionaries(ident, small_json, max_size=6)
arrays = st.lists(small_json, max_size=6)


@SETTINGS
@given(arrays, styles)
def test_walk_array_spans_parse_to_elements(value: list[Any], style: Style) -> None:
    text = dumps(value, style)
    i = skip_ws(text, 0)
    arr = walk_array(text, i)
    assert text[arr.start] == "[" and text[arr.end - 1] == "]"
    assert skip_ws(text, arr.end) == len(text)
    assert len(arr.elements) == len(value)
    for el, v in zip(arr.elements, value, strict=True):
        assert json.loads(text[el.start : el.end]) == v
        assert el.value == v


@SETTINGS
@given(objects, styles)
def test_walk_object_members_in_order_with_exact_spans(value: dict[str, Any], style: Style) -> None:
    text = dumps(value, style)
    members, end = walk_object(text, skip_ws(text, 0))
    assert skip_ws(text, end) == len(text)
    assert [m.key for m in members] == list(value)  # keys decoded, escapes and all
    for m in members:
        assert json.loads(text[m.start : m.end]) == value[m.key] == m.value
        assert m.array is None


@SETTINGS
@given(st.dictionaries(ident, st.one_of(arrays, small_json), min_size=1, max_size=5), styles)
def test_walk_document_walks_only_the_named_arrays(value: dict[str, Any], style: Style) -> None:
    text = dumps(value, style)
    names = set(list(value)[::2])
    members = walk_document(text, arrays=names)
    for m in members:
        if m.key in names and isinstance(value[m.key], list):
            assert m.array is not None
            assert (m.array.start, m.array.end) == (m.start, m.end)
            assert [e.value for e in m.array.elements] == value[m.key]
            for e in m.array.elements:
                assert json.loads(text[e.start : e.end]) == e.value
        else:
            assert m.array is None


def test_escaped_key_is_decoded() -> None:
    text = '{"messag\\u0065s": [1, 2], "a\\/b": 3}'
    members = walk_document(text, arrays=("messages",))
    assert [m.key for m in members] == ["messages", "a/b"]
    assert members[0].array is not None
    assert [e.value for e in members[0].array.elements] == [1, 2]


@SETTINGS
@given(objects, st.data())
def test_walk_document_agrees_with_json_loads_on_damaged_text(
    value: dict[str, Any], data: Any
) -> None:
    """Delete or insert one character anywhere: the walker accepts exactly what json.loads does."""
    text = json.dumps(value)
    pos = data.draw(st.integers(0, len(text)))
    if data.draw(st.booleans()) and pos < len(text):
        damaged = text[:pos] + text[pos + 1 :]
    else:
        damaged = (
            text[:pos] + data.draw(st.sampled_from(list(',:[]{}"\\ x1\u00a0\x0c'))) + text[pos:]
        )
    try:
        expected = json.loads(damaged)
    except ValueError:
        expected = None
    try:
        members = walk_document(damaged)
    except JsonSpanError:
        assert not isinstance(expected, dict)
    else:
        assert isinstance(expected, dict)
        assert {m.key: m.value for m in members} == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{"a": [1]} x', "trailing data"),
        ("{} {}", "trailing data"),
        ("[1]", "expected '{'"),
        ('{"a": 1,}', "expected a key"),
        ('{"a" 1}', "expected ':'"),
        ('{"a": 1 "b": 2}', "expected ',' or '}'"),
        ('{"a": tru}', "bad value for 'a'"),
        ('{"a', "bad key"),
        ("{", "expected a key"),
        ("", "expected '{'"),
        ("\ufeff{}", "expected '{'"),
        ('{"a": 1}\u00a0', "trailing data"),
    ],
)
def test_walk_document_errors(text: str, fragment: str) -> None:
    with pytest.raises(JsonSpanError, match="at char") as e:
        walk_document(text, arrays=("a",))
    assert fragment in str(e.value)
    assert 0 <= e.value.pos <= len(text)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[1,]", "bad array element"),
        ("[1 2]", "expected ',' or ']'"),
        ("[1,,2]", "bad array element"),
        ("[", "bad array element"),
        ("x", "expected '['"),
    ],
)
def test_walk_array_errors(text: str, fragment: str) -> None:
    with pytest.raises(JsonSpanError) as e:
        walk_array(text, 0)
    assert fragment in str(e.value)


def test_walk_array_error_position_points_into_the_text() -> None:
    text = '[{"a": 1}, {"b": nope}]'
    with pytest.raises(JsonSpanError) as e:
        walk_array(text, 0)
    assert text[e.value.pos :].startswith("nope")


def test_skip_ws_skips_only_json_whitespace() -> None:
    assert skip_ws(" \t\r\n x", 0) == 5
    assert skip_ws("\u00a0x", 0) == 0
    assert skip_ws("\x0cx", 0) == 0
    assert skip_ws("abc", 3) == 3


def test_empty_containers() -> None:
    arr = walk_array("[ \n ]", 0)
    assert arr == ArraySpan(0, 5, ())
    members, end = walk_object("{ \t}", 0)
    assert members == [] and end == 4


def _array(text: str) -> ArraySpan:
    return walk_array(text, text.index("["))


@pytest.mark.parametrize(
    ("text", "pieces", "expected"),
    [
        ("[1,2,3]", ["7", "8"], "[7,8]"),
        ("[1, 2, 3]", ["7", "8", "9"], "[7, 8, 9]"),
        ("[\n  1,\n  2\n]", ["7", "8", "9"], "[\n  7,\n  8,\n  9\n]"),
        ("[\n  1\n]", ["7", "8"], "[\n  7,8\n]"),  # one element: no separator to copy
        ("[ ]", ["7", "8"], "[7,8]"),
        ("[\n  1,\n  2\n]", [], "[]"),
        ("[]", [], "[]"),
        ("[1,2]", ['{"a": 1}'], '[{"a": 1}]'),
    ],
)
def test_rebuild_array_reuses_the_original_punctuation(
    text: str, pieces: list[str], expected: str
) -> None:
    out = rebuild_array(text, _array(text), pieces)
    assert out == expected
    json.loads(out)


@SETTINGS
@given(arrays, styles, st.data())
def test_rebuild_array_with_its_own_elements_parses_back(
    value: list[Any], style: Style, data: Any
) -> None:
    text = dumps(value, style)
    arr = walk_array(text, skip_ws(text, 0))
    sources = [text[e.start : e.end] for e in arr.elements]
    keep = data.draw(st.lists(st.sampled_from(range(len(sources))), max_size=8)) if sources else []
    out = rebuild_array(text, arr, [sources[k] for k in keep])
    assert json.loads(out) == [value[k] for k in keep]
    if style.layout in ("compact", "spaced", "indent") and len(value) >= 2:
        # a uniformly punctuated array keeps its own punctuation exactly: identity gives it back
        assert rebuild_array(text, arr, sources) == text[arr.start : arr.end]


def _outcome(load: Callable[[bytes], Any], body: bytes) -> tuple[str, Any]:
    """("ok", value) or ("error", the error's kind) of `load` on `body`."""
    try:
        return "ok", load(body)
    except UnicodeDecodeError:
        return "error", "unicode"
    except json.JSONDecodeError:
        return "error", "json"


@SETTINGS
@given(
    st.one_of(objects, arrays, small_json),
    styles,
    st.sampled_from(["", " ", "\n", "\t \r\n", "\ufeff", "\u00a0"]),
    st.sampled_from(["", "\n", " \r\n\t", "x", "{}", "\u00a0", "\x00"]),
    st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-32-le"]),
)
def test_loads_is_json_loads(value: Any, style: Style, lead: str, trail: str, enc: str) -> None:
    """The fast loader gives json.loads's value, or its kind of error, on any body: leading
    and trailing whitespace (JSON's and not), a byte-order mark, other encodings, extra data."""
    body = (lead + dumps(value, style) + trail).encode(enc, "surrogatepass")
    assert _outcome(loads, body) == _outcome(json.loads, body)


@SETTINGS
@given(st.binary(max_size=64))
def test_loads_is_json_loads_on_any_bytes(body: bytes) -> None:
    assert _outcome(loads, body) == _outcome(json.loads, body)


def test_loads_reads_a_small_answer_without_json_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path is taken for a plain UTF-8 answer (else the loader is only json.loads)."""
    called: list[bytes] = []
    real = json.loads

    def spy(b: bytes, *a: Any, **k: Any) -> Any:
        called.append(b)
        return real(b, *a, **k)

    monkeypatch.setattr(json, "loads", spy)
    assert loads(b'{"usage": {"input_tokens": 3}, "model": "m"}\n') == {
        "usage": {"input_tokens": 3},
        "model": "m",
    }
    assert called == []
    assert loads(b' {"a": 1}') == {"a": 1}
    assert called == [b' {"a": 1}']  # (the guard: the spy sees a fallback)


def test_a_walk_stops_at_the_first_element_past_its_limit():
    """`limit` elements are walked; one more raises TooManyElements before it is parsed (the
    element after the limit is malformed here, and never read)."""
    text = '{"m": [1, 2, 3, !!!]}'
    with pytest.raises(TooManyElements) as e:
        walk_document(text, arrays=("m",), limit=3)
    assert e.value.limit == 3
    members = walk_document('{"m": [1, 2, 3]}', arrays=("m",), limit=3)
    assert [x.value for x in members[0].array.elements] == [1, 2, 3]  # type: ignore[union-attr]
    assert walk_document('{"m": []}', arrays=("m",), limit=0)[0].value == []


def test_an_extended_array_counts_its_known_elements_toward_the_limit():
    text = "[1, 2, 3]"
    arr = walk_array(text, 0)
    two = list(arr.elements[:2])
    assert len(extend_array(text, 0, list(two), two[-1].end, 0, limit=3).elements) == 3
    with pytest.raises(TooManyElements):
        extend_array(text, 0, list(two), two[-1].end, 0, limit=2)
