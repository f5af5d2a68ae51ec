"""Added latency against body size, through real mitmdumps: `python -m bench.sizes`.

For each size (10 KB to 5 MB) one `bench.proxy_latency` run of the same body every time
(fresh processes each), and the addon's added latency per request: the median of the per-round
differences against plain mitmdump, and the addon's own hook time inside the proxy. Printed as
a markdown table; with matplotlib installed (the `plot` extra) also drawn, on log-log axes with
a line of slope 1 through the 1 MB point, so linear growth reads as parallel to it and better
than linear as flatter (`--png PATH`, default docs/bench-latency-vs-size.png).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from bench.proxy_latency import ROOT, run

SIZES = (10_000, 30_000, 100_000, 300_000, 1_048_576, 2_000_000, 5_000_000)


def sweep(
    dialect: str, preset: str, n: int, warmup: int, sizes: tuple[int, ...]
) -> list[dict[str, Any]]:
    out = []
    for size in sizes:
        res = run(dialect, "same", n, warmup, False, [], preset, 1, size)
        _, plain, addon = res["targets"]
        out.append(
            {
                "size": res["body_bytes"]["median"],
                "messages": res["messages"]["max"],
                "reuse": res["reuse"],
                "plain_ms": plain["median_ms"],
                "addon_ms": addon["median_ms"],
                "added_ms": res["overhead_paired_median_ms"],
                "hook_ms": res["in_proxy"].get("hook_ms"),
            }
        )
        print(f"  {size:>9,} bytes: +{out[-1]['added_ms']:.2f} ms", file=sys.stderr)
    return out


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| body bytes | messages | checkpoint reused | plain mitmdump ms | addon ms | "
        "added ms (median of per-round differences) | addon hook ms |",
        "|--:|--:|---|--:|--:|--:|--:|",
    ]
    for r in rows:
        hook = f"{r['hook_ms']:.2f}" if r["hook_ms"] is not None else "—"
        lines.append(
            f"| {r['size']:,} | {r['messages']} | {'yes' if r['reuse'] else 'no'} | "
            f"{r['plain_ms']:.2f} | {r['addon_ms']:.2f} | {r['added_ms']:.2f} | {hook} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> bool:
    """Draw the sweep; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    xs = [r["size"] / 1e6 for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.loglog(xs, [max(r["added_ms"], 0.01) for r in rows], "o-", label="added latency")
    hooks = [(x, r["hook_ms"]) for x, r in zip(xs, rows, strict=True) if r["hook_ms"]]
    if hooks:
        ax.loglog(*zip(*hooks, strict=True), "s--", label="addon hook (inside the proxy)")
    ref = min(rows, key=lambda r: abs(r["size"] - 1_048_576))
    k = max(ref["added_ms"], 0.01) / (ref["size"] / 1e6)
    ax.loglog(xs, [k * x for x in xs], ":", color="grey", label="linear (slope 1)")
    ax.set_xlabel("request body (MB)")
    ax.set_ylabel("ms per request")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sizes", description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=20, help="timed POSTs per target and size (20)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--dialect", choices=("anthropic", "openai"), default="anthropic")
    ap.add_argument("--preset", default="off", help="the addon's cg_preset (off)")
    ap.add_argument("--png", type=Path, default=ROOT / "docs" / "bench-latency-vs-size.png")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="comma-separated bytes")
    args = ap.parse_args(argv)
    sizes = tuple(int(x) for x in args.sizes.split(","))
    rows = sweep(args.dialect, args.preset, args.n, args.warmup, sizes)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{args.dialect}, cg_preset={args.preset}, {args.n} POSTs per size; load {load}\n")
    print(table(rows))
    title = f"context-guru added latency, {args.dialect}, cg_preset={args.preset}"
    if plot(rows, args.png, title):
        print(f"\nplot: {args.png}")
    else:
        print("\nno plot: matplotlib is not installed (pip install -e '.[plot]')")
    return 0


if __name__ == "__main__":
    sys.exit(main())
