"""The `summarize` component: decide per request, commission summaries off the hot path.

Per request the decision is one of

    pass        nothing to do (the reason says why)
    splice      a checkpoint whose covered prefix is intact is re-emitted byte-identically
    commission  a summary is worth making; the caller runs `complete()` in the background
                (and a splice from the old checkpoint may serve meanwhile)

and `complete()` turns the summarizer's answer into a checkpoint (and, in `full` marker mode, a
stash of the replaced span) in the store, so it survives a restart.

Which request writes the summary (`Commission.path`, counted by the caller):

    shared      the commissioning request as forwarded upstream plus one instruction, sent once
                its answer has begun, so the provider reads the transcript from its prompt cache
                (`cg.summarize.shared`; `model.share_cache` auto/always with `source: incoming`)
    fallback    the shared answer held no `<summary>` (only tool calls, say), or the provider
                refused the shared request (400/413/422): the standalone prompt, once. A 5xx,
                429, timeout or transport error is the counted failure it is on any path.
    standalone  the standalone prompt (`share_cache: never`, `source: config`, or `auto` when
                sharing would not pay: no breakpoint, no cache written, a forced tool choice)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import operator
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, runtime_checkable

from cg.pipeline.contract import RequestContext, Step
from cg.state import Checkpoint, Store, StoreError, owner, stash_key
from cg.state.facts import FactsCache, MessageFacts
from cg.state.session import header
from cg.state.tenant import CONVERSATION_HEX, UNBOUND
from cg.state.tokens import TokenCounter
from cg.summarize.config import SummarizeConfig
from cg.summarize.floor import build_floor, span_facts
from cg.summarize.prompt import build_prompt, extract_summary, has_summary, summary_text
from cg.summarize.shared import Layout, SharedRequest, build
from cg.summarize.span import Span, repair_orphans, select_span
from cg.summarize.triggers import (
    CACHE_TTL_1H,
    CACHE_TTL_DEFAULT,
    RequestFacts,
    WindowTable,
    cache_ttl,
    evaluate,
    resolve_window,
    shipped_windows,
)
from cg.wire.body import BodyIndex
from cg.wire.dialects import DIALECTS, Dialect, MessageView
from cg.wire.splice import Edit, Insert, Keep, Piece, Plan, is_identity

# `deferred`: another instance sharing the store holds the claim on this conversation, or has
# already written a newer checkpoint (`Store.claim`): its summary is reused, none is made here.
SummaryOutcome = Literal["completed", "blank", "failed", "timed_out", "no_model", "deferred"]
# Which request wrote (or tried to write) a summary.
SummaryRoute = Literal["shared", "fallback", "standalone"]
# How long a shared-cache job waits for its commissioning turn's answer to begin (the provider
# writes its cache entry then). Bounded, so a flow that never answers cannot hold a job.
ANSWER_WAIT = 60.0
# A job's reading of a body this long, or a span of this many messages, runs in a thread: the
# event loop serves every turn meanwhile (docs/behaviour.md#bounded-work-and-shared-use).
OFF_LOOP_BYTES = 256 * 1024
OFF_LOOP_MESSAGES = 2000
FACTS_INLINE = 200  # token counts a job writes back on the loop, at most


class SummarizerError(Exception):
    """The summarizer could not answer (unreachable, 4xx/5xx, malformed answer)."""


class SummarizerTimeout(SummarizerError):
    """The summarizer did not answer within its deadline."""


class NoModel(SummarizerError):
    """No model or endpoint is available to summarize with: a no-op, with that reason."""


class SummarizerRefused(SummarizerError):
    """The provider refused the request as sent (400, 413, 422): a shape or size problem, e.g.
    the shared request no longer fits the window once the instruction is appended. The
    shared-cache call falls back to the standalone prompt on it; anything else is a failure."""


class Summarizer(Protocol):
    """Writes one summary. Raises `SummarizerError`/`SummarizerTimeout`; None means blank."""

    async def __call__(self, prompt: str, job: Commission) -> str | None: ...


@runtime_checkable
class SharedSummarizer(Protocol):
    """A summarizer that can also send the shared-cache request: `body` as built by
    `cg.summarize.shared.build`, to the commissioning request's own endpoint. Returns the
    answer's text (None when it has none, e.g. only tool calls)."""

    async def __call__(self, prompt: str, job: Commission) -> str | None: ...

    async def shared(self, body: bytes, job: Commission) -> str | None: ...


@dataclass(slots=True)
class Commission:
    """Everything `complete()` needs; built on the hot path, run off it.

    `origin` carries what an `incoming` summarizer needs to reach the proxied request's own
    endpoint, and `forwarded` the request's body as it went upstream (what the provider cached);
    both live in memory only, for the life of the job, and are never stored or logged.
    `layouts` say where the span sits in that body (with or without this turn's splice).
    `began` is set by the caller when the commissioning turn's answer begins (`answer_began`);
    None means nobody will signal, and the job does not wait.
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
    # The covered hash of the checkpoint in the store when this was decided (None: none): the
    # claim is refused when another instance has written a newer one since.
    based_on: str | None = None
    conversation: str = ""  # the checkpoint key; defaults to the session
    forwarded: bytes | None = field(default=None, repr=False)
    layouts: tuple[Layout, ...] = ()
    began: asyncio.Event | None = field(default=None, repr=False)
    answer_status: int | None = None  # the commissioning answer's HTTP status, once it began
    path: SummaryRoute | None = None  # which request wrote (or tried to write) the summary
    note: str = ""  # why that path, for the log line
    # Who shows the job's calls (the mitmproxy face): the commissioning flow's id, and the id
    # its first call's flow is to have (named in the commissioning flow's comment up front).
    flow_id: str | None = None
    call_flow_id: str | None = None
    # The commissioning request's tenant (`cg.state.tenant`): the stash and the checkpoint are
    # written with it, and only its requests read them back.
    tenant: str = ""
    # What the summary is made from: the request's first n messages and prelude, hashed
    # (`Summarize._seen_hash`): a later request that repeats it all may take the checkpoint
    # over under another credential (`Summarize._handover`).
    seen: tuple[int, str] | None = None

    def answer_began(self, status: int | None) -> None:
        """The commissioning turn's answer began with `status` (None: the flow failed first)."""
        self.answer_status = status
        if self.began is not None:
            self.began.set()

    async def wait_answer(self, timeout: float) -> bool:
        """Wait (bounded) for `answer_began`; False when it did not come in time."""
        if self.began is None or self.began.is_set():
            return True
        try:
            await asyncio.wait_for(self.began.wait(), timeout)
        except TimeoutError:
            return False
        return True

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


INSERTS_MAX = 256  # checkpoint messages remembered (read and counted) at once
_DIGEST = operator.attrgetter("digest")  # map() with it is a C loop over ~400 facts
# Running totals after each message: tokens, output tokens, the largest output, a 1 h TTL.
_Totals = tuple[int, int, int, bool]


def _outside(index: BodyIndex) -> str:
    """The body's text outside the transcript array (whose breakpoints the facts know)."""
    return index.slice(0, index.array.start) + index.slice(index.array.end, len(index.chars))


def span_bytes(index: BodyIndex, span: Span) -> int:
    """The span's messages' bytes in the body (their separators included): what its stash
    would hold."""
    ends = index.byte_ends()
    start = ends[span.head - 1] if span.head else index.byte_offset(index.array.start)
    return ends[span.end - 1] - start


def conversation_key(session: str, first: bytes, tenant: str = "") -> str:
    """The checkpoint key of a conversation: its session, its first message and (a prefix of)
    its tenant, so that one tenant's checkpoint never replaces another's in a session both
    name; a request without a credential keeps the key from before tenancy."""
    key = f"{session}#{first.hex()[:12]}"
    return f"{key}@{tenant[:CONVERSATION_HEX]}" if tenant else key


def in_place(plan: Sequence[Piece], n: int) -> bool:
    """Whether `plan` is one piece per client message, in order, each kept or edited."""
    return len(plan) == n and all(
        isinstance(p, Keep | Edit) and p.index == i for i, p in enumerate(plan)
    )


def prefix_hash(digests: Sequence[bytes]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for d in digests:
        h.update(d)
    return h.hexdigest()


WINDOWS_MAX = 256  # models whose window a component remembers


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
        # `inflight` is asked and added to from the event loop and from the thread that reads
        # large bodies: the two steps are taken together.
        self._inflight_lock = threading.Lock()
        self.facts = facts or FactsCache(tokens)
        # Token counts outlive a restart in the store (the last store configured wins: every
        # component of one configuration shares it).
        self.facts.backing = store
        self.answer_wait = ANSWER_WAIT
        # A checkpoint's summary message, read (its view) and counted once: a reuse turn
        # re-sent the same message and parsed and tokenised it twice.
        self._inserts: dict[str, tuple[Insert, int]] = {}
        # The window of each model seen, with and without the 1M beta: looked up every turn,
        # it walked the whole table for the longest prefix.
        self._windows: dict[tuple[str, bool], int | None] = {}

    def window(self, model: object, beta_header: str) -> int | None:
        """`resolve_window` of the model named, under this component's tables, remembered."""
        if not isinstance(model, str):
            return None
        key = (model, "context-1m" in beta_header)
        if key in self._windows:
            return self._windows[key]
        found = resolve_window(model, beta_header, self.model_windows, self.table)
        if len(self._windows) >= WINDOWS_MAX:
            self._windows.clear()  # a model name per request from a misbehaving client
        self._windows[key] = found
        return found

    @property
    def marker_mode(self) -> str:
        """`full` degrades to `off` when the store cannot persist a stash."""
        mode = self.cfg.marker_mode
        return "off" if mode == "full" and not self.store.persistent else mode

    # -- the hot path --------------------------------------------------------------------------

    def invalidate(self, req: RequestContext) -> str | None:
        """The agent is compacting this conversation itself: its checkpoint no longer describes
        what the agent will send next. (A summary still in flight stores a checkpoint whose
        covered prefix the compacted history does not repeat: the next turn finds it diverged.)"""
        index = req.index
        if not index.messages:
            return None
        conv = conversation_key(req.session, self.facts.of(index, 0).digest, req.tenant)
        return f"checkpoint of {conv}" if self.store.delete_checkpoint(conv) else None

    def _outside_ttl(self, index: BodyIndex) -> float:
        """`cache_ttl` of the text outside the transcript array, memoised on the index: a next
        turn that shares every byte outside the array inherits it, rather than searching a
        Claude Code body's system and tools again."""
        owner, known = index.memo.outside_ttl
        if owner is self and known is not None:
            return known
        ttl = cache_ttl(_outside(index))
        index.memo.outside_ttl = (self, ttl)
        return ttl

    def _totals(self, index: BodyIndex, stats: Sequence[MessageFacts]) -> list[_Totals]:
        """Running totals over the messages (tokens, output tokens, the largest output, any
        breakpoint asking a 1 h TTL), one entry per message, memoised on the index as a list:
        a next turn inherits the entries of the messages it repeats byte for byte and adds
        only its new ones (not three passes over every message's facts every turn)."""
        owner, known = index.memo.totals
        cum: list[_Totals] = known if owner is self.facts and known is not None else []
        if len(cum) < len(stats):  # an inherited list is as long as the messages shared
            cum = list(cum)
            tokens, outputs, top, long = cum[-1] if cum else (0, 0, 0, False)
            for f in stats[len(cum) :]:
                tokens += f.tokens
                outputs += sum(f.outputs)
                top = max(top, *f.outputs) if f.outputs else top
                long = long or f.long_ttl
                cum.append((tokens, outputs, top, long))
        index.memo.totals = (self.facts, cum)
        return cum

    def _covered_hash(self, index: BodyIndex, stats: Sequence[MessageFacts], ce: int) -> str:
        """`prefix_hash(digests[:ce])`, memoised on the index as a list of `ce` entries (the
        hash last): a list memo is cut to the prefix a next turn shares, so it is still `ce`
        long exactly when that turn repeats the first `ce` messages byte for byte."""
        owner, known = index.memo.covered_hash
        if owner is self and known is not None and len(known) == ce and ce:
            return str(known[-1])
        h = prefix_hash(list(map(_DIGEST, stats[:ce])))
        index.memo.covered_hash = (self, [None] * (ce - 1) + [h] if ce else [])
        return h

    def apply(self, req: RequestContext, plan: Plan) -> Step:
        index = req.index
        n = len(index.messages)
        # An earlier component's edits (`mask`): its head and tail pieces are spliced as they
        # are, so a masked message there stays masked; the stash holds the client's sources.
        incoming: Plan | None = None
        if not is_identity(plan, n):
            if not in_place(plan, n):
                return Step(
                    None, "an earlier component changed the plan beyond editing messages in place"
                )
            incoming = plan
        stats = self.facts.all(index)
        totals = self._totals(index, stats)
        tokens, outputs, top, long = totals[-1] if totals else (0, 0, 0, False)

        def between(a: int, b: int) -> int:  # the tokens of messages a..b-1
            return (totals[b - 1][0] if b else 0) - (totals[a - 1][0] if a else 0)

        # The cache now alive was written by the previous request, with that request's TTL.
        # Which TTL this one asks: its messages' breakpoints are in their memoised facts, so the
        # ~1 MB body is not searched again every turn (`cache_ttl` reads what else there is).
        long = long or self.facts.prelude(index).long_ttl
        ttl_now = CACHE_TTL_1H if long else self._outside_ttl(index)
        prev = self.store.touch_session(req.session, req.now, ttl_now)
        last = prev.last_request if prev is not None else None
        ttl = prev.cache_ttl if prev is not None and prev.cache_ttl else CACHE_TTL_DEFAULT

        views = index.views
        span = select_span(views, self.cfg.keep_first, self.cfg.keep_last, index.dialect.pairing)
        if isinstance(span, str):
            return Step(None, span)
        # One session id can carry several conversations (an agent and its subagents): each
        # conversation, told apart by its first message, has its own checkpoint; and each
        # tenant has its own in a session another names too.
        conv = conversation_key(req.session, stats[0].digest, req.tenant)
        detail: dict[str, Any] = {
            "session": req.session,
            "conversation": conv,
            "span": [span.head, span.end],
        }

        step = Step(None, "no checkpoint", detail)
        cp = self.store.get_checkpoint(conv, req.tenant)
        based_on = cp.covered_hash if cp is not None else None
        legacy = None
        if cp is None:
            found = self._handover(index, stats, req, conv)
            if found is not None and found.tenant == UNBOUND:
                # A checkpoint from before tenancy, under the key it had: reused (it is
                # unbound: any tenant of its session reads it, as before), never replaced or
                # deleted here; this tenant's next summary goes under its own key.
                legacy = found
                cp, detail["conversation"] = legacy, legacy.session
            elif found is not None:
                cp = self._take_over(index, req, conv, found, detail)
                based_on = cp.covered_hash
        middle_tokens = 0
        if cp is not None:
            ce = cp.head_count + cp.covered_count
            if ce > n or self._covered_hash(index, stats, ce) != cp.covered_hash:
                if legacy is None:
                    self.store.delete_checkpoint(conv)
                detail["checkpoint"] = "diverged: invalidated" if legacy is None else "diverged"
                detail["conversation"] = conv
                cp = based_on = None
            elif ce > span.end:
                detail["checkpoint"] = "covers into the tail: not reused this turn"
                cp = None
            else:
                step = self._splice(index, cp, ce, detail, req.tenant, incoming)
                middle_tokens = between(ce, span.end)
                detail["middle_tokens"] = middle_tokens

        facts = RequestFacts(
            messages=n,
            request_tokens=tokens + self.facts.prelude(index).tokens,
            output_tokens=outputs,
            max_output_tokens=top,
            window=self.window(
                index.model,
                header(req.headers, "anthropic-beta") or "",
            ),
            last_request=last,
            now=req.now,
            ttl=ttl,
        )
        detail["tokens"] = facts.request_tokens
        if step.plan is not None and cp is not None:
            removed = between(cp.head_count, cp.head_count + cp.covered_count)
            summary_tokens = self._insert(index.dialect, cp.message)[1]
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

        span_tokens = between(span.head, span.end)
        stash_bound = self.store.max_stash_bytes
        if span_tokens < self.cfg.min_tokens:
            detail["commission"] = f"span of {span_tokens} tokens < min_tokens"
        elif self.marker_mode == "full" and span_bytes(index, span) > stash_bound:
            detail["commission"] = (
                f"span of {span_bytes(index, span)} bytes is over the stash bound "
                f"({stash_bound} bytes: a quarter of the stashes' share of store.max_mb)"
            )
            detail["bound"] = "stash"
        elif conv in self.inflight:
            detail["commission"] = "a summary for this session is already in flight"
        else:
            # What the store holds (this turn's clock: `batch_delay`) is committed first: a
            # store that cannot take writes is found before a summary it could not keep is
            # paid for (StoreError: the turn passes through, as when the clock was written at
            # once).
            self.store.flush_held()
            if not self._take(conv):  # (the other thread took it since the check above)
                detail["commission"] = "a summary for this session is already in flight"
                return step
            try:
                step.commission = self._commission(req, conv, span, stats, cp, step.plan)
            except BaseException:
                self.inflight.discard(conv)
                raise
            step.commission.based_on = based_on
            detail["commission"] = why
            if step.plan is None:
                step.reason = "commissioned a summary; this turn forwards untouched"
        return step

    def _handover(
        self, index: BodyIndex, stats: Sequence[MessageFacts], req: RequestContext, conv: str
    ) -> Checkpoint | None:
        """For a request with no checkpoint of its own: its conversation's checkpoint from
        before tenancy (unbound: any tenant of its session reads it, as before), or one another
        tenant wrote whose summary was made from nothing this request does not hold.

        The second is a credential that changed (an OAuth token refreshed, a key rotated): the
        session goes on under a new tenant. Such a checkpoint records what its summary was made
        from (`meta["seen"]`: the commissioning request's prelude and its first n messages,
        hashed); a request that repeats all of it byte for byte in canonical form sends every
        message the summary and its stash came from, so taking them over shows it nothing it
        did not send. Anything short of that is another user's state: not read."""
        base = conversation_key(req.session, stats[0].digest)
        found = [c for c in self.store.conversation_checkpoints(base) if c.session != conv]
        for cp in sorted(found, key=lambda c: c.updated, reverse=True):
            if cp.tenant == UNBOUND:
                if req.tenant:  # (an anonymous request's own key is the legacy one)
                    return cp
                continue
            seen = cp.meta.get("seen")
            if (
                isinstance(seen, list)
                and len(seen) == 2
                and isinstance(seen[0], int)
                and 0 < seen[0] <= len(stats)
                and self._seen_hash(index, stats, seen[0]) == seen[1]
            ):
                return cp
        return None

    def _seen_hash(self, index: BodyIndex, stats: Sequence[MessageFacts], n: int) -> str:
        """What a summary made from this request's first `n` messages was made from: its
        prelude (system, tools: what a shared-cache summarizer call sent) and those messages."""
        prelude = self.facts.prelude(index).digest
        return prefix_hash([prelude, *map(_DIGEST, stats[:n])])

    def _take_over(
        self,
        index: BodyIndex,
        req: RequestContext,
        conv: str,
        cp: Checkpoint,
        detail: dict[str, Any],
    ) -> Checkpoint:
        """`cp` (another tenant's, whose every source this request holds) as this tenant's
        own: the same summary bytes (the provider's cache stays warm), its stash copied for
        this tenant, under this tenant's key. The other tenant's rows are left as they are."""
        if cp.key is not None and self.marker_mode == "full":
            stash = self.store.get_stash(cp.key, owner(cp.session), cp.tenant)
            if stash is not None:
                self.store.put_stash(
                    cp.key, req.session, stash.sources(), stash.dialect, req.tenant
                )
        mine = self.store.put_checkpoint(replace(cp, session=conv, tenant=req.tenant))
        detail["handover"] = (
            "this conversation's checkpoint from another credential, whose every source this "
            "request holds: taken over"
        )
        return mine

    def _splice(
        self,
        index: BodyIndex,
        cp: Checkpoint,
        ce: int,
        detail: dict[str, Any],
        tenant: str,
        incoming: Plan | None = None,
    ) -> Step:
        mode = self.marker_mode
        if cp.tenant == UNBOUND:
            detail["tenant"] = "unbound"  # the state used is from before tenancy
        if (
            mode == "full"
            and cp.key
            and not self.store.has_stash(cp.key, owner(cp.session), tenant)
        ):
            # Degrade honestly: the marker now says the original expired, and stays so.
            floor = cp.meta.get("floor")
            text = summary_text(
                cp.summary,
                mode,
                cp.key,
                cp.covered_count,
                expired=True,
                floor=floor if isinstance(floor, str) else "",
            )
            msg = Insert.message(index.dialect.user_message(text), index.dialect)
            cp = replace(cp, key=None, message=msg.json)
            self.store.put_checkpoint(cp)
            detail["stash"] = "expired"
        insert = self._insert(index.dialect, cp.message)[0]
        if incoming is None:
            plan: Plan = [Keep(i) for i in range(cp.head_count)]
            plan.append(insert)
            plan.extend(Keep(i) for i in range(ce, len(index.messages)))
        else:
            plan = [*incoming[: cp.head_count], insert, *incoming[ce:]]
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

    def _take(self, conv: str) -> bool:
        """Mark `conv`'s summary in flight; False when it already was."""
        with self._inflight_lock:
            if conv in self.inflight:
                return False
            self.inflight.add(conv)
            return True

    def _insert(self, dialect: Dialect, message: str) -> tuple[Insert, int]:
        """The checkpoint message as it is spliced in, and its summary's token count."""
        key = dialect.name + "\0" + message
        known = self._inserts.get(key)
        if known is None:
            view = dialect.view(json.loads(message))
            known = (Insert(message, view), self.tokens.count_text(view.text))
            if len(self._inserts) >= INSERTS_MAX:
                self._inserts.clear()
            self._inserts[key] = known
        return known

    def _commission(
        self,
        req: RequestContext,
        conv: str,
        span: Span,
        stats: Sequence[MessageFacts],
        cp: Checkpoint | None,
        spliced: Plan | None = None,
    ) -> Commission:
        index = req.index
        views = index.views
        n = len(views)
        # Where the span sits in the body that goes upstream: spliced (this turn re-emits the
        # old checkpoint) or, should the splice not go out, as the client sent it.
        layouts = [Layout(n, span.head, n - span.end)]
        at = None
        if spliced is not None:
            at = next((i for i, p in enumerate(spliced) if isinstance(p, Insert)), None)
        if spliced is not None and at is not None:
            tail = sum(
                1 for p in spliced[at + 1 :] if not isinstance(p, Insert) and p.index >= span.end
            )
            layouts.insert(0, Layout(len(spliced), min(span.head, at), tail, summary_at=at))
        rolling = cp is not None and self.cfg.resummarize_tokens > 0
        start = cp.head_count + cp.covered_count if cp is not None and rolling else span.head
        model = index.model
        return Commission(
            session=req.session,
            tenant=req.tenant,
            conversation=conv,
            dialect=index.dialect.name,
            model=model if isinstance(model, str) else None,
            head=span.head,
            end=span.end,
            covered_hash=prefix_hash(list(map(_DIGEST, stats[: span.end]))),
            seen=(n, self._seen_hash(index, stats, n)),
            sources=[index.source(i) for i in range(span.head, span.end)],
            span=views[start : span.end],
            transcript=views,
            previous_summary=cp.summary if cp is not None and rolling else None,
            layouts=tuple(layouts),
        )

    # -- off the hot path ----------------------------------------------------------------------

    def abandon(self, job: Commission) -> None:
        """The caller cannot run `job`: free the session for a later commission."""
        self.inflight.discard(job.conversation)
        job.origin = None

    async def complete(
        self, job: Commission, summarizer: Summarizer | None = None
    ) -> SummaryOutcome:
        """Run the summarizer for `job` (default: this component's) and store the result as the
        session's checkpoint. With no summarizer at all, the job is a counted no-op."""
        summarizer = summarizer or self.summarizer
        claimed = False
        try:
            if summarizer is None:
                return "no_model"
            # Several proxies on one store: only the instance that claims the conversation
            # calls the summarizer; the others reuse what it writes.
            try:
                if not await self.store.claim(job.conversation, job.based_on):
                    job.note = "another instance holds this conversation's summary"
                    return "deferred"
                claimed = True
            except (StoreError, TimeoutError):
                return "failed"
            try:
                summary = await self._summarize(summarizer, job)
            except SummarizerTimeout:
                return "timed_out"
            except NoModel:
                return "no_model"
            except SummarizerError:
                return "failed"
            if summary is None:
                return "blank"
            mode = self.marker_mode
            key: str | None = None
            if mode == "full":
                key = stash_key(job.sources)
                self.store.put_stash(key, job.session, job.sources, job.dialect, job.tenant)
            dialect = DIALECTS[job.dialect]
            # The floor reads every message of the span: a long one off the event loop.
            if sum(map(len, job.sources)) > OFF_LOOP_BYTES:
                floor = await asyncio.to_thread(self.floor, job, key)
            else:
                floor = self.floor(job, key)
            text = summary_text(summary, mode, key, len(job.sources), floor=floor)
            message = Insert.message(dialect.user_message(text), dialect)
            meta: dict[str, Any] = {"seen": list(job.seen)} if job.seen is not None else {}
            if floor:
                meta["floor"] = floor
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
                    meta=meta,
                    tenant=job.tenant,
                )
            )
            # Counted complete once other instances can see it (PostgreSQL writes are queued).
            with contextlib.suppress(StoreError, TimeoutError):
                await self.store.settle()
            return "completed"
        finally:
            if claimed:
                # After the checkpoint (writes commit in order): an instance that claims in
                # between finds the new checkpoint and defers to it.
                with contextlib.suppress(StoreError):
                    self.store.release(job.conversation)
            self.inflight.discard(job.conversation)
            job.origin = None
            job.forwarded = None
            # The covered history's counts, for a restarted proxy (many: off the loop).
            if self.facts.pending() > FACTS_INLINE:
                await asyncio.to_thread(self.facts.flush)
            else:
                self.facts.flush()

    def floor(self, job: Commission, key: str | None) -> str:
        """The floor of `job`'s span (`cg.summarize.floor`), its ids naming the stash `key`."""
        cfg = self.cfg
        if not (cfg.keep_user_tokens or cfg.keep_artifact_tokens):
            return ""
        return build_floor(
            span_facts(job.dialect, job.sources),
            key,
            keep_user_tokens=cfg.keep_user_tokens,
            keep_artifact_tokens=cfg.keep_artifact_tokens,
            count=self.tokens.count_text,
        )

    async def _summarize(self, summarizer: Summarizer, job: Commission) -> str | None:
        """The summary text: from the shared-cache request when it can be made, else (or when
        its answer holds no `<summary>`) from the standalone prompt. Sets `job.path`."""
        if isinstance(summarizer, SharedSummarizer):
            shared = await self._shared_request(job)
            if isinstance(shared, SharedRequest):
                job.path = "shared"
                try:
                    answer = await summarizer.shared(shared.body, job)
                except SummarizerRefused as e:
                    answer, job.note = None, f"the provider refused the shared request: {e}"
                if has_summary(answer):
                    return extract_summary(answer)
                job.path = "fallback"
                job.note = job.note or "the shared answer held no <summary>"
            else:
                job.note = shared
        if job.path is None:
            job.path = "standalone"
        if len(job.span) > OFF_LOOP_MESSAGES:  # a long span's rendering, off the event loop
            prompt = await asyncio.to_thread(job.prompt, self.cfg)
        else:
            prompt = job.prompt(self.cfg)
        return extract_summary(await summarizer(prompt, job))

    async def _shared_request(self, job: Commission) -> SharedRequest | str:
        """The shared-cache request for `job`, or why it takes the standalone path.

        `auto` shares only where it pays: an Anthropic request that sets a `cache_control`
        breakpoint (OpenAI caches by itself), once the commissioning answer has begun with a
        2xx (an error or a missing answer wrote no cache entry), and when no forced tool choice
        rules out a text answer. `always` shares whenever it can (the model then sees the tool
        outputs even without the discount); it still waits for the answer, bounded.
        """
        model = self.cfg.model
        if model.share_cache == "never":
            return "model.share_cache: never"
        if model.source != "incoming":
            return "model.source: config (another model cannot read this one's cache)"
        if job.forwarded is None:
            return "no forwarded request to share"
        if model.model and model.model != job.model:
            return "model.model names another model than the request's"
        auto = model.share_cache == "auto"
        if (
            auto
            and not DIALECTS[job.dialect].auto_cache
            and b'"cache_control"' not in job.forwarded
        ):
            # A provider that caches only up to a breakpoint (Anthropic): without one the
            # transcript would be billed in full, dearer than the standalone prompt's masked copy.
            return "the request sets no cache_control: nothing was cached"
        began = await job.wait_answer(self.answer_wait)
        if auto and not began:
            return f"the commissioning answer did not begin within {self.answer_wait:g}s"
        status = job.answer_status
        if auto and began and job.began is not None and not (status and 200 <= status < 300):
            return f"the commissioning answer was {status or 'an error'}: nothing was cached"
        shared = functools.partial(
            build,
            job.forwarded,
            job.dialect,
            job.layouts,
            level=self.cfg.summary_level,
            custom_prompt=self.cfg.custom_prompt,
            refuse_forced_tool=auto,
        )
        # The forwarded body is indexed again to build the request: a large one off the loop.
        if len(job.forwarded) > OFF_LOOP_BYTES:
            return await asyncio.to_thread(shared)
        return shared()
