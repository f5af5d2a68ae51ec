"""`--plot OUT.png`: per session, two panels: the cumulative cost per turn above and the
retention of each turn's sent request below (1.0 where it went unchanged; a floor with the
stand-in summarizer), one line per preset.

matplotlib is an optional extra (`pip install 'context-guru[plot]'`), imported only here and
only when a plot is asked for, with the non-interactive Agg backend (no display needed).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

from cg.simulate.retained import FLOOR_LABEL, LABEL
from cg.simulate.run import Result

MAX_PANELS = 12


def missing() -> str | None:
    """Why no plot can be drawn (matplotlib absent), or None."""
    if importlib.util.find_spec("matplotlib") is None:
        return "--plot needs matplotlib (pip install 'context-guru[plot]'); no plot written"
    return None


def write(result: Result, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sessions = result.sessions[:MAX_PANELS]
    cols = min(3, len(sessions))
    rows = math.ceil(len(sessions) / cols)
    fig, axes = plt.subplots(
        2 * rows,
        cols,
        figsize=(5 * cols, 5.2 * rows),
        squeeze=False,
        gridspec_kw={"height_ratios": [3, 2] * rows},
    )
    floor = any(t.retained.floor is not False for t in result.totals.values())
    for n, s in enumerate(sessions):
        cost, kept = axes[2 * (n // cols)][n % cols], axes[2 * (n // cols) + 1][n % cols]
        for name in result.presets:
            t = s.tallies[name]
            cost.plot(range(1, len(t.curve) + 1), t.curve, label=name, linewidth=1.4)
            series = t.retained.series
            kept.step(range(1, len(series) + 1), series, where="mid", linewidth=1.1)
        window = f"{s.window // 1000}k" if s.window else "window ?"
        cost.set_title(f"{s.label} ({s.model}, {window})", fontsize=9)
        cost.set_ylabel("cumulative USD (estimate)", fontsize=8)
        kept.set_ylabel("retention floor" if floor else "retention", fontsize=8)
        kept.set_xlabel("turn", fontsize=8)
        kept.set_ylim(-0.02, 1.05)
        for ax in (cost, kept):
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
    for n in range(len(sessions), rows * cols):
        axes[2 * (n // cols)][n % cols].set_visible(False)
        axes[2 * (n // cols) + 1][n % cols].set_visible(False)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
    what = FLOOR_LABEL if floor else LABEL
    fig.suptitle(
        f"Cumulative cost and {what} per turn\nmodel estimates (context-guru simulate)",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.04, 1, 0.97))
    fig.savefig(out, dpi=80)
    plt.close(fig)
