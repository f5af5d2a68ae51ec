"""`bench.proxy_latency.cpu_seconds`: the CPU a process has used, the figure the throughput
phase divides by its requests. It must move with work done and say None when it cannot tell."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.proxy_latency import cpu_seconds


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
