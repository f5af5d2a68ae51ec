"""One preset's real pipeline, replayed offline over recorded sessions and billed.

Nothing here re-implements the proxy: every turn goes through `cg.pipeline.rewrite.rewrite_body` with the
components `cg.components.build_pipeline` builds from the preset, the expand-tool policy the
addon uses (`auto`), and a throwaway SQLite `Store` whose clock is the trace's. What is modelled
is what a trace cannot hold:

- **the summarizer**: a commissioned job is completed by a stand-in (`StandIn`, a summary of
  `summary_ratio` x the covered span's tokens, at most the `max_tokens` the summarizer client
  asks for at the preset's `summary_level`: a rolled-forward summary does not grow with the
  session) or, with `--model`, by the project's own
  summarizer client; as live, the commissioning turn forwards untouched and the summary is there
  from the next turn on (or the first turn `summary_latency` seconds later);
- **the summarizer's bill**: its call is sent just after the commissioning turn's answer begins.
  Sharing the cache (`model.source: incoming`, `share_cache` not `never`), it is the request as
  forwarded plus one instruction unit, so it reads the transcript from the session's cache;
  otherwise it is the standalone prompt (`build_prompt`'s text), at the full input price. Its
  output is the summary;
- **the agent's answer**: each turn's output tokens come from the trace (`cg.simulate.turns`).

Each rewritten turn's retention (`cg.retention.measure.of_plan`: the client's facts the sent
request still shows) is measured on the plan that was sent, and is a floor with the stand-in,
which writes no fact (`cg.simulate.retained`).
"""

from __future__ import annotations

import asyncio
import hashlib
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cg.billing.cache import Prompt, PromptCache, prompt_of, standalone
from cg.billing.prices import PriceTable
from cg.components import Services, build_pipeline
from cg.pipeline.contract import Component
from cg.pipeline.rewrite import ExpandPolicy, Rewrite, rewrite_body
from cg.settings import Config, StoreConfig
from cg.simulate.compaction import agent_threshold
from cg.simulate.retained import of_rewrite
from cg.simulate.standin import StandIn
from cg.simulate.tally import Tally
from cg.simulate.turns import SimTurn
from cg.state import Store, open_store
from cg.state.facts import FactsCache
from cg.summarize.client import MAX_TOKENS
from cg.summarize.component import Commission, Summarize, Summarizer
from cg.summarize.config import ModelConfig
from cg.wire.body import MessageCache, index_body
from cg.wire.dialects import DIALECTS
from cg.wire.usage import Usage

# The shared-cache call's appended instruction (span, level, framing, format): ~400-600 tokens.
INSTRUCTION_TOKENS = 500
# The summarizer call leaves once the commissioning turn's answer has begun.
CALL_DELAY_S = 1.0

SummarizerFactory = Callable[[ModelConfig, str], Summarizer]


@dataclass(frozen=True, slots=True)
class Options:
    summary_ratio: float = 0.05
    summary_latency: float = 0.0


def shares_cache(cfg: ModelConfig) -> bool:
    """Whether the summarizer call is built on the commissioning request
    (docs/behaviour.md#summarize-the-summarizer-call)."""
    return cfg.source == "incoming" and cfg.share_cache != "never"


class _Clock:
    """The store's clock: the trace's time, not the wall's."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@dataclass(slots=True)
class _Job:
    comp: Summarize
    job: Commission
    turn: int  # the commissioning turn's position in the session
    t: float
    model: str | None
    summary_tokens: int


class ProxyRun:
    """One preset over any number of sessions, with one throwaway store. Use `close()`."""

    def __init__(
        self,
        config: Config,
        facts: FactsCache,
        prices: PriceTable,
        options: Options,
        loop: asyncio.AbstractEventLoop,
        summarizers: SummarizerFactory | None = None,
    ) -> None:
        self.facts = facts
        self.prices = prices
        self.options = options
        self.loop = loop
        self.live = summarizers is not None
        self.clock = _Clock()
        self._tmp = tempfile.TemporaryDirectory(prefix="cg-simulate-")
        self.store: Store = open_store(
            StoreConfig(), str(Path(self._tmp.name) / "simulate.sqlite3"), now=self.clock
        )
        services = Services(
            self.store, facts.tokens, config.model_windows, summarizers=summarizers, facts=facts
        )
        self.components: list[Component] = build_pipeline(
            config.pipeline, config.components, services
        )
        self.expand = ExpandPolicy("auto", self.store)
        self.cache = MessageCache()
        self.sent_cache = MessageCache()
        self.standin = StandIn()

    def close(self) -> None:
        self.store.close()
        self._tmp.cleanup()

    def session(
        self,
        turns: Sequence[SimTurn],
        tick: Callable[[], None] = lambda: None,
        observe: Callable[[int, Rewrite], None] | None = None,
    ) -> Tally:
        """Replay one session and bill it. `observe` is shown each turn's rewrite as it is
        made (`cg.eval` takes the request sent from it), while this run's store holds its
        stashes."""
        tally = Tally()
        tally.retained.floor = not self.live
        cache = PromptCache()
        pending: list[_Job] = []
        context: dict[bytes, int] = {}  # per conversation: the last answer's context
        for i, turn in enumerate(turns):
            latency = self.options.summary_latency
            for p in [p for p in pending if i > p.turn and turn.t >= p.t + latency]:
                pending.remove(p)  # written by now: the store has it for this turn
                self._complete(p, tally)
            self.clock.t = turn.t
            req = turn.request
            rw = rewrite_body(
                req.body,
                req.dialect,
                self.components,
                headers=req.headers,
                now=turn.t,
                cache=self.cache,
                expand=self.expand,
            )
            if observe is not None:
                observe(i, rw)
            if rw.body is None:
                prompt = turn.prompt
                tally.retained.turn(None)
            else:
                tally.rewritten += 1
                prompt = prompt_of(index_body(rw.body, req.dialect, self.sent_cache), self.facts)
                tally.retained.turn(of_rewrite(rw))
            threshold = agent_threshold(turn.window, req.dialect.codex_session_header)
            if threshold is not None and context.get(turn.conversation, 0) >= threshold:
                tally.agent_compaction_turns += 1
            usage = cache.bill(prompt, turn.t) + Usage(output_tokens=turn.output)
            tally.charge(self.prices, "agent", turn.model, usage)
            tally.sent(prompt.tokens, turn.window)
            context[turn.conversation] = prompt.tokens + turn.output
            gap = turns[i + 1].t - turn.t if i + 1 < len(turns) else 2 * CALL_DELAY_S
            at = turn.t + min(CALL_DELAY_S, max(gap, 0.0) / 2)
            for comp, job in rw.commissions:
                if not isinstance(comp, Summarize):
                    continue
                tally.commissioned += 1
                tally.marks.append(i)
                pending.append(self._call(comp, job, turn, i, prompt, cache, at, tally))
            tally.close_turn()
            tick()
        for p in pending:  # paid for even if the session ended before it could be used
            self._complete(p, tally)
        return tally

    def _call(
        self,
        comp: Summarize,
        job: Commission,
        turn: SimTurn,
        i: int,
        sent: Prompt,
        cache: PromptCache,
        at: float,
        tally: Tally,
    ) -> _Job:
        """Bill the summarizer call's input at `at`; the job completes later."""
        cfg = comp.cfg.model
        covered = sum(m.tokens for m in turn.messages[job.head : job.end])
        if shares_cache(cfg):
            model = cfg.model or job.model
            seed = hashlib.blake2b(job.covered_hash.encode(), digest_size=16).digest()
            prompt = sent.extended(seed, INSTRUCTION_TOKENS)
        else:
            model = cfg.model if cfg.source == "config" else (cfg.model or job.model)
            text = job.prompt(comp.cfg)
            tokens = self.facts.tokens.count_text(text)
            digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16)
            prompt = standalone(digest.digest(), tokens, auto=DIALECTS[job.dialect].auto_cache)
        tally.charge(self.prices, "summarizer", model, cache.bill(prompt, at))
        size = max(1, round(covered * self.options.summary_ratio))
        size = min(size, MAX_TOKENS.get(comp.cfg.summary_level, MAX_TOKENS["regular"]))
        return _Job(comp, job, i, turn.t, model, size)

    def _complete(self, p: _Job, tally: Tally) -> None:
        """Run the component's own `complete` (the checkpoint lands in the store, as live) and
        bill the summary as the call's output."""
        if self.live:
            outcome = self.loop.run_until_complete(p.comp.complete(p.job))
            cp = self.store.get_checkpoint(p.job.conversation) if outcome == "completed" else None
            output = self.facts.tokens.count_text(cp.summary) if cp is not None else 0
        else:
            self.standin.expect(p.job, p.summary_tokens)
            outcome = self.loop.run_until_complete(p.comp.complete(p.job, self.standin))
            output = p.summary_tokens
        if outcome == "completed":
            tally.summaries += 1
        tally.charge(self.prices, "summarizer", p.model, Usage(output_tokens=output))
