"""Counters for `/_cg/stats` and `cg.stats`: one object on the addon, no module globals."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


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

    def count(self, outcome: str) -> None:
        if outcome in ("rewritten", "passed_through", "failed_open", "bypassed"):
            setattr(self, outcome, getattr(self, outcome) + 1)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
