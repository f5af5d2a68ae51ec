"""The control endpoints (`/_cg/`: the dashboard, health, stats, sessions, expand, metrics) and the
`cg.stats` / `cg.sessions` commands, answered from the runtime's counters, ledger and store.

Who may ask, and the answer's framing, are `cg.proxy.control`'s; the pages that read the store
are read and rendered off the loop (`cg.proxy.pages`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable
from typing import Any

from mitmproxy import command, ctx, exceptions, http

from cg import __version__
from cg.billing.ledger import chart_of
from cg.billing.listing import PAGE_DEFAULT, BadPage, page_key, page_limit
from cg.expand.tool import parse_id
from cg.proxy import control, dashboard, metrics, pages
from cg.proxy.runtime import Runtime
from cg.proxy.scope import stats_doc
from cg.state import StoreError


class Control:
    name = "contextguru_control"  # (unique among every script's addons)

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.metrics = metrics.Metrics(rt)  # (its own registry: no state shared across addons)

    def request(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        """A `/_cg/` request is answered here (the addons after this one leave it alone)."""
        if flow.live and control.is_control(flow.request.path):
            return control.answer(flow, self._routes(), self.rt.control)
        return None

    def _routes(self) -> dict[str, control.Handler]:
        return {
            "": self._dashboard_endpoint,
            "health": self._health_endpoint,
            "stats": self._stats_endpoint,
            "sessions": self._sessions_endpoint,
            "expand": self._expand_endpoint,
            "metrics": self._metrics_endpoint,
        }

    def _metrics_endpoint(self, flow: http.HTTPFlow, caller: control.Caller) -> http.Response:
        """`GET /_cg/metrics`: Prometheus' text format (`cg.proxy.metrics`): process-wide
        figures, as `/_cg/stats`, from memory (a scrape never reads the ledger)."""
        return http.Response.make(
            200,
            self.metrics.render(),
            {"content-type": metrics.CONTENT_TYPE, "cache-control": "no-store"},
        )

    def _dashboard_endpoint(
        self, flow: http.HTTPFlow, caller: control.Caller
    ) -> http.Response | Awaitable[http.Response]:
        """`GET /_cg/`: the savings dashboard (HTML) with one page of sessions (`limit`,
        `cursor` as `/_cg/sessions`), for a local caller; a remote one reads its own session
        only, as `/_cg/sessions`. Read and rendered off the loop (`cg.proxy.pages`)."""
        scope = caller.scope()
        if scope == "":
            return control.no_session()
        page = pages.page_args(flow)
        if isinstance(page, http.Response):
            return page
        limit, cursor = page
        # Copied here, on the loop, which counts (the chart's points: once the page is known).
        counters = self.rt.stats.to_json() if scope is None else None
        ledger, meter, count = self.rt.meter.ledger, self.rt.meter, self.rt.tokens.count_text
        tally = self.rt.tally

        def read() -> tuple[dict[str, Any], dict[str, Any]]:
            doc = pages.sessions_doc(ledger, count, scope, limit, cursor)
            return doc, (stats_doc(counters, meter, tally) if counters is not None else {})

        def render(doc: dict[str, Any], totals: dict[str, Any], history: Any) -> http.Response:
            listed = [str(s.get("id")) for s in doc["sessions"]]
            charts = chart_of(history, ledger.prices, listed) if ledger is not None else {}
            nxt = doc.get("next")
            html = dashboard.render(
                totals,
                doc["sessions"],
                charts,
                error=doc.get("error"),
                next_href=pages.href(limit, nxt) if nxt else None,
                first_href=pages.href(limit, None) if cursor else None,
            )
            return http.Response.make(
                200,
                html.encode("utf-8"),
                {
                    "content-type": "text/html; charset=utf-8",
                    "cache-control": "no-store",
                    "content-security-policy": dashboard.CSP,
                    "x-content-type-options": "nosniff",
                },
            )

        async def board() -> http.Response:
            doc, totals = await self.rt.off_loop.run(read)
            listed = [str(s.get("id")) for s in doc["sessions"]]
            history = ledger.history_copy(listed) if ledger is not None else {}  # on the loop
            return await self.rt.off_loop.run(functools.partial(render, doc, totals, history))

        return board()

    def _health_endpoint(self, flow: http.HTTPFlow, caller: control.Caller) -> http.Response:
        """`{"ok": …, "serving": true, …, "store": {"ok": …}}`: `serving` says the process is
        up and forwarding (as a pass-through if need be: what a launcher waits for); `ok`
        whether it also does its work, which needs the store (false, with `error`, while the
        store is unusable: every request passes through then); `store` why (the reason to a
        local caller only: it names the file)."""
        store = self.rt.store_state()
        doc: dict[str, Any] = {"ok": bool(store["ok"]), "serving": True}
        if not store["ok"] and caller.local:
            doc["error"] = f"{store.get('error')}: passing every request through unchanged"
        if not caller.local:
            store = {"ok": store["ok"]}
        else:  # (its modes name the upstream: a local caller's, a launcher deciding to reuse it)
            doc["mode"] = list(ctx.options.mode)
        doc.update(version=__version__, preset=ctx.options.cg_preset, store=store)
        return control.json_response(200, doc)

    def _sessions_endpoint(
        self, flow: http.HTTPFlow, caller: control.Caller
    ) -> http.Response | Awaitable[http.Response]:
        """`GET /_cg/sessions?limit=N&cursor=C`: a page of sessions, read off the loop."""
        scope = caller.scope()
        if scope == "":
            return control.no_session()
        page = pages.page_args(flow)
        if isinstance(page, http.Response):
            return page
        ledger, count = self.rt.meter.ledger, self.rt.tokens.count_text
        return self.rt.off_loop.run(
            lambda: control.json_response(200, pages.sessions_doc(ledger, count, scope, *page))
        )

    def _stats_endpoint(
        self, flow: http.HTTPFlow, caller: control.Caller
    ) -> Awaitable[http.Response]:
        """`GET /_cg/stats`: the counters (copied here, on the loop, which counts) with the
        ledger's totals (summed in the store, off the loop)."""
        counters, meter, tally = self.rt.stats.to_json(), self.rt.meter, self.rt.tally
        return self.rt.off_loop.run(
            lambda: control.json_response(200, stats_doc(counters, meter, tally))
        )

    def stats_json(self) -> dict[str, Any]:
        """The counters, with this process's `usage` and `savings` and the whole ledger's
        under `ledger` (`cg.proxy.scope`; docs/control.md)."""
        return stats_doc(self.rt.stats.to_json(), self.rt.meter, self.rt.tally)

    def sessions_json(
        self, session: str | None = None, limit: int = PAGE_DEFAULT, cursor: str | None = None
    ) -> dict[str, Any]:
        """`GET /_cg/sessions`: a page of sessions (or only `session`) with its checkpoint,
        usage and savings, and `next`, the cursor of the page after it (None: the last)."""
        return pages.sessions_doc(
            self.rt.meter.ledger, self.rt.tokens.count_text, session, limit, cursor
        )

    @command.command("cg.stats")  # type: ignore[untyped-decorator]
    def stats_command(self) -> str:
        """context-guru's counters, usage and savings (as /_cg/stats), as JSON."""
        return json.dumps(self.stats_json(), ensure_ascii=False, indent=1)

    @command.command("cg.sessions")  # type: ignore[untyped-decorator]
    def sessions_command(self, cursor: str = "", limit: int = PAGE_DEFAULT) -> str:
        """A page of sessions with their checkpoint, usage and savings (as /_cg/sessions), as
        JSON; `cursor`: a page's `next`, for the page after it."""
        try:
            page = page_limit(str(limit)), cursor or None
            if cursor:
                page_key(cursor)
        except BadPage as e:
            raise exceptions.CommandError(str(e)) from None
        return json.dumps(self.sessions_json(None, *page), ensure_ascii=False, indent=1)

    def _expand_endpoint(self, flow: http.HTTPFlow, caller: control.Caller) -> http.Response:
        """`GET /_cg/expand?id=KEY`: the stashed span as JSON; `id=KEY%23N`: its N-th message
        alone (1-based). 400 malformed, 404 unknown, expired or no message N. A remote caller
        reads only its own session's stashes, whole or a message at a time."""
        ident = flow.request.query.get("id", "")
        parsed = parse_id(ident)
        if parsed is None:
            return control.json_response(
                400, {"error": f"not a context-guru id (KEY or KEY#N): {ident[:64]!r}"}
            )
        key, n = parsed
        scope = caller.scope()
        if scope == "":
            return control.no_session()
        try:
            stash = self.rt.store.get_stash(key, scope) if self.rt.store is not None else None
            sources = stash.sources() if stash is not None and n is not None else []
        except StoreError as e:
            return control.json_response(503, {"error": f"the store is unavailable: {e}"})
        if stash is None:
            return control.json_response(
                404, {"error": f"id {ident} is unknown or no longer available (expired)"}
            )
        doc: dict[str, Any] = {
            "id": ident,
            "session": stash.session,
            "created": stash.created,
            "count": stash.count,
            "dialect": stash.dialect,
        }
        if n is None:
            return control.json_response(200, {**doc, "messages": stash.messages()})
        if not 1 <= n <= len(sources):
            return control.json_response(
                404,
                {
                    "error": f"id {ident}: the stash holds {len(sources)} messages, "
                    f"{key}#1 to {key}#{len(sources)}"
                },
            )
        src = sources[n - 1]
        return control.json_response(
            200, {**doc, "key": key, "n": n, "message": json.loads(src), "source": src}
        )
