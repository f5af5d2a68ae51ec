"""Compare a shared-cache summarizer request with the request it was built from, byte for byte.

`split_shared(forwarded, shared, dialect)` asserts that `shared` is `forwarded` with one message
appended to `messages` (after the last one, with the array's own separator) and nothing else
changed but the values of a few top-level members; it returns the appended message and those
members' new values, for the test to check against what it allows.
"""

from __future__ import annotations

import json
from typing import Any

from cg.wire.body import BodyIndex, index_body
from cg.wire.dialects import DIALECTS


def _skeleton(index: BodyIndex, blank: set[str]) -> str:
    """The body's text with the values of `blank` members (and `messages`) cut out."""
    text = index.text
    spans = sorted((m.start, m.end) for k, m in index.members.items() if k in blank)
    out, at = [], 0
    for start, end in spans:
        out.append(text[at:start])
        out.append("<cut>")
        at = end
    out.append(text[at:])
    return "".join(out)


def split_shared(
    forwarded: bytes, shared: bytes, dialect: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the appended message, {member: new value}) after asserting every other byte is equal."""
    a = index_body(forwarded, DIALECTS[dialect])
    b = index_body(shared, DIALECTS[dialect])
    assert list(a.members) == list(b.members), "top-level members added, dropped or reordered"
    n = len(a.messages)
    assert len(b.messages) == n + 1, (len(a.messages), len(b.messages))
    for i in range(n):
        assert b.source(i) == a.source(i), f"messages[{i}] is not byte-identical"
    # The messages array: the original's bytes with one separator and the new message inserted.
    arr_a = a.text[a.array.start : a.array.end]
    last, new = b.messages[n - 1], b.messages[n]
    inserted = b.text[last.end : new.end]
    arr_b = b.text[b.array.start : b.array.end]
    assert arr_b.replace(inserted, "", 1) == arr_a, "the messages array changed beyond the append"
    if n >= 2:
        assert inserted[: -len(b.source(n))] == a.text[a.messages[0].end : a.messages[1].start]
    changed = {
        k: b.members[k].value
        for k in a.members
        if k != "messages"
        and a.text[a.members[k].start : a.members[k].end]
        != b.text[b.members[k].start : b.members[k].end]
    }
    blank = {"messages", *changed}
    assert _skeleton(a, blank) == _skeleton(b, blank), "bytes outside the members changed"
    message: dict[str, Any] = json.loads(b.source(n))
    return message, changed
