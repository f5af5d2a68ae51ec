"""Which flows are a provider's besides the turns the addon routes: their credential headers are
redacted once answered, as a turn's are (docs/behaviour.md#bounded-work-and-shared-use,
`cg_redact_credentials`).

An agent sends its key on more than its turns: `…/v1/messages/count_tokens`, `GET /v1/models`,
a `HEAD /` as it starts. Those are not the pipeline's, but a saved flow (`mitmdump -w`) or
mitmdump's printout (`--flow-detail 2`) would hold the key in clear. A flow is a provider's when

- it came in through a reverse-mode listener (which fronts one upstream: the provider), or
- its host is a known provider API host (`KNOWN`), a `cg_hosts` entry, or a host that has
  served a routed provider request in this process (`learn`; at most `LEARN_MAX`, so a client
  that names many hosts grows nothing without bound).

The host is read as cheaply as it is: the address connected to (`request.data.host`, the name in
regular and upstream modes) first, the `Host` header only when that misses (transparent and
local modes, where the address is an IP). Only flows the addon does not route are asked: a turn
costs nothing here but its host's membership in `seen`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence

from mitmproxy import http
from mitmproxy.proxy.mode_specs import ReverseMode

from cg.proxy.control import host_name
from cg.state.session import header

# The APIs whose agents the addon serves: Anthropic's, OpenAI's, and Codex's sign-in-with-ChatGPT
# backend (`chatgpt.com/backend-api/codex/…`). Others by `cg_hosts` or by being served (`learn`).
KNOWN = ("api.anthropic.com", "api.openai.com", "chatgpt.com")
LEARN_MAX = 256
_WILD = frozenset("*?[")


class ProviderHosts:
    """`KNOWN` and the `cg_hosts` patterns given, and the hosts `seen` (carried across a
    reconfiguration: they served provider requests whatever the options say now)."""

    def __init__(self, cg_hosts: Sequence[str] = (), seen: Iterable[str] = ()) -> None:
        entries = {p.lower().rstrip(".") for p in (*KNOWN, *cg_hosts)}
        self.names = frozenset(p for p in entries if _WILD.isdisjoint(p))
        wild = sorted(entries - self.names)
        # `*.example.com` is a suffix (`str.endswith`, far cheaper); anything else is fnmatch's.
        self.suffixes = tuple(p[1:] for p in wild if p[:2] == "*." and _WILD.isdisjoint(p[2:]))
        self.patterns = tuple(p for p in wild if p[1:] not in self.suffixes)
        self.seen: set[str] = set(seen)

    def learn(self, host: str) -> None:
        """`host` (a routed flow's `request.data.host`) served a provider request."""
        if len(self.seen) < LEARN_MAX:
            self.seen.add(host)

    def _named(self, name: str) -> bool:
        return (
            name in self.names
            or name.endswith(self.suffixes)
            or any(fnmatch.fnmatchcase(name, p) for p in self.patterns)
        )

    def __call__(self, flow: http.HTTPFlow) -> bool:
        """Whether `flow` (one the addon does not route) is a provider's."""
        if isinstance(flow.client_conn.proxy_mode, ReverseMode):
            return True
        req = flow.request
        host = req.data.host
        if host in self.seen or self._named(host.lower().rstrip(".")):
            return True
        # (the raw field, not `host_header`: mitmproxy's own lookup decodes every header first)
        value = header(req.headers, "host") or req.data.authority.decode("utf-8", "replace")
        name = host_name(value) if value else None
        return name is not None and name != host and self._named(name)
