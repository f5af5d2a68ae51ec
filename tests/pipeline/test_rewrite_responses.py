"""`rewrite_body` on generated Responses bodies, serialised every way a JSON writer may, through
the real `summarize` component (commission, complete, splice): every outcome is either a body
that passes every shape rule with each retained item's bytes as sent, or the original bytes."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given

from cg.state.sqlite import SqliteStore
from cg.summarize.span import leading_system
from cg.wire.body import index_body
from cg.wire.dialects import RESPONSES
from cg.wire.shape import check_wire_roles, validate_shape
from tests.support.strategies import SETTINGS, Sample, responses_bodies
from tests.support.transcripts import config, make


@SETTINGS
@given(responses_bodies(min_turns=2, max_turns=7))
def test_a_generated_body_is_rewritten_validly_or_passed_through(s: Sample) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "cg.sqlite3")
        try:
            check(s, store)
        finally:
            store.close()


def check(s: Sample, store: SqliteStore) -> None:
    d = make(config(keep_first=1, keep_last=2), store, dialect="responses")
    first = d.send(s.raw)
    assert first.outcome == "passed_through" and first.body is None
    if not d.pending:
        return  # no span (too short, an additional_tools item in the middle, …): said why
    assert d.drain() == ["completed"]
    r = d.send(s.raw)
    assert r.outcome in ("rewritten", "failed_open"), r.record
    if r.outcome == "failed_open":
        assert r.body is None
        return
    assert r.body is not None
    src = index_body(s.raw, RESPONSES)
    out = index_body(r.body, RESPONSES)
    assert validate_shape(out.views, RESPONSES) == []
    assert check_wire_roles(r.body, RESPONSES) == []
    # [head, summary, tail]: every retained item is its original bytes, the system prompt kept.
    (at,) = [i for i, v in enumerate(out.views) if v.text.startswith("=== History Summary ===")]
    assert at >= leading_system(src.views)
    tail = len(out.messages) - at - 1
    kept = [out.source(i) for i in range(at)] + [
        out.source(i) for i in range(at + 1, len(out.messages))
    ]
    orig = [src.source(i) for i in range(at)] + [
        src.source(i) for i in range(len(src.messages) - tail, len(src.messages))
    ]
    assert kept == orig
    # Everything outside `input` is byte-identical.
    text, new = s.text, r.body.decode("utf-8")
    assert new[: out.array.start] == text[: src.array.start]
    assert new[out.array.end :] == text[src.array.end :]
    doc: Any = json.loads(r.body)
    assert {k: v for k, v in doc.items() if k != "input"} == {
        k: v for k, v in s.body.items() if k != "input"
    }
