"""Measuring inside the addon proxy, for `bench.proxy_latency`; not part of the addon.

Loaded with `-s` after `cg_addon.py`. Its `response` hook (the addon's `request` hook has run
by then) keeps each provider flow's decision-record timings and the addon's `MessageCache` hit
count; `gc.callbacks` time every full (generation-2) collection. `GET /_bench/probe` answers
all of it as JSON, with the collector's state (`gc.get_freeze_count()` shows whether anything
froze the heap). Nothing is written anywhere; the benchmark fetches it at the end.
"""

from __future__ import annotations

import gc
import json
import time
from typing import Any

from mitmproxy import ctx, http

PATH = "/_bench/probe"


class Probe:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.full_gcs_ms: list[float] = []
        self._t0 = 0.0
        gc.callbacks.append(self._gc)

    def _gc(self, phase: str, info: dict[str, int]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.full_gcs_ms.append(round((time.perf_counter() - self._t0) * 1000.0, 3))

    def done(self) -> None:
        if self._gc in gc.callbacks:
            gc.callbacks.remove(self._gc)

    def _hits(self) -> int | None:
        addon = ctx.master.addons.get("contextguru")
        cache = getattr(addon, "cache", None)
        hits = getattr(cache, "hits", None)
        return hits if isinstance(hits, int) else None

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.request.path != PATH:
            return
        body = {
            "records": self.records,
            "full_gcs_ms": self.full_gcs_ms,
            "gc_freeze_count": gc.get_freeze_count(),
            "gc_count": gc.get_count(),
            "gc_objects": len(gc.get_objects()),
        }
        flow.response = http.Response.make(
            200, json.dumps(body).encode(), {"content-type": "application/json"}
        )

    def response(self, flow: http.HTTPFlow) -> None:
        rec = flow.metadata.get("context_guru")
        if rec is None:
            return
        self.records.append(
            {
                "outcome": rec.get("outcome"),
                "messages_in": rec.get("messages_in"),
                "timings_ms": rec.get("timings_ms", {}),
                "cache_hits_total": self._hits(),
            }
        )


addons = [Probe()]
