"""Talking to the upstream ourselves: a request with the agent's own headers, as bytes, and a
provider's error read back.

The 400 safety net (`cg.proxy.resend`) and the expand rounds (`cg.expand.continuation`) both send
the agent's request again, or a continuation of it: one way to build it, here.

Where to send it: in transparent and local modes (and behind a CONNECT whose server address an
addon rewrote) mitmproxy's `request.url` names the *address* it connected to, not the provider.
Our own calls connect to that same address, but name the provider — the `Host` header's name —
for SNI, the certificate check and the `Host` header (`sni_name`, httpx's `sni_hostname`), as
mitmproxy's own upstream connection did; a certificate is never checked against an IP address
the provider never put in it.
"""

from __future__ import annotations

import ipaddress
import json
import os
import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import certifi
import httpx

# Hop-by-hop or recomputed: never copied between the two HTTP stacks.
HOP_BY_HOP = frozenset(
    {b"host", b"content-length", b"transfer-encoding", b"connection", b"keep-alive", b"upgrade"}
)

# The agent's own request had no read timeout through mitmproxy, and neither has its re-send:
# a long generation may take minutes to start answering. The agent keeps its own timeout.
RESEND_TIMEOUT = httpx.Timeout(None, connect=30.0)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return False
    return True


def sni_name(url_host: str, host_header: str | None) -> str | None:
    """The provider's name for SNI and the certificate check, when the URL names an address.

    `url_host` is the host mitmproxy connected to (`request.host`), `host_header` the name the
    agent asked for (`request.pretty_host`: the `Host` header or HTTP/2 `:authority`). None when
    the URL already names a host (reverse and regular modes: httpx does the right thing) or the
    agent named no host but an address.
    """
    name = (host_header or "").strip().rstrip(".").lower()
    if not name or not _is_address(url_host) or _is_address(name):
        return None
    if len(name) > 253 or any(c not in _NAME_CHARS for c in name):
        return None  # not a DNS name: never handed to the TLS layer
    return name


_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-._")


def sni_extensions(sni: str | None) -> dict[str, Any]:
    """httpx request extensions that verify the certificate against `sni` (none when None)."""
    return {"sni_hostname": sni} if sni else {}


def ssl_context(verify: bool | str) -> ssl.SSLContext:
    """The TLS context of our own calls upstream (`upstream_verify`'s value): certifi's CAs,
    mitmproxy's `ssl_verify_upstream_trusted_ca` (a file or a directory), or no verification
    under `ssl_insecure`. One for the summarizer's httpx clients and the relay's own client."""
    if verify is False:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    if verify is True:
        return ssl.create_default_context(cafile=certifi.where())
    if os.path.isdir(verify):
        return ssl.create_default_context(capath=verify)
    return ssl.create_default_context(cafile=verify)


def upstream_verify(options: Any) -> bool | str:
    """TLS verification for our own upstream calls, following mitmproxy's upstream options."""
    if getattr(options, "ssl_insecure", False):
        return False
    ca = getattr(options, "ssl_verify_upstream_trusted_ca", None)
    return str(ca) if ca else True


def provider_message(body: bytes | None, limit: int = 500) -> str:
    """The `error.message` of an Anthropic or OpenAI error body, else the body's start."""
    if not body:
        return ""
    try:
        doc = json.loads(body)
        err = doc.get("error") if isinstance(doc, dict) else None
        msg = err.get("message") if isinstance(err, dict) else None
        if isinstance(msg, str):
            return msg[:limit]
    except ValueError:
        pass
    return body[:limit].decode("utf-8", "replace")


def agent_request(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    headers: Iterable[tuple[bytes, bytes]],
    content: bytes,
    drop: frozenset[bytes] = HOP_BY_HOP,
    sni: str | None = None,
) -> httpx.Request:
    """A request upstream carrying the agent's own headers (as bytes), and only those.

    The client's defaults (accept-encoding, user-agent, …) would change what the provider sends
    back, e.g. an encoding the agent never asked for. No read timeout: the agent's request had
    none through mitmproxy, and the agent keeps its own. `sni` (from `sni_name`): `url` names
    an address; TLS and the `Host` header name this provider instead.
    """
    headers = list(headers)
    kept = [(k, v) for k, v in headers if k.lower() not in drop]
    out = client.build_request(
        method,
        url,
        headers=kept,
        content=content,
        timeout=RESEND_TIMEOUT,
        extensions=sni_extensions(sni),
    )
    if sni:
        # The agent's own Host (HTTP/2 has none in the headers: then the name alone).
        host = next((v for k, v in headers if k.lower() == b"host"), sni.encode("ascii"))
        out.headers["host"] = host.decode("latin-1")
    sent = {k.lower() for k, _ in kept} | {b"host", b"content-length"}
    for name in {k for k in out.headers if k.encode() not in sent}:
        del out.headers[name]
    return out


@dataclass(frozen=True, slots=True)
class Exchange:
    """One request we sent upstream ourselves (a summary, an expand round) and what came back,
    handed to whoever shows it (the mitmproxy face turns it into a flow). Plain data, so the
    layers that send never import mitmproxy. The headers are as sent: the receiver redacts the
    credential before anything is kept. `status` None: no answer (`error` says why)."""

    method: str
    url: str
    request_headers: tuple[tuple[str, str], ...]
    request_body: bytes
    started: float  # wall clock (time.time()), as mitmproxy's timestamps
    ended: float
    status: int | None = None
    response_headers: tuple[tuple[str, str], ...] = ()
    response_body: bytes = b""
    error: str | None = None


ExchangeSink = Callable[[Exchange], None]


def exchange_of(
    req: httpx.Request,
    started: float,
    resp: httpx.Response | None = None,
    error: str | None = None,
) -> Exchange:
    """An `Exchange` from an httpx request and its (read) response, or the error instead."""
    return Exchange(
        req.method,
        str(req.url),
        tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in req.headers.raw),
        req.content,
        started,
        time.time(),
        resp.status_code if resp is not None else None,
        tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in resp.headers.raw)
        if resp is not None
        else (),
        resp.content if resp is not None else b"",
        error,
    )
