"""The components a config may name in `pipeline`, and how each is built from its YAML block.

Building a component validates its block, so a bad key refuses the whole config at load time,
naming the key; nothing is validated later on the request path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cg.mask.component import Mask
from cg.mask.config import parse_mask
from cg.pipeline.contract import Component
from cg.state import Store
from cg.state.facts import FactsCache
from cg.state.tokens import TokenCounter
from cg.summarize.component import Summarize, Summarizer
from cg.summarize.config import ModelConfig, parse_summarize


@dataclass(slots=True)
class Services:
    """What components share: one store, one token counter, the user's window table, and
    (optionally) one `FactsCache`, so a reader beside the pipeline (the usage ledger, the
    simulator's billing) counts each message's tokens once with it."""

    store: Store
    tokens: TokenCounter
    model_windows: Mapping[str, int] = field(default_factory=dict)
    env: Mapping[str, str] | None = None
    summarizers: Callable[[ModelConfig, str], Summarizer] | None = None
    facts: FactsCache | None = None


Builder = Callable[[Mapping[str, Any], Services], Component]


def _summarize(raw: Mapping[str, Any], s: Services) -> Component:
    cfg = parse_summarize(raw, s.env)
    summarizer = s.summarizers(cfg.model, cfg.summary_level) if s.summarizers else None
    return Summarize(cfg, s.store, s.tokens, s.model_windows, summarizer=summarizer, facts=s.facts)


def _mask(raw: Mapping[str, Any], s: Services) -> Component:
    return Mask(parse_mask(raw), s.store, s.tokens, s.model_windows, facts=s.facts)


COMPONENTS: dict[str, Builder] = {"summarize": _summarize, "mask": _mask}


def build_pipeline(
    names: list[str], blocks: Mapping[str, Mapping[str, Any]], services: Services
) -> list[Component]:
    """Components in pipeline order. Raises ValueError naming the component and the key."""
    out: list[Component] = []
    for name in names:
        if name not in COMPONENTS:
            raise ValueError(f"config: pipeline: unknown component {name!r}")
        out.append(COMPONENTS[name](blocks.get(name) or {}, services))
    for name, block in blocks.items():
        if name not in names and name in COMPONENTS:
            COMPONENTS[name](block or {}, services)  # validate blocks of unused components too
    return out
