"""A script whose hooks burn the addon's CPU and touch nothing else: hook cost without footprint.

`python -m bench.trees bench/floor bench/spin . --size 3000 --dialect anthropic --set
cg_preset=off --hook-cpu` runs it beside the floor, the addon and plain mitmdump. Why: the addon
costs more over the floor than its hooks' own CPU inside the loaded proxy, and that alone cannot
say whether the rest is the hooks' CPU counted again (the proxy
serving fewer requests at a time) or what the hooks do to mitmproxy's own work afterwards (the
objects and code they bring into the caches, the garbage they leave). This script answers it:
each hook spins on `time.thread_time_ns` for as long as the addon's takes (`DEFAULT_US`, from
docs/benchmarks.md; `BENCH_SPIN_US="REQUEST,RESPONSEHEADERS,RESPONSE"` to change), allocating nothing
and reading no flow. The addon's cost over this script, with the same hook CPU (the
`--hook-cpu` table says whether it is), is what its footprint costs the rest of the proxy.

It is `bench/floor` (the options `bench.trees` sets, the health answer that makes the harness
take it for a tree) with the spins added; every request passes through untouched.
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path
from typing import Any

from mitmproxy import http

FLOOR = Path(__file__).resolve().parent.parent / "floor" / "cg_addon.py"
DEFAULT_US = (60, 5, 40)  # the addon's hooks inside the loaded proxy (docs/benchmarks.md)


def budget(spec: str | None) -> tuple[int, int, int]:
    """Each hook's spin in ns, from `BENCH_SPIN_US` ("60,5,40") or the default."""
    if not spec:
        return DEFAULT_US[0] * 1000, DEFAULT_US[1] * 1000, DEFAULT_US[2] * 1000
    parts = [int(p) for p in spec.split(",")]
    if len(parts) != 3 or min(parts) < 0:
        raise ValueError(f"BENCH_SPIN_US: three µs figures, not {spec!r}")
    return parts[0] * 1000, parts[1] * 1000, parts[2] * 1000


def spin(ns: int) -> None:
    """Burn `ns` of this thread's CPU: one loop on two ints, nothing allocated that stays."""
    end = time.thread_time_ns() + ns
    while time.thread_time_ns() < end:
        pass


def _floor() -> Any:
    """`bench/floor`'s script class, loaded by path: each bench tree runs with only its own
    directory on `PYTHONPATH`."""
    spec = importlib.util.spec_from_file_location("bench_floor_script", FLOOR)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"bench/spin: cannot load {FLOOR}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Floor


class Spin(_floor()):  # type: ignore[misc]  # the floor's options and health answer
    version = "spin"

    def __init__(self) -> None:
        self.request_ns, self.responseheaders_ns, self.response_ns = budget(
            os.environ.get("BENCH_SPIN_US")
        )

    def request(self, flow: http.HTTPFlow) -> None:
        super().request(flow)
        if flow.response is None:  # not the health check
            spin(self.request_ns)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        spin(self.responseheaders_ns)

    async def response(self, flow: http.HTTPFlow) -> None:
        spin(self.response_ns)


addons = [Spin()]
