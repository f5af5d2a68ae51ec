"""The mitmproxy face of context-guru: options, hooks and control endpoints, kept thin.

One request, in order: control endpoint? -> provider route? -> allowed host? -> bypass? -> size
cap? -> `rewrite_body` (index, pipeline, splice, validate) -> assign the new body once, or leave
the original untouched. Every provider flow ends with its decision record in
`flow.metadata["context_guru"]`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from mitmproxy import ctx, exceptions, http

from cg import __version__, control
from cg.body import MessageCache
from cg.dialects import route
from cg.pipeline import Component
from cg.rewrite import rewrite_body
from cg.settings import Config, host_allowed, load_config
from cg.stats import Stats

log = logging.getLogger("context_guru")

META = "context_guru"
BYPASS_HEADER = "x-context-guru-bypass"
KNOWN_COMPONENTS: dict[str, type] = {}


class ContextGuru:
    def __init__(self) -> None:
        self.stats = Stats()
        self.cache = MessageCache()
        self.config = Config()
        self.components: list[Component] = []
        self.hosts: Sequence[str] = ()
        self.max_body = 32 * 1024 * 1024
        self.allow_remote_control = False

    def load(self, loader: Any) -> None:
        loader.add_option(
            "cg_preset",
            str,
            "off",
            "context-guru preset: a name from presets/ (e.g. off).",
        )
        loader.add_option(
            "cg_config",
            str | None,
            None,
            "A context-guru YAML config file, merged over the preset.",
        )
        loader.add_option(
            "cg_hosts",
            Sequence[str],
            [],
            "Hosts whose provider requests context-guru may rewrite (exact or *.example.com); "
            "empty means any host. Other hosts' traffic passes through untouched.",
        )
        loader.add_option(
            "cg_max_body_mb",
            int,
            32,
            "Request bodies larger than this many MiB pass through without being parsed.",
        )
        loader.add_option(
            "cg_control_remote",
            bool,
            False,
            "Answer /_cg/ control endpoints for non-loopback clients too.",
        )

    def configure(self, updated: set[str]) -> None:
        if not any(k.startswith("cg_") for k in updated):
            return
        opts = ctx.options
        try:
            if opts.cg_max_body_mb < 0:
                raise ValueError(f"cg_max_body_mb: must be >= 0 (got {opts.cg_max_body_mb})")
            config = load_config(opts.cg_preset, opts.cg_config, list(KNOWN_COMPONENTS))
        except ValueError as e:
            raise exceptions.OptionsError(str(e)) from None  # type: ignore[no-untyped-call]
        self.config = config
        self.components = [
            KNOWN_COMPONENTS[n](config.components.get(n, {})) for n in config.pipeline
        ]
        self.hosts = tuple(opts.cg_hosts)
        self.max_body = opts.cg_max_body_mb * 1024 * 1024
        self.allow_remote_control = opts.cg_control_remote

    # -- hooks -------------------------------------------------------------------------------

    def request(self, flow: http.HTTPFlow) -> None:
        req = flow.request
        if control.is_control(req.path):
            control.answer(flow, self._routes(), self.allow_remote_control)
            return
        dialect = route(req.method, req.path)
        if dialect is None or not host_allowed(req.host, self.hosts):
            return
        self.stats.requests += 1
        t0 = time.perf_counter()
        record: dict[str, Any]
        if req.headers.get(BYPASS_HEADER, "").strip() == "1":
            record = {
                "dialect": dialect.name,
                "outcome": "bypassed",
                "reason": f"{BYPASS_HEADER}: 1",
            }
        elif req.raw_content is None:
            record = {
                "dialect": dialect.name,
                "outcome": "passed_through",
                "reason": "body streamed",
            }
        elif len(req.raw_content) > self.max_body:
            record = {
                "dialect": dialect.name,
                "outcome": "passed_through",
                "reason": f"body of {len(req.raw_content)} bytes is over cg_max_body_mb",
            }
        else:
            try:
                raw = req.get_content(strict=True)
            except ValueError as e:
                raw = None
                record = {
                    "dialect": dialect.name,
                    "outcome": "passed_through",
                    "reason": f"cannot decode body: {e}",
                }
            if raw is not None:
                result = rewrite_body(
                    raw, dialect, self.components, headers=req.headers, cache=self.cache
                )
                record = result.record
                if result.body is not None:
                    try:
                        req.content = result.body
                    except Exception as e:  # noqa: BLE001 - an encoder error must fail open
                        req.content = raw
                        record["outcome"] = "failed_open"
                        record["reason"] = f"cannot re-encode body: {e}"
        self.stats.count(record["outcome"])
        record.setdefault("timings_ms", {})["hook"] = round((time.perf_counter() - t0) * 1000, 3)
        flow.metadata[META] = record
        if record["outcome"] == "failed_open":
            log.warning("context-guru failed open on %s: %s", req.path, record["reason"])
        elif record["outcome"] == "rewritten":
            flow.marked = ":scissors:"
            flow.comment = f"cg: {record.get('messages_in')}→{record.get('messages_out')} messages"

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        """Stream provider SSE straight through: the agent sees tokens as they arrive."""
        if META not in flow.metadata or flow.response is None:
            return
        if flow.response.headers.get("content-type", "").startswith("text/event-stream"):
            flow.response.stream = True

    # -- control endpoints -------------------------------------------------------------------

    def _routes(self) -> dict[str, control.Handler]:
        return {
            "health": lambda f: control.json_response(
                200, {"ok": True, "version": __version__, "preset": ctx.options.cg_preset}
            ),
            "stats": lambda f: control.json_response(200, self.stats.to_json()),
        }
