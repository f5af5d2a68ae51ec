"""Retention and size as pure functions (`cg.state.policy`), held once for both engines: the
shares of `max_mb`, the fair quotas per tenant and per session, which stashes of a group go
and in what order, and the runs an SQLite eviction deletes in. Each engine's tests
(test_store.py, test_tenancy.py) hold that it reads what these ask for and deletes what they
name."""

from __future__ import annotations

from collections.abc import Iterator

from hypothesis import given, settings
from hypothesis import strategies as hs

from cg.state.policy import (
    LEDGER_TTL_DAYS,
    STASH_MAX,
    Candidate,
    chunks,
    excess,
    facts_cap,
    fair_level,
    ledger_cutoff,
    max_stash_bytes,
    quota_victims,
    quotas,
    stash_limits,
    take,
)

MB = 1024 * 1024
DAY = 86400.0


def test_the_shares_of_max_mb():
    assert stash_limits(32 * MB) == (16 * MB, int(16 * MB * 0.9))  # half, evicted down to 90%
    assert max_stash_bytes(32 * MB) == 4 * MB  # a quarter of the stashes' share
    assert max_stash_bytes(1024 * MB) == STASH_MAX  # and never more than the bound
    assert facts_cap(32 * MB) == 32 * MB // 400  # a quarter at ~100 bytes a row
    assert facts_cap(1) == 1000  # at least


def test_the_ledger_outlives_the_ttl_by_its_own_days():
    assert ledger_cutoff(1000 * DAY, 3 * 3600.0) == 1000 * DAY - LEDGER_TTL_DAYS * DAY
    assert ledger_cutoff(1000 * DAY, 40 * DAY) == 960 * DAY  # a longer TTL wins


def test_the_fair_level_leaves_small_holders_whole_and_shares_the_rest():
    assert fair_level([100, 100], 135) == 67  # two equal: half each
    assert fair_level([10, 500], 300) == 290  # the small one whole, the rest to the other
    assert fair_level([10, 20], 300) == 20  # everything fits: nobody is capped
    assert quotas({("t", "a"): 10, ("t", "b"): 500}, 300) == {("t", "b"): 290}
    assert quotas({("t", "a"): 10, ("t", "b"): 20}, 300) == {}


USAGE = hs.dictionaries(
    hs.tuples(hs.sampled_from(["t1", "t2", "t3", "*", ""]), hs.sampled_from("abcdefgh")),
    hs.integers(1, 10_000),
    min_size=1,
)


@settings(max_examples=300, deadline=None)
@given(USAGE, hs.integers(0, 40_000))
def test_quotas_bring_the_total_within_the_target_and_spare_every_fair_holder(
    usage: dict[tuple[str, str], int], target: int
):
    caps = quotas(usage, target)
    assert set(caps) <= set(usage) and all(caps[g] < usage[g] for g in caps)
    if sum(usage.values()) <= target:
        assert caps == {}
    else:
        assert sum(min(n, caps.get(g, n)) for g, n in usage.items()) <= target
    tenants: dict[str, dict[str, int]] = {}
    for (t, s), n in usage.items():
        tenants.setdefault(t, {})[s] = n
    for t, sessions in tenants.items():
        fair_tenant = target // len(tenants)
        if sum(sessions.values()) <= fair_tenant:
            assert not any((t, s) in caps for s in sessions)  # a tenant within its share
        for s, n in sessions.items():
            if n <= fair_tenant // len(sessions):
                assert (t, s) not in caps  # a session within its share of its tenant's


def test_a_group_loses_its_unnamed_stashes_first_and_no_more_than_its_excess():
    rows = [("k1", 10, True, 1.0), ("k2", 10, False, 2.0), ("k3", 10, False, 3.0)]
    assert excess(rows, 15) == [(False, 2.0, "k2", 10), (False, 3.0, "k3", 10)]
    assert excess(rows, 25) == [
        (False, 2.0, "k2", 10),
        (False, 3.0, "k3", 10),
        (True, 1.0, "k1", 10),
    ]
    assert excess(rows, 0) == []

    def rows_iter() -> Iterator[tuple[str, int, bool, float]]:
        yield ("a", 10, False, 1.0)
        yield ("b", 10, False, 2.0)  # the row that ends the walk
        raise AssertionError("read past the excess")  # a cursor is not read to its end

    assert excess(rows_iter(), 5) == [(False, 1.0, "a", 10)]


def test_candidates_go_unnamed_then_least_recently_used_until_within_target():
    cands: list[Candidate] = [
        (True, 1.0, "named", "s", "t", 10),
        (False, 5.0, "newer", "s", "t", 10),
        (False, 2.0, "older", "r", "t", 10),
    ]
    victims, left = take(cands, 30, 15)
    assert [v[0] for v in victims] == ["older", "newer"] and left == 10
    assert take(cands, 10, 15) == ([], 10)


def test_quota_victims_reads_only_the_groups_over_their_quota_and_closes_them():
    usage = {("t", "big"): 90, ("t", "small"): 10}
    asked: list[tuple[str, str]] = []
    closed: list[str] = []

    class Rows(list[tuple[str, int, bool, float]]):
        def close(self) -> None:
            closed.append("closed")

    def rows_of(session: str, tenant: str) -> Rows:
        asked.append((session, tenant))
        return Rows([(f"{session}{i}", 10, False, float(i)) for i in range(9)])

    victims, left = quota_victims(usage, 100, 50, rows_of)
    assert asked == [("big", "t")] and closed == ["closed"]  # `small` is within its share
    assert [v[0] for v in victims] == [f"big{i}" for i in range(5)] and left == 50


def test_an_eviction_deletes_in_runs_of_at_most_the_limit():
    victims = [("a", "s", "t", 40), ("b", "s", "t", 40), ("c", "s", "t", 40), ("d", "s", "t", 200)]
    assert chunks(victims, 100) == [
        [("a", "s", "t"), ("b", "s", "t")],
        [("c", "s", "t")],
        [("d", "s", "t")],  # one victim at least, whatever its size
    ]
    assert chunks([], 100) == []
