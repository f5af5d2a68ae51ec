"""`bench.evict` times evictions of a store filled past its size bound that find nothing to do:
the guard refuses a timed eviction that found work (the figure would not be the steady state)."""

from __future__ import annotations

from bench.evict import measure


def test_bench_evict_times_no_op_evictions_of_a_store_its_bound_has_trimmed() -> None:
    out = measure(stashes=400, span_kb=8, max_mb=2, reps=3)
    assert 0 < out["stashes_left"] < 400  # vacuity: the bound evicted while it filled
    assert out["file_mb"] <= 2
    assert out["evict_ms_median"] > 0 and out["reps"] == 3
