"""The providers' prompt cache as they bill it, for the fake provider: an independent oracle.

Written from the providers' documentation, not from `cg.billing` (whose figures it checks):

anthropic   The prompt is rendered tools → system → messages, one unit per tool, system block
            and message content block. A unit carrying `cache_control` is a breakpoint (at
            most 4: more is a 400). A request reads the longest cached prefix that ends at a
            breakpoint or up to `LOOKBACK` units before one, and writes the prefix up to each
            later breakpoint (`cache_creation_input_tokens`, split by each breakpoint's `ttl`:
            5 min or 1 h); what follows the last breakpoint is `input_tokens`. A prefix shorter
            than `min_tokens` is never written. `tool_choice` and `thinking` key the messages
            part (changing them misses from the first message on; tools and system still hit),
            `model` keys everything. `cache_control` itself is not part of a unit, so a
            breakpoint that moves (Claude Code moves its own every turn) leaves the prefix hash
            of the units it left unchanged.
openai      The prompt is rendered tools → messages, one unit per tool and per message, keyed by
            `model`, `tool_choice` and `prompt_cache_key`. Every prefix of at least
            `min_tokens` is cached automatically, with no write premium; a request reads the
            longest cached prefix, counted in `OPENAI_STEP`-token increments from `min_tokens`.
responses   The same automatic caching, the prompt rendered tools → instructions → input items
            (one unit per tool, for `instructions`, and per item), keyed the same way.

Entries live `TTL` seconds from their last use (a read refreshes them), on an injectable clock.
A unit's size is ceil(bytes / 4) of its canonical JSON (sorted keys, compact, raw UTF-8): a
simple, deterministic token measure that tests can compute by hand.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

LOOKBACK = 20
MAX_BREAKPOINTS = 4
TTL = {"5m": 300.0, "1h": 3600.0}
MIN_TOKENS = 1024
OPENAI_STEP = 128

Json = Any


class TooManyBreakpoints(ValueError):
    """More than `MAX_BREAKPOINTS` blocks carry `cache_control`: the provider answers 400."""


def canonical(value: Json) -> bytes:
    # surrogatepass: a lone surrogate (a body may carry "\\ud800") must not crash the fake
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8", "surrogatepass")


def size(value: Json) -> int:
    """A unit's token count: ceil(bytes / 4) of its canonical JSON."""
    return math.ceil(len(canonical(value)) / 4)


def _without_cc(block: Json) -> Json:
    if isinstance(block, dict):
        return {k: v for k, v in block.items() if k != "cache_control"}
    return block


def _ttl(block: Json) -> str | None:
    """The breakpoint a block sets: "5m", "1h", or None for none."""
    cc = block.get("cache_control") if isinstance(block, dict) else None
    if not isinstance(cc, dict):
        return None
    return "1h" if cc.get("ttl") == "1h" else "5m"


@dataclass(frozen=True, slots=True)
class Unit:
    """One unit of a rendered prompt: its value (cache_control removed), tokens, breakpoint."""

    value: Json
    tokens: int
    breakpoint: str | None = None


@dataclass(frozen=True, slots=True)
class Rendered:
    """A prompt as units, each prefix named by a chained hash (`keys[k]` names units[:k+1])."""

    units: list[Unit]
    keys: list[bytes]

    @property
    def total(self) -> int:
        return sum(u.tokens for u in self.units)

    def upto(self, k: int) -> int:
        """Tokens of the first k units."""
        return sum(u.tokens for u in self.units[:k])


def _chain(root: Json, parts: list[tuple[Json | None, Unit]]) -> Rendered:
    """Hash the units in order; a `salt` before a unit (e.g. tool_choice) keys it and all after."""
    h = hashlib.blake2b(canonical(root), digest_size=16).digest()
    keys: list[bytes] = []
    for salt, unit in parts:
        if salt is not None:
            h = hashlib.blake2b(h + b"|salt|" + canonical(salt), digest_size=16).digest()
        h = hashlib.blake2b(h + canonical(unit.value), digest_size=16).digest()
        keys.append(h)
    return Rendered([u for _, u in parts], keys)


def anthropic_units(body: dict[str, Json]) -> Rendered:
    """tools → system → messages, at content-block granularity."""
    parts: list[tuple[Json | None, Unit]] = []
    for tool in body.get("tools") or []:
        v = _without_cc(tool)
        parts.append((None, Unit({"tool": v}, size({"tool": v}), _ttl(tool))))
    system = body.get("system")
    if isinstance(system, str) and system:
        parts.append((None, Unit({"system": system}, size({"system": system}))))
    elif isinstance(system, list):
        for block in system:
            v = _without_cc(block)
            parts.append((None, Unit({"system": v}, size({"system": v}), _ttl(block))))
    salt: Json | None = {"tool_choice": body.get("tool_choice"), "thinking": body.get("thinking")}
    for m in body.get("messages") or []:
        role = m.get("role") if isinstance(m, dict) else None
        content = m.get("content") if isinstance(m, dict) else m
        blocks = content if isinstance(content, list) else [content]
        for block in blocks:
            v = {"role": role, "block": _without_cc(block)}
            parts.append((salt, Unit(v, size(v), _ttl(block))))
            salt = None
    if salt is not None:  # no messages: still key the (empty) rest
        parts.append((salt, Unit({"end": True}, 0)))
    return _chain({"model": body.get("model")}, parts)


def openai_units(body: dict[str, Json]) -> Rendered:
    """tools → messages, one unit per tool and per message."""
    parts: list[tuple[Json | None, Unit]] = []
    for tool in body.get("tools") or []:
        parts.append((None, Unit({"tool": tool}, size({"tool": tool}))))
    for m in body.get("messages") or []:
        parts.append((None, Unit({"message": m}, size({"message": m}))))
    root = {
        "model": body.get("model"),
        "tool_choice": body.get("tool_choice"),
        "prompt_cache_key": body.get("prompt_cache_key"),
    }
    return _chain(root, parts)


def responses_units(body: dict[str, Json]) -> Rendered:
    """tools → instructions → input items, one unit each (a string `input` is one item)."""
    parts: list[tuple[Json | None, Unit]] = []
    for tool in body.get("tools") or []:
        parts.append((None, Unit({"tool": tool}, size({"tool": tool}))))
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        parts.append((None, Unit({"instructions": instructions}, size(instructions))))
    items = body.get("input")
    for item in [items] if isinstance(items, str) else items or []:
        parts.append((None, Unit({"item": item}, size({"item": item}))))
    root = {
        "model": body.get("model"),
        "tool_choice": body.get("tool_choice"),
        "prompt_cache_key": body.get("prompt_cache_key"),
    }
    return _chain(root, parts)


def gemini_units(body: dict[str, Json]) -> Rendered:
    """tools → systemInstruction → contents, one unit each; the model (from the path, put in
    `model` by the fake) and `toolConfig` key them all (implicit caching: no breakpoints)."""
    parts: list[tuple[Json | None, Unit]] = []
    for tool in body.get("tools") or []:
        parts.append((None, Unit({"tool": tool}, size({"tool": tool}))))
    system = body.get("systemInstruction")
    if system is not None:
        parts.append((None, Unit({"system": system}, size({"system": system}))))
    for c in body.get("contents") or []:
        parts.append((None, Unit({"content": c}, size({"content": c}))))
    root = {"model": body.get("model"), "toolConfig": body.get("toolConfig")}
    return _chain(root, parts)


@dataclass(frozen=True, slots=True)
class Bill:
    """What one request was billed, in the provider's own terms.

    `input_tokens`: full price (Anthropic's `input_tokens`; OpenAI's uncached prompt part).
    `write_5m` / `write_1h`: written to the cache (Anthropic only). `read`: read from it.
    """

    dialect: str
    input_tokens: int
    write_5m: int
    write_1h: int
    read: int

    @property
    def prompt_tokens(self) -> int:
        return self.input_tokens + self.write_5m + self.write_1h + self.read

    @property
    def read_share(self) -> float:
        return self.read / self.prompt_tokens if self.prompt_tokens else 0.0

    def anthropic_usage(self, output_tokens: int) -> dict[str, Json]:
        return {
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": self.write_5m + self.write_1h,
            "cache_read_input_tokens": self.read,
            "cache_creation": {
                "ephemeral_5m_input_tokens": self.write_5m,
                "ephemeral_1h_input_tokens": self.write_1h,
            },
            "output_tokens": output_tokens,
            "service_tier": "standard",
        }

    def responses_usage(self, output_tokens: int) -> dict[str, Json]:
        """A Responses `usage`: `cache_write_tokens` 0, as for every model without a write
        premium (the SDK requires the key)."""
        prompt = self.prompt_tokens
        return {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": self.read, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + output_tokens,
        }

    def gemini_usage(self, output_tokens: int) -> dict[str, Json]:
        """A `usageMetadata`: the cached part inside `promptTokenCount`, as the API reports it
        (its key omitted when nothing was read)."""
        prompt = self.prompt_tokens
        out: dict[str, Json] = {"promptTokenCount": prompt}
        if self.read:
            out["cachedContentTokenCount"] = self.read
        out["candidatesTokenCount"] = output_tokens
        out["totalTokenCount"] = prompt + output_tokens
        return out

    def openai_usage(self, completion_tokens: int) -> dict[str, Json]:
        prompt = self.prompt_tokens
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.read, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }


@dataclass(slots=True)
class _Entry:
    expires: float
    ttl: float


@dataclass
class PromptCache:
    """One provider's prompt cache. `scope` separates organisations (the fake uses the
    request's credential): a prefix cached under one scope is never read under another."""

    clock: Callable[[], float] = time.monotonic
    min_tokens: int = MIN_TOKENS
    _entries: dict[tuple[str, bytes], _Entry] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def bill(self, dialect: str, body: dict[str, Json], scope: str = "") -> Bill:
        """Bill one request and update the cache as the provider would when its answer begins.

        Raises `TooManyBreakpoints` (anthropic) before touching the cache.
        """
        if dialect == "anthropic":
            r = anthropic_units(body)
            marks = [k for k, u in enumerate(r.units) if u.breakpoint]
            if len(marks) > MAX_BREAKPOINTS:
                raise TooManyBreakpoints(
                    f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
                    f"Found {len(marks)}."
                )
            with self._lock:
                return self._anthropic(r, marks, scope)
        if dialect == "gemini":
            r = gemini_units(body)
        else:
            r = responses_units(body) if dialect == "responses" else openai_units(body)
        with self._lock:
            return self._openai(r, scope, dialect)

    def _alive(self, scope: str, key: bytes, now: float) -> _Entry | None:
        e = self._entries.get((scope, key))
        if e is None:
            return None
        if e.expires <= now:
            del self._entries[(scope, key)]
            return None
        return e

    def _anthropic(self, r: Rendered, marks: list[int], scope: str) -> Bill:
        now = self.clock()
        total = r.total
        if not marks:
            return Bill("anthropic", total, 0, 0, 0)
        # Read: the longest live prefix ending at a breakpoint or up to LOOKBACK units before.
        hit = -1
        for b in marks:
            for k in range(b, max(-1, b - LOOKBACK - 1), -1):
                if k > hit and self._alive(scope, r.keys[k], now) is not None:
                    hit = k
                    break
        read = r.upto(hit + 1)
        if hit >= 0:
            found = self._entries[(scope, r.keys[hit])]
            found.expires = now + found.ttl
        # Write: each later breakpoint's prefix (long enough), each segment at its own TTL.
        writes = {"5m": 0, "1h": 0}
        covered = hit + 1  # units already paid for (read) or written
        for b in marks:
            if b < covered:
                used = self._alive(scope, r.keys[b], now)
                if used is not None:
                    used.expires = now + used.ttl  # used by this request: refreshed
                continue
            end_tokens = r.upto(b + 1)
            if end_tokens < self.min_tokens:
                continue
            ttl = r.units[b].breakpoint or "5m"
            writes[ttl] += end_tokens - r.upto(covered)
            covered = b + 1
            self._entries[(scope, r.keys[b])] = _Entry(now + TTL[ttl], TTL[ttl])
        return Bill("anthropic", total - r.upto(covered), writes["5m"], writes["1h"], read)

    def _openai(self, r: Rendered, scope: str, dialect: str = "openai") -> Bill:
        now = self.clock()
        total = r.total
        hit = -1
        for k in range(len(r.units) - 1, -1, -1):
            if self._alive(scope, r.keys[k], now) is not None:
                hit = k
                break
        cached = r.upto(hit + 1)
        read = 0
        if cached >= self.min_tokens:
            read = self.min_tokens + (cached - self.min_tokens) // OPENAI_STEP * OPENAI_STEP
        if hit >= 0:
            e = self._entries[(scope, r.keys[hit])]
            e.expires = now + e.ttl
        running = 0
        for k, unit in enumerate(r.units):
            running += unit.tokens
            if running >= self.min_tokens:
                self._entries[(scope, r.keys[k])] = _Entry(now + TTL["5m"], TTL["5m"])
        return Bill(dialect, total - read, 0, 0, read)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


class Clock:
    """A hand-driven clock for tests: `advance(seconds)`; never sleeps."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
