"""What one preset cost on one session (or on all of them): the bill, split agent / summarizer.

Costs are priced with the shipped price table (`cg.billing.prices`), long-prompt tier included.
A model with no price makes the bill *unknown*, never zero: `cost_usd` is then None and
`unpriced` names the models, while every other figure (tokens, turns, summaries) stays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from cg.billing.prices import PriceTable
from cg.simulate.retained import Retained
from cg.wire.usage import Usage

Payer = Literal["agent", "summarizer"]


@dataclass(slots=True)
class Tally:
    agent: Usage = field(default_factory=Usage)
    summarizer: Usage = field(default_factory=Usage)
    agent_usd: float = 0.0
    summarizer_usd: float = 0.0
    unpriced: set[str] = field(default_factory=set)
    turns: int = 0
    rewritten: int = 0
    commissioned: int = 0
    summaries: int = 0
    tokens_sent: int = 0
    peak_tokens: int = 0
    peak_frac: float | None = None
    # Turns on which the agent's own compaction would start: the previous answer's context
    # (input + cache + output, as the provider reports it) at or past the agent's threshold.
    agent_compaction_turns: int = 0
    over_window: int = 0
    curve: list[float] = field(default_factory=list)  # cumulative USD after each turn
    sizes: list[int] = field(default_factory=list)  # tokens of the agent request of each turn
    marks: list[int] = field(default_factory=list)  # turns that commissioned / compacted
    retained: Retained = field(default_factory=Retained)  # what the sent requests kept

    def charge(
        self, prices: PriceTable, payer: Payer, model: str | None, usage: Usage
    ) -> float | None:
        """Add `usage` to the bill; its USD, or None when `model` has no price."""
        cost = None
        if model is not None:
            cost = prices.cost(model, usage, prices.tier(model, usage.prompt_tokens))
        if cost is None:
            self.unpriced.add(model or "(no model)")
        if payer == "agent":
            self.agent += usage
            self.agent_usd += cost or 0.0
        else:
            self.summarizer += usage
            self.summarizer_usd += cost or 0.0
        return cost

    def sent(self, tokens: int, window: int | None) -> None:
        """One agent request of `tokens` went upstream."""
        self.turns += 1
        self.sizes.append(tokens)
        self.tokens_sent += tokens
        self.peak_tokens = max(self.peak_tokens, tokens)
        if window:
            frac = tokens / window
            self.peak_frac = frac if self.peak_frac is None else max(self.peak_frac, frac)
            if tokens > window:
                self.over_window += 1

    def close_turn(self) -> None:
        self.curve.append(self.agent_usd + self.summarizer_usd)

    @property
    def cost_usd(self) -> float | None:
        return None if self.unpriced else self.agent_usd + self.summarizer_usd

    @property
    def summarizer_cost_usd(self) -> float | None:
        return None if self.unpriced else self.summarizer_usd

    def add(self, other: Tally) -> None:
        """Sum `other` in (curves, sizes and marks are per session and are not summed)."""
        self.agent += other.agent
        self.summarizer += other.summarizer
        self.agent_usd += other.agent_usd
        self.summarizer_usd += other.summarizer_usd
        self.unpriced |= other.unpriced
        for name in (
            "turns",
            "rewritten",
            "commissioned",
            "summaries",
            "tokens_sent",
            "agent_compaction_turns",
            "over_window",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.retained.add(other.retained)
        self.peak_tokens = max(self.peak_tokens, other.peak_tokens)
        if other.peak_frac is not None:
            self.peak_frac = max(self.peak_frac or 0.0, other.peak_frac)

    def to_json(
        self, reference: float | None, baseline: float | None, session: bool = False
    ) -> dict[str, Any]:
        """`session`: one session's, with the per-turn retention series and its worst turn."""
        cost = self.cost_usd
        return {
            "cost_usd": _round(cost),
            "ratio": _ratio(cost, reference),
            "ratio_to_agent_compaction": _ratio(cost, baseline),
            "summarizer_cost_usd": _round(self.summarizer_cost_usd),
            "summaries": self.summaries,
            "commissioned": self.commissioned,
            "rewritten": self.rewritten,
            "turns": self.turns,
            "tokens_sent": self.tokens_sent,
            "peak_tokens": self.peak_tokens,
            "peak_frac": None if self.peak_frac is None else round(self.peak_frac, 4),
            "agent_compaction_turns": self.agent_compaction_turns,
            "over_window": self.over_window,
            "retention": self.retained.session_json() if session else self.retained.to_json(),
            "usage": {"agent": self.agent.to_json(), "summarizer": self.summarizer.to_json()},
            "unpriced_models": sorted(self.unpriced),
        }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def _ratio(cost: float | None, ref: float | None) -> float | None:
    if cost is None or ref is None or ref <= 0:
        return None
    return round(cost / ref, 4)
