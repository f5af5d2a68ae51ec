"""cg.wire.upstream: reading a provider's error, and re-sending an original request ourselves.

`resend` runs against a real HTTP server on 127.0.0.1 (the fake provider), so the bytes and
headers checked are the ones that crossed a socket.
"""

from __future__ import annotations

import gzip
import json
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace

import httpx
import pytest
from mitmproxy import http
from mitmproxy.options import Options

from cg.proxy.resend import resend
from cg.wire.upstream import provider_message, upstream_verify
from tests.support.fakeprovider import (
    DEFAULT_TEXT,
    FakeProvider,
    Reply,
    anthropic_error,
    openai_error,
)

ORIGINAL = (
    b'{"model": "claude-test",  "max_tokens": 64,\n "messages": [{"role": "user", '
    b'"content": "caf\\u00e9 \xe2\x9c\x93"}, {"role": "assistant", "content": "ok"}, '
    b'{"role": "user", "content": "go on"}]}'
)
REWRITTEN = b'{"model":"claude-test","max_tokens":64,"messages":[{"role":"user","content":"x"}]}'

# -- provider_message ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        anthropic_error(400, "invalid_request_error", "messages.3: `tool_use` ids must be unique"),
        openai_error(400, "invalid_request_error", "messages.3: `tool_use` ids must be unique"),
    ],
    ids=["anthropic", "openai"],
)
def test_provider_message_reads_both_dialects_error_message(reply):
    assert reply.body is not None
    assert provider_message(reply.body) == "messages.3: `tool_use` ids must be unique"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", ""),
        (None, ""),
        (b"<html>Bad Gateway</html>", "<html>Bad Gateway</html>"),
        (b'{"error": "flat string"}', '{"error": "flat string"}'),
        (b'{"error": {"type": "x"}}', '{"error": {"type": "x"}}'),
        (b'{"error": {"message": 7}}', '{"error": {"message": 7}}'),
        (b'["error"]', '["error"]'),
        (b"caf\xe9 \xff", "caf\ufffd \ufffd"),
        (b'{"error": {"message": "unterminated', '{"error": {"message": "unterminated'),
    ],
    ids=[
        "empty",
        "none",
        "html",
        "error-string",
        "no-message",
        "message-not-str",
        "array",
        "not-utf8",
        "truncated-json",
    ],
)
def test_provider_message_falls_back_to_the_body_start(body, message):
    assert provider_message(body) == message


def test_provider_message_is_bounded():
    long = json.dumps({"error": {"message": "m" * 10_000}}).encode()
    assert provider_message(long) == "m" * 500
    assert provider_message(b"x" * 10_000, limit=40) == "x" * 40


# -- upstream_verify ---------------------------------------------------------------------------


def test_upstream_verify_follows_mitmproxy_options(tmp_path):
    ca = tmp_path / "ca.pem"
    assert upstream_verify(Options()) is True
    assert upstream_verify(Options(ssl_insecure=True)) is False
    assert upstream_verify(Options(ssl_verify_upstream_trusted_ca=str(ca))) == str(ca)
    both = Options(ssl_insecure=True, ssl_verify_upstream_trusted_ca=str(ca))
    assert upstream_verify(both) is False  # insecure wins: mitmproxy does not verify at all


def test_upstream_verify_on_option_like_objects():
    assert upstream_verify(SimpleNamespace()) is True
    assert upstream_verify(SimpleNamespace(ssl_insecure=False, ssl_verify_upstream_trusted_ca=None))
    assert upstream_verify(SimpleNamespace(ssl_verify_upstream_trusted_ca="")) is True


# -- resend ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as p:
        yield p


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(trust_env=False) as c:
        yield c


def rewritten_request(url: str, headers: list[tuple[bytes, bytes]]) -> http.Request:
    """A request as the addon leaves it: the rewritten body in place, original kept apart."""
    req = http.Request.make("POST", url, b"", headers)
    req.raw_content = REWRITTEN
    return req


CLIENT_HEADERS = [
    (b"Host", b"api.anthropic.com"),
    (b"Content-Type", b"application/json"),
    (b"X-Api-Key", b"sk-agent"),
    (b"anthropic-version", b"2023-06-01"),
    (b"anthropic-beta", b"a-beta, another-beta"),
    (b"X-Custom", b"first"),
    (b"x-custom", b"second"),
    (b"Content-Length", b"999"),
    (b"Connection", b"keep-alive, x-hop"),
    (b"Keep-Alive", b"timeout=5"),
    (b"x-e2e-id", b"resend-1"),
]
HOP = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "upgrade"}


def _end_to_end(
    headers: list[tuple[str, str]] | list[tuple[bytes, bytes]],
) -> list[tuple[str, str]]:
    out = []
    for k, v in headers:
        ks = k.decode() if isinstance(k, bytes) else k
        vs = v.decode() if isinstance(v, bytes) else v
        if ks.lower() not in HOP:
            out.append((ks.lower(), vs))
    return sorted(out)


def _last(provider: FakeProvider, e2e_id: str):
    got = provider.wait_for(1, where=lambda r: r.header("x-e2e-id") == e2e_id)
    assert len(got) == 1
    return got[0]


async def test_resend_sends_the_original_bytes_and_end_to_end_headers(provider, client):
    headers = [*CLIENT_HEADERS[:-1], (b"x-e2e-id", b"resend-bytes")]
    req = rewritten_request(f"{provider.url}/v1/messages?beta=true", headers)
    answer = await resend(client, req, ORIGINAL)
    got = _last(provider, "resend-bytes")
    assert got.method == "POST"
    assert got.path == "/v1/messages?beta=true"
    assert got.body == ORIGINAL
    assert got.header("content-length") == str(len(ORIGINAL))
    assert _end_to_end(got.headers) == _end_to_end(headers)
    assert answer.status_code == 200
    assert json.loads(answer.content or b"")["content"][0]["text"] == DEFAULT_TEXT


async def test_resend_adds_no_header_the_client_did_not_send(provider, client):
    """No `accept-encoding` of httpx's own: the client would get an encoding it never asked for."""
    headers = [(b"content-type", b"application/json"), (b"x-e2e-id", b"resend-bare")]
    req = rewritten_request(f"{provider.url}/v1/messages", headers)
    await resend(client, req, ORIGINAL)
    got = _last(provider, "resend-bare")
    assert _end_to_end(got.headers) == _end_to_end(headers)
    assert got.header("accept-encoding") is None
    assert got.header("user-agent") is None


async def test_resend_keeps_an_encoded_request_body_as_sent(provider, client):
    gz = gzip.compress(ORIGINAL, mtime=0)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-encoding", b"gzip"),
        (b"x-e2e-id", b"resend-gzip"),
    ]
    req = rewritten_request(f"{provider.url}/v1/messages", headers)
    answer = await resend(client, req, gz)
    got = _last(provider, "resend-gzip")
    assert got.body == gz
    assert got.decoded == ORIGINAL
    assert answer.status_code == 200


async def test_resend_returns_an_encoded_answer_raw_and_whole(provider, client):
    payload = json.dumps({"type": "message", "content": [{"type": "text", "text": "zipped ✓"}]})
    zipped = gzip.compress(payload.encode(), mtime=0)
    provider.script(
        Reply(
            201,
            body=zipped,
            headers={
                "content-type": "application/json",
                "content-encoding": "gzip",
                "x-request-id": "req_1",
            },
        )
    )
    headers = [(b"accept-encoding", b"gzip"), (b"x-e2e-id", b"resend-zipped-answer")]
    answer = await resend(client, rewritten_request(f"{provider.url}/v1/messages", headers), b"{}")
    assert answer.status_code == 201
    assert answer.raw_content == zipped  # still encoded: the client decodes it, as it asked
    assert answer.headers["content-encoding"] == "gzip"
    assert answer.headers["content-length"] == str(len(zipped))
    assert answer.headers["x-request-id"] == "req_1"
    assert answer.content == payload.encode()


async def test_resend_returns_a_streamed_answer_whole(provider, client):
    body = b'{"model":"m","max_tokens":9,"stream":true,"messages":[{"role":"user","content":"hi"}]}'
    headers = [(b"content-type", b"application/json"), (b"x-e2e-id", b"resend-sse")]
    answer = await resend(client, rewritten_request(f"{provider.url}/v1/messages", headers), body)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert "transfer-encoding" not in answer.headers
    raw = answer.raw_content or b""
    assert answer.headers["content-length"] == str(len(raw))
    assert raw.startswith(b"event: message_start\n")
    assert raw.rstrip().endswith(b'data: {"type":"message_stop"}')
    text = "".join(
        json.loads(line[6:])["delta"]["text"]
        for line in raw.decode().splitlines()
        if line.startswith("data: ") and '"text_delta"' in line
    )
    assert text == DEFAULT_TEXT


async def test_resend_returns_an_error_answer_as_is(provider, client):
    provider.script(openai_error(429, "rate_limit_error", "slow down"))
    headers = [(b"x-e2e-id", b"resend-429")]
    req = rewritten_request(f"{provider.url}/v1/chat/completions", headers)
    answer = await resend(client, req, b"{}")
    assert answer.status_code == 429
    assert provider_message(answer.content) == "slow down"


async def test_resend_to_a_closed_port_raises(client):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    req = rewritten_request(f"http://127.0.0.1:{port}/v1/messages", [])
    with pytest.raises(httpx.TransportError):
        await resend(client, req, ORIGINAL)


async def test_resend_waits_as_long_as_the_provider_takes(provider):
    """No read timeout of the pooled client's own: a slow answer to the re-sent original is
    still the answer (the agent's own request had none through mitmproxy either)."""
    gate = threading.Event()
    slow = Reply(hold=gate, hold_timeout=1.0)  # answers after 1 s
    provider.script(slow)
    headers = [(b"x-e2e-id", b"resend-slow")]
    async with httpx.AsyncClient(trust_env=False, timeout=0.2) as short:
        answer = await resend(
            short, rewritten_request(f"{provider.url}/v1/messages", headers), b"{}"
        )
    assert slow.hold_timed_out
    assert answer.status_code == 200
