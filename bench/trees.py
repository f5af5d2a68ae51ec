"""The addon of several source trees beside plain mitmdump, in one run: `python -m bench.trees
TREE [TREE ...] [--dialect openai] [--rounds 12] [--size 0] [--set KEY=VALUE ...] [--hook-cpu]`.

Why: `bench.proxy_latency` compares one tree's addon with plain mitmdump, and two of its runs
a minute apart differ by more (±0.1 in the throughput ratio on the 2-core machine of
docs/benchmarks.md) than most single changes are worth. Here every tree's mitmdump runs at
once beside one plain mitmdump and one upstream, and the rounds rotate through them, so each
round compares the trees under the same load of the machine; a change is judged by the
per-round difference of CPU per request (read from /proc/PID/stat: the proxy's own user +
system time over the round's requests), whose median over the rounds is printed with how
many rounds it won.

A TREE is a directory holding a checkout of the project (`git archive REV | tar -x -C DIR`):
its mitmdump loads `DIR/cg_addon.py` with `PYTHONPATH=DIR`, `cg_preset=summarize`, its own
SQLite file, and each `--set` (which replaces either); its `/_cg/health` must be the addon's.
The traffic is `bench.proxy_latency`'s `same` body (the 1 MB, 400-message reuse turn by
default; `--size` picks another corpus turn), sent by 16 clients in parallel, 20 requests each
per round (125 each for a body under 100 KB); the first request commissions the summary (the
1 MB turn does), which is awaited before any round, so every timed turn reuses it.
`--hook-cpu` loads each tree's script through `bench/hookcpu.py`, which times its hooks and the
garbage collector inside the loaded proxy: a second table gives each tree's CPU per request in
each hook and in the collector, and the collector's passes by generation.
Loopback only; every process started is stopped.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench import hookcpu
from bench import proxy_latency as pl

CLIENTS = 16
HOOKCPU = Path(hookcpu.__file__)


@dataclass
class Variant:
    name: str
    tree: Path | None  # None: plain mitmdump
    port: int = 0
    pid: int = 0
    rps: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)
    # `--hook-cpu`: each round's µs a request inside each hook and the collector, and the
    # collector's passes per 1,000 requests by generation (`bench.hookcpu`)
    hooks: list[dict[str, float]] = field(default_factory=list)


def start(
    v: Variant, up: int, tmp: Path, sets: list[str], procs: list[pl.Proc], hook_cpu: bool = False
) -> None:
    v.port = pl.free_port()
    argv = [
        pl.mitmdump(), "--mode", f"reverse:http://{pl.HOST}:{up}", "--listen-host", pl.HOST,
        "--listen-port", str(v.port), "--set", f"confdir={tmp / v.name}",
    ]  # fmt: skip
    env = dict(os.environ)
    if v.tree is not None:
        if hook_cpu:  # the tree's script, loaded and timed by bench/hookcpu.py
            argv += ["-s", str(HOOKCPU)]
            env[hookcpu.SCRIPT_ENV] = str(v.tree / "cg_addon.py")
        else:
            argv += ["-s", str(v.tree / "cg_addon.py")]
        for kv in addon_options(sets, tmp / f"{v.name}.sqlite3"):
            argv += ["--set", kv]
        env["PYTHONPATH"] = str(v.tree)
    log = tmp / f"{v.name}.log"
    with log.open("wb") as f:
        popen = subprocess.Popen(
            argv, cwd=v.tree or pl.ROOT, stdin=subprocess.DEVNULL, stdout=f,
            stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    v.pid = popen.pid
    procs.append(pl.Proc(v.name, popen, log))
    if v.tree is not None:
        pl.wait_for_addon(procs[-1], f"http://{pl.HOST}:{v.port}")


def addon_options(sets: list[str], db: Path) -> list[str]:
    """Each addon's `--set`s: `cg_preset=summarize` and its own `cg_db`, replaced by a `--set`
    of the same key, never repeated. mitmproxy refuses an option given twice, and a script
    whose deferred options fail to apply is dropped without a word: the run measured plain
    mitmdump as every tree."""
    options = {"cg_preset": "summarize", "cg_db": str(db)}
    for kv in sets:
        key, sep, value = kv.partition("=")
        if not sep:
            raise SystemExit(f"bench.trees: --set {kv!r} is not KEY=VALUE")
        options[key] = value
    return [f"{k}={v}" for k, v in options.items()]


def run(
    trees: list[Path],
    dialect: str,
    rounds: int,
    size: int,
    sets: list[str],
    hook_cpu: bool = False,
) -> str:
    names = [t.name or str(t) for t in trees]
    if len(set(names)) != len(names):
        raise SystemExit("bench.trees: give each tree a directory of its own name")
    variants = [Variant("plain", None)] + [Variant(n, t) for n, t in zip(names, trees, strict=True)]
    procs: list[pl.Proc] = []
    with tempfile.TemporaryDirectory(prefix="cg-bench-trees-") as d:
        tmp = Path(d)
        try:
            _, up = pl.start_upstream(tmp, procs)
            for v in variants:
                start(v, up, tmp, sets, procs, hook_cpu)
            traffic = pl.same_traffic(dialect, 1, size) if size else pl.same_traffic(dialect, 1)
            body, path = traffic.body(0), pl.PATHS[dialect]
            headers = {"content-type": "application/json", **pl.HEADERS[dialect]}
            per = 20 if len(body) >= 100_000 else 125
            for v in variants:
                base = f"http://{pl.HOST}:{v.port}"
                httpx.post(base + path, content=body, headers=headers, trust_env=False)
                if v.tree is not None:
                    with httpx.Client(base_url=base, trust_env=False) as c:
                        summaries = c.get("/_cg/stats").json().get("summaries", {})
                        if summaries.get("commissioned"):  # a body too small commissions none
                            pl.wait_for_summary(c)
                pl.throughput(base, path, body, headers, CLIENTS, 5)  # warm-up
            for r in range(rounds):
                k = r % len(variants)
                for v in variants[k:] + variants[:k]:
                    base = f"http://{pl.HOST}:{v.port}"
                    timed = hook_cpu and v.tree is not None
                    h0 = totals(base) if timed else {}
                    c0 = pl.cpu_seconds(v.pid)
                    rps = pl.throughput(base, path, body, headers, CLIENTS, per)
                    c1 = pl.cpu_seconds(v.pid)
                    v.rps.append(rps)
                    if c0 is not None and c1 is not None:
                        v.cpu_us.append((c1 - c0) / (CLIENTS * per) * 1e6)
                    if timed:
                        v.hooks.append(per_request(h0, totals(base), CLIENTS * per))
        finally:
            for p in procs:
                p.stop()
    return report(variants, dialect, rounds, len(body), per)


def totals(base: str) -> dict[str, int]:
    """`bench.hookcpu`'s running totals in the proxy at `base`."""
    answer = httpx.get(base + hookcpu.PATH, trust_env=False)
    answer.raise_for_status()
    out: dict[str, int] = answer.json()
    return out


def per_request(before: dict[str, int], after: dict[str, int], requests: int) -> dict[str, float]:
    """One round's µs a request in each hook and in the collector, and the collector's passes
    per 1,000 requests by generation. Refused unless every request went through every hook:
    a round whose flows were not the addon's measured nothing."""
    d = {k: after[k] - before[k] for k in after}
    for h in hookcpu.HOOKS:
        if d[f"{h}_calls"] != requests:
            raise RuntimeError(
                f"bench.trees: {d[f'{h}_calls']} {h} hooks timed for {requests} requests"
            )
    out = {h: d[f"{h}_ns"] / requests / 1000 for h in hookcpu.HOOKS}
    out["gc"] = sum(d[f"gc{g}_ns"] for g in range(3)) / requests / 1000
    for g in range(3):
        out[f"gc{g}_per_1000"] = d[f"gc{g}_passes"] * 1000 / requests
    return out


def report(variants: list[Variant], dialect: str, rounds: int, size: int, per: int) -> str:
    plain = variants[0]
    p_rps, p_cpu = statistics.median(plain.rps), statistics.median(plain.cpu_us or [0.0])
    lines = [
        f"{dialect}, {size:,}-byte body, {CLIENTS} clients x {per} requests per round, "
        f"{rounds} rounds (medians):",
        "",
        "| proxy | req/s | / plain | CPU per request | over plain | plain/addon CPU |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for v in variants:
        rps, cpu = statistics.median(v.rps), statistics.median(v.cpu_us or [0.0])
        lines.append(
            f"| {v.name} | {rps:.1f} | {rps / p_rps:.3f}x | {cpu:,.0f} us | "
            f"{cpu - p_cpu:+,.0f} us | {p_cpu / cpu if cpu else 0:.3f}x |"
        )
    lines.append("")
    timed = [v for v in variants if v.hooks]
    if timed:
        lines += [
            "Inside each tree's proxy, its main thread's CPU per request (`--hook-cpu`; medians):",
            "",
            "| proxy | request | responseheaders | response | hooks | collector "
            "| collections per 1,000 requests (gen 0 / 1 / 2) |",
            "|---|--:|--:|--:|--:|--:|--:|",
        ]
        for v in timed:
            m = {k: statistics.median(r[k] for r in v.hooks) for k in v.hooks[0]}
            hooks = sum(m[h] for h in hookcpu.HOOKS)
            lines.append(
                f"| {v.name} | {m['request']:.1f} us | {m['responseheaders']:.1f} us | "
                f"{m['response']:.1f} us | {hooks:.1f} us | {m['gc']:.1f} us | "
                f"{m['gc0_per_1000']:.0f} / {m['gc1_per_1000']:.0f} / {m['gc2_per_1000']:.1f} |"
            )
        lines.append("")
    trees = variants[1:]
    for i, a in enumerate(trees):
        for b in trees[i + 1 :]:
            diffs = [y - x for x, y in zip(a.cpu_us, b.cpu_us, strict=True)]
            if diffs:
                won = sum(d < 0 for d in diffs)
                lines.append(
                    f"- {b.name} against {a.name}: CPU per request {statistics.median(diffs):+,.0f}"
                    f" us (median of the per-round differences); {b.name} lower in {won} of "
                    f"{len(diffs)} rounds"
                )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="The addon of several trees beside plain mitmdump, rounds interleaved."
    )
    ap.add_argument("trees", nargs="+", type=Path, help="directories, each a project checkout")
    ap.add_argument("--dialect", choices=sorted(pl.PATHS), default="openai")
    ap.add_argument("--rounds", type=int, default=12, help="interleaved rounds (default 12)")
    ap.add_argument("--size", type=int, default=0, help="body size (default: the 1 MB turn)")
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE for every addon")
    ap.add_argument(
        "--hook-cpu",
        action="store_true",
        help="also time each tree's hooks and the collector inside its proxy (bench.hookcpu)",
    )
    args = ap.parse_args(argv)
    for t in args.trees:
        if not (t / "cg_addon.py").is_file():
            ap.error(f"{t} holds no cg_addon.py")
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    trees = [t.resolve() for t in args.trees]
    print(run(trees, args.dialect, args.rounds, args.size, args.set, args.hook_cpu))
    return 0


if __name__ == "__main__":
    sys.exit(main())
