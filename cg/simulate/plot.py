"""`--plot OUT.png`: cumulative cost per turn, one panel per session, one line per preset.

matplotlib is an optional extra (`pip install 'context-guru[plot]'`), imported only here and
only when a plot is asked for, with the non-interactive Agg backend (no display needed).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

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
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.4 * rows), squeeze=False)
    for ax, s in zip(axes.flat, sessions, strict=False):
        for name in result.presets:
            curve = s.tallies[name].curve
            ax.plot(range(1, len(curve) + 1), curve, label=name, linewidth=1.4)
        window = f"{s.window // 1000}k" if s.window else "window ?"
        ax.set_title(f"{s.label} ({s.model}, {window})", fontsize=9)
        ax.set_xlabel("turn", fontsize=8)
        ax.set_ylabel("cumulative USD (estimate)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(sessions) :]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
    fig.suptitle("Cumulative cost per turn: a model estimate (context-guru simulate)", fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 0.97))
    fig.savefig(out, dpi=80)
    plt.close(fig)
