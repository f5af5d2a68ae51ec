"""List prices per model, in USD per million tokens (docs/behaviour.md#usage-cost-and-savings).

The shipped table is `cg/presets/tables/prices.yaml` (dated, each figure with its source); a
config's `prices:` map overrides it model by model. A model takes its entry as
`cg.settings.model_entry` finds it (its name, its family's by prefix, or either after a gateway's
provider prefix). A model with no price is *unknown*: its cost is None, never zero, and every
total it enters says so.

Some models charge more for a long prompt (every token of a request whose input, cache reads and
writes included, passes `long_prompt.threshold_tokens`); such a request is billed wholly at the
`long_prompt` rates. The ledger records which tier each request fell in (`tier()`), since a sum
of many requests no longer tells.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import yaml

from cg.settings import PRESETS_DIR, Price, Rates, model_entry, parse_prices
from cg.wire.usage import Usage

PRICES_FILE = PRESETS_DIR / "tables" / "prices.yaml"
LONG = "long"
MATCHED_MAX = 1024  # model names remembered (a client naming endless models must not grow it)


def cost_at(rates: Rates, u: Usage) -> float:
    """USD for `u` at `rates` (per million tokens); the 1-hour share of writes priced apart."""
    write_5m = u.cache_write_tokens - u.cache_write_1h_tokens
    return (
        u.input_tokens * rates.input
        + write_5m * rates.cache_write_5m
        + u.cache_write_1h_tokens * rates.cache_write_1h
        + u.cache_read_tokens * rates.cache_read
        + u.output_tokens * rates.output
    ) / 1_000_000


@dataclass(frozen=True, slots=True)
class PriceTable:
    prices: dict[str, Price]
    date: str = ""
    # model -> its price (None: unpriced), for names matched by prefix: each answer is priced
    # three times, and the prefix search goes over the whole table.
    _matched: dict[str, Price | None] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def lookup(self, model: str) -> Price | None:
        if model in self.prices:
            return self.prices[model]
        if model in self._matched:
            return self._matched[model]
        best = model_entry(model, self.prices)
        found = self.prices[best] if best is not None else None
        if len(self._matched) < MATCHED_MAX:
            self._matched[model] = found
        return found

    def tier(self, model: str, prompt_tokens: int) -> str:
        """`long` when this request is billed at the model's long-prompt rates, else ``."""
        p = self.lookup(model)
        lp = p.long_prompt if p is not None else None
        return LONG if lp is not None and prompt_tokens > lp.threshold_tokens else ""

    def cost(self, model: str, usage: Usage, tier: str = "") -> float | None:
        """USD for `usage` of `model`; None when the model has no price (unknown, not free)."""
        p = self.lookup(model)
        if p is None:
            return None
        rates: Rates = p.long_prompt if tier == LONG and p.long_prompt is not None else p
        return cost_at(rates, usage)

    def with_overrides(self, overrides: Mapping[str, Any]) -> PriceTable:
        if not overrides:
            return self
        return PriceTable({**self.prices, **parse_prices(overrides, "prices")}, self.date)


@cache
def shipped_prices() -> PriceTable:
    data = yaml.safe_load(PRICES_FILE.read_text(encoding="utf-8")) or {}
    return PriceTable(parse_prices(data.get("models") or {}, "prices.yaml"), str(data.get("date")))


def price_table(overrides: Mapping[str, Any] | None = None) -> PriceTable:
    """The shipped table with a config's `prices` map over it."""
    return shipped_prices().with_overrides(overrides or {})
