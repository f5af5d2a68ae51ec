"""A test-only mitmproxy script, loaded before cg_addon.py: what a client really sent, and where
a hostname really goes.

    mitmdump -s tests/e2e/tap.py -s cg_addon.py -s tests/e2e/recorder.py \\
        --set tap_file=FILE --set tap_route=api.anthropic.com=127.0.0.1:PORT,...

`Tap` (`tap_file`): one JSON line per request (but `/_cg/` ones) as the client sent it, before any other addon has
seen it — id, method, scheme, host, path, headers (in order) and the body bytes (base64). The
flow is tagged `x-e2e-id: ID` (a fresh id unless the client sent one), so the provider's record
and the recorder's decision line pair with it; the recorded headers are the client's, without
the tag. For clients that cannot be hooked (Claude Code is a native binary).

`Route` (`tap_route`): connections to a listed hostname go to 127.0.0.1:PORT instead; SNI and
`Host` stay the hostname, so a client that believes it talks to https://api.anthropic.com
through `HTTPS_PROXY` reaches a local fake that holds a certificate for that name, and nothing
leaves the machine.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Sequence
from typing import IO, Any

from mitmproxy import ctx, http
from mitmproxy.proxy import server_hooks

E2E_HEADER = "x-e2e-id"


class Tap:
    def __init__(self) -> None:
        self.out: IO[str] | None = None

    def load(self, loader: Any) -> None:
        loader.add_option("tap_file", str, "", "Append a JSON line per request, as sent, here.")

    def configure(self, updated: set[str]) -> None:
        if "tap_file" in updated:
            self.done()
            if ctx.options.tap_file:
                self.out = open(ctx.options.tap_file, "a", encoding="utf-8")  # noqa: SIM115

    def done(self) -> None:
        if self.out is not None:
            self.out.close()
            self.out = None

    def request(self, flow: http.HTTPFlow) -> None:
        req = flow.request
        if self.out is None or req.path.startswith("/_cg/"):  # the harness's own polls
            return
        if not flow.live:
            # Not sent by a client: a flow the addon shows for one of its own calls (a summary,
            # an expand round), run through the hooks as a flow read from a file.
            return
        headers = [[k.decode("latin-1"), v.decode("latin-1")] for k, v in req.headers.fields]
        e2e_id = req.headers.get(E2E_HEADER) or uuid.uuid4().hex
        line = {
            "id": e2e_id,
            "method": req.method,
            "scheme": req.scheme,
            "host": req.pretty_host,
            "path": req.path,
            "headers": headers,
            "body": base64.b64encode(req.raw_content or b"").decode("ascii"),
        }
        req.headers[E2E_HEADER] = e2e_id
        self.out.write(json.dumps(line) + "\n")
        self.out.flush()


class Route:
    def __init__(self) -> None:
        self.routes: dict[str, int] = {}

    def load(self, loader: Any) -> None:
        loader.add_option(
            "tap_route", Sequence[str], [], "HOST=127.0.0.1:PORT: connect there for HOST."
        )

    def configure(self, updated: set[str]) -> None:
        if "tap_route" in updated:
            routes = {}
            for item in ctx.options.tap_route:
                host, _, target = item.partition("=")
                addr, _, port = target.rpartition(":")
                if addr != "127.0.0.1":
                    raise ValueError(f"tap_route: only 127.0.0.1 targets (got {item!r})")
                routes[host] = int(port)
            self.routes = routes

    def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        assert data.server.address is not None
        host = str(data.server.address[0])
        if host in self.routes:
            data.server.sni = data.server.sni or host
            data.server.address = ("127.0.0.1", self.routes[host])


addons = [Tap(), Route()]
