"""The prompt-cache billing model: hand-computed cases for both providers, and the shape of a
real Claude Code request."""

from __future__ import annotations

import json
from collections.abc import ItemsView
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

import cg.billing.cache as cache_mod
from cg.billing.cache import (
    TTL_1H,
    TTL_5M,
    Prompt,
    PromptCache,
    build,
    chain,
    prompt_of,
    standalone,
)
from cg.state.facts import FactsCache
from cg.state.tokens import TokenCounter
from cg.wire.body import MessageCache, index_body
from cg.wire.dialects import ANTHROPIC, DIALECTS
from cg.wire.usage import Usage
from tests.support.strategies import SETTINGS, NextTurn, next_turns

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def prompt(sizes: list[int], bps: tuple[int, ...] = (), *, tag: bytes = b"", auto: bool = False,
           ttl: float = TTL_5M) -> Prompt:  # fmt: skip
    """Units of the given token sizes; unit i's content is `tag + i + size`, so two prompts
    share a prefix exactly as far as their tags and sizes agree."""
    keys, cum, key, total = [], [], b"", 0
    for i, n in enumerate(sizes):
        key = chain(key, tag + f"{i}:{n}".encode())
        total += n
        keys.append(key)
        cum.append(total)
    return Prompt(tuple(keys), tuple(cum), bps, ttl, auto)


def test_anthropic_first_request_writes_up_to_its_last_breakpoint_and_sends_the_rest() -> None:
    cache = PromptCache()
    u = cache.bill(prompt([2000, 500, 500, 300], bps=(0, 2)), now=0)
    assert u == Usage(input_tokens=300, cache_write_tokens=3000, cache_read_tokens=0, requests=1)


def test_anthropic_next_turn_reads_the_previous_prefix_and_writes_only_what_is_new() -> None:
    cache = PromptCache()
    cache.bill(prompt([2000, 500, 500], bps=(2,)), now=0)
    u = cache.bill(prompt([2000, 500, 500, 700, 300], bps=(4,)), now=60)
    assert u == Usage(cache_write_tokens=1000, cache_read_tokens=3000, requests=1)


def test_anthropic_cache_expires_five_minutes_after_its_last_use() -> None:
    cache = PromptCache()
    cache.bill(prompt([2000, 500], bps=(1,)), now=0)
    assert cache.bill(prompt([2000, 500, 100], bps=(2,)), now=299).cache_read_tokens == 2500
    # The read at 299 refreshed the 2500-token entry and wrote the 2600 one: both live to 599.
    assert cache.bill(prompt([2000, 500, 100, 50], bps=(3,)), now=598).cache_read_tokens == 2600
    cold = cache.bill(prompt([2000, 500, 100, 50, 10], bps=(4,)), now=598 + 301)
    assert cold == Usage(cache_write_tokens=2660, requests=1)


def test_a_one_hour_breakpoint_outlives_five_minutes_and_is_priced_apart() -> None:
    cache = PromptCache()
    u = cache.bill(prompt([3000], bps=(0,), ttl=TTL_1H), now=0)
    assert (u.cache_write_tokens, u.cache_write_1h_tokens) == (3000, 3000)
    assert cache.bill(prompt([3000, 10], bps=(0,), ttl=TTL_1H), now=3000).cache_read_tokens == 3000


def test_a_prefix_under_the_minimum_is_never_cached() -> None:
    cache = PromptCache()
    assert cache.bill(prompt([500, 300], bps=(1,)), now=0) == Usage(input_tokens=800, requests=1)
    assert cache.bill(prompt([500, 300], bps=(1,)), now=1) == Usage(input_tokens=800, requests=1)


def test_a_changed_prelude_misses_everything() -> None:
    cache = PromptCache()
    cache.bill(prompt([2000, 500], bps=(1,)), now=0)
    u = cache.bill(prompt([2000, 500], bps=(1,), tag=b"other tools "), now=1)
    assert u.cache_read_tokens == 0 and u.cache_write_tokens == 2500


def test_a_request_with_no_breakpoint_reads_but_writes_nothing() -> None:
    cache = PromptCache()
    cache.bill(prompt([2000, 500], bps=(1,)), now=0)
    shared = prompt([2000, 500], bps=(1,)).extended(b"instruction", 400)
    assert cache.bill(shared, now=5) == Usage(input_tokens=400, cache_read_tokens=2500, requests=1)


def test_openai_caches_every_prefix_from_1024_tokens_automatically() -> None:
    cache = PromptCache()
    first = cache.bill(prompt([800, 600, 400], auto=True), now=0)
    assert first == Usage(cache_write_tokens=1800, requests=1)  # priced as the model says
    second = cache.bill(prompt([800, 600, 999], auto=True), now=10)  # shares 1400 tokens
    assert second == Usage(cache_write_tokens=999, cache_read_tokens=1400, requests=1)
    short = PromptCache()
    assert short.bill(prompt([800, 100], auto=True), now=0) == Usage(input_tokens=900, requests=1)
    assert short.bill(prompt([800, 100, 5], auto=True), now=1).cache_read_tokens == 0


def test_a_standalone_prompt_is_billed_at_the_full_input_price() -> None:
    cache = PromptCache()
    assert cache.bill(standalone(b"p", 5000), now=0) == Usage(input_tokens=5000, requests=1)


def test_a_claude_code_request_has_one_unit_per_message_and_its_breakpoints() -> None:
    body = json.loads((FIXTURES / "claude_code_2.1.197_turn16.json").read_text())
    raw = json.dumps(body, ensure_ascii=False).encode()
    index = index_body(raw, ANTHROPIC)
    p = prompt_of(index, FactsCache(TokenCounter()))
    assert len(p.keys) == 1 + len(body["messages"])
    last = len(body["messages"])  # Claude Code marks the last message (and its system prompt)
    assert 0 in p.breakpoints and p.breakpoints[-1] == last
    assert p.ttl == TTL_5M and not p.auto
    assert list(p.cum) == sorted(p.cum) and p.cum[0] > 1024
    # The same request with its breakpoint moved keys the same prefixes.
    moved = json.loads(raw)
    for m in moved["messages"]:
        if isinstance(m["content"], list):
            for b in m["content"]:
                b.pop("cache_control", None)
    p2 = prompt_of(index_body(json.dumps(moved).encode(), ANTHROPIC), FactsCache(TokenCounter()))
    assert p2.keys == p.keys and p2.breakpoints == (0,)


@SETTINGS
@given(next_turns())
def test_the_chain_memoised_on_a_warm_index_equals_one_built_from_scratch(turn: NextTurn) -> None:
    """`prompt_of` hashes only the messages a warm index did not inherit: whatever the next turn
    keeps, appends or changes, its prompt equals the one `build` makes from every message."""
    dialect = DIALECTS[turn.sample.dialect]
    facts = FactsCache(TokenCounter())
    cache = MessageCache()
    first = index_body(turn.first, dialect, cache)
    p1 = prompt_of(first, facts)
    assert p1 == build(facts.prelude(first), facts.all(first), dialect.name != "anthropic")
    second = index_body(turn.second, dialect, cache)
    p2 = prompt_of(second, facts)
    fresh = index_body(second.raw, dialect)
    assert p2 == build(facts.prelude(fresh), facts.all(fresh), dialect.name != "anthropic")
    # Vacuity guard: the second index inherited the first one's chain where they share messages.
    if second.shared:
        warm, cold = second.memo.chain[1], first.memo.chain[1]
        assert warm is not None and cold is not None
        assert warm[: second.shared] == cold[: second.shared]
    # The whole body again: the memoised prompt itself, not one rebuilt.
    if turn.how == "same" and turn.sample.messages:
        assert second.shared == len(turn.sample.messages) and p2 is p1


def test_a_claude_code_next_turn_hashes_only_its_new_messages() -> None:
    body = json.loads((FIXTURES / "claude_code_2.1.197_turn16.json").read_text())
    facts, cache = FactsCache(TokenCounter()), MessageCache()
    earlier = dict(body, messages=body["messages"][:-2])
    first = index_body(json.dumps(earlier).encode(), ANTHROPIC, cache)
    prompt_of(first, facts)
    second = index_body(json.dumps(body).encode(), ANTHROPIC, cache)
    assert second.shared == len(body["messages"]) - 2
    chained = second.memo.chain[1]
    assert chained is not None
    inherited = list(chained)
    assert len(inherited) == second.shared
    hashed: list[bytes] = []
    real = cache_mod.chain
    try:

        def counted(prev: bytes, digest: bytes) -> bytes:
            hashed.append(digest)
            return real(prev, digest)

        cache_mod.chain = counted
        p = prompt_of(second, facts)
    finally:
        cache_mod.chain = real
    assert len(hashed) == 1 + 2  # the prelude's key, then the two messages not inherited
    fresh = index_body(second.raw, ANTHROPIC)
    assert p == build(facts.prelude(fresh), facts.all(fresh), auto=False)


class _Eager(PromptCache):
    """The cache as it was: every expired entry dropped at every request."""

    def _expire(self, now: float) -> None:
        for k in [k for k, (exp, _) in self.entries.items() if exp <= now]:
            del self.entries[k]


def _live(cache: PromptCache, now: float) -> dict[bytes, tuple[float, float]]:
    return {k: e for k, e in cache.entries.items() if e[0] > now}


@SETTINGS
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),  # which of four related prompts
            st.integers(1, 6),  # its length in units
            st.booleans(),  # OpenAI's automatic caching
            st.sampled_from([TTL_5M, TTL_1H]),
            st.sampled_from([0.0, 1.0, 120.0, 299.0, 301.0, 3599.0, 4000.0]),  # time passing
        ),
        max_size=25,
    )
)
def test_expiry_walked_only_when_due_bills_as_walking_every_request(
    steps: list[tuple[int, int, bool, float, float]],
) -> None:
    """`PromptCache` drops expired entries only once one may have expired (`next_expiry`);
    over any run of requests it bills, and holds live, exactly what a cache walking all its
    entries every request does (prompts sharing prefixes, both providers' rules, both TTLs)."""
    lazy, eager = PromptCache(), _Eager()
    now = 0.0
    for shape, n, auto, ttl, dt in steps:
        now += dt
        sizes = [700, 400, 300, 900, 200, 500][:n]
        p = prompt(sizes, bps=(n - 1,) if shape % 2 else (0, n - 1), tag=b"%d" % (shape // 2),
                   auto=auto, ttl=ttl)  # fmt: skip
        assert lazy.bill(p, now) == eager.bill(p, now)
        assert _live(lazy, now) == _live(eager, now)
        assert all(e[0] >= lazy.next_expiry for e in lazy.entries.values())


class _Counted(dict[bytes, tuple[float, float]]):
    """Entries that count the walks over them."""

    walks = 0

    def items(self) -> ItemsView[bytes, tuple[float, float]]:  # type: ignore[override]
        self.walks += 1
        return super().items()


def test_expiry_is_not_walked_before_an_entry_can_have_expired() -> None:
    """Vacuity guard for the property above: a session's next turns within the TTL do not walk
    its ~400 entries, and one after the TTL does, dropping what expired."""
    cache = PromptCache()
    cache.entries = entries = _Counted()
    cache.bill(prompt([2000] * 400, auto=True), now=0)
    assert len(entries) == 400 and cache.next_expiry == TTL_5M and entries.walks == 1
    for t in (10.0, 20.0, 30.0):
        cache.bill(prompt([2000] * 401, auto=True), now=t)
    assert entries.walks == 1 and len(entries) == 401
    other = prompt([2000] * 3, tag=b"other", auto=True)
    cache.bill(other, now=30 + TTL_5M + 1)
    assert entries.walks == 2 and entries.keys() == set(other.keys)
