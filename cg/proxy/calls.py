"""Our own requests upstream (a summary, an expand round) as mitmproxy flows, so mitmweb lists
them beside the agent's: its request and its answer, marked and commented, the credential
redacted whatever `cg_redact_credentials` says (the flow is ours, nobody replays it).

The flow is built from what was already sent and read (`cg.wire.upstream.Exchange`): showing it
sends nothing. It is not live, so no addon forwards it, and the addon's own hooks skip it.
"""

from __future__ import annotations

import time
import urllib.parse

from mitmproxy import connection, http
from mitmproxy import flow as mflow
from mitmproxy.net.http import status_codes

from cg.proxy import view as views
from cg.wire.upstream import Exchange
from cg.wire.urlkey import redact_key

# The credential headers (cg.proxy.redact.CREDENTIAL_HEADERS), replaced in every flow shown.
SECRET_HEADERS = frozenset({"authorization", "x-api-key", "api-key", "x-goog-api-key"})
REDACTED = "[redacted by context-guru]"


def _headers(pairs: tuple[tuple[str, str], ...], body: bytes) -> http.Headers:
    """The headers as sent or received, the credential redacted; the body is kept decoded
    (httpx decoded the answer), so its encoding and length are said anew."""
    out = http.Headers(
        [
            (
                k.encode("latin-1"),
                (REDACTED if k.lower() in SECRET_HEADERS else v).encode("latin-1"),
            )
            for k, v in pairs
            if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")
        ]
    )
    out["content-length"] = str(len(body))
    return out


def call_flow(ex: Exchange, rec: dict[str, object], flow_id: str | None = None) -> http.HTTPFlow:
    """A finished flow of one exchange, carrying view record `rec` (its mark and comment).
    `flow_id`: the id named up front (in the commissioning flow's comment)."""
    url = urllib.parse.urlsplit(redact_key(ex.url))
    port = url.port or (443 if url.scheme == "https" else 80)
    host = url.hostname or ""
    client = connection.Client(
        peername=("127.0.0.1", 0), sockname=("127.0.0.1", 0), timestamp_start=ex.started
    )
    server = connection.Server(address=(host, port))
    f = http.HTTPFlow(client, server)
    if flow_id:
        f.id = flow_id
    path = url.path + (f"?{url.query}" if url.query else "")
    f.request = http.Request(
        host,
        port,
        ex.method.encode(),
        url.scheme.encode(),
        b"",
        path.encode(),
        b"HTTP/1.1",
        _headers(ex.request_headers, ex.request_body),
        ex.request_body,
        None,
        ex.started,
        ex.started,
    )
    if ex.status is not None:
        f.response = http.Response(
            b"HTTP/1.1",
            ex.status,
            status_codes.RESPONSES.get(ex.status, "").encode(),
            _headers(ex.response_headers, ex.response_body),
            ex.response_body,
            None,
            ex.started,
            ex.ended,
        )
    else:
        f.error = mflow.Error(ex.error or "no answer", time.time())
    views.mark(f, dict(rec))
    return f
