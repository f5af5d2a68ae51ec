"""The high-volume fuzz run: every target of tests/fuzz/targets.py with hypothesis at volume, and
with atheris (coverage-guided, byte-level) where it is installed.

    python -m tests.fuzz.run                          # 20,000 hypothesis inputs per target
    python -m tests.fuzz.run --examples 2000 --targets body,tap
    python -m tests.fuzz.run --atheris 60             # and 60 s of atheris per target
    python -m tests.fuzz.run --json out.json          # the figures docs/reliability.md quotes

Each target's inputs are counted as they run. A failing input is shrunk by hypothesis and
written to tests/fuzz/corpus/<target>/<hash>.bin (`--save`), where tests/fuzz/test_fuzz.py
replays it on every `make test`: what the fuzzer found stays found.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings

from tests.fuzz.targets import SEEN, TARGETS, Target, close_hooks

CORPUS = Path(__file__).with_name("corpus")


def save(target: str, data: bytes) -> Path:
    path = CORPUS / target / (hashlib.sha256(data).hexdigest()[:16] + ".bin")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


SEEDS = 64  # the first inputs of each hypothesis run seed atheris


def hypothesis_run(t: Target, examples: int, keep: bool, seeds: list[bytes]) -> dict[str, Any]:
    ran = 0
    last: list[bytes] = []

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate, Phase.shrink],
    )
    @given(t.inputs())
    def one(data: bytes) -> None:
        nonlocal ran
        ran += 1
        last[:] = [data]
        if len(seeds) < SEEDS:
            seeds.append(data)
        t.run(data)

    t0 = time.monotonic()
    failure = None
    try:
        one()
    except Exception as e:  # noqa: BLE001 - the finding, reported
        failure = {
            "error": f"{type(e).__name__}: {e}"[:500],
            "input": last[0].hex() if last else None,
            "trace": traceback.format_exc(limit=6)[-2000:],
        }
        if keep and last:
            failure["saved"] = str(save(t.name, last[0]))
    return {"inputs": ran, "seconds": round(time.monotonic() - t0, 1), "failure": failure}


def atheris_run(name: str, seconds: int, seeds: list[bytes]) -> dict[str, Any]:
    """atheris in a subprocess (it owns the process: libFuzzer's main loop), seeded with
    valid inputs; its working corpus lives in a temporary directory."""
    try:
        import atheris  # noqa: F401
    except ImportError:
        return {"skipped": "atheris is not installed (pip install atheris)"}
    crashes = CORPUS / name / "atheris"
    crashes.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"cg-atheris-{name}-"))
    for data in seeds:
        (work / hashlib.sha256(data).hexdigest()[:16]).write_bytes(data)
    cmd = [
        sys.executable,
        "-m",
        "tests.fuzz.atheris_fuzz",
        name,
        f"-max_total_time={seconds}",
        f"-artifact_prefix={crashes}/",
        "-print_final_stats=1",
        "-rss_limit_mb=4096",
        str(work),
    ]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120, check=False)
    runs = 0
    for line in proc.stderr.splitlines():
        if line.startswith("stat::number_of_executed_units:"):
            runs = int(line.split(":")[-1])
    found = sorted(str(p) for p in crashes.iterdir() if p.name.startswith(("crash-", "leak-")))
    if not found:
        crashes.rmdir()
    shutil.rmtree(work, ignore_errors=True)
    return {
        "inputs": runs,
        "seconds": round(time.monotonic() - t0, 1),
        "exit": proc.returncode,
        "crashes": found,
        "tail": proc.stderr.splitlines()[-15:] if proc.returncode else [],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--examples", type=int, default=20_000, help="hypothesis inputs per target")
    ap.add_argument("--targets", default=",".join(TARGETS), help="comma-separated target names")
    ap.add_argument("--atheris", type=int, default=0, help="seconds of atheris per target")
    ap.add_argument("--save", action="store_true", help="write failing inputs to the corpus")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)
    names = [n for n in args.targets.split(",") if n]
    report: dict[str, Any] = {"examples_per_target": args.examples, "targets": {}}
    os.environ.setdefault("CONTEXT_GURU_SUMMARIZE_TIMEOUT", "2")
    failed = False
    for name in names:
        t = TARGETS[name]
        seeds: list[bytes] = []
        row: dict[str, Any] = {"hypothesis": hypothesis_run(t, args.examples, args.save, seeds)}
        if args.atheris:
            row["atheris"] = atheris_run(name, args.atheris, seeds)
        row["seen"] = {k: v for k, v in sorted(SEEN.items()) if k.startswith(name + ":")}
        report["targets"][name] = row
        failed |= row["hypothesis"]["failure"] is not None
        failed |= bool(row.get("atheris", {}).get("crashes"))
        print(json.dumps({name: row}), flush=True)
    close_hooks()
    report["total_inputs"] = sum(
        r["hypothesis"]["inputs"] + r.get("atheris", {}).get("inputs", 0)
        for r in report["targets"].values()
    )
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(f"total inputs: {report['total_inputs']}; failures: {'yes' if failed else 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
