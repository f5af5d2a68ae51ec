"""Talking to the upstream ourselves: re-sending an original request, reading a provider error.

Used by the 400 safety net: when a provider refuses a rewritten request, the original bytes go
out once more with the original headers, and that answer is what the client gets.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from mitmproxy import http

# Hop-by-hop or recomputed: never copied between the two HTTP stacks.
_SKIP = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade"}
)

_SKIP_B = frozenset(h.encode() for h in _SKIP)

# The agent's own request had no read timeout through mitmproxy, and neither has its re-send:
# a long generation may take minutes to start answering. The agent keeps its own timeout.
RESEND_TIMEOUT = httpx.Timeout(None, connect=30.0)


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


async def resend(client: httpx.AsyncClient, req: http.Request, original: bytes) -> http.Response:
    """Send `req` upstream again with `original` as its (still encoded) body; the answer whole."""
    headers = [(k, v) for k, v in req.headers.fields if k.lower() not in _SKIP_B]
    out = client.build_request(
        req.method, req.url, headers=headers, content=original, timeout=RESEND_TIMEOUT
    )
    # The client's defaults (accept-encoding, user-agent, …) would change what the provider
    # sends back, e.g. an encoding the agent never asked for: send the agent's headers only.
    sent = {k.lower() for k, _ in headers} | {b"host", b"content-length"}
    for name in {k for k in out.headers if k.encode() not in sent}:
        del out.headers[name]
    resp = await client.send(out, stream=True)
    try:
        raw = b"".join([chunk async for chunk in resp.aiter_raw()])
    finally:
        await resp.aclose()
    answer = http.Response.make(
        resp.status_code,
        b"",
        [(k, v) for k, v in resp.headers.raw if k.lower() not in _SKIP_B],
    )
    answer.raw_content = raw
    answer.headers["content-length"] = str(len(raw))
    return answer
