"""One answer's token counts, in the provider-neutral names of
docs/behaviour.md#usage-cost-and-savings.

    input_tokens            input billed at the full price (Anthropic `input_tokens`; OpenAI
                            `prompt_tokens` / `input_tokens` minus the cached part)
    cache_write_tokens      input written to the prompt cache (Anthropic
                            `cache_creation_input_tokens`; OpenAI `*_tokens_details.
                            cache_write_tokens`, reported and billed from GPT-5.6 on, else 0)
    cache_write_1h_tokens   the part of cache_write_tokens written for one hour (Anthropic
                            `cache_creation.ephemeral_1h_input_tokens`), priced apart
    cache_read_tokens       input read from the cache (Anthropic `cache_read_input_tokens`;
                            OpenAI `prompt_tokens_details.cached_tokens` /
                            `input_tokens_details.cached_tokens`)
    output_tokens           `output_tokens` / `completion_tokens`
    requests                answers that reported usage

`from_provider` reads a `usage` object of any of the three wire formats; anything that is not one
raises `UsageError`, which a caller counts and skips: a malformed usage never breaks an answer.
"""

from __future__ import annotations

from typing import Any

from cg.frozen import frozen


class UsageError(ValueError):
    """A `usage` object of the wrong shape; the message says what was wrong."""


@frozen
class Usage:
    input_tokens: int = 0
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0
    cache_read_tokens: int = 0
    output_tokens: int = 0
    requests: int = 0

    def __add__(self, other: Usage) -> Usage:
        # Spelled out, not a loop over `fields()`: it runs several times per answer booked.
        return Usage(
            self.input_tokens + other.input_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
            self.cache_write_1h_tokens + other.cache_write_1h_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.output_tokens + other.output_tokens,
            self.requests + other.requests,
        )

    def scaled(self, k: float) -> Usage:
        """Every token count times k (rounded); `requests` unchanged."""
        return Usage(
            round(self.input_tokens * k),
            round(self.cache_write_tokens * k),
            round(self.cache_write_1h_tokens * k),
            round(self.cache_read_tokens * k),
            round(self.output_tokens * k),
            self.requests,
        )

    @property
    def prompt_tokens(self) -> int:
        """Every input token, however billed: the size of the context the provider saw."""
        return self.input_tokens + self.cache_write_tokens + self.cache_read_tokens

    def to_json(self) -> dict[str, int]:
        """The five keys of docs/behaviour.md#usage-cost-and-savings (the 1-hour share of the writes
        is a pricing detail)."""
        return {
            "input_tokens": self.input_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "output_tokens": self.output_tokens,
            "requests": self.requests,
        }


def _count(obj: dict[str, Any], key: str, where: str) -> int:
    v = obj.get(key)
    if type(v) is int and v >= 0:  # (a JSON count; a bool's type is bool)
        return v
    if v is None:
        return 0
    raise UsageError(f"{where}.{key} is {v!r}, not a count")


def _obj(v: Any, where: str) -> dict[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise UsageError(f"{where} is a {type(v).__name__}, not an object")
    return v


def from_anthropic(u: Any) -> Usage:
    u = _obj(u, "usage")
    if not u:
        raise UsageError("usage is empty")
    write = _count(u, "cache_creation_input_tokens", "usage")
    split = _obj(u.get("cache_creation"), "usage.cache_creation")
    write_1h = _count(split, "ephemeral_1h_input_tokens", "usage.cache_creation")
    return Usage(
        input_tokens=_count(u, "input_tokens", "usage"),
        cache_write_tokens=write,
        cache_write_1h_tokens=min(write_1h, write) if write else write_1h,
        cache_read_tokens=_count(u, "cache_read_input_tokens", "usage"),
        output_tokens=_count(u, "output_tokens", "usage"),
        requests=1,
    )


def from_openai(u: Any) -> Usage:
    """Chat Completions (`prompt_tokens`) or Responses (`input_tokens`) usage."""
    u = _obj(u, "usage")
    if "prompt_tokens" in u or "completion_tokens" in u:
        prompt = _count(u, "prompt_tokens", "usage")
        details = _obj(u.get("prompt_tokens_details"), "usage.prompt_tokens_details")
        output = _count(u, "completion_tokens", "usage")
    elif "input_tokens" in u or "output_tokens" in u:
        prompt = _count(u, "input_tokens", "usage")
        details = _obj(u.get("input_tokens_details"), "usage.input_tokens_details")
        output = _count(u, "output_tokens", "usage")
    else:
        raise UsageError("usage has neither prompt_tokens nor input_tokens")
    cached = _count(details, "cached_tokens", "usage.*_tokens_details")
    # GPT-5.6 and later bill cache writes at 1.25x input and report them apart; they are part
    # of the prompt, like the cached tokens.
    written = _count(details, "cache_write_tokens", "usage.*_tokens_details")
    if cached + written > prompt:
        raise UsageError(
            f"usage: {cached} cached + {written} written tokens of a {prompt}-token prompt"
        )
    return Usage(
        input_tokens=prompt - cached - written,
        cache_write_tokens=written,
        cache_read_tokens=cached,
        output_tokens=output,
        requests=1,
    )


def from_provider(dialect: str, u: Any) -> Usage:
    """The usage object of an answer in `dialect` (`Dialect.usage`; OpenAI's form for a name
    no dialect has)."""
    from cg.wire.dialects import DIALECTS  # the dialects read usage with this module's readers

    d = DIALECTS.get(dialect)
    return d.usage(u) if d is not None else from_openai(u)
