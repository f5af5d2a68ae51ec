"""`bench.proxy_latency.cpu_seconds`: the CPU a process has used, the figure the throughput
phase divides by its requests. It must move with work done and say None when it cannot tell.
And `bench.trees`' verdict on a change, which rests on that figure round by round."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from bench.hooks import flows, measure, real_headers
from bench.proxy_latency import (
    ANTHROPIC_REPLY,
    HEADERS,
    HOST,
    PATHS,
    ROOT,
    Proc,
    cpu_seconds,
    per_round_line,
    same_traffic,
    start_upstream,
    wait_for_addon,
)
from bench.trees import Variant, addon_options, per_request, report, start, totals


def test_cpu_seconds_counts_a_process_s_work_and_only_its_own() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", "import sys\nx = 0\nfor i in range(3_000_000): x += i\n"
         "print('done', flush=True)\nsys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    ) as child:  # fmt: skip
        try:
            assert child.stdout is not None and child.stdout.readline() == b"done\n"
            used = cpu_seconds(child.pid)
            assert used is not None and used > 0.05  # the loop's CPU, counted
            mine = cpu_seconds(os.getpid())
            assert mine is not None and mine >= 0.0
        finally:
            child.kill()
            child.wait()
    assert cpu_seconds(None) is None
    assert cpu_seconds(child.pid) is None  # reaped: no such process


def test_bench_trees_judges_a_change_by_its_per_round_cpu_difference() -> None:
    """`bench.trees` reports each tree against plain mitmdump (medians) and each pair of trees
    by the median of their per-round CPU differences, with the rounds each won: a tree lower
    in most rounds is reported so even when one round's noise would swing a median of medians."""
    plain = Variant("plain", None, rps=[300.0, 280.0, 320.0], cpu_us=[2000.0, 2100.0, 1900.0])
    a = Variant("a", Path("a"), rps=[200.0, 210.0, 190.0], cpu_us=[3000.0, 2600.0, 3400.0])
    b = Variant("b", Path("b"), rps=[240.0, 250.0, 230.0], cpu_us=[2800.0, 2900.0, 3100.0])
    out = report([plain, a, b], "openai", 3, 1_000_000, 20)
    assert "| a | 200.0 | 0.667x | 3,000 us | +1,000 us | 0.667x |" in out
    assert "| b | 240.0 | 0.800x | 2,900 us | +900 us | 0.690x |" in out
    assert "b against a: CPU per request -200 us" in out and "lower in 2 of 3 rounds" in out


def test_bench_trees_gives_each_option_once_a_set_replacing_the_default(tmp_path: Path) -> None:
    """mitmproxy drops a script silently when one of its options is given twice, so a tree run
    with `--set cg_preset=off` measured plain mitmdump as the addon: each key goes once, the
    last `--set` of it winning over the default."""
    db = tmp_path / "t.sqlite3"
    assert addon_options([], db) == ["cg_preset=summarize", f"cg_db={db}"]
    got = addon_options(["cg_preset=off", "cg_max_body_mb=4", "cg_preset=codex"], db)
    assert got == ["cg_preset=codex", f"cg_db={db}", "cg_max_body_mb=4"]
    keys = [kv.split("=", 1)[0] for kv in got]
    assert len(keys) == len(set(keys))
    with pytest.raises(SystemExit, match="not KEY=VALUE"):
        addon_options(["cg_preset"], db)


def test_a_health_answered_upstream_is_refused_as_no_addon(tmp_path: Path) -> None:
    """The fake upstream answers any GET with 200, so a proxy whose script did not load still
    passes a plain readiness check on `/_cg/health`; `wait_for_addon` requires the addon's own
    answer (its version and preset), and names the log to read."""
    procs: list[Proc] = []
    try:
        upstream, port = start_upstream(tmp_path, procs)
        with pytest.raises(RuntimeError, match="the addon did not load"):
            wait_for_addon(upstream, f"http://{HOST}:{port}")
    finally:
        for p in procs:
            p.stop()


def test_bench_hooks_times_each_hook_of_a_booked_small_flow() -> None:
    """`bench.hooks` times the three hooks of small pass-through flows that were booked (its
    guard refuses a run whose flows never reached the ledger), reading memory between them when
    asked."""
    out = asyncio.run(measure("off", 40, 2, 16))
    assert out["outcome"] == "passed_through" and out["body_bytes"] == 515
    assert set(out["us"]) == {"request", "responseheaders", "response"}
    assert all(v > 0 for v in out["us"].values())
    assert out["total_us"] == pytest.approx(sum(out["us"].values()), abs=0.2)


def test_bench_hooks_real_headers_are_claude_code_s_and_an_answer_s() -> None:
    """`--real-headers`: each flow carries Claude Code's captured request headers (its session
    id among them; the host and length its own) and an Anthropic answer's, and is booked."""
    request, answer = real_headers()
    assert len(request) >= 19 and len(answer) >= 18
    assert "x-claude-code-session-id" in request and "host" not in request
    f = flows(1, same_traffic("anthropic", 1, 3000).body(0), (request, answer))[0]
    assert len(f.request.headers) >= len(request) and len(f.response.headers) >= len(answer)
    assert f.request.headers["x-claude-code-session-id"] == request["x-claude-code-session-id"]
    out = asyncio.run(measure("off", 40, 2, 0, real=True))
    assert out["outcome"] == "passed_through" and out["headers"] == "claude-code"


def test_bench_hooks_lean_times_bench_lean_on_the_same_flows_and_checks_it_booked() -> None:
    """`bench.hooks --lean` times `bench/lean`'s hooks on the same flows, and refuses a run in
    which its sums did not count every warm-up answer (as when its route missed the bench's
    `?beta=true` path)."""
    out = asyncio.run(measure("off", 40, 2, 0, lean=True))
    assert out["script"] == "bench/lean" and out["outcome"] == "metered"
    assert out["us"]["request"] > 0 and out["us"]["response"] > 0


def _script_tree(name: str, tmp_path: Path, procs: list[Proc]) -> str:
    """`bench/NAME` started beside a fake upstream as `bench.trees` starts a tree (its options,
    its health answer checked): its base URL."""
    _, up = start_upstream(tmp_path, procs)
    v = Variant(name, ROOT / "bench" / name)
    start(v, up, tmp_path, ["cg_preset=off"], procs)
    return f"http://{HOST}:{v.port}"


def _post_small_turn(base: str) -> httpx.Response:
    """The bench's small Anthropic turn, as its clients send it."""
    return httpx.post(
        base + PATHS["anthropic"],
        content=same_traffic("anthropic", 1, 3000).body(0),
        headers={"content-type": "application/json", **HEADERS["anthropic"]},
        trust_env=False,
    )


def test_the_floor_script_is_taken_for_a_tree_and_passes_requests_through(
    tmp_path: Path,
) -> None:
    """`bench/floor` (the three hooks doing nothing) starts as `bench.trees` starts a tree, with
    its options, answers the health check as the addon would, and forwards a provider request."""
    procs: list[Proc] = []
    try:
        r = _post_small_turn(_script_tree("floor", tmp_path, procs))
        assert r.status_code == 200 and r.json()["type"] == "message"  # the upstream's answer
    finally:
        for p in procs:
            p.stop()


def test_the_lean_script_meters_every_flow_it_is_measured_on(tmp_path: Path) -> None:
    """`bench/lean` (the least a metering script does) is only a budget if it meters: started
    as `bench.trees` starts a tree, it forwards the provider's answer unchanged and has booked
    each answer's usage under the request's session by the time the client has it."""
    procs: list[Proc] = []
    try:
        base = _script_tree("lean", tmp_path, procs)
        for _ in range(3):
            assert _post_small_turn(base).content == ANTHROPIC_REPLY  # as the upstream sent it
        sums = httpx.get(base + "/_cg/health", trust_env=False).json()["sums"]
        usage = json.loads(ANTHROPIC_REPLY)["usage"]
        assert list(sums.values()) == [
            [3 * usage["input_tokens"], 0, 0, 3 * usage["output_tokens"], 3]
        ]
    finally:
        for p in procs:
            p.stop()


def test_the_spin_script_burns_its_budget_in_each_hook_and_passes_requests_through(
    tmp_path: Path,
) -> None:
    """`bench/spin` is the addon's hook CPU without its footprint: only a control if each hook
    really spends its budget inside the proxy (timed by `bench.hookcpu`, as `bench.trees
    --hook-cpu` times it) and the answer comes back as the upstream sent it."""
    procs: list[Proc] = []
    try:
        _, up = start_upstream(tmp_path, procs)
        v = Variant("spin", ROOT / "bench" / "spin")
        start(v, up, tmp_path, ["cg_preset=off"], procs, hook_cpu=True)
        base = f"http://{HOST}:{v.port}"
        before = totals(base)
        for _ in range(3):
            assert _post_small_turn(base).content == ANTHROPIC_REPLY
        got = per_request(before, totals(base), 3)
        assert got["request"] >= 60 and got["responseheaders"] >= 5 and got["response"] >= 40
    finally:
        for p in procs:
            p.stop()


def test_the_spin_budget_is_three_figures_in_microseconds() -> None:
    spec = importlib.util.spec_from_file_location("spin", ROOT / "bench" / "spin" / "cg_addon.py")
    assert spec is not None and spec.loader is not None
    spin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(spin)
    assert spin.budget(None) == (60_000, 5_000, 40_000)
    assert spin.budget("1,2,3") == (1_000, 2_000, 3_000)
    for bad in ("1,2", "1,-2,3", "a,b,c"):
        with pytest.raises(ValueError):
            spin.budget(bad)


def test_the_throughput_phase_reports_the_rounds_own_ratios() -> None:
    """Each round's addon/plain ratio is summarised (median and range), not only the ratio of
    the two targets' medians; one round says nothing of spread, so it gets no line."""
    line = per_round_line([0.95, 0.85, 0.9, 0.88, 0.97])
    assert "median **0.90×**" in line and "0.85–0.97×" in line and "5 rounds" in line
    assert per_round_line([0.9]) == ""


def test_hook_cpu_times_every_hook_of_every_flow_inside_the_proxy(tmp_path: Path) -> None:
    """`bench.trees --hook-cpu`: the tree's script, loaded through `bench/hookcpu.py`, still
    answers as itself (its health, the upstream's answer unchanged), and each of its three
    hooks is timed once per flow, the report's own request left out; a round whose hooks did not
    all run for every request is refused rather than divided."""
    procs: list[Proc] = []
    try:
        _, up = start_upstream(tmp_path, procs)
        v = Variant("addon", ROOT)
        start(v, up, tmp_path, ["cg_preset=off"], procs, hook_cpu=True)
        base = f"http://{HOST}:{v.port}"
        before = totals(base)
        for _ in range(3):
            assert _post_small_turn(base).content == ANTHROPIC_REPLY
        after = totals(base)
        got = per_request(before, after, 3)
        assert {k: after[f"{k}_calls"] - before[f"{k}_calls"] for k in got if "gc" not in k} == {
            "request": 3,
            "responseheaders": 3,
            "response": 3,
        }
        assert got["request"] > 0 and got["response"] > 0 and got["gc"] >= 0
        stats = httpx.get(base + "/_cg/stats", trust_env=False).json()
        assert stats["requests"] == 3  # the addon's own count: it ran, as itself
        with pytest.raises(RuntimeError, match="3 request hooks timed for 4 requests"):
            per_request(before, after, 4)
    finally:
        for p in procs:
            p.stop()


def test_the_hook_cpu_table_gives_each_timed_tree_its_medians() -> None:
    plain = Variant("plain", None, rps=[300.0], cpu_us=[1000.0])
    row = {
        "request": 60.0, "responseheaders": 6.0, "response": 40.0, "gc": 30.0,
        "gc0_per_1000": 119.0, "gc1_per_1000": 11.0, "gc2_per_1000": 1.0,
    }  # fmt: skip
    a = Variant("a", Path("a"), rps=[250.0], cpu_us=[1200.0], hooks=[row])
    out = report([plain, a], "anthropic", 1, 515, 125)
    assert "| a | 60.0 us | 6.0 us | 40.0 us | 106.0 us | 30.0 us | 119 / 11 / 1.0 |" in out
    assert "--hook-cpu" in out
    assert "responseheaders" not in report(
        [plain, Variant("b", Path("b"), rps=[1.0])], "x", 1, 1, 1
    )
