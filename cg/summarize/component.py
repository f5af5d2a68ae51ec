"""The `summarize` component: decide per request, commission summaries off the hot path.

Per request the decision is one of

    pass        nothing to do (the reason says why)
    splice      a checkpoint whose covered prefix is intact is re-emitted byte-identically
    commission  a summary is worth making; the caller runs `complete()` in the background
                (and a splice from the old checkpoint may serve meanwhile)

and `complete()` turns the summarizer's answer into a checkpoint (and, in `full` marker mode, a
stash of the replaced span) in the store, so it survives a restart.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from cg.body import BodyIndex
from cg.dialects import MessageView
from cg.facts import FactsCache, canonical_digest
from cg.pipeline import RequestContext, Step
from cg.splice import Insert, Keep, Plan, is_identity
from cg.store import Checkpoint, Store, owner, stash_key
from cg.summarize.config import SummarizeConfig
from cg.summarize.prompt import build_prompt, extract_summary, summary_text
from cg.summarize.span import Span, repair_orphans, select_span
from cg.summarize.triggers import (
    CACHE_TTL_DEFAULT,
    RequestFacts,
    WindowTable,
    cache_ttl,
    evaluate,
    resolve_window,
    shipped_windows,
)
from cg.tokens import TokenCounter

Outcome = Literal["completed", "blank", "failed", "timed_out", "no_model"]


class SummarizerError(Exception):
    """The summarizer could not answer (unreachable, 4xx/5xx, malformed answer)."""


class SummarizerTimeout(SummarizerError):
    """The summarizer did not answer within its deadline."""


class NoModel(SummarizerError):
    """No model or endpoint is available to summarize with: a no-op, with that reason."""


class Summarizer(Protocol):
    """Writes one summary. Raises `SummarizerError`/`SummarizerTimeout`; None means blank."""

    async def __call__(self, prompt: str, job: Commission) -> str | None: ...


@dataclass(slots=True)
class Commission:
    """Everything `complete()` needs; built on the hot path, run off it.

    `origin` carries what an `incoming` summarizer needs to reach the proxied request's own
    endpoint; it lives in memory only, for the life of the job, and is never stored.
    """

    session: str
    dialect: str
    model: str | None
    head: int
    end: int
    covered_hash: str
    sources: list[str]
    span: list[MessageView]
    transcript: list[MessageView]
    previous_summary: str | None
    origin: Any = field(default=None, repr=False)
    conversation: str = ""  # the checkpoint key; defaults to the session

    def __post_init__(self) -> None:
        self.conversation = self.conversation or self.session

    def prompt(self, cfg: SummarizeConfig) -> str:
        return build_prompt(
            self.span,
            self.transcript,
            level=cfg.summary_level,
            include_tool_calls=cfg.include_tool_calls,
            custom_prompt=cfg.custom_prompt,
            previous_summary=self.previous_summary,
        )


def message_digest(index: BodyIndex, i: int) -> bytes:
    """What message i says, blind to where the client moved `cache_control` (see
    `cg.facts.canonical_digest`); `Summarize` reads it memoised from a `FactsCache`."""
    return canonical_digest(index.messages[i].value)


def conversation_key(session: str, first: bytes) -> str:
    """The checkpoint key of a conversation: its session and its first message."""
    return f"{session}#{first.hex()[:12]}"


def prefix_hash(digests: Sequence[bytes]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for d in digests:
        h.update(d)
    return h.hexdigest()


class Summarize:
    name = "summarize"

    def __init__(
        self,
        cfg: SummarizeConfig,
        store: Store,
        tokens: TokenCounter,
        model_windows: Mapping[str, int] | None = None,
        table: WindowTable | None = None,
        summarizer: Summarizer | None = None,
        facts: FactsCache | None = None,
    ) -> None:
        self.cfg = cfg
        self.summarizer = summarizer
        self.store = store
        self.tokens = tokens
        self.model_windows = dict(model_windows or {})
        self.table = table or shipped_windows()
        self.inflight: set[str] = set()
        self.facts = facts or FactsCache(tokens)

    @property
    def marker_mode(self) -> str:
        """`full` degrades to `off` when the store cannot persist a stash."""
        mode = self.cfg.marker_mode
        return "off" if mode == "full" and not self.store.persistent else mode

    # -- the hot path --------------------------------------------------------------------------

    def apply(self, req: RequestContext, plan: Plan) -> Step:
        index = req.index
        n = len(index.messages)
        if not is_identity(plan, n):
            return Step(None, "summarize runs alone: an earlier component changed the plan")
        # The cache now alive was written by the previous request, with that request's TTL.
        prev = self.store.touch_session(req.session, req.now, cache_ttl(index.text))
        last = prev.last_request if prev is not None else None
        ttl = prev.cache_ttl if prev is not None and prev.cache_ttl else CACHE_TTL_DEFAULT

        views = index.views
        span = select_span(views, self.cfg.keep_first, self.cfg.keep_last)
        if isinstance(span, str):
            return Step(None, span)
        stats = self.facts.all(index)
        digests = [s.digest for s in stats]
        # One session id can carry several conversations (an agent and its subagents): each
        # conversation, told apart by its first message, has its own checkpoint.
        conv = conversation_key(req.session, digests[0])
        detail: dict[str, Any] = {
            "session": req.session,
            "conversation": conv,
            "span": [span.head, span.end],
        }

        step = Step(None, "no checkpoint", detail)
        cp = self.store.get_checkpoint(conv)
        middle_tokens = 0
        if cp is not None:
            ce = cp.head_count + cp.covered_count
            if ce > n or prefix_hash(digests[:ce]) != cp.covered_hash:
                self.store.delete_checkpoint(conv)
                detail["checkpoint"] = "diverged: invalidated"
                cp = None
            elif ce > span.end:
                detail["checkpoint"] = "covers into the tail: not reused this turn"
                cp = None
            else:
                step = self._splice(index, cp, ce, detail)
                middle_tokens = sum(s.tokens for s in stats[ce : span.end])
                detail["middle_tokens"] = middle_tokens

        facts = RequestFacts(
            messages=n,
            request_tokens=sum(s.tokens for s in stats) + self.facts.prelude(index).tokens,
            output_tokens=sum(sum(s.outputs) for s in stats),
            max_output_tokens=max((max(s.outputs, default=0) for s in stats), default=0),
            window=resolve_window(
                index.members["model"].value if "model" in index.members else None,
                req.headers.get("anthropic-beta", ""),
                self.model_windows,
                self.table,
            ),
            last_request=last,
            now=req.now,
            ttl=ttl,
        )
        detail["tokens"] = facts.request_tokens
        if step.plan is not None and cp is not None:
            removed = sum(s.tokens for s in stats[cp.head_count : cp.head_count + cp.covered_count])
            summary_tokens = self.tokens.count_text(json.loads(cp.message)["content"])
            detail["tokens_after"] = facts.request_tokens - removed + summary_tokens
            detail["reused"] = True
        detail["window"] = facts.window
        trig = evaluate(self.cfg, facts)
        detail["trigger"] = trig.to_json()

        if cp is not None:
            if self.cfg.resummarize_tokens == 0:
                want, why = trig.fire, "no reuse: a fresh summary every eligible turn"
            else:
                want = middle_tokens > self.cfg.resummarize_tokens
                why = f"rolling forward: {middle_tokens} new tokens > resummarize_tokens"
                # The ceiling holds for what is sent too: a summarized request that grew to it
                # rolls forward now, however few tokens `resummarize_tokens` counted.
                sent = detail.get("tokens_after")
                ceiling = self.cfg.trigger.ceiling_frac
                window = facts.window or 0
                if not want and sent is not None and 0 < ceiling * window <= sent:
                    want = True
                    why = (
                        f"rolling forward: the request sent is {sent} tokens >= "
                        f"ceiling_frac {ceiling} x {window}"
                    )
        else:
            want, why = trig.fire, "trigger fired"
        if not want:
            if cp is None:
                step.reason = "trigger did not fire"
            return step

        span_tokens = sum(s.tokens for s in stats[span.head : span.end])
        if span_tokens < self.cfg.min_tokens:
            detail["commission"] = f"span of {span_tokens} tokens < min_tokens"
        elif conv in self.inflight:
            detail["commission"] = "a summary for this session is already in flight"
        else:
            step.commission = self._commission(req, conv, span, digests, cp)
            detail["commission"] = why
            if step.plan is None:
                step.reason = "commissioned a summary; this turn forwards untouched"
        return step

    def _splice(self, index: BodyIndex, cp: Checkpoint, ce: int, detail: dict[str, Any]) -> Step:
        mode = self.marker_mode
        if mode == "full" and cp.key and not self.store.has_stash(cp.key, owner(cp.session)):
            # Degrade honestly: the marker now says the original expired, and stays so.
            text = summary_text(cp.summary, mode, cp.key, cp.covered_count, expired=True)
            msg = Insert.message({"role": "user", "content": text}, index.dialect)
            cp = replace(cp, key=None, message=msg.json)
            self.store.put_checkpoint(cp)
            detail["stash"] = "expired"
        insert = Insert(cp.message, index.dialect.view(json.loads(cp.message)))
        plan: Plan = [Keep(i) for i in range(cp.head_count)]
        plan.append(insert)
        plan.extend(Keep(i) for i in range(ce, len(index.messages)))
        plan = repair_orphans(index, plan)
        detail["checkpoint"] = {"covered": [cp.head_count, ce], "key": cp.key}
        stashed = frozenset(range(cp.head_count, ce)) if cp.key else frozenset()
        return Step(
            plan,
            "spliced the session's checkpoint",
            detail,
            stash_required=mode == "full" and cp.key is not None,
            stashed=stashed,
        )

    def _commission(
        self,
        req: RequestContext,
        conv: str,
        span: Span,
        digests: list[bytes],
        cp: Checkpoint | None,
    ) -> Commission:
        index = req.index
        views = index.views
        rolling = cp is not None and self.cfg.resummarize_tokens > 0
        start = cp.head_count + cp.covered_count if cp is not None and rolling else span.head
        model = index.members["model"].value if "model" in index.members else None
        self.inflight.add(conv)
        return Commission(
            session=req.session,
            conversation=conv,
            dialect=index.dialect.name,
            model=model if isinstance(model, str) else None,
            head=span.head,
            end=span.end,
            covered_hash=prefix_hash(digests[: span.end]),
            sources=[index.source(i) for i in range(span.head, span.end)],
            span=views[start : span.end],
            transcript=views,
            previous_summary=cp.summary if cp is not None and rolling else None,
        )

    # -- off the hot path ----------------------------------------------------------------------

    def abandon(self, job: Commission) -> None:
        """The caller cannot run `job`: free the session for a later commission."""
        self.inflight.discard(job.conversation)
        job.origin = None

    async def complete(self, job: Commission, summarizer: Summarizer | None = None) -> Outcome:
        """Run the summarizer for `job` (default: this component's) and store the result as the
        session's checkpoint. With no summarizer at all, the job is a counted no-op."""
        summarizer = summarizer or self.summarizer
        try:
            if summarizer is None:
                return "no_model"
            try:
                answer = await summarizer(job.prompt(self.cfg), job)
            except SummarizerTimeout:
                return "timed_out"
            except NoModel:
                return "no_model"
            except SummarizerError:
                return "failed"
            summary = extract_summary(answer)
            if summary is None:
                return "blank"
            mode = self.marker_mode
            key: str | None = None
            if mode == "full":
                key = stash_key(job.sources)
                self.store.put_stash(key, job.session, job.sources, job.dialect)
            from cg.dialects import DIALECTS

            text = summary_text(summary, mode, key, len(job.sources))
            message = Insert.message({"role": "user", "content": text}, DIALECTS[job.dialect])
            self.store.put_checkpoint(
                Checkpoint(
                    session=job.conversation,
                    summary=summary,
                    head_count=job.head,
                    covered_count=job.end - job.head,
                    covered_hash=job.covered_hash,
                    key=key,
                    message=message.json,
                    created=0.0,
                    updated=0.0,
                )
            )
            return "completed"
        finally:
            self.inflight.discard(job.conversation)
            job.origin = None
