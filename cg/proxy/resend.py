"""The 400 safety net's second try: the original request sent upstream again, answered whole.

When a provider refuses a rewritten request, the original bytes go out once more with the
original headers, and that answer (as a mitmproxy response) is what the client gets.
"""

from __future__ import annotations

import httpx
from mitmproxy import http

from cg.wire.upstream import HOP_BY_HOP, agent_request


async def resend(
    client: httpx.AsyncClient, req: http.Request, original: bytes, sni: str | None = None
) -> http.Response:
    """Send `req` upstream again with `original` as its (still encoded) body; the answer whole.
    `sni`: the request's URL names an address, and TLS names this provider (`sni_name`)."""
    out = agent_request(client, req.method, req.url, req.headers.fields, original, sni=sni)
    resp = await client.send(out, stream=True)
    try:
        raw = b"".join([chunk async for chunk in resp.aiter_raw()])
    finally:
        await resp.aclose()
    answer = http.Response.make(
        resp.status_code,
        b"",
        [(k, v) for k, v in resp.headers.raw if k.lower() not in HOP_BY_HOP],
    )
    answer.raw_content = raw
    answer.headers["content-length"] = str(len(raw))
    return answer
