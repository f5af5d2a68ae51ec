"""`GET /_cg/metrics`: the proxy's figures in Prometheus' text format, for fleets.

Written by prometheus-client (`generate_latest`) from one collector on a registry of this
addon's own (never the library's global one: two addons in one process, as the tests make,
report apart). The collector reads, when scraped, what `/_cg/stats` reads on the loop: the
counters, this process's usage and savings (`cg.billing.tally`, in memory: a scrape never reads
the store's ledger), the retention measured, and whether the store is usable. Every figure is
since this process started (Prometheus takes the rate of a counter; a restart resets it, which
it understands). Dollars are `_usd`; the would-have-been cost and what was saved are
ESTIMATES (their HELP says so); a model without a price leaves its dollars out, never zero.
No label holds a session id, a model name from a request or anything else a client chose.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cg import __version__
from cg.proxy.runtime import Runtime

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
P = "context_guru_"
OUTCOMES = ("rewritten", "passed_through", "failed_open", "bypassed")
SUMMARIES = ("commissioned", "completed", "failed", "timed_out", "reused", "deferred")
BUCKETS = ("input_tokens", "cache_write_tokens", "cache_read_tokens", "output_tokens")


def _counter(name: str, doc: str, value: Any) -> CounterMetricFamily:
    return CounterMetricFamily(P + name, doc, value=float(value or 0))


class Figures(Collector):
    """The runtime's figures as metric families, read at each scrape."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def collect(self) -> Iterator[Metric]:
        rt, s = self.rt, self.rt.stats
        info = GaugeMetricFamily(P + "info", "context-guru's version and preset", labels=["version", "preset"])  # fmt: skip
        info.add_metric([__version__, rt.preset or ""], 1.0)
        yield info
        yield GaugeMetricFamily(P + "start_time_seconds", "when this process started (Unix time)", value=rt.tally.started)  # fmt: skip
        yield _counter("requests", "provider requests intercepted", s.requests)
        turns = CounterMetricFamily(P + "turns", "provider requests by what was done with them", labels=["outcome"])  # fmt: skip
        for outcome in OUTCOMES:
            turns.add_metric([outcome], float(getattr(s, outcome)))
        yield turns
        yield _counter("rewrites", "requests sent rewritten (smaller)", s.rewritten)
        yield _counter("retried_original", "rewritten requests re-sent as the client sent them after a 400", s.retried_original)  # fmt: skip
        summaries = CounterMetricFamily(P + "summaries", "summary jobs by how they went", labels=["state"])  # fmt: skip
        for state in SUMMARIES:
            summaries.add_metric([state], float(getattr(s.summaries, state)))
        yield summaries
        yield from self._money()
        r = s.retention.to_json()
        yield _counter("retention_turns", "rewritten turns whose retention was measured", r["turns"])  # fmt: skip
        for key in ("mean", "min"):
            if isinstance(r.get(key), int | float):
                yield GaugeMetricFamily(P + f"retention_{key}", f"the {key} share of a rewritten turn's facts still visible in the request sent", value=r[key])  # fmt: skip
        up = self.rt.store_state().get("ok") is True
        yield GaugeMetricFamily(P + "store_up", "1 while the store is usable; 0 while every request passes through", value=1.0 if up else 0.0)  # fmt: skip

    def _money(self) -> Iterator[Metric]:
        ledger = self.rt.meter.ledger
        if ledger is None:
            return
        rep = self.rt.tally.report(ledger.prices)
        usage, sv = rep["usage"], rep["savings"]
        sent = CounterMetricFamily(P + "usage_tokens", "tokens the provider reported, by who asked and bucket", labels=["kind", "bucket"])  # fmt: skip
        for kind in ("agent", "summarizer"):
            for bucket in BUCKETS:
                sent.add_metric([kind, bucket.removesuffix("_tokens")], float(usage[kind][bucket]))
        yield sent
        yield _counter("tokens_not_sent", "tokens the rewrites left out of the requests (our count)", sv["tokens_not_sent"])  # fmt: skip
        billed = CounterMetricFamily(P + "billed_usd", "dollars billed, priced from the provider's usage", labels=["kind"])  # fmt: skip
        for kind in ("agent", "summarizer"):
            value = sv[f"billed_{kind}_usd"]
            if isinstance(value, int | float):
                billed.add_metric([kind], float(value))
        yield billed
        if isinstance(sv["without_rewrite_usd"], int | float):
            yield _counter("without_rewrite_usd", "ESTIMATE: dollars the turns would have been billed unrewritten", sv["without_rewrite_usd"])  # fmt: skip
        if isinstance(sv["saved_usd"], int | float):
            yield GaugeMetricFamily(P + "saved_usd", "ESTIMATE: without_rewrite_usd minus billed (negative while summaries cost more)", value=sv["saved_usd"])  # fmt: skip


class Metrics:
    """One registry per addon, holding the one collector."""

    def __init__(self, rt: Runtime) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(Figures(rt))

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))
