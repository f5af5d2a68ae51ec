"""cg.billing.listing: a page's cursor names exactly the key it was made of (any id, any time),
anything else given as a cursor is refused as one (never another error), and `limit` is a
plain integer in range."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cg.billing.listing import (
    CURSOR_MAX,
    PAGE_DEFAULT,
    PAGE_MAX,
    BadPage,
    cursor_of,
    page_key,
    page_limit,
)

IDS = st.text(max_size=200)  # ids are allow-listed, head hashes and `unidentified`: any text here
TIMES = st.floats(allow_nan=False, allow_infinity=False)


@given(TIMES, IDS)
def test_a_cursor_names_exactly_its_key(seen: float, session: str) -> None:
    cursor = cursor_of((seen, session))
    assert page_key(cursor) == (seen, session)
    assert cursor.isascii() and "=" not in cursor and "/" not in cursor and "+" not in cursor


@given(st.text(max_size=300))
def test_anything_else_is_refused_as_a_cursor(text: str) -> None:
    try:
        seen, session = page_key(text)
    except BadPage as e:
        assert e.name == "cursor" and str(e).startswith("cursor: ")
    else:  # text that happens to decode to a pair is a key like any other
        assert isinstance(seen, float) and isinstance(session, str)


@pytest.mark.parametrize(
    "value",
    [[1.0], [1.0, "a", 2], ["1", "a"], [True, "a"], [1.0, 2], {"a": 1}, "s", None, [None, "a"]],
)
def test_a_decoded_value_that_is_not_a_time_and_an_id_is_refused(value: object) -> None:
    raw = base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()
    with pytest.raises(BadPage, match="cursor"):
        page_key(raw)


def test_nan_infinity_and_an_overlong_cursor_are_refused() -> None:
    for text in ('[NaN,"a"]', '[Infinity,"a"]', '[-Infinity,"a"]'):
        with pytest.raises(BadPage):
            page_key(base64.urlsafe_b64encode(text.encode()).decode())
    long = cursor_of((1.0, "x" * CURSOR_MAX))
    with pytest.raises(BadPage):
        page_key(long)


@pytest.mark.parametrize(
    ("given", "limit"), [(None, PAGE_DEFAULT), ("1", 1), (str(PAGE_MAX), PAGE_MAX), (" 7 ", 7)]
)
def test_a_limit_in_range_is_taken(given: str | None, limit: int) -> None:
    assert page_limit(given) == limit


@pytest.mark.parametrize("given", ["0", str(PAGE_MAX + 1), "-1", "1.5", "", "x", "٣", "1e2"])
def test_a_limit_out_of_range_or_not_an_integer_is_refused(given: str) -> None:
    with pytest.raises(BadPage, match="limit: an integer from 1 to 500"):
        page_limit(given)
