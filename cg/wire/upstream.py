"""Talking to the upstream ourselves: a request with the agent's own headers, as bytes, and a
provider's error read back.

The 400 safety net (`cg.proxy.resend`) and the expand rounds (`cg.expand.continuation`) both send
the agent's request again, or a continuation of it: one way to build it, here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import httpx

# Hop-by-hop or recomputed: never copied between the two HTTP stacks.
HOP_BY_HOP = frozenset(
    {b"host", b"content-length", b"transfer-encoding", b"connection", b"keep-alive", b"upgrade"}
)

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


def agent_request(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    headers: Iterable[tuple[bytes, bytes]],
    content: bytes,
    drop: frozenset[bytes] = HOP_BY_HOP,
) -> httpx.Request:
    """A request upstream carrying the agent's own headers (as bytes), and only those.

    The client's defaults (accept-encoding, user-agent, …) would change what the provider sends
    back, e.g. an encoding the agent never asked for. No read timeout: the agent's request had
    none through mitmproxy, and the agent keeps its own.
    """
    kept = [(k, v) for k, v in headers if k.lower() not in drop]
    out = client.build_request(method, url, headers=kept, content=content, timeout=RESEND_TIMEOUT)
    sent = {k.lower() for k, _ in kept} | {b"host", b"content-length"}
    for name in {k for k in out.headers if k.encode() not in sent}:
        del out.headers[name]
    return out
