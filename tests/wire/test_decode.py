"""The bounded decoder (cg/wire/decode.py): what mitmproxy decodes, it decodes the same; it never
produces more than its limit, however small the input; a chain is undone right to left."""

from __future__ import annotations

import gzip
import tracemalloc
import zlib
from collections.abc import Iterator

import brotli
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mitmproxy.net import encoding as mitm

from cg.wire import decode
from tests.support import bombs as bombs_mod

CODINGS = ["gzip", "deflate", "br", "zstd"]
MIB = 1024 * 1024


def _raw_deflate(b: bytes) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    return c.compress(b) + c.flush()


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=4000), coding=st.sampled_from(CODINGS))
def test_decodes_what_mitmproxy_decodes_the_same(body: bytes, coding: str) -> None:
    encoded = mitm.encode(body, coding)
    assert decode.decode(encoded, coding, len(body)) == mitm.decode(encoded, coding) == body


@settings(max_examples=200, deadline=None)
@given(
    body=st.binary(min_size=1, max_size=4000),
    chain=st.lists(st.sampled_from(CODINGS), min_size=1, max_size=3),
    slack=st.integers(-3, 3),
)
def test_a_chain_is_undone_and_the_limit_is_exact(
    body: bytes, chain: list[str], slack: int
) -> None:
    """`encode` applies a chain left to right; `decode` undoes it within `limit` bytes, and
    refuses (TooLarge) exactly when the body is longer than the limit (or a stage is)."""
    header = ", ".join(chain)
    encoded = decode.encode(body, header)
    limit = max(0, len(body) + slack)
    stages = [body]
    for c in chain:
        stages.append(decode.encode(stages[-1], c))
    if all(len(s) <= limit for s in stages[:-1]):
        assert decode.decode(encoded, header, limit) == body
    else:
        with pytest.raises(decode.TooLarge):
            decode.decode(encoded, header, limit)


def test_raw_deflate_and_multi_member_gzip_read_as_mitmproxy_reads_them() -> None:
    body = b"hello world " * 100
    assert decode.decode(_raw_deflate(body), "deflate", MIB) == mitm.decode(
        _raw_deflate(body), "deflate"
    )
    two = gzip.compress(b"abc") + gzip.compress(b"def")
    assert decode.decode(two, "gzip", 6) == mitm.decode(two, "gzip") == b"abcdef"
    assert decode.decode(two + b"\0\0\0", "x-gzip", 6) == b"abcdef"  # zero padding ends it
    assert decode.decode(b"{}", "identity", 2) == decode.decode(b"{}", "", 2) == b"{}"
    with pytest.raises(decode.TooLarge):
        decode.decode(b"{}", "", 1)  # no coding: the body's own length is bounded too


@pytest.mark.parametrize("coding", CODINGS)
@pytest.mark.parametrize(
    "bad",
    [b"garbage that is no compressed stream", "truncated"],
    ids=["garbage", "truncated"],
)
def test_unreadable_bytes_are_undecodable_never_another_error(coding: str, bad: object) -> None:
    data = (
        bad if isinstance(bad, bytes) else mitm.encode(b"x" * 5000 + bytes(range(256)), coding)[:40]
    )
    with pytest.raises(decode.Undecodable):
        decode.decode(data, coding, MIB)


def test_an_unknown_coding_is_undecodable() -> None:
    with pytest.raises(decode.Undecodable, match="unknown content-encoding 'base64'"):
        decode.decode(b"aGk=", "base64", MIB)
    with pytest.raises(decode.Undecodable):
        decode.encode(b"hi", "gzip, compress")


# -- bombs: a small body that decodes to 1 GiB, built streaming ---------------------------------


@pytest.fixture(scope="module")
def bombs() -> Iterator[dict[str, bytes]]:
    built = {"br": bombs_mod.br(), "zstd": bombs_mod.zstd(), "gzip": bombs_mod.gzip()}
    yield built


def test_the_gzip_bomb_is_a_real_gzip_stream() -> None:
    """Vacuity guard: the hand-assembled gzip bomb decodes (here 64 MiB) to what it claims."""
    small = bombs_mod.gzip(4)
    out = zlib.decompressobj(31).decompress(small)
    assert len(out) == 4 * 16 * MIB and not out.strip(b"\0")


@pytest.mark.parametrize("coding", ["br", "zstd", "gzip"])
def test_a_bomb_stops_at_the_limit_and_never_holds_more(
    bombs: dict[str, bytes], coding: str
) -> None:
    """1 GiB of zeros in under 1.1 MB of input (tests/support/bombs.py): decoding stops once past the 32 MiB limit, and
    the memory Python allocates meanwhile stays near the limit (mitmproxy's decoder would
    hold the whole GiB)."""
    data = bombs[coding]
    assert len(data) < 1_100_000
    limit = 32 * MIB
    tracemalloc.start()
    try:
        with pytest.raises(decode.TooLarge, match="more than 33554432 bytes"):
            decode.decode(data, coding, limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * limit, f"{coding}: {peak} bytes allocated"


def test_a_chain_bomb_stops_at_the_limit(bombs: dict[str, bytes]) -> None:
    """`Content-Encoding: gzip, br`: a few KB of br around the gzip bomb; each stage bounded."""
    chained = bombs_mod.gzip_in_br()
    assert len(chained) < 64 * 1024
    with pytest.raises(decode.TooLarge):
        decode.decode(chained, "gzip, br", 32 * MIB)


def test_the_brotli_fallback_is_bounded_too(
    bombs: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the C decoder (the Python binding fed a few bytes at a time), a bomb stops too,
    overshooting by at most a few meta-blocks; and ordinary bodies still decode."""
    assert decode.BROTLI_C is not None, "the C decoder is what the other tests exercised"
    monkeypatch.setattr(decode, "BROTLI_C", None)
    tracemalloc.start()
    try:
        with pytest.raises(decode.TooLarge):
            decode.decode(bombs["br"], "br", 32 * MIB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 32 * MIB
    body = bytes(range(256)) * 400
    assert decode.decode(brotli.compress(body), "br", MIB) == body
    assert len(brotli.compress(body)) > 100
    with pytest.raises(decode.Undecodable):
        decode.decode(brotli.compress(body)[:50], "br", MIB)
