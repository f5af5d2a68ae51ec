"""Run components in order over one indexed body; a failing component is reverted alone.

A component reads the index and the plan so far and returns a new plan, or None to skip, with a
reason either way. An exception reverts that component only and is recorded; the runner never
raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cg.body import BodyIndex
from cg.splice import Plan, identity


@dataclass(slots=True)
class Step:
    """A component's answer: `plan` None means it skipped; `reason` says why, either way."""

    plan: Plan | None
    reason: str
    detail: dict[str, Any] = field(default_factory=dict)


class Component(Protocol):
    name: str

    def apply(self, index: BodyIndex, plan: Plan) -> Step: ...


@dataclass(slots=True)
class PipelineResult:
    plan: Plan
    records: list[dict[str, Any]]


def run_pipeline(components: Sequence[Component], index: BodyIndex) -> PipelineResult:
    plan = identity(len(index.messages))
    records: list[dict[str, Any]] = []
    for c in components:
        try:
            step = c.apply(index, plan)
        except Exception as e:  # noqa: BLE001 - a component's bug must not reach the request
            records.append(
                {"component": c.name, "acted": False, "error": f"{type(e).__name__}: {e}"}
            )
            continue
        records.append(
            {
                "component": c.name,
                "acted": step.plan is not None,
                "reason": step.reason,
                **step.detail,
            }
        )
        if step.plan is not None:
            plan = step.plan
    return PipelineResult(plan, records)
