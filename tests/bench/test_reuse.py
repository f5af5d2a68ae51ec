"""`bench.reuse`'s timing: a line's samples hold its own call, not the freeing of what another
line returned (a cold turn's index freed inside the warm line's timing had doubled it)."""

from __future__ import annotations

from bench.reuse import Line, run


class Clock:
    """A clock that moves only when told: one tick per reading, `cost` more when a result
    that is costly to free is freed."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


class Costly:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def __del__(self) -> None:
        self.clock.now += 1000.0


def test_a_line_s_timing_holds_no_other_line_s_result_being_freed() -> None:
    clock = Clock()
    heavy = Line("b", "cold", "returns a result costly to free", lambda: lambda: Costly(clock))
    light = Line("b", "warm", "returns nothing", lambda: lambda: None)
    run([heavy, light], reps=5, warmup=0, clock=clock)
    # Each sample is one tick of the clock's own reading, in ms: the freeing fell outside both.
    assert light.samples == [1000.0] * 5
    assert heavy.samples == [1000.0] * 5
    assert clock.now > 5 * 1000.0  # vacuity: the costly results were freed, and cost
