"""The relay's upstream leg: a small HTTP/1.1 client on asyncio streams.

Every streamed turn offered `context_guru_expand` (on a summarized session: nearly every turn)
goes upstream from the relay (`cg.proxy.relay`), and httpx's CPU per request over loopback (its
layers, httpcore's state machine, anyio, a scan of every pooled connection) was half of what the
relay cost a reuse turn (docs/benchmarks.md). This client does only what that leg needs: one POST with the agent's headers as bytes, the answer's
head, and its body de-framed (content-length, chunked, or up to the close), on a kept-alive
connection per (address, TLS name).

What it leaves to others: redirects, cookies, auth, proxies (the relay is not used behind an
upstream proxy), HTTP/2 (it offers ALPN `http/1.1` only, which every provider serves). The
rare continuation round (a call to our tool) still goes through httpx.

Kept-alive connections: one idle longer than `KEEPALIVE_EXPIRY`, or holding bytes no request
asked for, or opened before the TLS settings changed, is closed rather than used. One the server
closed while it sat idle fails on its next request before a byte of answer arrives; that one
request is sent again once on a fresh connection (as browsers and urllib3 do for this race). A
failure after any answer byte is never retried: that request was answered.

What the agent sent is checked before it goes: a header name that is not a token, or a value or
path with CR, LF or NUL (an HTTP/2 client's value can hold one; h11 refused them on httpx's leg),
is refused (`H1Error`; the relay answers 502), never written onto a shared connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import ssl
import time
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from cg.wire.upstream import ssl_context

CONNECT_TIMEOUT = 30.0  # as `RESEND_TIMEOUT`: no read timeout, the agent keeps its own
MAX_IDLE = 64  # kept-alive connections per (address, TLS name)
# Seconds a kept-alive connection may sit idle and still be used: httpx's default, which the
# relay's leg had. Longer would save a TLS handshake on turns further apart, but a connection a
# NAT dropped silently (no FIN, no RST) would then hang a turn until TCP gives up.
KEEPALIVE_EXPIRY = 5.0
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # an HTTP field name (RFC 9110 token)
_BAD_VALUE = re.compile(rb"[\r\n\x00]")
MAX_HEAD = 256 * 1024
READ = 64 * 1024


class H1Error(Exception):
    """The upstream's answer could not be read as HTTP/1.1."""


@dataclass(slots=True, eq=False)
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    key: tuple[str, str, int, str | None]
    generation: int  # the pool's, when opened: an older one is never pooled again
    reused: bool = False
    idle_since: float = 0.0


@dataclass(slots=True, eq=False)
class Answer:
    """An answer's head, and its body as it arrives (`chunks`, de-framed, not decoded)."""

    status: int
    reason: bytes
    headers: list[tuple[bytes, bytes]]
    _conn: _Conn | None
    _pool: H1Pool
    _framing: tuple[str, int]  # ("length", n) | ("chunked", 0) | ("close", 0) | ("none", 0)
    _keep: bool
    _done: bool = field(default=False)

    def header(self, name: bytes) -> bytes | None:
        return next((v for k, v in self.headers if k.lower() == name), None)

    @property
    def length(self) -> int | None:
        """The body's length when its head says it (content-length, or none at all)."""
        kind, n = self._framing
        return n if kind in ("length", "none") else None

    async def chunks(self) -> AsyncIterator[bytes]:
        conn = self._conn
        assert conn is not None, "the body was read already"
        kind, n = self._framing
        r = conn.reader
        if kind == "length":
            while n:
                data = await r.read(min(n, READ))
                if not data:
                    raise H1Error("the answer ended before its content-length")
                n -= len(data)
                yield data
        elif kind == "chunked":
            try:
                while True:
                    line = await r.readuntil(b"\r\n")
                    try:
                        size = int(line.split(b";", 1)[0].strip(), 16)
                    except ValueError:
                        raise H1Error(f"bad chunk size {line[:40]!r}") from None
                    if size == 0:
                        while (await r.readuntil(b"\r\n")) != b"\r\n":
                            pass  # trailers: read and dropped, as httpx did
                        break
                    while size:  # passed on as it arrives, never held whole
                        data = await r.read(min(size, READ))
                        if not data:
                            raise H1Error("the answer ended inside a chunk")
                        size -= len(data)
                        yield data
                    if await r.readexactly(2) != b"\r\n":
                        raise H1Error("a chunk did not end with CRLF")
            except asyncio.LimitOverrunError:
                raise H1Error("a chunk-size line is too long") from None
            except asyncio.IncompleteReadError:
                raise H1Error("the answer ended inside its chunked body") from None
        elif kind == "close":
            while data := await r.read(READ):
                yield data
        self._done = True

    async def aclose(self) -> None:
        """Give the connection back when the body was read whole and it may carry another
        request; else close it."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._done and self._keep and not conn.reader.at_eof():
            self._pool._release(conn)
        else:
            _close(conn)


class H1Pool:
    def __init__(self, verify: bool | str = True) -> None:
        self._verify: bool | str = verify
        self._ssl: ssl.SSLContext | None = None
        self._idle: dict[tuple[str, str, int, str | None], list[_Conn]] = {}
        # Bumped when `verify` changes and on `close()`: a connection opened before (one in use
        # at that moment included) is closed when it comes back, never pooled.
        self._generation = 0
        self.connects = 0  # connections opened (tests: keep-alive is real)

    @property
    def verify(self) -> bool | str:
        return self._verify

    @verify.setter
    def verify(self, value: bool | str) -> None:
        if value != self._verify:
            self._verify, self._ssl = value, None
            self.close()  # no connection verified under the old setting is used again

    def _context(self) -> ssl.SSLContext:
        if self._ssl is None:
            ctx = ssl_context(self._verify)  # as the summarizer's httpx clients verify
            ctx.set_alpn_protocols(["http/1.1"])
            self._ssl = ctx
        return self._ssl

    async def post(
        self,
        url: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        sni: str | None = None,
    ) -> Answer:
        """POST `body` to `url` with exactly `headers` (the caller left out Host and framing),
        and `Host` (the agent's own under `sni`, as `agent_request` does); the answer's head."""
        parts = urlsplit(url)
        scheme, host = parts.scheme, parts.hostname or ""
        port = parts.port or (443 if scheme == "https" else 80)
        if sni:
            host_header = next((v for k, v in headers if k.lower() == b"host"), sni.encode())
        else:
            default = port == (443 if scheme == "https" else 80)
            name = f"[{host}]" if ":" in host else host
            host_header = (name if default else f"{name}:{port}").encode("idna")
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        for k, v in [(b"host", host_header), *headers]:
            # mitmproxy checks an HTTP/2 client's field names, not its values: a CR or LF in
            # one would write a header (or a request) of the client's onto a shared connection.
            if not _TOKEN.fullmatch(k) or _BAD_VALUE.search(v):
                raise H1Error(f"a request header cannot be sent as HTTP/1.1: {k[:40]!r}")
        # mitmproxy's URL carries the path's bytes as `surrogateescape`: the same bytes again.
        path = target.encode("utf-8", "surrogateescape")
        if b" " in path or _BAD_VALUE.search(path):
            raise H1Error("the request target cannot be sent as HTTP/1.1")
        lines = [b"POST %s HTTP/1.1\r\nhost: %s\r\n" % (path, host_header)]
        lines += [k + b": " + v + b"\r\n" for k, v in headers if k.lower() != b"host"]
        lines.append(b"content-length: %d\r\n\r\n" % len(body))
        head = b"".join(lines)
        close = any(k.lower() == b"connection" and b"close" in v.lower() for k, v in headers)
        key = (scheme, host, port, sni)
        conn = self._take(key)
        if conn is not None:
            try:
                return await self._exchange(conn, head, body, close)
            except _Stale:
                _close(conn)  # closed by the server while idle: once more, on a new one
            except BaseException:
                _close(conn)
                raise
        conn = await self._open(key)
        try:
            return await self._exchange(conn, head, body, close)
        except BaseException:
            _close(conn)
            raise

    async def _exchange(self, conn: _Conn, head: bytes, body: bytes, close: bool) -> Answer:
        """Send the request, read the answer's head. A reused connection that fails before
        any answer byte raises `_Stale` (the caller sends once more, on a new one)."""
        w, r = conn.writer, conn.reader
        try:
            if len(body) < 65536:
                w.write(head + body)
            else:
                w.write(head)
                w.write(body)
            await w.drain()
            raw = await r.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as e:
            if conn.reused and not e.partial:
                raise _Stale from None
            raise H1Error("the connection closed before the answer's head ended") from None
        except asyncio.LimitOverrunError:
            raise H1Error("the answer's head is too large") from None
        except OSError:
            # Sent again only if not a byte of answer arrived: one that began was answered.
            if conn.reused and not _buffered(r):
                raise _Stale from None
            raise
        status, reason, headers = _head(raw)
        while 100 <= status < 200 and status != 101:  # 100 Continue, 103 Early Hints
            try:
                raw = await r.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                raise H1Error("the answer's head did not follow its 1xx") from None
            status, reason, headers = _head(raw)
        return Answer(
            status, reason, headers, conn, self, _framing(status, headers), _keep(headers, close)
        )

    def _take(self, key: tuple[str, str, int, str | None]) -> _Conn | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if (
                conn.reader.at_eof()
                or conn.writer.is_closing()
                or _buffered(conn.reader)  # bytes no request asked for (a 408 on idle, say)
                or now - conn.idle_since > KEEPALIVE_EXPIRY
            ):
                _close(conn)
                continue
            conn.reused = True
            return conn
        return None

    async def _open(self, key: tuple[str, str, int, str | None]) -> _Conn:
        scheme, host, port, sni = key
        tls = self._context() if scheme == "https" else None
        generation = self._generation
        async with asyncio.timeout(CONNECT_TIMEOUT):  # no connection left behind if cancelled
            reader, writer = await asyncio.open_connection(
                host,
                port,
                ssl=tls,
                server_hostname=(sni or host) if tls else None,
                limit=MAX_HEAD,
            )
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        self.connects += 1
        return _Conn(reader, writer, key, generation)

    def _release(self, conn: _Conn) -> None:
        idle = self._idle.setdefault(conn.key, [])
        if conn.generation != self._generation or len(idle) >= MAX_IDLE:
            _close(conn)
            return
        conn.reused = False
        conn.idle_since = time.monotonic()
        idle.append(conn)

    def close(self) -> None:
        """Close every idle connection; one in use is closed when its answer is done."""
        self._generation += 1
        for idle in self._idle.values():
            for conn in idle:
                _close(conn)
        self._idle.clear()


class _Stale(Exception):
    """A reused connection ended before any answer byte."""


def _buffered(reader: asyncio.StreamReader) -> bool:
    """Whether bytes wait unread (StreamReader keeps them in `_buffer`; it has no public way
    to ask without reading)."""
    return bool(getattr(reader, "_buffer", b""))


def _close(conn: _Conn) -> None:
    with contextlib.suppress(Exception):
        conn.writer.close()


def _head(raw: bytes) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    lines = raw[:-4].split(b"\r\n")
    status_line = lines[0].split(b" ", 2)
    if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1."):
        raise H1Error(f"not an HTTP/1.1 status line: {lines[0][:60]!r}")
    try:
        status = int(status_line[1])
    except ValueError:
        raise H1Error(f"bad status {status_line[1][:10]!r}") from None
    reason = status_line[2] if len(status_line) > 2 else b""
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise H1Error(f"bad header line {line[:60]!r}")
        headers.append((name, value.strip()))
    return status, reason, headers


def _framing(status: int, headers: list[tuple[bytes, bytes]]) -> tuple[str, int]:
    if status in (204, 304):
        return ("none", 0)
    te = b",".join(v for k, v in headers if k.lower() == b"transfer-encoding").lower()
    if te:
        if te.rsplit(b",", 1)[-1].strip() != b"chunked":
            return ("close", 0)
        return ("chunked", 0)
    lengths = {v.strip() for k, v in headers if k.lower() == b"content-length"}
    if lengths:
        if len(lengths) != 1 or not next(iter(lengths)).isdigit():
            raise H1Error(f"bad content-length {sorted(lengths)!r}")
        n = int(next(iter(lengths)))
        return ("length", n) if n else ("none", 0)
    return ("close", 0)


def _keep(headers: list[tuple[bytes, bytes]], close: bool) -> bool:
    if close:
        return False
    conn = b",".join(v for k, v in headers if k.lower() == b"connection").lower()
    return b"close" not in conn


def decoder(encoding: bytes | None) -> Callable[[bytes], bytes] | None:
    """A streaming decoder for a content-encoding (None for identity); raises H1Error for one
    it cannot read, and so does the decoder, for bytes that are not what they claim."""
    step = _decoder(encoding)
    if step is None:
        return None

    def decode(data: bytes) -> bytes:
        try:
            return step(data)
        except Exception as e:  # noqa: BLE001 - zlib, brotli and zstandard raise their own
            raise H1Error(f"undecodable answer body: {type(e).__name__}: {e}") from None

    return decode


def _decoder(encoding: bytes | None) -> Callable[[bytes], bytes] | None:
    enc = (encoding or b"").strip().lower()
    if enc in (b"", b"identity"):
        return None
    if b"," in enc:
        raise H1Error(f"stacked content-encodings {enc.decode('latin-1')!r} are not read here")
    if enc in (b"gzip", b"x-gzip"):
        return _Frames(lambda: zlib.decompressobj(wbits=zlib.MAX_WBITS | 16)).feed
    if enc == b"deflate":
        return _Deflate().feed
    if enc == b"br":
        import brotli  # mitmproxy's own dependency

        return brotli.Decompressor().process  # type: ignore[no-any-return]
    if enc == b"zstd":
        import zstandard  # mitmproxy's own dependency

        return _Frames(lambda: zstandard.ZstdDecompressor().decompressobj()).feed
    raise H1Error(f"content-encoding {enc.decode('latin-1')!r} is not one this relay reads")


class _Frames:
    """A body of one or more frames (zstd, RFC 8878) or members (gzip): each decoded in turn,
    the bytes after one frame's end fed to a new decoder (as httpx's decoders do)."""

    def __init__(self, new: Callable[[], Any]) -> None:
        self._new = new
        self._d = new()

    def feed(self, data: bytes) -> bytes:
        out = []
        while data:
            out.append(self._d.decompress(data))
            if not self._d.eof:
                break
            data = self._d.unused_data
            self._d = self._new()
        return b"".join(out)


class _Deflate:
    """`deflate` as servers send it: zlib-wrapped, or (often) raw."""

    def __init__(self) -> None:
        self._d: zlib._Decompress | None = None
        self._first = b""

    def feed(self, data: bytes) -> bytes:
        if self._d is None:
            self._first += data
            if len(self._first) < 2:
                return b""
            zlib_wrapped = (self._first[0] & 0x0F) == 8 and (
                (self._first[0] << 8) | self._first[1]
            ) % 31 == 0
            self._d = zlib.decompressobj(zlib.MAX_WBITS if zlib_wrapped else -zlib.MAX_WBITS)
            data, self._first = self._first, b""
        return self._d.decompress(data)
