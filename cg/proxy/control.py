"""Control endpoints under `/_cg/`, answered by the addon and never forwarded."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable
from typing import Any

from mitmproxy import http

PREFIX = "/_cg/"


def is_control(path: str) -> bool:
    return path.split("?", 1)[0].startswith(PREFIX)


def is_loopback(peer: Any) -> bool:
    try:
        addr = ipaddress.ip_address(str(peer[0]).split("%", 1)[0])
    except (ValueError, TypeError, IndexError):
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def json_response(status: int, payload: Any) -> http.Response:
    body = json.dumps(payload, ensure_ascii=False, indent=1).encode()
    return http.Response.make(
        status, body, {"content-type": "application/json", "cache-control": "no-store"}
    )


Handler = Callable[[http.HTTPFlow], http.Response]


def answer(flow: http.HTTPFlow, routes: dict[str, Handler], allow_remote: bool) -> None:
    """Answer a control request in place; it never reaches the upstream."""
    if not allow_remote and not is_loopback(flow.client_conn.peername):
        flow.response = json_response(
            403, {"error": "control endpoints answer loopback clients only"}
        )
        return
    name = flow.request.path.split("?", 1)[0][len(PREFIX) :].strip("/")
    handler = routes.get(name)
    if handler is None:
        flow.response = json_response(404, {"error": f"unknown control endpoint {name!r}"})
        return
    if flow.request.method not in ("GET", "HEAD"):
        flow.response = json_response(405, {"error": "use GET"})
        return
    flow.response = handler(flow)
