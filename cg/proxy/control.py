"""Control endpoints under `/_cg/`, answered by the addon and never forwarded.

Who is answered (`admit`), each step a refusal of its own:

1. **The Host** the request was sent to (the `Host` header; `:authority` in HTTP/2) must be a
   loopback literal (127.0.0.0/8, `::1`, IPv4-mapped), `localhost`, or a name in
   `cg_control_hosts` (default `context-guru.test`, a reserved name that resolves nowhere, so
   no page can be served from it): else 421. A browser always sends the Host it resolved, and
   a page cannot choose it, so this is what stops DNS rebinding (a page on
   `rebind.attacker.example` whose name now resolves to 127.0.0.1: same origin to the browser,
   no `Origin` sent) and, through a regular proxy, any page's `fetch("http://anything/_cg/…")`.
   Such a request is refused, not forwarded: docs/behaviour.md#the-control-surface reserves `/_cg/`
   ("never forwarded"), a forward would carry the caller's control token and session headers to a
   host it did not mean, and a refusal that names the option tells a person who meant it what to
   set. A request that names no host at all (HTTP/1.0 without `Host`, as a balancer's health check
   sends) is no browser's: it passes this step, and the next ones still apply. mitmproxy's reverse
   mode replaces the `Host` before any hook (`keep_host_header`), so the one the client sent is kept
   on control requests as they are parsed (`capture_client_host`); where it could not be, a
   reverse-mode control request is refused (its Host is unknown).
2. **The Origin**: a request carrying `Origin` whose host is not an allowed Host (1), or
   `Origin: null` (a sandboxed frame, a `file:` page), is refused (403). No CORS header is
   ever sent, so no other origin reads an answer in a browser either.
3. **The token**: with `cg_control_token` set every request needs it, loopback included:
   `Authorization: Bearer TOKEN`, or HTTP Basic with the token as the password (a person's
   browser: the 401 offers `Basic`), else 401.
4. **The peer**: a loopback client reads everything, every session; a remote one is answered
   with the token (3), or with `cg_control_remote` and no token, else 403.

A remote caller is scoped to its own session: it proves which one with the header its agent
sends, `x-context-guru-session` (or `x-claude-code-session-id`), allow-listed as in
docs/behaviour.md#sessions.
`/_cg/sessions` then lists that session only and `/_cg/expand` resolves only stashes that
session owns (another session's id is "unknown", never "forbidden": existence is not told).
`/_cg/stats` is process-wide counters, no session id and no content.

The token is compared in constant time and the `authorization` header is removed from every
control flow once read, so a saved flow file (`mitmdump -w`) or a viewer never holds it. No
handler opens a file: the endpoints read the store the options named, and nothing a request says
becomes a path.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import functools
import hmac
import ipaddress
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from mitmproxy import ctx, http
from mitmproxy.proxy.mode_specs import ReverseMode

from cg.settings import host_patterns
from cg.state.session import HEADER_CG, HEADER_CLAUDE_CODE, valid_session_id

PREFIX = "/_cg/"
_PREFIX_BYTES = PREFIX.encode()
# The reserved `.test` name a browser or client reaches the dashboard by through a regular
# proxy (tests/e2e/harness.py, docs/mitmweb.md); it resolves nowhere, so no page can be served from it.
DEFAULT_HOSTS = ("context-guru.test",)
HOSTS_OPTION = "cg_control_hosts"
REALM = 'realm="context-guru"'
# Where a control request's Host, as the client sent it, is kept (`capture_client_host`).
CLIENT_HOST = "_cg_client_host"
_NOT_KEPT = object()


def is_control(path: str) -> bool:
    return path.split("?", 1)[0].startswith(PREFIX)


def _loopback_ip(text: str) -> bool:
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def is_loopback(peer: Any) -> bool:
    try:
        return _loopback_ip(str(peer[0]).split("%", 1)[0])
    except (TypeError, IndexError):
        return False


def host_name(value: str) -> str | None:
    """The name in a `Host` or `:authority` value, without its port and brackets, lower case
    and without a trailing dot; None when it is no host (an empty name, a port that is not
    digits, an unclosed bracket)."""
    v = value.strip()
    if v.startswith("["):
        name, bracket, rest = v[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port = rest[1:] if rest else "0"
    elif v.count(":") == 1:
        name, _, port = v.partition(":")
    else:
        name, port = v, "0"  # no port, or a bare IPv6 address (no port can be told from it)
    name = name.lower().rstrip(".")
    return name if name and port.isdigit() else None


def control_hosts(entries: Sequence[str]) -> tuple[str, ...]:
    """`cg_control_hosts` made into patterns (exact names or `*.example.com`, as `cg_hosts`):
    a URL, a path or a port is refused as there; so is an entry of wildcards alone, which
    would answer any Host (DNS rebinding again). Raises ValueError naming the option."""
    out = []
    for h in host_patterns(entries, HOSTS_OPTION):
        name = host_name(h)
        if name is None or (h.startswith("[") and not h.endswith("]")):
            raise ValueError(
                f"{HOSTS_OPTION}: {h!r} is not a host name; give names or *.example.com, no "
                "scheme, path or port"
            )
        if not name.strip("*.?"):
            raise ValueError(
                f"{HOSTS_OPTION}: {h!r} would answer any Host; give names or *.example.com "
                "(loopback addresses and localhost are always answered)"
            )
        out.append(name)
    return tuple(out)


def host_allowed(name: str, patterns: Sequence[str]) -> bool:
    """`name` (from `host_name`) is a loopback literal, `localhost`, or one of `patterns`."""
    if name == "localhost" or _loopback_ip(name):
        return True
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def capture_client_host() -> bool:
    """Keep the `Host` (`:authority`) of each control request as the client sent it, on the
    request (`CLIENT_HOST`), before mitmproxy's reverse mode replaces it with the upstream's.

    mitmproxy rewrites it in `HttpStream.state_wait_for_request_headers`, before the first
    hook, and keeps no copy: that method is wrapped here, once per process. The wrapper reads
    the path of every request (one `startswith`) and does nothing else for any other. Returns
    whether it is in place (False: this mitmproxy has no such method)."""
    try:
        from mitmproxy.proxy.layers.http import HttpStream
    except ImportError:
        return False
    original = getattr(HttpStream, "state_wait_for_request_headers", None)
    if original is None:
        return False
    if getattr(original, "cg_keeps_client_host", False):
        return True

    @functools.wraps(original)
    def state_wait_for_request_headers(self: Any, event: Any) -> Any:
        try:  # (free when nothing raises) a hook of ours never breaks mitmproxy
            req = event.request
            if req.data.path.startswith(_PREFIX_BYTES):
                setattr(req, CLIENT_HOST, req.host_header)
        except Exception:  # noqa: BLE001 - not kept: the control request is refused
            pass
        return original(self, event)

    state_wait_for_request_headers.cg_keeps_client_host = True  # type: ignore[attr-defined]
    HttpStream.state_wait_for_request_headers = state_wait_for_request_headers  # type: ignore[method-assign]
    return True


def client_host(flow: http.HTTPFlow) -> tuple[bool, str | None]:
    """(known, the Host the client sent, None if it sent none); not known when mitmproxy
    replaced it (reverse mode) and it was not kept."""
    req = flow.request
    kept = getattr(req, CLIENT_HOST, _NOT_KEPT)
    if kept is not _NOT_KEPT:
        return True, kept if isinstance(kept, str) else None
    if isinstance(flow.client_conn.proxy_mode, ReverseMode) and not getattr(
        ctx.options, "keep_host_header", False
    ):
        return False, None
    return True, req.host_header


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
    """`remote`: answer non-loopback clients (option `cg_control_remote`); `token`: the token
    every caller must present (option `cg_control_token`; empty: none); `hosts`: the names
    besides loopback and `localhost` a control request may be sent to (`cg_control_hosts`)."""

    remote: bool = False
    token: str = ""
    hosts: tuple[str, ...] = DEFAULT_HOSTS


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


def _credentials(flow: http.HTTPFlow) -> list[bytes]:
    """The token each `authorization` value offers: a Bearer token, or a Basic password."""
    out = []
    for value in flow.request.headers.get_all("authorization"):
        scheme, _, rest = value.strip().partition(" ")
        scheme = scheme.lower()
        if scheme == "bearer":
            out.append(rest.strip().encode("utf-8", "surrogateescape"))
        elif scheme == "basic":
            try:
                pair = base64.b64decode(rest.strip(), validate=True)
            except (binascii.Error, ValueError):
                continue
            out.append(pair.partition(b":")[2])
    return out


def _has_token(flow: http.HTTPFlow, token: str) -> bool:
    want = token.encode("utf-8", "surrogateescape")
    found = False
    for given in _credentials(flow):
        found |= hmac.compare_digest(given, want)  # every value compared, in constant time
    return found


def _session(flow: http.HTTPFlow) -> str | None:
    for name in (HEADER_CG, HEADER_CLAUDE_CODE):
        v: str | None = flow.request.headers.get(name)
        if v is not None and valid_session_id(v.strip()):
            return v.strip()
    return None


def _misdirected(why: str) -> http.Response:
    return json_response(
        421,
        {
            "error": f"{why}; control endpoints answer only a Host that is a loopback address, "
            f"localhost or a name in {HOSTS_OPTION}"
        },
    )


def _host_refusal(flow: http.HTTPFlow, policy: ControlPolicy) -> http.Response | None:
    known, host = client_host(flow)
    if not known:
        return _misdirected("the Host this request was sent to is not known (reverse mode)")
    if host is None or not host.strip():
        return None  # no host named: no browser's request
    name = host_name(host)
    if name is None or not host_allowed(name, policy.hosts):
        return _misdirected(f"Host {host[:64]!r} is not one of ours")
    return None


def _origin_refusal(flow: http.HTTPFlow, policy: ControlPolicy) -> http.Response | None:
    for origin in flow.request.headers.get_all("origin"):
        try:
            parts = urlsplit(origin.strip())
            name = (parts.hostname or "").rstrip(".")
            ok = bool(parts.scheme) and bool(name) and host_allowed(name, policy.hosts)
            parts.port  # noqa: B018 - a port that is no number raises
        except ValueError:
            ok = False
        if not ok:
            return json_response(
                403,
                {
                    "error": f"Origin {origin[:64]!r} is not one of ours; control endpoints "
                    f"answer no page from another site (allowed: loopback, localhost, "
                    f"{HOSTS_OPTION})"
                },
            )
    return None


def _unauthorized(endpoint: str) -> http.Response:
    resp = json_response(
        401,
        {
            "error": "control endpoints need the token (cg_control_token): "
            "'Authorization: Bearer <token>', or HTTP Basic with it as the password"
        },
    )
    # The dashboard is a person's: a browser asks for Basic credentials, and none for Bearer.
    offered = ["Basic"] if endpoint == "" else ["Bearer", "Basic"]
    resp.headers.set_all("www-authenticate", [f"{s} {REALM}" for s in offered])
    return resp


def admit(flow: http.HTTPFlow, policy: ControlPolicy, endpoint: str = "") -> Caller | http.Response:
    """The caller, or the refusal to send it (`endpoint`: the name asked for, `""` the
    dashboard)."""
    refusal = _host_refusal(flow, policy) or _origin_refusal(flow, policy)
    if refusal is not None:
        return refusal
    if policy.token and not _has_token(flow, policy.token):
        return _unauthorized(endpoint)
    if is_loopback(flow.client_conn.peername):
        return Caller(local=True)
    if not policy.token and not policy.remote:
        return json_response(403, {"error": "control endpoints answer loopback clients only"})
    return Caller(local=False, session=_session(flow))


def answer(
    flow: http.HTTPFlow, routes: dict[str, Handler], policy: ControlPolicy
) -> Awaitable[None] | None:
    """Answer a control request in place; it never reaches the upstream. A handler that
    answers off the event loop makes this return an awaitable (the request hook returns it,
    and mitmproxy awaits it: other flows go on meanwhile)."""
    name = flow.request.path.split("?", 1)[0][len(PREFIX) :].strip("/")
    caller = admit(flow, policy, name)
    # Read once, kept nowhere: a saved flow or a viewer never shows the token.
    flow.request.headers.pop("authorization", None)
    if isinstance(caller, http.Response):
        flow.response = caller
        return None
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
