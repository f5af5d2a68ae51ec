"""A loopback relay for the streamed answers of turns offered `context_guru_expand`.

mitmproxy streams an answer through a synchronous callable, and sends nothing after the
upstream's end of message but trailers: an addon cannot await a continuation round mid-stream
and write its answer after the provider's. So a turn that asks to stream and was offered our
tool is pointed (in the request hook) at this relay, a plain HTTP/1.1 server on 127.0.0.1 in
the proxy's own event loop. The relay sends the request upstream itself (the agent's headers
and body, a kept-alive connection of `cg.proxy.h1`, the provider's name for TLS), and passes
the answer back event by event through an `ExpandGate`: the agent sees every event as it comes, and only an answer that
begins a call to our tool is held, from that call on, while the continuation runs; its final
answer then completes the stream (`cg.expand.stream.rest`). mitmproxy streams what the relay
writes as it would the provider's bytes.

A relay job is found by a random token in one request header, which only this loopback hop
carries. The hop carries no body: the job holds the request's bytes, so the ~1 MB a long
session sends crosses the process once (our client to the provider), not three times (mitmproxy
to the relay, the relay's read, the client). The flow's URL, headers and body are restored as soon as
the answer's headers arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from cg.expand import continuation
from cg.expand.stream import ExpandGate, rest
from cg.expand.tool import TOOL_NAME
from cg.proxy.h1 import H1Error, H1Pool, decoder
from cg.wire.answers import Reply, ResponseParseError, tool_calls
from cg.wire.upstream import HOP_BY_HOP

log = logging.getLogger("context_guru")

HEADER = "x-context-guru-relay"
MAX_HEAD = 1024 * 1024
# The request goes upstream as mitmproxy would send it (the agent's headers, `connection` and
# `content-encoding` included, with the body as encoded): only our hop's token and what httpx
# frames itself are left out.
# `host` stays: under a provider's name (transparent and local modes) the agent's own goes
# upstream, port and all, as `agent_request` sends it; `cg.proxy.h1` writes it once, first.
_DROP = frozenset({b"content-length", b"transfer-encoding", b"upgrade", HEADER.encode()})
_DECODED_DROP = HOP_BY_HOP | {b"content-encoding"}  # a gated answer passes on decoded


@dataclass(slots=True)
class RelayJob:
    """One turn to relay: where and what to send, and (once done) what the loop did."""

    url: str
    headers: tuple[tuple[bytes, bytes], ...]  # the flow's request headers, restored after the hop
    body: bytes  # as it goes upstream (content-encoded, if the agent's was)
    # The decoded request, for the continuation: read only when the answer called our tool
    # (decoding ~1 MB on every relayed turn's hot path would be paid for nothing).
    text: Callable[[], str]
    dialect: str
    sni: str | None
    resolve: Callable[[str], str]
    origin: tuple[bytes, str, int]  # the flow's scheme, host and port, restored after the hop
    gated: bool = False  # the answer went through the gate (a 2xx SSE answer)
    continued: bool = False  # it called our tool: the continuation loop ran
    rounds: int = 0
    log: list[dict[str, Any]] = field(default_factory=list)
    replies: list[Reply] | None = None
    error: str | None = None
    # perf_counter() when the job was made, reached the relay, had the provider's headers, and
    # was answered: where a relayed turn's time goes (`timings_ms` in its record).
    times: list[float] = field(default_factory=list)
    token: str = ""  # its key in `Relay.jobs` until the relay takes it


class Relay:
    def __init__(
        self, clients: Callable[[str | None], httpx.AsyncClient], h1: H1Pool | None = None
    ) -> None:
        self.clients = clients  # the continuation's rounds
        self.h1 = h1 if h1 is not None else H1Pool()  # the relayed request itself
        self.jobs: dict[str, RelayJob] = {}
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, limit=MAX_HEAD)
        self.port = self.server.sockets[0].getsockname()[1]

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        self.server = None
        self.port = 0
        self.jobs.clear()
        self.h1.close()

    def add(self, job: RelayJob) -> str:
        token = secrets.token_hex(16)
        self.jobs[token] = job  # (bounded by the flows in flight: ending one forgets its job)
        return token

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:  # small writes (an event, a head) go out at once: no Nagle stall
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            # Keep-alive: mitmproxy sends its client's next request on the same connection.
            while not reader.at_eof():
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    break  # closed between requests
                headers: dict[bytes, bytes] = {}
                for line in head.split(b"\r\n")[1:]:
                    name, sep, value = line.partition(b":")
                    if sep:
                        headers[name.strip().lower()] = value.strip()
                await _drain_body(reader, headers)
                job = self.jobs.pop(headers.get(HEADER.encode(), b"").decode("latin-1"), None)
                if job is None:
                    writer.write(
                        _status(502, b"unknown relay job")
                        + b"content-length: 0\r\nconnection: close\r\n\r\n"
                    )
                    await writer.drain()
                    break
                job.times.append(time.perf_counter())
                if not await self._relay(job, writer):
                    break
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass  # mitmproxy went away (its client did): nothing to answer
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _relay(self, job: RelayJob, writer: asyncio.StreamWriter) -> bool:
        """Answer one job; whether the connection may carry another."""
        headers = [(k, v) for k, v in job.headers if k.lower() not in _DROP]
        try:
            ans = await self.h1.post(job.url, headers, job.body, job.sni)
            job.times.append(time.perf_counter())
        except (TimeoutError, OSError, EOFError, H1Error) as e:
            job.error = f"{type(e).__name__}: {e}"
            msg = f"context-guru relay: the provider could not be reached ({type(e).__name__})"
            body = msg.encode()
            writer.write(
                _status(502, b"Bad Gateway")
                + b"content-type: text/plain\r\ncontent-length: %d\r\n" % len(body)
                + b"connection: close\r\n\r\n"
                + body
            )
            return False
        try:
            ctype = (ans.header(b"content-type") or b"").decode("latin-1")
            gated = ans.status == 200 and ctype.startswith("text/event-stream")
            decode = None
            drop = HOP_BY_HOP
            if gated:
                try:
                    encodings = [v for k, v in ans.headers if k.lower() == b"content-encoding"]
                    decode = decoder(b",".join(encodings) or None)
                except H1Error as e:  # passed on as it came, ungated: the agent can read it
                    gated, job.error = False, str(e)
                if decode is not None:
                    drop = _DECODED_DROP
            lines = [_status(ans.status, ans.reason)]
            lines += [k + b": " + v + b"\r\n" for k, v in ans.headers if k.lower() not in drop]
            # An answer that is not gated and says its length passes on as it came, framed by
            # it (mitmproxy reads a length for less than it reads chunks); a gated one is
            # re-framed in chunks, since what it becomes is known only at its end.
            length = None if gated else ans.length
            framed = False  # in chunks: only an answer whose length is not known up front
            if ans.status in (204, 304):
                lines.append(b"\r\n")
            elif length is not None:
                lines.append(b"content-length: %d\r\n\r\n" % length)
            else:
                lines.append(b"transfer-encoding: chunked\r\n\r\n")
                framed = True
            # At once (with TCP_NODELAY): the answer's headers mark when it began.
            writer.write(b"".join(lines))
            gate = None
            if gated:
                gate = ExpandGate(job.dialect)
                job.gated = True
            async for chunk in ans.chunks():
                data = decode(chunk) if decode is not None else chunk
                out = gate.feed(data) if gate is not None else data
                if out:
                    writer.write(b"%x\r\n%s\r\n" % (len(out), out) if framed else out)
                    await writer.drain()
            if gate is not None:
                out = gate.finish() if not gate.holding else await self._continue(job, gate, ctype)
                if out:
                    writer.write(b"%x\r\n%s\r\n" % (len(out), out))
            if framed:
                writer.write(b"0\r\n\r\n")
            job.times.append(time.perf_counter())
        except (TimeoutError, OSError, EOFError, H1Error) as e:
            # The provider's answer broke off or could not be read after its head went out (or
            # mitmproxy's side went away): end the stream the way the provider's reset would.
            job.error = f"{type(e).__name__}: {e}"
            return False
        finally:
            await ans.aclose()
        return True

    async def _continue(self, job: RelayJob, gate: ExpandGate, ctype: str) -> bytes:
        """Our call began: run the loop on the whole first answer, and complete the stream."""
        assert gate.at is not None
        try:
            first = continuation.parse(job.dialect, bytes(gate.whole), ctype)
        except ResponseParseError as e:
            job.error = f"unreadable response: {e}"
            return gate.held_bytes()
        if not any(c.name == TOOL_NAME for c in tool_calls(first)):
            return gate.held_bytes()
        job.continued = True
        try:
            out = await continuation.run(
                self.clients(job.sni),
                job.url,
                [(k, v) for k, v in job.headers if k.lower() != HEADER.encode()],
                job.dialect,
                job.text(),
                first,
                True,
                job.resolve,
                sni=job.sni,
            )
            assert out.final is not None
            tail = rest(first, out.final, out.rounds, gate.at, gate.seq)
        except Exception as e:  # noqa: BLE001 - the client gets the answer as it came
            job.error = f"{type(e).__name__}: {e}"
            log.warning("context-guru: the streamed continuation failed: %s", type(e).__name__)
            return gate.held_bytes()
        job.rounds, job.log, job.replies = out.rounds, out.log, out.replies
        return tail


def _status(code: int, reason: bytes) -> bytes:
    return b"HTTP/1.1 %d %s\r\n" % (code, reason)


async def _drain_body(reader: asyncio.StreamReader, headers: dict[bytes, bytes]) -> None:
    """Read the request's body (the job holds it already): content-length or chunked."""
    if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
            await reader.readexactly(size + 2)
            if size == 0:
                return
    n = int(headers.get(b"content-length", b"0") or b"0")
    if n:
        await reader.readexactly(n)
