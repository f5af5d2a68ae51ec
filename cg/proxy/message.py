"""Reading a flow's request or response the way mitmproxy does, without its per-lookup cost.

Why: mitmproxy's `Headers.get` converts every header field to `str` and builds a list before it
compares one name, and `get_content` asks for `content-encoding` that way each time. A provider
flow was read that way five times over its life (its body, content type and encoding, twice
each side), a tenth of the addon's own time on a small turn. These read the raw fields
once per name, and agree with mitmproxy on every input (tests/proxy/test_message.py).
"""

from __future__ import annotations

from mitmproxy import http

from cg.state.session import header
from cg.wire import decode
from cg.wire.upstream import sni_name


def content(message: http.Message, strict: bool = True) -> bytes | None:
    """`message.get_content(strict)`: the body, decoded when it has a content-encoding."""
    if not header(message.headers, "content-encoding"):
        return message.raw_content
    return message.get_content(strict=strict)


def bounded_content(message: http.Message, limit: int) -> bytes:
    """The body decoded as its content-encoding says, never more than `limit` bytes of it
    produced (`cg.wire.decode`: raises TooLarge, or Undecodable; both ValueErrors). A streamed
    body (no content) is the caller's to refuse first."""
    raw = message.raw_content
    if raw is None:
        raise decode.Undecodable("the body is streamed")
    return decode.decode(raw, header(message.headers, "content-encoding") or "", limit)


def set_content(message: http.Message, body: bytes) -> None:
    """`message.content = body`. Without a content-encoding the body and its content-length go
    in with one edit of the raw fields: mitmproxy's setter read and rewrote the headers three
    times (each converting every field to `str`). With one coding, mitmproxy's own (it
    encodes); with a chain (`gzip, br`), which mitmproxy cannot encode (its setter would drop
    the header and send the body plain), ours (`cg.wire.decode.encode`: Undecodable when a
    coding is unknown), its content-length set as for a plain body."""
    ce = header(message.headers, "content-encoding")
    if ce and len(decode.codings(ce)) <= 1:
        message.content = body
        return
    raw = decode.encode(body, ce) if ce else body
    message.raw_content = raw
    if header(message.headers, "transfer-encoding") is not None:
        return  # as mitmproxy: no content-length beside a transfer-encoding
    length = b"%d" % len(raw)
    fields: list[tuple[bytes, bytes]] = []
    put = False
    for k, v in message.headers.fields:
        if k.lower() != b"content-length":
            fields.append((k, v))
        elif not put:  # the first keeps its place and spelling; any other goes
            fields.append((k, length))
            put = True
    if not put:
        fields.append((b"content-length", length))
    message.headers.fields = tuple(fields)


def content_type(message: http.Message) -> str:
    """The `content-type` header, or ""."""
    return header(message.headers, "content-type") or ""


def upstream_sni(req: http.Request) -> str | None:
    """The provider's name for our own calls' TLS when `req.url` names the address connected
    to (transparent and local modes): the name the agent asked for (`Host`, `:authority`).

    Remembered by what `pretty_host` reads (the host connected to, the HTTP version, the
    `:authority` and the `Host` header): a relayed turn asks it every time, and mitmproxy's
    `pretty_host` parses the authority afresh."""
    data = req.data
    key = (data.host, data.http_version, data.authority, header(req.headers, "host"))
    if key not in _SNI:
        if len(_SNI) >= SNI_MEMO_MAX:
            _SNI.clear()
        _SNI[key] = sni_name(data.host, req.pretty_host)
    return _SNI[key]


SNI_MEMO_MAX = 256
_SNI: dict[tuple[str, bytes, bytes, str | None], str | None] = {}
