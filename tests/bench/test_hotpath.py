"""`bench.hotpath --ascii`: the corpus bodies written in ASCII are the same documents."""

from __future__ import annotations

import json

from bench.corpus import anthropic_body
from bench.hotpath import ascii_only


def test_ascii_only_is_the_same_document_in_ascii() -> None:
    raw = '{"a": "é ✓ 😀 \\" \\\\u00e9", "b": ["ü", 1]}'.encode()
    out = ascii_only(raw)
    assert out.isascii() and json.loads(out) == json.loads(raw)


def test_the_corpus_body_written_in_ascii_parses_to_the_same() -> None:
    raw = anthropic_body()
    assert not raw.isascii()  # vacuity: there is something to escape
    out = ascii_only(raw)
    assert out.isascii() and json.loads(out) == json.loads(raw)
