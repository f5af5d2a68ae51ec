"""The prompt-cache billing model (docs/behaviour.md#usage-cost-and-savings): how a provider splits
a request's input into what it reads from its prompt cache, what it writes to it, and what it bills
at the full price.

A request is seen as a `Prompt`: a row of units — the prelude (model, tools, system, tool choice,
thinking: everything the cache keys on before the messages), then each message — each carrying
the key of the prefix that ends with it (a hash chain, blind to where `cache_control` sits), the
prefix's tokens, and whether a `cache_control` breakpoint ends there. A `PromptCache` is one
session's cache at the provider:

- it holds the prefixes earlier requests wrote, each until its TTL (5 minutes, or 1 hour when the
  request asked `ttl: "1h"`) runs out from its last use;
- a request reads its longest live cached prefix (billed at the cache-read price, 0.1× input on
  Anthropic) and refreshes it;
- Anthropic (`auto=False`): the request writes the rest of its input up to its last breakpoint
  (1.25× input, 2× for 1 h) and bills what follows at the full input price; a prefix under
  `min_tokens` is never cached;
- OpenAI (`auto=True`): every prefix of `min_tokens` (1,024) tokens or more is cached
  automatically, so the part of such a request not read from the cache is written to it; the
  price table says what a write costs (GPT-6 and later: 1.25x input; a model with no write
  premium is priced with `cache_write` equal to `input`, so the bill is the same either way).

Simplifications, on purpose: units are whole messages (a provider caches at block or token
granularity), Anthropic's 20-block lookback window is not modelled (a hit may be anywhere in the
prefix), and one `min_tokens` applies to every model. The simulator and the savings estimate use
this one model, so their figures are comparable with each other; both are labelled estimates.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

from cg.state.facts import FactsCache, MessageFacts, Prelude
from cg.wire.body import BodyIndex
from cg.wire.usage import Usage

TTL_5M = 300.0
TTL_1H = 3600.0
MIN_TOKENS = 1024


def chain(prev: bytes, digest: bytes) -> bytes:
    """The key of the prefix that ends with a unit of `digest`, after the prefix `prev`."""
    return hashlib.blake2b(prev + digest, digest_size=16).digest()


@dataclass(frozen=True, slots=True)
class Prompt:
    """A request as the prompt cache sees it: `keys[i]` and `cum[i]` are the key and the tokens
    of the prefix ending with unit i; `breakpoints` the units a `cache_control` ends; `ttl` what
    this request's writes live for; `auto` OpenAI's automatic caching."""

    keys: tuple[bytes, ...]
    cum: tuple[int, ...]
    breakpoints: tuple[int, ...] = ()
    ttl: float = TTL_5M
    auto: bool = False

    @property
    def tokens(self) -> int:
        return self.cum[-1] if self.cum else 0

    def extended(self, digest: bytes, tokens: int, breakpoint: bool = False) -> Prompt:
        """This prompt with one more unit appended (a summarizer's instruction, say)."""
        prev = self.keys[-1] if self.keys else b""
        n = len(self.keys)
        return Prompt(
            (*self.keys, chain(prev, digest)),
            (*self.cum, self.tokens + tokens),
            (*self.breakpoints, n) if breakpoint else self.breakpoints,
            self.ttl,
            self.auto,
        )


def build(prelude: Prelude, messages: Sequence[MessageFacts], auto: bool) -> Prompt:
    keys: list[bytes] = []
    cum: list[int] = []
    bps: list[int] = []
    key = chain(b"", prelude.digest)
    total = prelude.tokens
    keys.append(key)
    cum.append(total)
    if prelude.breakpoint:
        bps.append(0)
    long = prelude.long_ttl
    for n, m in enumerate(messages, 1):
        key = chain(key, m.digest)
        total += m.tokens
        keys.append(key)
        cum.append(total)
        if m.breakpoint:
            bps.append(n)
        long = long or m.long_ttl
    return Prompt(tuple(keys), tuple(cum), tuple(bps), TTL_1H if long else TTL_5M, auto)


def prompt_of(index: BodyIndex, facts: FactsCache) -> Prompt:
    """The prompt-cache shape of an indexed request (facts memoised, so cheap on a warm turn).

    The hash chain is memoised on the index too (`memo.chain`, one unit per message): a
    warm index inherits its shared prefix's units, so a turn hashes only its new messages
    rather than re-chaining ~400 every time."""
    prelude = facts.prelude(index)
    messages = facts.all(index)
    owner, known = index.memo.chain
    units: list[tuple[bytes, int, bool, bool]] = (
        known if owner is prelude and known is not None else []
    )
    if len(units) > len(messages):
        units = units[: len(messages)]
    # A turn that repeats every message of the body its memo came from, byte for byte, has
    # that body's prompt (a message's breakpoint is in its bytes, not in its digest): the same
    # tuples again, not three lists as long as the messages rebuilt.
    was, prompt = index.memo.prompt
    if (
        units is known
        and len(units) == len(messages)
        and was is prelude
        and isinstance(prompt, Prompt)
        and len(prompt.keys) == len(units) + 1
    ):
        return prompt
    if len(units) < len(messages):
        units = list(units)
        key, total = units[-1][:2] if units else (chain(b"", prelude.digest), prelude.tokens)
        for m in messages[len(units) :]:
            key = chain(key, m.digest)
            total += m.tokens
            units.append((key, total, m.breakpoint, m.long_ttl))
    index.memo.chain = (prelude, units)
    prompt = _prompt(prelude, units, index.dialect.auto_cache)
    index.memo.prompt = (prelude, prompt)
    return prompt


def _prompt(prelude: Prelude, units: list[tuple[bytes, int, bool, bool]], auto: bool) -> Prompt:
    keys = [chain(b"", prelude.digest)]
    keys += [u[0] for u in units]
    cum = [prelude.tokens]
    cum += [u[1] for u in units]
    bps = [0] if prelude.breakpoint else []
    bps += [n for n, u in enumerate(units, 1) if u[2]]
    long = prelude.long_ttl or any(u[3] for u in units)
    return Prompt(tuple(keys), tuple(cum), tuple(bps), TTL_1H if long else TTL_5M, auto)


def standalone(digest: bytes, tokens: int, auto: bool = False) -> Prompt:
    """A one-unit request with no breakpoint: a standalone summarizer prompt."""
    return Prompt((chain(b"", digest),), (tokens,), (), TTL_5M, auto)


class PromptCache:
    """One session's prompt cache at the provider: prefix key -> (expires at, TTL)."""

    def __init__(self, min_tokens: int = MIN_TOKENS) -> None:
        self.min_tokens = min_tokens
        self.entries: dict[bytes, tuple[float, float]] = {}
        # No entry expires before this (a lower bound, lowered by every write): `bill` drops
        # expired entries only once one may have, not by walking them all every request (an
        # OpenAI session holds one per message; a read checks its entry's expiry itself).
        # Entries written from outside (`_load`) are found by the first walk: it starts at 0.
        self.next_expiry = 0.0

    def cached_prefix(self, prompt: Prompt, now: float) -> int:
        """The index of the longest live cached prefix of `prompt`, or -1."""
        for i in range(len(prompt.keys) - 1, -1, -1):
            e = self.entries.get(prompt.keys[i])
            if e is not None and e[0] > now:
                return i
        return -1

    def bill(self, prompt: Prompt, now: float) -> Usage:
        """What `prompt` sent at `now` is billed (output aside), and the cache after it."""
        self._expire(now)
        hit = self.cached_prefix(prompt, now)
        read = prompt.cum[hit] if hit >= 0 else 0
        if hit >= 0:
            _, ttl = self.entries[prompt.keys[hit]]
            self.entries[prompt.keys[hit]] = (now + ttl, ttl)
        if prompt.auto:
            if read < self.min_tokens:
                read = 0
            # Every prefix of min_tokens or more, written or refreshed: one C-speed update
            # with one shared value, not a Python loop over every key.
            first = bisect.bisect_left(prompt.cum, self.min_tokens)
            if first < len(prompt.keys):
                entry = (now + prompt.ttl, prompt.ttl)
                self.entries.update(dict.fromkeys(prompt.keys[first:], entry))
                self.next_expiry = min(self.next_expiry, entry[0])
            rest = prompt.tokens - read
            if prompt.tokens < self.min_tokens:
                return Usage(input_tokens=rest, requests=1)
            return Usage(cache_write_tokens=rest, cache_read_tokens=read, requests=1)
        write = 0
        for b in prompt.breakpoints:
            if prompt.cum[b] < self.min_tokens:
                continue
            if b > hit:
                write = max(write, prompt.cum[b] - read)
            self.entries[prompt.keys[b]] = (now + prompt.ttl, prompt.ttl)
            self.next_expiry = min(self.next_expiry, now + prompt.ttl)
        return Usage(
            input_tokens=prompt.tokens - read - write,
            cache_write_tokens=write,
            cache_write_1h_tokens=write if prompt.ttl >= TTL_1H else 0,
            cache_read_tokens=read,
            requests=1,
        )

    def _expire(self, now: float) -> None:
        if now < self.next_expiry:
            return  # nothing can have expired yet
        dead = [k for k, (exp, _) in self.entries.items() if exp <= now]
        for k in dead:
            del self.entries[k]
        self.next_expiry = min((exp for exp, _ in self.entries.values()), default=math.inf)
