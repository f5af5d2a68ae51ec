"""Counters for `/_cg/stats` and `cg.stats`: one object on the addon, no module globals."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from cg.retention.facts import KINDS
from cg.retention.measure import Retention


@dataclass(slots=True)
class SummaryCounts:
    commissioned: int = 0
    completed: int = 0
    failed: int = 0
    timed_out: int = 0
    reused: int = 0
    # Jobs not run here: another instance sharing the store claimed the conversation, or had
    # already written a newer checkpoint (its summary is reused instead).
    deferred: int = 0
    # Which request wrote each job's summary (docs/behaviour.md#summarize-the-summarizer-call): the
    # shared-cache call, the standalone prompt after a shared answer with no <summary>, or the
    # standalone prompt alone.
    shared: int = 0
    fallback: int = 0
    standalone: int = 0


@dataclass(slots=True)
class UsageCounts:
    """How reading the providers' `usage` went, answer by answer
    (docs/behaviour.md#usage-cost-and-savings): `read` answers booked in the ledger; `missing` 2xx
    answers that reported none (an OpenAI stream without
    `stream_options.include_usage`); `malformed` usage of the wrong shape, skipped; `truncated`
    streams that ended mid-event (what they reported before is booked); `undecodable` streams
    in a content-encoding the tap cannot undo; `tap_errors` taps disabled by an internal error;
    `store_errors` ledger writes that failed. None of these ever touches the answer."""

    read: int = 0
    missing: int = 0
    malformed: int = 0
    truncated: int = 0
    undecodable: int = 0
    tap_errors: int = 0
    store_errors: int = 0
    summarizer_read: int = 0


@dataclass(slots=True)
class RetentionCounts:
    """The retention of the rewritten turns measured (docs/behaviour.md#retention), summed as
    they are recorded. Written on the event loop only (`cg.proxy.retained` records there, the
    worker thread only measures), and read there by `/_cg/stats`: no lock is needed."""

    turns: int = 0
    failed: int = 0  # measurements that raised (the turn's record says why)
    _sum: float = 0.0
    _min: float | None = None
    _visible: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    _facts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))

    def add(self, r: Retention) -> None:
        ratio = r.ratio
        self.turns += 1
        self._sum += ratio
        self._min = ratio if self._min is None else min(self._min, ratio)
        for k in KINDS:
            self._visible[k] += r.visible[k]
            self._facts[k] += r.total[k]

    def to_json(self) -> dict[str, Any]:
        """`{turns, mean, min, by_kind: {user, file, command, error}, failed}`: mean and min of
        the turns' ratios; a kind's visible facts over its facts, summed over the turns (null
        when no turn had a fact of that kind); mean and min null before the first turn."""
        return {
            "turns": self.turns,
            "mean": round(self._sum / self.turns, 4) if self.turns else None,
            "min": round(self._min, 4) if self._min is not None else None,
            "by_kind": {
                k: round(self._visible[k] / self._facts[k], 4) if self._facts[k] else None
                for k in KINDS
            },
            "failed": self.failed,
        }


@dataclass(slots=True)
class Stats:
    requests: int = 0
    rewritten: int = 0
    passed_through: int = 0
    failed_open: int = 0
    bypassed: int = 0
    retried_original: int = 0
    expansions: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    summaries: SummaryCounts = field(default_factory=SummaryCounts)
    usage_reads: UsageCounts = field(default_factory=UsageCounts)
    retention: RetentionCounts = field(default_factory=RetentionCounts)

    def count(self, outcome: str) -> None:
        if outcome in ("rewritten", "passed_through", "failed_open", "bypassed"):
            setattr(self, outcome, getattr(self, outcome) + 1)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["retention"] = self.retention.to_json()
        return out
