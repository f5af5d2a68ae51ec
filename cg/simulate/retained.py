"""What one preset's sent requests kept of the client's facts, over a session or the corpus
(docs/savings.md#retention).

Each rewritten turn is measured with `cg.retention.measure` (visible facts / facts of the
client's request, per kind and in all); a turn sent as the client wrote it keeps everything by
construction, so it is counted apart (`unchanged`) and never enters the mean or the minimum,
which would otherwise be diluted by the turns before the first summary.

With the stand-in summarizer (`cg.simulate.standin`, which writes no fact) the figures are a
**floor**: what the kept messages and the component's own part of the summary message (its
framing, the floor of user messages and artifacts) show, whatever a real summary would add.
`floor` says which it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cg.pipeline.rewrite import Rewrite
from cg.retention.facts import KINDS, Kind
from cg.retention.measure import Retention, of_plan

FLOOR_LABEL = "retention floor (stand-in summarizer writes no facts)"
LABEL = "retention"


def of_rewrite(rw: Rewrite) -> Retention:
    """What the rewritten request `rw` kept of the client's facts: its plan over the client's
    index, which `rewrite_body` gives with every new body."""
    if rw.index is None or rw.shape is None:
        raise ValueError("a rewritten body without the plan it was made of")
    return of_plan(rw.index, rw.shape.plan)


def _zeros() -> dict[Kind, int]:
    return dict.fromkeys(KINDS, 0)


@dataclass(slots=True)
class Retained:
    measured: int = 0  # rewritten turns measured
    unchanged: int = 0  # turns sent unchanged: 1.0 by construction, not in mean or min
    ratio_sum: float = 0.0
    low: float | None = None
    # Facts summed over the measured turns, per kind (a fact re-counted on every turn it is in).
    visible: dict[Kind, int] = field(default_factory=_zeros)
    total: dict[Kind, int] = field(default_factory=_zeros)
    # Per kind, over the measured turns that have facts of the kind: the sum and the minimum.
    kind_sum: dict[Kind, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))
    kind_turns: dict[Kind, int] = field(default_factory=_zeros)
    kind_low: dict[Kind, float] = field(default_factory=dict)
    series: list[float] = field(default_factory=list)  # per turn of a session (1.0 unchanged)
    worst: tuple[int, Retention] | None = None  # (turn, its retention): the session's lowest
    floor: bool | None = None  # None until a preset says (the stand-in's summaries, or not)

    def turn(self, r: Retention | None) -> None:
        """One turn: `r` of what was sent, or None when it was sent unchanged."""
        if r is None:
            self.unchanged += 1
            self.series.append(1.0)
            return
        ratio = r.ratio
        self.series.append(ratio)
        if self.worst is None or ratio < self.worst[1].ratio:
            self.worst = (len(self.series) - 1, r)
        self.measured += 1
        self.ratio_sum += ratio
        self.low = ratio if self.low is None else min(self.low, ratio)
        for k in KINDS:
            self.visible[k] += r.visible[k]
            self.total[k] += r.total[k]
            kr = r.kind_ratio(k)
            if kr is not None:
                self.kind_sum[k] += kr
                self.kind_turns[k] += 1
                self.kind_low[k] = min(self.kind_low.get(k, 1.0), kr)

    def add(self, other: Retained) -> None:
        """Sum `other` in (the series and the worst turn are per session: not summed)."""
        self.measured += other.measured
        self.unchanged += other.unchanged
        self.ratio_sum += other.ratio_sum
        if other.low is not None:
            self.low = other.low if self.low is None else min(self.low, other.low)
        for k in KINDS:
            self.visible[k] += other.visible[k]
            self.total[k] += other.total[k]
            self.kind_sum[k] += other.kind_sum[k]
            self.kind_turns[k] += other.kind_turns[k]
            if k in other.kind_low:
                self.kind_low[k] = min(self.kind_low.get(k, 1.0), other.kind_low[k])
        if other.floor is not None:
            self.floor = other.floor if self.floor is None else (self.floor or other.floor)

    @property
    def mean(self) -> float | None:
        return self.ratio_sum / self.measured if self.measured else None

    def kind_mean(self, k: Kind) -> float | None:
        n = self.kind_turns[k]
        return self.kind_sum[k] / n if n else None

    @property
    def label(self) -> str:
        return LABEL if self.floor is False else FLOOR_LABEL

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "floor": self.floor is not False,
            "measured_turns": self.measured,
            "unchanged_turns": self.unchanged,
            "mean": _r(self.mean),
            "min": _r(self.low),
            "by_kind": {
                k: {
                    "visible": self.visible[k],
                    "facts": self.total[k],
                    "ratio": _r(self.visible[k] / self.total[k]) if self.total[k] else None,
                    "mean": _r(self.kind_mean(k)),
                    "min": _r(self.kind_low.get(k)),
                }
                for k in KINDS
            },
        }

    def session_json(self) -> dict[str, Any]:
        """`to_json` and, for one session, the per-turn series and the worst turn."""
        out = self.to_json()
        out["series"] = [round(x, 4) for x in self.series]
        if self.worst is not None:
            out["worst"] = {"turn": self.worst[0], **self.worst[1].to_json()}
        return out


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)
