"""Run components in order over one indexed body; a failing component is reverted alone.

A component reads the request and the plan so far and returns a `Step`: a new plan, or None to
skip, with a reason either way. The runner enforces the contract:

- an exception reverts that component only, and is recorded;
- a step that drops whole messages while declaring `stash_required` must have stashed every one
  of them (`stashed`), or it is reverted — lossy-but-reversible must stay reversible.

A step may also carry a `commission` (work to run off the hot path); the caller runs it.
The runner never raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cg.pipeline.contract import Component, RequestContext
from cg.wire.splice import Insert, Plan, identity


@dataclass(slots=True)
class PipelineResult:
    plan: Plan
    records: list[dict[str, Any]]
    commissions: list[tuple[Component, Any]] = field(default_factory=list)


def dropped(plan: Plan, n: int) -> set[int]:
    """Input messages that appear in the plan neither whole nor cut."""
    present = {p.index for p in plan if not isinstance(p, Insert)}
    return set(range(n)) - present


def run_pipeline(components: Sequence[Component], req: RequestContext) -> PipelineResult:
    n = len(req.index.messages)
    plan = identity(n)
    out = PipelineResult(plan, [])
    for c in components:
        try:
            step = c.apply(req, plan)
        except Exception as e:  # noqa: BLE001 - a component's bug must not reach the request
            out.records.append(
                {"component": c.name, "acted": False, "error": f"{type(e).__name__}: {e}"}
            )
            continue
        record = {"component": c.name, "acted": step.plan is not None, "reason": step.reason}
        record.update(step.detail)
        if step.commission is not None:
            out.commissions.append((c, step.commission))
        if step.plan is not None and step.stash_required:
            lost = dropped(step.plan, n) - step.stashed
            if lost:
                record["acted"] = False
                record["reverted"] = f"dropped {len(lost)} messages without stashing them"
                out.records.append(record)
                continue
        out.records.append(record)
        if step.plan is not None:
            plan = step.plan
    out.plan = plan
    return out
