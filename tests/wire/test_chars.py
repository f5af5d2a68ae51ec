"""`Chars`: a text as segments shared with the previous turn's, read as the whole string."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from cg.wire.body import MessageCache, index_body
from cg.wire.chars import MAX_SEGMENTS, Chars
from cg.wire.dialects import ANTHROPIC
from tests.support.strategies import SETTINGS

FIXTURE = Path(__file__).parent.parent / "fixtures" / "claude_code_2.1.197_turn16.json"
TEXTS = st.text(alphabet=st.sampled_from("ab,{}[]é✓😀 "), max_size=30)


@SETTINGS
@given(TEXTS, st.lists(st.tuples(st.integers(0, 40), TEXTS, st.integers(0, 40)), max_size=40))
def test_spliced_texts_read_as_the_strings_they_stand_for(
    first: str, steps: list[tuple[int, str, int]]
) -> None:
    chars, text = Chars.of(first), first
    for p, middle, after in steps:
        p = min(p, len(text))
        after = min(max(after, p), len(text))
        chars = chars.spliced(p, middle, after)
        text = text[:p] + middle + text[after:]
        assert len(chars) == len(text)
        assert chars.segments <= MAX_SEGMENTS + 1
        for a in range(len(text) + 1):
            assert chars.slice(a, len(text) + 3) == text[a:]
            s, shift, end = chars.locate(a) if a < len(text) else (text, 0, len(text))
            assert s[a - shift : end - shift] == text[a:end]
        assert chars.slice(1, 0) == ""
    assert chars.whole() == text and chars.slice(0, len(text)) == text


def test_a_long_session_keeps_a_few_segments_and_shares_its_base() -> None:
    """60 turns on the Claude Code fixture: the text never grows past MAX_SEGMENTS + 1
    segments, the first turn's decoded text is still the base (never copied), and every turn
    reads as the body decoded whole."""
    doc = json.loads(FIXTURE.read_bytes())
    raw = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()
    cache = MessageCache()
    index = index_body(raw, ANTHROPIC, cache)
    base = index.chars.locate(0)[0]
    most = 0
    for n in range(60):
        doc["messages"].append({"role": "user", "content": f"turn {n} 😀"})
        raw = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()
        index = index_body(raw, ANTHROPIC, cache)
        assert index.shared == len(doc["messages"]) - 1  # vacuity: read warm
        most = max(most, index.chars.segments)
        assert index.chars.slice(0, len(index.chars)) == raw.decode()
        assert index.chars.locate(0)[0] is base
    assert MAX_SEGMENTS <= most <= MAX_SEGMENTS + 1  # it grew to the bound, and was joined
