"""The relay's HTTP/1.1 client (`cg.proxy.h1`) against real servers on 127.0.0.1: what it
sends, every body framing, keep-alive and the stale-connection retry (and when it must not
retry), TLS under a provider's name, the content decoders, and through a real `Relay` an encoded
event stream and an expand call for one message (`KEY#N`)."""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import socket
import ssl
import struct
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import brotli
import httpx
import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from cg.expand.tool import TOOL_NAME, resolve
from cg.proxy.h1 import H1Error, H1Pool, _buffered, _Conn, decoder
from cg.proxy.relay import HEADER as RELAY_HEADER
from cg.proxy.relay import Relay, RelayJob
from cg.state.records import stash_key
from cg.state.sqlite import SqliteStore
from cg.wire.answers import Reply, render_sse
from tests.e2e.pki import make_pki
from tests.expand.test_continuation import (
    ANTHROPIC_SENT,
    Upstream,
    anthropic_msg,
    expand_call,
)
from tests.support.strategies import SETTINGS

Handler = Callable[["Seen", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclass
class Seen:
    """What the server was sent: each request's head and body, and connections accepted."""

    heads: list[bytes] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    connections: int = 0


async def read_request(seen: Seen, r: asyncio.StreamReader) -> bool:
    try:
        head = await r.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return False
    n = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    seen.heads.append(head)
    seen.bodies.append(await r.readexactly(n))
    return True


def answering(*answers: bytes, close_after: bool = False) -> Handler:
    """Answer each request on a connection with the next of `answers` (the last repeats)."""

    async def handle(seen: Seen, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        i = 0
        while await read_request(seen, r):
            w.write(answers[min(i, len(answers) - 1)])
            await w.drain()
            i += 1
            if close_after:
                break

    return handle


@asynccontextmanager
async def server(
    handle: Handler, tls: ssl.SSLContext | None = None
) -> AsyncIterator[tuple[Seen, int]]:
    seen = Seen()

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        seen.connections += 1
        try:
            await handle(seen, r, w)
        finally:
            w.close()

    srv = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=tls)
    try:
        yield seen, srv.sockets[0].getsockname()[1]
    finally:
        srv.close()


async def body_of(pool: H1Pool, url: str, body: bytes = b"{}", **kw: object) -> tuple[int, bytes]:
    ans = await pool.post(url, [(b"x-api-key", b"k"), (b"anthropic-version", b"1")], body, **kw)  # type: ignore[arg-type]
    try:
        return ans.status, b"".join([c async for c in ans.chunks()])
    finally:
        await ans.aclose()


OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


async def test_the_request_carries_the_agents_headers_a_host_and_its_length() -> None:
    async with server(answering(OK)) as (seen, port):
        pool = H1Pool()
        assert await body_of(pool, f"http://127.0.0.1:{port}/v1/messages?beta=true", b"abc") == (
            200,
            b"{}",
        )
        assert seen.heads == [
            b"POST /v1/messages?beta=true HTTP/1.1\r\nhost: 127.0.0.1:%d\r\nx-api-key: k\r\n"
            b"anthropic-version: 1\r\ncontent-length: 3\r\n\r\n" % port
        ]
        assert seen.bodies == [b"abc"]
        pool.close()


async def test_under_a_provider_name_the_agents_host_is_sent() -> None:
    async with server(answering(OK)) as (seen, port):
        pool = H1Pool()
        ans = await pool.post(
            f"http://127.0.0.1:{port}/v1/messages",
            [(b"Host", b"api.provider.invalid"), (b"x-a", b"b")],
            b"{}",
            sni="api.provider.invalid",
        )
        await ans.aclose()
        assert seen.heads[0].startswith(
            b"POST /v1/messages HTTP/1.1\r\nhost: api.provider.invalid\r\nx-a: b\r\n"
        )
        pool.close()


async def test_a_kept_alive_connection_carries_the_next_request() -> None:
    async with server(answering(OK)) as (seen, port):
        pool = H1Pool()
        for _ in range(3):
            assert await body_of(pool, f"http://127.0.0.1:{port}/") == (200, b"{}")
        assert (seen.connections, pool.connects, len(seen.bodies)) == (1, 1, 3)
        pool.close()


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nx-trailer: 1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabcde",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nabcde",
    ],
    ids=["chunked", "length", "100-continue"],
)
async def test_every_framing_is_read_and_the_connection_kept(answer: bytes) -> None:
    async with server(answering(answer)) as (seen, port):
        pool = H1Pool()
        assert await body_of(pool, f"http://127.0.0.1:{port}/") == (200, b"abcde")
        assert await body_of(pool, f"http://127.0.0.1:{port}/") == (200, b"abcde")
        assert seen.connections == 1
        pool.close()


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\nabcde",  # up to the close
        b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 5\r\n\r\nabcde",
    ],
    ids=["close-delimited", "connection-close"],
)
async def test_an_answer_that_ends_its_connection_is_not_kept(answer: bytes) -> None:
    async with server(answering(answer, close_after=True)) as (seen, port):
        pool = H1Pool()
        assert await body_of(pool, f"http://127.0.0.1:{port}/") == (200, b"abcde")
        assert await body_of(pool, f"http://127.0.0.1:{port}/") == (200, b"abcde")
        assert seen.connections == 2
        pool.close()


async def test_a_connection_closed_while_idle_is_replaced_and_the_request_sent_once_more() -> None:
    async with server(answering(OK, close_after=True)) as (seen, port):
        pool = H1Pool()
        assert await body_of(pool, f"http://127.0.0.1:{port}/") == (200, b"{}")
        # The server closed after its answer; the client has not noticed yet.
        (idle,) = pool._idle[("http", "127.0.0.1", port, None)]
        assert not idle.writer.is_closing()
        assert await body_of(pool, f"http://127.0.0.1:{port}/", b"second") == (200, b"{}")
        assert seen.connections == 2 and pool.connects == 2
        assert seen.bodies == [b"{}", b"second"]  # delivered once: the stale connection took none
        pool.close()


async def test_an_answer_that_began_is_never_sent_again() -> None:
    """A reused connection whose answer breaks off inside its head: an error, not a retry."""
    calls = 0

    async def handle(seen: Seen, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        nonlocal calls
        while await read_request(seen, r):
            calls += 1
            w.write(OK if calls == 1 else b"HTTP/1.1 200 OK\r\ncontent-le")
            await w.drain()
            if calls > 1:
                return

    async with server(handle) as (seen, port):
        pool = H1Pool()
        await body_of(pool, f"http://127.0.0.1:{port}/")
        with pytest.raises(H1Error):
            await body_of(pool, f"http://127.0.0.1:{port}/")
        assert len(seen.bodies) == 2 and seen.connections == 1
        pool.close()


async def test_a_body_cut_short_is_an_error() -> None:
    cut = b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc"
    async with server(answering(cut, close_after=True)) as (_, port):
        pool = H1Pool()
        with pytest.raises(H1Error, match="content-length"):
            await body_of(pool, f"http://127.0.0.1:{port}/")
        assert pool._idle.get(("http", "127.0.0.1", port, None), []) == []
        pool.close()


@pytest.mark.parametrize(
    "answer",
    [
        b"SSH-2.0-OpenSSH\r\n\r\n",
        b"HTTP/1.1 2x0 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nab",
        b"HTTP/1.1 200 OK\r\n folded: no\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
    ],
)
async def test_an_answer_that_is_not_http_1_1_is_an_error(answer: bytes) -> None:
    async with server(answering(answer, close_after=True)) as (_, port):
        pool = H1Pool()
        with pytest.raises(H1Error):
            await body_of(pool, f"http://127.0.0.1:{port}/")
        pool.close()


async def test_tls_is_verified_against_the_providers_name_not_the_address(tmp_path: Path) -> None:
    pki = make_pki(tmp_path, ["api.provider.invalid"], address=False)
    async with server(answering(OK), tls=pki.server_context()) as (seen, port):
        pool = H1Pool(verify=str(pki.ca))
        url = f"https://127.0.0.1:{port}/v1/messages"
        ans = await pool.post(
            url, [(b"host", b"api.provider.invalid")], b"{}", sni="api.provider.invalid"
        )
        await ans.aclose()
        assert ans.status == 200 and seen.heads
        with pytest.raises(ssl.SSLCertVerificationError):
            await pool.post(url, [], b"{}")  # checked against 127.0.0.1: not in the certificate
        pool.close()


async def test_a_changed_verify_setting_drops_the_kept_connections(tmp_path: Path) -> None:
    pki = make_pki(tmp_path, ["api.provider.invalid"], address=False)
    async with server(answering(OK), tls=pki.server_context()) as (_seen, port):
        pool = H1Pool(verify=str(pki.ca))
        url = f"https://127.0.0.1:{port}/"
        sni = "api.provider.invalid"
        ans = await pool.post(url, [], b"{}", sni=sni)
        await ans.aclose()
        pool.verify = True  # the system's CAs: this throwaway CA is not among them
        with pytest.raises(ssl.SSLCertVerificationError):
            await pool.post(url, [], b"{}", sni=sni)
        pool.close()


SSE = b"event: ping\ndata: {}\n\n" * 50
_raw = zlib.compressobj(wbits=-15)
RAW_DEFLATE = _raw.compress(SSE) + _raw.flush()


@pytest.mark.parametrize(
    "name,encoded",
    [
        (b"gzip", gzip.compress(SSE)),
        (b"deflate", zlib.compress(SSE)),
        (b"deflate", RAW_DEFLATE),
        (b"br", brotli.compress(SSE)),
        (b"zstd", zstandard.ZstdCompressor().compress(SSE)),
    ],
    ids=["gzip", "deflate-zlib", "deflate-raw", "br", "zstd"],
)
def test_each_encoding_is_decoded_as_it_streams(name: bytes, encoded: bytes) -> None:
    decode = decoder(name)
    assert decode is not None
    out = b"".join(decode(encoded[i : i + 7]) for i in range(0, len(encoded), 7))
    assert out == SSE


def test_identity_needs_no_decoder_and_an_unknown_encoding_or_bad_bytes_are_errors() -> None:
    assert decoder(None) is None and decoder(b"identity") is None
    with pytest.raises(H1Error):
        decoder(b"compress")
    decode = decoder(b"gzip")
    assert decode is not None
    with pytest.raises(H1Error):
        decode(b"not gzip at all")


@SETTINGS
@given(body=st.binary(max_size=3000), cuts=st.lists(st.integers(1, 400), max_size=12))
def test_a_chunked_body_is_the_concatenation_of_its_chunks(body: bytes, cuts: list[int]) -> None:
    pieces, at = [], 0
    for n in cuts:
        if at >= len(body):
            break
        pieces.append(body[at : at + n])
        at += n
    pieces.append(body[at:])
    framed = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces if p) + b"0\r\n\r\n"
    answer = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + framed

    async def run() -> tuple[int, bytes]:
        async with server(answering(answer)) as (_, port):
            pool = H1Pool()
            try:
                return await body_of(pool, f"http://127.0.0.1:{port}/")
            finally:
                pool.close()

    assert asyncio.run(run()) == (200, body)


# -- through the relay ---------------------------------------------------------------------------


def sse_answer(encoding: bytes | None, payload: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    if encoding:
        head += b"content-encoding: " + encoding + b"\r\n"
    return head + b"content-length: %d\r\n\r\n" % len(payload) + payload


TEXT_SSE = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"m","type":"message",'
    b'"role":"assistant","content":[],"model":"x","stop_reason":null,"usage":{"input_tokens":1,'
    b'"output_tokens":0}}}\n\n'
    b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
    b'"content_block":{"type":"text","text":""}}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":"Hi"}}\n\n'
    b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
    b'"usage":{"output_tokens":1}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)


async def hop(relay: Relay, job: RelayJob) -> bytes:
    """What mitmproxy reads back from the relay for `job`: the head, then the body (as long
    as its content-length says, or de-chunked)."""
    token = relay.add(job)
    r, w = await asyncio.open_connection("127.0.0.1", relay.port)
    w.write(
        b"POST /v1/messages HTTP/1.1\r\nhost: x\r\n%s: %s\r\ncontent-length: 0\r\n\r\n"
        % (RELAY_HEADER.encode(), token.encode())
    )
    await w.drain()
    head = await r.readuntil(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length: *(\d+)\r$", head)
    if length is not None:
        body = await r.readexactly(int(length.group(1)))
    else:
        body = b""
        while size := int((await r.readuntil(b"\r\n")).strip(), 16):
            body += (await r.readexactly(size + 2))[:-2]
        await r.readexactly(2)
    w.close()
    return head + body


async def through_relay(
    port: int, headers: tuple[tuple[bytes, bytes], ...], sni: str | None = None
) -> tuple[bytes, RelayJob]:
    """One job through a real `Relay` to the server on `port`: what mitmproxy would read."""
    relay = Relay(lambda sni: None)  # type: ignore[arg-type,return-value]
    await relay.start()
    job = RelayJob(
        f"http://127.0.0.1:{port}/v1/messages",
        headers,
        b"{}",
        lambda: "{}",
        "anthropic",
        sni,
        lambda key: "",
        (b"https", "api.provider.invalid", 443),
    )
    try:
        return await hop(relay, job), job
    finally:
        relay.close()


async def relayed(answer: bytes) -> tuple[bytes, RelayJob]:
    """One job through a real `Relay` to a server giving `answer`."""
    async with server(answering(answer)) as (_, port):
        return await through_relay(
            port, ((b"content-type", b"application/json"), (b"accept-encoding", b"gzip"))
        )


async def test_the_relay_decodes_an_encoded_event_stream_for_its_gate() -> None:
    out, job = await relayed(sse_answer(b"gzip", gzip.compress(TEXT_SSE)))
    head, _, body = out.partition(b"\r\n\r\n")
    assert b"content-encoding" not in head.lower() and b"text/event-stream" in head
    assert body == TEXT_SSE and job.gated and job.error is None


async def test_an_encoding_the_relay_cannot_read_passes_as_it_came_ungated() -> None:
    out, job = await relayed(sse_answer(b"compress", b"\x1f\x9dsomething"))
    head, _, body = out.partition(b"\r\n\r\n")
    assert b"content-encoding: compress" in head and body == b"\x1f\x9dsomething"
    # Not gated, its length known: framed by it, as the provider sent it.
    assert b"content-length: 11" in head and b"transfer-encoding" not in head
    assert not job.gated and job.error is not None and "compress" in job.error


async def test_a_relayed_call_for_one_message_is_answered_with_it_alone(tmp_path: Path) -> None:
    """The streamed path: an answer through a real `Relay` calls `context_guru_expand` with
    `KEY#N`; the relay's continuation resolves that id against a real store (the job's resolver,
    as `Runtime.resolver` makes it) and the next round carries the N-th message alone."""
    sources = [
        '{"role":"user","content":"run it"}',
        '{"role":"user","content":[{"type":"tool_result","tool_use_id":"t0","content":"42 \\u2713"}]}',
    ]
    key = stash_key(sources)
    call = anthropic_msg(1, expand_call("toolu_r1", f"{key}#2"), text="Checking.")
    up = Upstream("anthropic", anthropic_msg(2, text="It printed 42."))
    rounds = httpx.AsyncClient(transport=httpx.MockTransport(up))
    sent = ANTHROPIC_SENT.replace("STREAM", "true")
    with SqliteStore(tmp_path / "cg.sqlite3") as st:
        st.put_stash(key, "s1", sources, "anthropic")
        async with server(answering(sse_answer(None, render_sse(Reply("anthropic", call))))) as (
            _,
            port,
        ):
            relay = Relay(lambda sni: rounds)
            await relay.start()
            job = RelayJob(
                f"http://127.0.0.1:{port}/v1/messages",
                ((b"content-type", b"application/json"),),
                sent.encode(),
                lambda: sent,
                "anthropic",
                None,
                lambda ident: resolve(st, ident, "s1"),
                (b"https", "api.provider.invalid", 443),
            )
            try:
                out = await hop(relay, job)
            finally:
                relay.close()
                await rounds.aclose()
    assert job.continued and job.error is None and job.rounds == 1  # the vacuity guard
    assert job.log == [{"round": 1, "ids": [f"{key}#2"]}]
    (req,) = up.requests
    result = json.loads(req.content)["messages"][-1]["content"][0]
    assert result["tool_use_id"] == "toolu_r1"
    assert result["content"] == (
        f"Message 2 of 2 that the summary <<cg:{key}>> replaced, verbatim (its original JSON):"
        f"\n\n{sources[1]}"
    )
    body = out.partition(b"\r\n\r\n")[2]
    assert b"It printed 42." in body and TOOL_NAME.encode() not in body


# -- what the review of this client found (each failed before its fix) ---------------------------


class Watched(H1Pool):
    """A pool that keeps a hand on every connection it opens (to wait on what they hold)."""

    def __init__(self, verify: bool | str = True) -> None:
        super().__init__(verify)
        self.opened: list[_Conn] = []

    async def _open(self, key: tuple[str, str, int, str | None]) -> _Conn:
        conn = await super()._open(key)
        self.opened.append(conn)
        return conn


async def until(cond: Callable[[], bool]) -> None:
    """Yield to the loop until `cond` holds (the servers here run in the same loop)."""
    for _ in range(100_000):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


async def test_a_header_value_with_a_line_break_is_refused_never_written() -> None:
    async with server(answering(OK)) as (seen, port):
        pool = H1Pool()
        for headers in (
            [(b"x-a", b"1\r\nx-injected: 2")],
            [(b"x-a", b"1\nx")],
            [(b"x a", b"1")],
            [(b"host", b"h\r\nx: y")],
        ):
            with pytest.raises(H1Error, match="cannot be sent"):
                await pool.post(f"http://127.0.0.1:{port}/", headers, b"{}", sni="h")
        assert seen.heads == [] and pool.connects == 0
        pool.close()


async def test_an_idle_connection_holding_unasked_bytes_is_not_reused() -> None:
    """A server that answers an idle kept-alive connection with a 408 and closes: that 408 is
    no answer to the next request."""

    async def handle(seen: Seen, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        if await read_request(seen, r):
            w.write(OK)
            await w.drain()
            await until(lambda: bool(pool._idle.get(key)))  # the client pooled it: now idle
            w.write(
                b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            )
            await w.drain()
        while await read_request(seen, r):
            w.write(OK)
            await w.drain()

    async with server(handle) as (seen, port):
        pool = Watched()
        key = ("http", "127.0.0.1", port, None)
        assert await body_of(pool, f"http://127.0.0.1:{port}/", b"first") == (200, b"{}")
        first = pool.opened[0]
        await until(lambda: _buffered(first.reader) or first.reader.at_eof())
        assert await body_of(pool, f"http://127.0.0.1:{port}/", b"second") == (200, b"{}")
        assert pool.connects == 2 and seen.bodies == [b"first", b"second"]
        pool.close()


async def test_a_reset_after_part_of_the_answer_head_is_not_sent_again() -> None:
    async def handle(seen: Seen, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        n = 0
        while await read_request(seen, r):
            n += 1
            if n == 1:
                w.write(OK)
                await w.drain()
                continue
            w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
            await w.drain()
            await until(lambda: _buffered(pool.opened[0].reader))  # the client has them
            sock = w.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            w.transport.abort()  # a reset
            return

    async with server(handle) as (seen, port):
        pool = Watched()
        assert await body_of(pool, f"http://127.0.0.1:{port}/", b"first") == (200, b"{}")
        with pytest.raises((OSError, H1Error)):
            await body_of(pool, f"http://127.0.0.1:{port}/", b"second")
        assert seen.bodies == [b"first", b"second"]  # the second was answered: never sent twice
        pool.close()


async def test_a_connection_in_use_when_verify_changes_is_not_pooled(tmp_path: Path) -> None:
    pki = make_pki(tmp_path, ["api.provider.invalid"], address=False)
    async with server(answering(OK), tls=pki.server_context()) as (_, port):
        pool = H1Pool(verify=str(pki.ca))
        url, sni = f"https://127.0.0.1:{port}/", "api.provider.invalid"
        ans = await pool.post(url, [], b"{}", sni=sni)
        pool.verify = True  # reconfigured while that answer was read: the CA is not trusted now
        assert [c async for c in ans.chunks()] == [b"{}"]
        await ans.aclose()
        with pytest.raises(ssl.SSLCertVerificationError):
            await pool.post(url, [], b"{}", sni=sni)
        pool.close()


async def test_a_connection_idle_past_its_expiry_is_not_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import cg.proxy.h1 as h1

    async with server(answering(OK)) as (seen, port):
        pool = H1Pool()
        await body_of(pool, f"http://127.0.0.1:{port}/")
        await body_of(pool, f"http://127.0.0.1:{port}/")
        assert pool.connects == 1  # within the expiry: kept
        monkeypatch.setattr(h1, "KEEPALIVE_EXPIRY", -1.0)
        await body_of(pool, f"http://127.0.0.1:{port}/")
        assert pool.connects == 2 and seen.connections == 2
        pool.close()


async def test_the_relay_sends_the_agents_own_host_under_a_provider_name() -> None:
    async with server(answering(OK)) as (seen, port):
        headers = ((b"Host", b"gw.provider.invalid:8443"), (b"content-type", b"application/json"))
        out, _ = await through_relay(port, headers, sni="gw.provider.invalid")
        assert out.startswith(b"HTTP/1.1 200")
        assert seen.heads[0].startswith(
            b"POST /v1/messages HTTP/1.1\r\nhost: gw.provider.invalid:8443\r\ncontent-type"
        )


def test_a_zstd_body_of_several_frames_is_decoded_whole() -> None:
    c = zstandard.ZstdCompressor()
    one, two = c.compress(b"event: a\n\n"), c.compress(b"event: b\n\n")
    for pieces in ([one, two], [one + two], [one + two[:3], two[3:]]):
        decode = decoder(b"zstd")
        assert decode is not None
        assert b"".join(decode(p) for p in pieces) == b"event: a\n\nevent: b\n\n"
    decode = decoder(b"gzip")
    assert decode is not None
    assert decode(gzip.compress(b"a") + gzip.compress(b"b")) == b"ab"


async def test_stacked_encodings_pass_as_they_came_ungated() -> None:
    payload = gzip.compress(gzip.compress(TEXT_SSE))
    answer = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-encoding: gzip\r\n"
        b"content-encoding: gzip\r\ncontent-length: %d\r\n\r\n" % len(payload) + payload
    )
    out, job = await relayed(answer)
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.lower().count(b"content-encoding: gzip") == 2 and body == payload
    assert not job.gated and job.error is not None and "stacked" in job.error
