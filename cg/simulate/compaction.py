"""The baseline `agent-compaction`: no proxy, the agent compacting its own transcript as Claude
Code does (measured: docs/claude-code.md).

- **When**: before sending a turn, when the previous answer's context (input + cache + output,
  as the provider reported it) is at or past the window less 33k tokens (20k output reserve +
  13k buffer): 167k of a 200k window (83.5%), 967k of 1M (96.7%). The window is the request's
  (`resolve_window`, the `anthropic-beta` context-1m header included); unknown: never.
- **The compaction turn**: the request the agent would send now without its newest tool round,
  with a ~6.4k-character instruction appended to its last user message (so the prefix before
  that message is read from the cache) and `cache_control` on it; its answer is the summary
  (`summary_ratio` x the compacted tokens, at most the 20k tokens reserved for output).
- **The restart**: `[summary message, the kept newest round]`, sent once the summary is written
  (every later request is as late); later requests are the trace's, transformed the same way:
  `[summary, kept round, what the trace adds after it]`. The agent may compact again.

Everything is built from message facts (digest, tokens, breakpoint), never from bytes: the
baseline is a model of another program, not a run of this one.

**Codex** (a `responses` session) compacts at 90% of the window, at most 244,800 tokens (90% of
its catalogue's 272,000, docs/codex.md), summarizes everything, and restarts from its system items, the user's own prompts
(every `user` message, its environment context included) and the summary, with no tool round.

**Retention** is measurable all the same, since every message a restart keeps is one of the
trace's: a request after a compaction shows the facts of the trace's messages it keeps (`origin`,
their positions), against the facts of the uncompacted request it stands for (the trace's own,
re-indexed for it). The summary is modelled as tokens only, so it shows no fact: the figure is a
floor, as with the stand-in summarizer.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from cg.billing.cache import PromptCache, build
from cg.billing.prices import PriceTable
from cg.retention.measure import Retention, of_plan
from cg.simulate.tally import Tally
from cg.simulate.turns import SimTurn
from cg.state.facts import MessageFacts
from cg.wire.body import MessageCache, index_body
from cg.wire.splice import Keep
from cg.wire.usage import Usage

OUTPUT_RESERVE = 20_000
# Codex 0.169.0 (docs/codex.md): it compacts at 90% of the window its catalogue gives the model,
# 272,000 for all but one, and restarts from its system items, the user's prompts and the summary.
CODEX_WINDOW = 272_000
CODEX_LIMIT_FRAC = 0.9
CODEX_KEEPS = frozenset({"developer", "system", "user"})
BUFFER = 13_000
# ~6.4k characters of "CRITICAL: Respond with TEXT ONLY…" at ~4 characters a token.
INSTRUCTION_TOKENS = 1_600
# "This session is being continued from a previous conversation that ran out of context…"
PREAMBLE_TOKENS = 60
# How long writing the summary holds the agent up: a fixed start plus output at this speed.
COMPACTION_START_S = 10.0
OUTPUT_TOKENS_PER_S = 60.0


def agent_threshold(window: int | None, codex: bool = False) -> int | None:
    """The previous answer's context at which Claude Code compacts, or None (window unknown);
    `codex`: Codex's limit, 90% of the window, which Codex's catalogue caps at 272,000 whatever
    the API's (a smaller window is a `model_context_window` Codex was given too)."""
    if not window:
        return None
    if codex:
        return round(CODEX_LIMIT_FRAC * min(window, CODEX_WINDOW))
    return max(window - OUTPUT_RESERVE - BUFFER, 0)


Message = tuple[MessageFacts, str]  # facts, role


@dataclass(slots=True)
class _Conversation:
    prefix: tuple[Message, ...] = ()  # what stands for the trace's first `base` messages
    base: SimTurn | None = None
    context: int = 0
    compactions: int = 0
    origin: tuple[
        int | None, ...
    ] = ()  # each prefix message's position in the trace; None: a summary


def _digest(*parts: bytes) -> bytes:
    return hashlib.blake2b(b"".join(parts), digest_size=16).digest()


def run(
    turns: Sequence[SimTurn],
    prices: PriceTable,
    summary_ratio: float,
    tick: Callable[[], None] = lambda: None,
) -> Tally:
    """One session as the agent alone would have sent and been billed for it."""
    tally = Tally()
    tally.retained.floor = True
    cache = PromptCache()
    indexes = MessageCache()
    convs: dict[bytes, _Conversation] = {}
    shift = 0.0
    for turn in turns:
        conv = convs.setdefault(turn.conversation, _Conversation())
        own: tuple[Message, ...] = tuple(zip(turn.messages, turn.roles, strict=True))
        if conv.base is not None and turn.extends(conv.base):
            n = len(conv.base.messages)
            msgs = conv.prefix + own[n:]
            origin = conv.origin + tuple(range(n, len(own)))
        else:  # first turn, or a history that diverged from what was compacted: as recorded
            conv.base, conv.prefix, conv.origin = None, (), ()
            msgs, origin = own, tuple(range(len(own)))
        codex = turn.request.dialect.codex_session_header  # (Codex's dialect)
        threshold = agent_threshold(turn.window, codex)
        now = turn.t + shift
        auto = turn.prompt.auto
        if threshold is not None and conv.context >= threshold:
            tally.agent_compaction_turns += 1
            # Claude Code summarizes all but its newest round and keeps that; Codex summarizes
            # everything and keeps its system items and the user's own prompts.
            if codex:
                cut = len(msgs)
            else:
                cut = max((i for i, (_, r) in enumerate(msgs) if r == "assistant"), default=0)
            if cut > 0:
                *before, (last, _role) = msgs[:cut]
                asked = replace(
                    last,
                    digest=_digest(last.digest, b"compact"),
                    tokens=last.tokens + INSTRUCTION_TOKENS,
                    breakpoint=True,
                )
                request = build(turn.prelude, [m for m, _ in before] + [asked], auto)
                summary = round(summary_ratio * sum(m.tokens for m, _ in msgs[:cut]))
                summary = min(max(summary, 1), OUTPUT_RESERVE)
                usage = cache.bill(request, now) + Usage(output_tokens=summary)
                tally.charge(prices, "summarizer", turn.model, usage)
                tally.summaries += 1
                tally.marks.append(tally.turns)
                conv.compactions += 1
                shift += COMPACTION_START_S + summary / OUTPUT_TOKENS_PER_S
                now = turn.t + shift
                note = MessageFacts(
                    _digest(turn.conversation, conv.compactions.to_bytes(4, "big")),
                    summary + PREAMBLE_TOKENS,
                    (),
                    False,
                    False,
                )
                if codex:
                    keep = [
                        j
                        for j, (_, r) in enumerate(msgs)
                        if r in CODEX_KEEPS and origin[j] is not None
                    ]
                    conv.prefix = (*(msgs[j] for j in keep), (note, "user"))
                    conv.origin = (*(origin[j] for j in keep), None)
                else:
                    conv.prefix = ((note, "user"), *msgs[cut:])
                    conv.origin = (None, *origin[cut:])
                conv.base = turn
                msgs, origin = conv.prefix, conv.origin
        if msgs is not own:
            tally.rewritten += 1
            tally.retained.turn(_retention(turn, origin, indexes))
        else:
            tally.retained.turn(None)
        prompt = build(turn.prelude, [m for m, _ in msgs], auto)
        usage = cache.bill(prompt, now) + Usage(output_tokens=turn.output)
        tally.charge(prices, "agent", turn.model, usage)
        tally.sent(prompt.tokens, turn.window)
        conv.context = prompt.tokens + turn.output
        tally.close_turn()
        tick()
    return tally


def _retention(turn: SimTurn, origin: tuple[int | None, ...], indexes: MessageCache) -> Retention:
    """The facts of `turn`'s own request that its compacted form still shows: the trace's
    messages at the positions `origin` names (None: a summary, which shows none)."""
    index = index_body(turn.request.body, turn.request.dialect, indexes)
    return of_plan(index, [Keep(i) for i in origin if i is not None])
