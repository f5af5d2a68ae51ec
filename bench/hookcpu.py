"""A tree's script with its hooks timed inside its own loaded mitmdump: `bench.trees --hook-cpu`.

Why: the CPU a hook costs in a quiet process (`bench.hooks`) is not what it costs in a proxy
serving 16 clients, where mitmproxy's own work runs between a flow's hooks and evicts theirs
from the caches: the loaded figure is about twice the quiet one, and a change can move the first
without the second (docs/benchmarks.md, "The small turn"). What the throughput target sees is
the second.

Loaded by mitmdump in place of `TREE/cg_addon.py` (named by `CG_HOOKCPU_SCRIPT`), it loads that
script, wraps its addons' `request`, `responseheaders` and `response` in `time.thread_time_ns`
(the proxy's main thread: CPU, not wall time), counts the garbage collector's passes and their
CPU by generation, and answers `GET /_hookcpu` with the running totals (that request is not
counted). The collector's CPU is counted wherever a pass ran, inside a hook or not, so it
overlaps the hooks' figures. The timing adds the same small cost a flow to every tree alike
(`bench/floor`, whose hooks do nothing, reads it): compare trees with each other.
"""

from __future__ import annotations

import functools
import gc
import importlib.util
import inspect
import json
import os
import time
from collections.abc import Callable
from typing import Any

from mitmproxy import http

HOOKS = ("request", "responseheaders", "response")
PATH = "/_hookcpu"
SCRIPT_ENV = "CG_HOOKCPU_SCRIPT"

TOTALS: dict[str, int] = {}
for _h in HOOKS:
    TOTALS[f"{_h}_ns"] = 0
    TOTALS[f"{_h}_calls"] = 0
for _g in range(3):
    TOTALS[f"gc{_g}_ns"] = 0
    TOTALS[f"gc{_g}_passes"] = 0
_gc_start = [0]


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _gc_start[0] = time.thread_time_ns()
        return
    g = info["generation"]
    TOTALS[f"gc{g}_ns"] += time.thread_time_ns() - _gc_start[0]
    TOTALS[f"gc{g}_passes"] += 1


def _timed(name: str, hook: Callable[..., Any], count: bool = True) -> Callable[..., Any]:
    """`hook` with its CPU added to TOTALS (but for our own report's flow). `count`: the flow
    is counted here (a hook several of a script's addons have counts once a flow, at the first
    of them, and its CPU is the sum over all of them)."""
    ns, calls = f"{name}_ns", f"{name}_calls"
    step = 1 if count else 0
    if inspect.iscoroutinefunction(hook):

        @functools.wraps(hook)
        async def timed_async(flow: http.HTTPFlow) -> None:
            if flow.request.path == PATH:
                return
            t = time.thread_time_ns()
            await hook(flow)
            TOTALS[ns] += time.thread_time_ns() - t
            TOTALS[calls] += step

        return timed_async

    @functools.wraps(hook)
    def timed(flow: http.HTTPFlow) -> Any:
        if flow.request.path == PATH:
            return None
        t = time.thread_time_ns()
        pending = hook(flow)  # a control answer read off the loop: mitmproxy awaits it
        TOTALS[ns] += time.thread_time_ns() - t
        TOTALS[calls] += step
        return pending

    return timed


class Report:
    """Answers `GET /_hookcpu` with TOTALS, before the tree's script sees the request."""

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.request.path == PATH:
            body = json.dumps(TOTALS).encode()
            flow.response = http.Response.make(200, body, {"content-type": "application/json"})


def timed_addons(script: str) -> list[Any]:
    """The addons of the script at `script`, each of its hooks timed. (Not `load`: mitmproxy
    would call a script's module-level `load` as its hook.)"""
    spec = importlib.util.spec_from_file_location("cg_hookcpu_tree", script)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"bench.hookcpu: cannot load {script}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    inner = list(module.addons)
    counted: set[str] = set()
    for addon in inner:
        for name in HOOKS:
            hook = getattr(addon, name, None)
            if hook is not None:
                setattr(addon, name, _timed(name, hook, name not in counted))
                counted.add(name)
    return inner


addons: list[Any] = []
if SCRIPT_ENV in os.environ:  # as mitmdump's script (imported by bench.trees: nothing to do)
    gc.callbacks.append(_on_gc)
    addons = [Report(), *timed_addons(os.environ[SCRIPT_ENV])]
