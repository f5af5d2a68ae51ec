"""When a first summary is worth commissioning (docs/behaviour.md#summarize-triggers).

Request gates are ANDed and a zero gate imposes nothing. A fraction gate needs the model's
window; when the window is unknown the gate is not resolvable and does not fire (the decision
record says so). Two hard triggers fire regardless of the gates and of the cache state: one tool
output of `huge_output_frac` of the window, and a request at `ceiling_frac` of the window (close
to failing anyway, or to the agent's own compaction). `cache_state: cold` acts only when the session's prompt cache is presumed expired.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Protocol

import yaml

from cg.settings import PRESETS_DIR, model_entry
from cg.summarize.config import TriggerConfig

CACHE_TTL_DEFAULT = 300.0
CACHE_TTL_1H = 3600.0
ONE_MILLION = 1_000_000
_TTL_1H = re.compile(r'"ttl"\s*:\s*"1h"')


@dataclass(frozen=True, slots=True)
class WindowTable:
    windows: dict[str, int]
    context_1m: tuple[str, ...]


@cache
def shipped_windows() -> WindowTable:
    data: dict[str, Any] = (
        yaml.safe_load((PRESETS_DIR / "tables" / "model_windows.yaml").read_text()) or {}
    )
    return WindowTable(
        {str(k): int(v) for k, v in (data.get("windows") or {}).items()},
        tuple(str(p) for p in data.get("context_1m") or ()),
    )


def _entry(model: str, table: Mapping[str, int]) -> int | None:
    best = model_entry(model, table)
    return table[best] if best is not None else None


def resolve_window(
    model: object, beta_header: str, user_windows: Mapping[str, int], table: WindowTable
) -> int | None:
    """The model's context window, or None when unknown (fraction gates then cannot fire)."""
    if not isinstance(model, str) or not model:
        return None
    if model in user_windows:
        return user_windows[model]
    if "context-1m" in beta_header and model_entry(model, table.context_1m) is not None:
        return ONE_MILLION
    return _entry(model, user_windows) or _entry(model, table.windows)


def cache_ttl(body_text: str) -> float:
    """5 minutes, or 1 hour when the request's `cache_control` asks `ttl: "1h"`."""
    return CACHE_TTL_1H if _TTL_1H.search(body_text) else CACHE_TTL_DEFAULT


@dataclass(frozen=True, slots=True)
class RequestFacts:
    messages: int
    request_tokens: int
    output_tokens: int
    max_output_tokens: int
    window: int | None
    last_request: float | None
    now: float
    ttl: float


@dataclass(slots=True)
class TriggerResult:
    fire: bool = False
    hard: str | None = None
    blocked: list[str] = field(default_factory=list)
    cache: str = "unknown"

    def to_json(self) -> dict[str, Any]:
        return {"fire": self.fire, "hard": self.hard, "blocked": self.blocked, "cache": self.cache}


class Gated(Protocol):
    """What `evaluate` reads of a component's configuration: its `trigger` block, the message
    gate and the cache state it acts in (`SummarizeConfig`, and the `mask` component's)."""

    @property
    def trigger(self) -> TriggerConfig: ...

    @property
    def min_messages(self) -> int: ...

    @property
    def cache_state(self) -> str: ...


def evaluate(cfg: Gated, f: RequestFacts) -> TriggerResult:
    t = cfg.trigger
    r = TriggerResult()

    def frac_gate(name: str, frac: float, tokens: int) -> None:
        if frac <= 0:
            return
        if f.window is None:
            r.blocked.append(f"{name}: window unknown, fraction not resolvable")
        elif tokens < frac * f.window:
            r.blocked.append(f"{name}: {tokens} < {frac} x {f.window}")

    if cfg.min_messages and f.messages < cfg.min_messages:
        r.blocked.append(f"min_messages: {f.messages} < {cfg.min_messages}")
    if t.min_request_tokens and f.request_tokens < t.min_request_tokens:
        r.blocked.append(f"min_request_tokens: {f.request_tokens} < {t.min_request_tokens}")
    if t.min_output_tokens and f.output_tokens < t.min_output_tokens:
        r.blocked.append(f"min_output_tokens: {f.output_tokens} < {t.min_output_tokens}")
    frac_gate("min_request_frac", t.min_request_frac, f.request_tokens)
    frac_gate("min_output_frac", t.min_output_frac, f.output_tokens)

    if f.last_request is None:
        r.cache = "unknown"
    elif f.now - f.last_request > f.ttl:
        r.cache = "cold"
    else:
        r.cache = "warm"

    if f.window is not None:
        if t.huge_output_frac > 0 and f.max_output_tokens >= t.huge_output_frac * f.window:
            r.hard = f"huge_output_frac: one tool output of {f.max_output_tokens} tokens"
        elif t.ceiling_frac > 0 and f.request_tokens >= t.ceiling_frac * f.window:
            r.hard = (
                f"ceiling: {f.request_tokens} tokens >= ceiling_frac {t.ceiling_frac} x {f.window}"
            )
    if r.hard:
        r.fire = True
    elif not r.blocked:
        if cfg.cache_state == "cold" and r.cache != "cold":
            r.blocked.append(f"cache_state: cold, but the session's cache is {r.cache}")
        else:
            r.fire = True
    return r
