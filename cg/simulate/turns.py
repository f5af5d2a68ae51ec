"""What the simulator knows about each recorded turn, computed once and shared by every preset.

Each request's per-message facts (digest, tokens, `cache_control`) come from one `FactsCache`, so
a message is tokenised once however many turns re-send it and however many presets replay it.
The agent's output on a turn is not in a request trace; it is read off the next request of the
same conversation: the tokens of the assistant message(s) that request adds after this one's
messages. Where there is no such request (the last turn, or a history that diverged), the
session's median is used.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from cg.billing.cache import Prompt, build
from cg.simulate.trace import Request
from cg.state.facts import FactsCache, MessageFacts, Prelude
from cg.summarize.triggers import WindowTable, resolve_window
from cg.wire.body import BodyIndex


@dataclass(slots=True)
class SimTurn:
    """One recorded request as the prompt cache and the agent see it."""

    request: Request
    model: str | None
    window: int | None
    prelude: Prelude
    messages: tuple[MessageFacts, ...]
    roles: tuple[str, ...]
    prompt: Prompt
    output: int = 0
    output_known: bool = field(default=False)

    @property
    def t(self) -> float:
        return self.request.t

    @property
    def tokens(self) -> int:
        return self.prompt.tokens

    @property
    def conversation(self) -> bytes:
        """The first message's digest: one session id may carry several conversations."""
        return self.messages[0].digest if self.messages else b""

    def extends(self, earlier: SimTurn) -> bool:
        """This request re-sends every message of `earlier`, in order (cache_control aside)."""
        n = len(earlier.messages)
        return len(self.messages) >= n and all(
            a.digest == b.digest for a, b in zip(self.messages, earlier.messages, strict=False)
        )


class Preparer:
    """Turns requests into `SimTurn`s with one shared `FactsCache` and window table."""

    def __init__(
        self, facts: FactsCache, model_windows: Mapping[str, int], table: WindowTable
    ) -> None:
        self.facts = facts
        self.model_windows = model_windows
        self.table = table

    def __call__(self, request: Request, index: BodyIndex) -> SimTurn:
        model_member = index.members.get("model")
        model = model_member.value if model_member is not None else None
        model = model if isinstance(model, str) else None
        beta = next((v for k, v in request.headers.items() if k.lower() == "anthropic-beta"), "")
        prelude = self.facts.prelude(index)
        messages = tuple(self.facts.all(index))
        auto = index.dialect.auto_cache
        return SimTurn(
            request=request,
            model=model,
            window=resolve_window(model, beta, self.model_windows, self.table),
            prelude=prelude,
            messages=messages,
            roles=tuple(v.role for v in index.views),
            prompt=build(prelude, messages, auto),
        )


def fill_outputs(turns: Sequence[SimTurn]) -> None:
    """Set each turn's `output`: what the next request of its conversation adds as the
    assistant's; else the session's median (0 when no turn tells)."""
    last: dict[bytes, SimTurn] = {}
    for turn in turns:
        prev = last.get(turn.conversation)
        if prev is not None and turn.extends(prev):
            n = len(prev.messages)
            prev.output = sum(
                m.tokens
                for m, role in zip(turn.messages[n:], turn.roles[n:], strict=True)
                if role == "assistant"
            )
            prev.output_known = True
        last[turn.conversation] = turn
    known = [t.output for t in turns if t.output_known]
    median = round(statistics.median(known)) if known else 0
    for t in turns:
        if not t.output_known:
            t.output = median
