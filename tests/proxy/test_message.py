"""`cg.state.session.header` and `cg.proxy.message` read mitmproxy's messages from their raw
fields, memoised per version of the fields: they must agree with `Headers.get` and
`get_content` on every input, and see every change made to the headers since."""

from __future__ import annotations

import gzip

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mitmproxy import http
from mitmproxy.test import tutils

from cg.proxy.addon import REDACTED, redact, upstream_sni
from cg.proxy.message import content, content_type, set_content
from cg.state.session import header
from cg.wire import decode
from cg.wire.upstream import sni_name

NAMES = ["content-type", "Content-Type", "x-api-key", "X-Claude-Code-Session-Id", "session-id", "a"]
names = st.sampled_from(NAMES)
values = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x2FF), max_size=12)
fields = st.lists(st.tuples(names, values), max_size=8)


def headers_of(pairs: list[tuple[str, str]]) -> http.Headers:
    return http.Headers([(k.encode(), v.encode("utf-8", "surrogateescape")) for k, v in pairs])


@settings(max_examples=200)
@given(pairs=fields, edits=st.lists(st.tuples(names, st.one_of(st.none(), values)), max_size=4))
def test_header_agrees_with_mitmproxy_before_and_after_every_change(
    pairs: list[tuple[str, str]], edits: list[tuple[str, str | None]]
) -> None:
    h = headers_of(pairs)
    other = headers_of(list(reversed(pairs)))  # a second message read in between
    for name, value in [(None, None), *edits]:
        if name is not None:
            if value is None:
                h.pop(name, None)
            else:
                h[name] = value
        for n in {x.lower() for x in NAMES}:
            assert header(h, n) == h.get(n)
            assert header(other, n) == other.get(n)


@settings(max_examples=200)
@given(st.lists(st.tuples(names, st.binary(max_size=8)), max_size=8))
def test_header_agrees_with_mitmproxy_on_any_value_bytes(pairs: list[tuple[str, bytes]]) -> None:
    """Values that are not UTF-8 (mitmproxy decodes them with surrogateescape), repeated names
    joined: the one value asked for is decoded from the raw fields as mitmproxy would."""
    h = http.Headers([(k.encode(), v) for k, v in pairs])
    for n in {x.lower() for x in NAMES}:
        assert header(h, n) == h.get(n)


def test_header_reads_many_messages_in_flight_each_as_its_own() -> None:
    """With many flows in flight, each message's fields are read as their own however the
    reads interleave (the memo holds many field tuples, and a changed one is read afresh)."""
    many = [headers_of([("X-Claude-Code-Session-Id", f"s{i}"), ("a", str(i))]) for i in range(300)]
    for _ in range(2):
        for i, h in enumerate(many):
            assert header(h, "x-claude-code-session-id") == f"s{i}" and header(h, "a") == str(i)
    many[5]["a"] = "changed"
    assert header(many[5], "a") == "changed"


def test_header_reads_a_plain_dict_case_insensitively() -> None:
    assert header({"X-Claude-Code-Session-Id": "s"}, "x-claude-code-session-id") == "s"
    assert header({"a": "1"}, "b") is None


@pytest.mark.parametrize(
    ("encoding", "raw"),
    [
        (None, b'{"a":1}'),
        ("", b'{"a":1}'),
        ("identity", b'{"a":1}'),
        ("gzip", gzip.compress(b'{"a":1}')),
        ("gzip", b"not gzip at all"),
        ("br", b"\x00\x01 not brotli"),
    ],
)
@pytest.mark.parametrize("strict", [True, False])
def test_content_agrees_with_get_content(encoding: str | None, raw: bytes, strict: bool) -> None:
    req = tutils.treq(content=b"")
    req.raw_content = raw
    if encoding is not None:
        req.headers["content-encoding"] = encoding
    try:
        want: bytes | type[Exception] | None = req.get_content(strict=strict)
    except ValueError:
        want = ValueError
    if want is ValueError:
        with pytest.raises(ValueError):
            content(req, strict=strict)
    else:
        assert content(req, strict=strict) == want
    req.raw_content = None
    assert content(req, strict=strict) is None


def test_content_type_is_the_header_or_empty() -> None:
    resp = tutils.tresp()
    resp.headers["Content-Type"] = "text/event-stream; charset=utf-8"
    assert content_type(resp) == "text/event-stream; charset=utf-8"
    del resp.headers["content-type"]
    assert content_type(resp) == ""


def test_redact_replaces_every_credential_value_in_place_and_nothing_else() -> None:
    h = http.Headers(
        [
            (b"Authorization", b"Bearer sk-1"),
            (b"content-type", b"application/json"),
            (b"X-Api-Key", b"sk-2"),
            (b"x-api-key", b"sk-3"),
        ]
    )
    redact(h)
    assert h.fields == (
        (b"Authorization", REDACTED.encode()),
        (b"content-type", b"application/json"),
        (b"X-Api-Key", REDACTED.encode()),
        (b"x-api-key", REDACTED.encode()),
    )
    assert header(h, "x-api-key") == f"{REDACTED}, {REDACTED}"  # the memo saw the change
    quiet = http.Headers([(b"content-type", b"application/json")])
    before = quiet.fields
    redact(quiet)
    assert quiet.fields is before  # nothing to redact: untouched


hosts = st.sampled_from(["127.0.0.1", "::1", "api.anthropic.com", "10.0.0.7", "[::1]"])
authorities = st.sampled_from(["", "api.openai.com", "api.openai.com:443", "127.0.0.1:8080"])
host_headers = st.one_of(st.none(), authorities, st.sampled_from(["Api.Anthropic.com.", "x y"]))


@settings(max_examples=200)
@given(
    turns=st.lists(
        st.tuples(hosts, st.sampled_from([b"HTTP/1.1", b"HTTP/2.0"]), authorities, host_headers),
        min_size=1,
        max_size=6,
    )
)
def test_upstream_sni_remembered_is_what_pretty_host_gives(
    turns: list[tuple[str, bytes, str, str | None]],
) -> None:
    """`upstream_sni` remembers its answer by what `pretty_host` reads: any sequence of
    requests (the same ones again, or one field changed) gets what mitmproxy's own reading
    gives each, not a remembered answer of another."""
    for host, version, authority, host_header in turns:
        req = tutils.treq(content=b"")
        req.data.host, req.data.http_version = host, version
        req.data.authority = authority.encode()
        req.headers.pop("host", None)
        if host_header is not None:
            req.headers["Host"] = host_header
        assert upstream_sni(req) == sni_name(req.host, req.pretty_host)
        assert upstream_sni(req) == sni_name(req.host, req.pretty_host)  # remembered


def test_upstream_sni_names_the_provider_behind_an_address() -> None:
    """Vacuity guard for the property above: an address connected to, the provider's name
    asked for, is an SNI (and a name connected to needs none)."""
    req = tutils.treq(content=b"")
    req.data.host = "10.0.0.7"
    req.headers["Host"] = "api.anthropic.com"
    assert upstream_sni(req) == "api.anthropic.com"
    req.data.host = "api.anthropic.com"
    assert upstream_sni(req) is None


framing_names = st.sampled_from(
    ["content-length", "Content-Length", "content-encoding", "transfer-encoding", "x-a"]
)
framing_values = st.sampled_from(["", "gzip", "identity", "chunked", "12", "nonsense-enc"])


@settings(max_examples=300)
@given(
    pairs=st.lists(st.tuples(framing_names, framing_values), max_size=6),
    body=st.binary(max_size=64),
)
def test_set_content_agrees_with_mitmproxy(pairs: list[tuple[str, str]], body: bytes) -> None:
    """`set_content` leaves a message as `message.content = body` does: the same raw bytes
    and the same header fields in the same order and spelling, whatever framing headers it
    had (none, repeated, empty, an encoding mitmproxy cannot apply) — but for a chain of
    codings (a repeated `content-encoding`), which mitmproxy would drop to send the body
    plain: there the header stays and the body is encoded in its chain (or, a coding unknown,
    refused, for the caller to send the original)."""
    ours, theirs = tutils.treq(content=b"old"), tutils.treq(content=b"old")
    ours.headers = headers_of(pairs)
    theirs.headers = headers_of(pairs)
    ce = ours.headers.get("content-encoding")
    chain = decode.codings(ce or "")
    if len(chain) > 1:
        fields = ours.headers.fields
        try:
            set_content(ours, body)
        except decode.Undecodable:
            assert any(c not in ("gzip", "deflate", "br", "zstd") for c in chain)
            assert ours.headers.fields == fields and ours.raw_content == b"old"
            return
        assert decode.decode(ours.raw_content or b"", ce or "", 1 << 20) == body
        assert ours.headers.get_all("content-encoding") == theirs.headers.get_all(
            "content-encoding"
        )
        return
    set_content(ours, body)
    theirs.content = body
    assert ours.raw_content == theirs.raw_content
    assert ours.headers.fields == theirs.headers.fields


def test_set_content_encodes_a_chain_mitmproxy_would_drop() -> None:
    """Vacuity guard for the chain branch above: `gzip, br` stays, the body is encoded in
    that order (br last) with its length, where mitmproxy sends it plain without the header."""
    req, theirs = tutils.treq(content=b"old"), tutils.treq(content=b"old")
    for r in (req, theirs):
        r.headers = headers_of([("content-encoding", "gzip, br"), ("content-length", "3")])
    set_content(req, b"hello")
    theirs.content = b"hello"
    assert theirs.raw_content == b"hello" and "content-encoding" not in theirs.headers
    assert req.headers["content-encoding"] == "gzip, br"
    assert req.headers["content-length"] == str(len(req.raw_content or b""))
    assert decode.decode(req.raw_content or b"", "gzip, br", 100) == b"hello"


def test_set_content_writes_one_content_length_in_place() -> None:
    """Vacuity guard for the property above: the fast path (no encoding) really ran and
    rewrote the length where it was."""
    req = tutils.treq(content=b"")
    req.headers = headers_of([("x-a", "1"), ("Content-Length", "3"), ("content-length", "3")])
    set_content(req, b"hello")
    assert req.headers.fields == ((b"x-a", b"1"), (b"Content-Length", b"5"))
    assert req.raw_content == b"hello"
