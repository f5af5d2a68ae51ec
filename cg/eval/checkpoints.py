"""The checkpoints of a replayed session: each distinct replaced span, where it was first sent.

A checkpoint is the first turn on which a rewrite replaced a given set of the client's messages
(a summary spliced, or a mask's stubs): the client's request and the request as rewritten are
kept, with the positions replaced, the stash ids the new messages' markers name, and the probes
of the facts first found in the replaced messages (`cg.eval.probes`). A checkpoint that keeps
serving turn after turn is one checkpoint; a summary rolled forward is a new one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from cg.eval.probes import Probe, span_probes
from cg.expand.tool import markers
from cg.pipeline.rewrite import Rewrite
from cg.simulate.turns import SimTurn
from cg.wire.splice import Insert, Keep


@dataclass(slots=True)
class Checkpoint:
    label: str  # the session, as simulate names it
    turn: int  # the turn of the session it was first sent on
    dialect: str
    headers: Mapping[str, str]
    original: bytes  # the client's request
    rewritten: bytes  # the request the pipeline sent
    replaced: tuple[int, ...]  # the client's messages not sent as they came
    keys: tuple[str, ...]  # the stash ids named by the new messages' markers
    session: str  # the store's session id (the stashes' owner)
    model: str  # the model the request names
    probes: list[Probe] = field(default_factory=list)

    @property
    def span(self) -> list[int]:
        """The replaced positions as [first, last + 1]."""
        return [self.replaced[0], self.replaced[-1] + 1] if self.replaced else []


def collector(
    label: str,
    turns: list[SimTurn],
    out: list[Checkpoint],
    probes: int,
    seed: str,
) -> Callable[[int, Rewrite], None]:
    """A `ProxyRun.session` observer that appends each new checkpoint of `turns` to `out`."""
    seen: set[tuple[bytes, tuple[int, ...], tuple[str, ...]]] = set()

    def observe(i: int, rw: Rewrite) -> None:
        if rw.body is None or rw.shape is None or rw.index is None:
            return
        plan = rw.shape.plan
        kept = {p.index for p in plan if isinstance(p, Keep)}
        replaced = tuple(j for j in range(len(rw.index.messages)) if j not in kept)
        if not replaced:
            return  # only the expand tool went in
        keys = tuple(k for p in plan if isinstance(p, Insert) for k in markers(p.json))
        ident = (turns[i].conversation, replaced, keys)
        if ident in seen:
            return
        seen.add(ident)
        request = turns[i].request
        dialect = request.dialect
        messages = json.loads(request.body).get(dialect.array_key) or []
        cp = Checkpoint(
            label,
            i,
            dialect.name,
            request.headers,
            request.body,
            rw.body,
            replaced,
            keys,
            rw.record.get("session", ""),
            turns[i].model or "(no model)",
        )
        cp.probes = span_probes(dialect.name, messages, replaced, probes, f"{seed}:{label}:{i}")
        out.append(cp)

    return observe
