"""Control endpoints under `/_cg/`, answered by the addon and never forwarded.

Who is answered (`ControlPolicy`):

    loopback client            everything, every session
    remote, `cg_control_token` set
                               only with `Authorization: Bearer TOKEN` (else 401)
    remote, `cg_control_remote` and no token
                               answered (anyone who reaches the port: use a token)
    remote, neither            403

A remote caller is scoped to its own session: it proves which one with the header its agent
sends, `x-context-guru-session` (or `x-claude-code-session-id`), allow-listed as in SPEC §8.
`/_cg/sessions` then lists that session only and `/_cg/expand` resolves only stashes that
session owns (another session's id is "unknown", never "forbidden": existence is not told).
`/_cg/stats` is process-wide counters, no session id and no content.

The token is compared in constant time and the `authorization` header is removed from every
control flow once read, so a saved flow file (`mitmdump -w`) or a viewer never holds it. No
handler opens a file: the endpoints read the store the options named, and nothing a request says
becomes a path.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from mitmproxy import http

from cg.state.session import HEADER_CG, HEADER_CLAUDE_CODE, valid_session_id

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


def json_response(
    status: int, payload: Any, headers: dict[str, str] | None = None
) -> http.Response:
    body = json.dumps(payload, ensure_ascii=False, indent=1).encode()
    return http.Response.make(
        status,
        body,
        {"content-type": "application/json", "cache-control": "no-store", **(headers or {})},
    )


@dataclass(frozen=True, slots=True)
class ControlPolicy:
    """`remote`: answer non-loopback clients (option `cg_control_remote`); `token`: a bearer
    token non-loopback clients must present (option `cg_control_token`; empty: none)."""

    remote: bool = False
    token: str = ""


@dataclass(frozen=True, slots=True)
class Caller:
    """Who asks: a loopback client (`local`, every session), or a remote one scoped to the
    session it named (`session`, None when it named none)."""

    local: bool
    session: str | None = None

    def scope(self) -> str | None:
        """The session this caller may read (None: any, for a local caller)."""
        return None if self.local else self.session or ""


# A handler answers at once, or (the session list, the dashboard, the ledger's totals: reads
# that grow with the store) with an awaitable that reads off the event loop.
Handler = Callable[[http.HTTPFlow, Caller], http.Response | Awaitable[http.Response]]


def _bearer(flow: http.HTTPFlow) -> str:
    value = flow.request.headers.get("authorization", "")
    scheme, _, token = value.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _session(flow: http.HTTPFlow) -> str | None:
    for name in (HEADER_CG, HEADER_CLAUDE_CODE):
        v: str | None = flow.request.headers.get(name)
        if v is not None and valid_session_id(v.strip()):
            return v.strip()
    return None


def admit(flow: http.HTTPFlow, policy: ControlPolicy) -> Caller | http.Response:
    """The caller, or the refusal to send it."""
    if is_loopback(flow.client_conn.peername):
        return Caller(local=True)
    if policy.token:
        given = _bearer(flow).encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(given, policy.token.encode("utf-8", "surrogateescape")):
            return json_response(
                401,
                {"error": "control endpoints need 'Authorization: Bearer <cg_control_token>'"},
                {"www-authenticate": 'Bearer realm="context-guru"'},
            )
    elif not policy.remote:
        return json_response(403, {"error": "control endpoints answer loopback clients only"})
    return Caller(local=False, session=_session(flow))


def answer(
    flow: http.HTTPFlow, routes: dict[str, Handler], policy: ControlPolicy
) -> Awaitable[None] | None:
    """Answer a control request in place; it never reaches the upstream. A handler that
    answers off the event loop makes this return an awaitable (the request hook returns it,
    and mitmproxy awaits it: other flows go on meanwhile)."""
    caller = admit(flow, policy)
    # Read once, kept nowhere: a saved flow or a viewer never shows the token.
    flow.request.headers.pop("authorization", None)
    if isinstance(caller, http.Response):
        flow.response = caller
        return None
    name = flow.request.path.split("?", 1)[0][len(PREFIX) :].strip("/")
    handler = routes.get(name)
    if handler is None:
        flow.response = json_response(404, {"error": f"unknown control endpoint {name[:64]!r}"})
        return None
    if flow.request.method not in ("GET", "HEAD"):
        flow.response = json_response(405, {"error": "use GET"})
        return None
    answered = handler(flow, caller)
    if isinstance(answered, http.Response):
        flow.response = answered
        return None
    return _later(flow, answered)


async def _later(flow: http.HTTPFlow, pending: Awaitable[http.Response]) -> None:
    """The handler's answer once it is ready; an error is a 500 (a hook never raises)."""
    try:
        flow.response = await pending
    except Exception as e:  # noqa: BLE001 - the answer says what failed, the proxy goes on
        flow.response = json_response(500, {"error": f"{type(e).__name__}: {e}"})


def no_session() -> http.Response:
    """A remote caller that named no session reads none."""
    return json_response(
        400,
        {
            "error": f"a remote caller reads only its own session: send it in {HEADER_CG} "
            f"(or {HEADER_CLAUDE_CODE}), as the agent does"
        },
    )
