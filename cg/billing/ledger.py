"""The usage ledger (docs/behaviour.md#usage-cost-and-savings): what each session was billed, and
what it would have been billed had nothing been rewritten.

Per provider answer the addon hands over one `Turn` (what the request hook knew) and the usage
of every round the turn took (one, or several after an expand continuation). The ledger adds,
in one store transaction:

- `agent` rows: every round's usage as the provider reported it, under the answer's model and
  price tier;
- `estimate` rows (what the turn would have cost unrewritten): for a turn sent as the client
  sent it, its own billed usage; for a rewritten turn, the ORIGINAL request priced under the
  prompt-cache model (`cg.billing.cache`) — a per-session `PromptCache` fed with the original
  requests' shapes in order (every turn feeds it, rewritten or not), its buckets scaled by
  (the provider's prompt tokens of the sent request / our token count of the sent request) so
  the estimate is in the provider's tokens, and output = the turn's actual output (the final
  round's);
- the turn counters: turns, rewritten turns, `tokens_not_sent` (our count of the original minus
  the sent request, over rewritten turns), rewritten turns whose estimate could not be made.

The summarizer's own calls are `summarizer` rows. The per-session caches live in memory (an LRU
of `max_sessions`) and their few live entries are stored with every turn, so a restarted proxy
resumes the model where it stood instead of presuming a cold cache (which would fake savings).
Nothing here holds a header or a credential: headers are read for the session id only.
"""

from __future__ import annotations

import functools
import heapq
import json
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cg.billing.cache import Prompt, PromptCache, prompt_of
from cg.billing.prices import PriceTable
from cg.billing.savings import report, rows_cost
from cg.billing.tally import Tally
from cg.frozen import frozen
from cg.state import NO_TURNS, LedgerTurns, Store, UsageRow
from cg.state.facts import FactsCache
from cg.state.session import session_of, valid_session_id
from cg.wire.body import BodyIndex, BodyRejected, MessageCache, index_body
from cg.wire.dialects import DIALECTS
from cg.wire.splice import Edit, Insert, Keep, SentShape
from cg.wire.usage import Usage

HISTORY_TURNS = 200  # per session, for the dashboard's chart (memory only)
# A chart point: the turn's time, whether it was rewritten, its ledger rows, and the cost of the
# summarizer calls booked since the session's turn before (None: one was unpriced).
_Point = tuple[float, bool, list[tuple[str, str, str, Usage]], float | None]
UNKNOWN_MODEL = "unknown"
UNIDENTIFIED = "unidentified"  # a flow whose body could not be read to find its session
# Made once, not per answer booked (both are frozen).
_ONE_TURN = LedgerTurns(turns=1)
_NO_USAGE = Usage()
STATE_ENTRIES = 64  # cache entries stored per session: the newest prefixes are what the next
# request can hit


@dataclass(slots=True)
class Turn:
    """What the request hook knew about one provider flow, kept for the flow's life only.

    `index` is the client's request as indexed (None when it was not: too large, streamed,
    undecodable); `rewritten` whether the bytes sent differ from the client's; `at` the
    request's timestamp (orders the prompt-cache model); `feed` whether an unchanged turn feeds
    the session's modelled cache (False where no pipeline ran, as under `off`: nothing there is
    ever rewritten, and a cold session's first shape would cost a full tokenisation)."""

    dialect: str
    session: str | None
    index: BodyIndex | None
    rewritten: bool
    at: float
    feed: bool = True
    shape: SentShape | None = None  # a rewritten turn's: what the body sent is made of


@frozen
class Round:
    """One answer's usage, read and converted, and the model the answer names (or None)."""

    usage: Usage
    model: str | None = None


def request_model(index: BodyIndex | None) -> str | None:
    m = index.model if index is not None else None
    return m if isinstance(m, str) else None


def _answered_model(rounds: list[Round]) -> str | None:
    """The first model an answer named (a loop: cheaper than `next` of a generator)."""
    for r in rounds:
        if r.model:
            return r.model
    return None


class Ledger:
    def __init__(
        self,
        store: Store,
        prices: PriceTable,
        facts: FactsCache,
        max_sessions: int = 256,
        sent_bodies: int = 16,
    ) -> None:
        self.store = store
        self.prices = prices
        self.facts = facts
        self.max_sessions = max_sessions
        self._caches: OrderedDict[str, PromptCache] = OrderedDict()
        # The dashboard's chart: each session's latest turns, in memory only (this process's
        # turns; the ledger's sums are what persists). Priced by `chart`.
        self.history: OrderedDict[str, deque[_Point]] = OrderedDict()
        self._summarizer_due: dict[str, float | None] = {}
        # The bodies sent upstream, apart from the addon's cache of client bodies (which the
        # next turn is matched against): a rewritten session's next sent body repeats its
        # head, summary and tail, so it is indexed from the previous one's bytes.
        self._sent = MessageCache(max_lists=sent_bodies)  # the addon's `cg_warm_sessions`
        self.tally = Tally()  # this process's bookings (the runtime gives its own, kept)

    # -- writing --------------------------------------------------------------------------

    def agent_turn(
        self,
        turn: Turn,
        rounds: list[Round],
        headers: Mapping[str, str],
        sent: bytes | None = None,
    ) -> str:
        """Record one agent turn; `sent` is the body that went upstream when it differs from
        the client's (a rewritten turn). Returns the session it was booked under. Raises on a
        store error (the caller counts it)."""
        session = self.session_of(turn, headers)
        model = _answered_model(rounds) or request_model(turn.index) or UNKNOWN_MODEL
        rows: list[tuple[str, str, str, Usage]] = [
            ("agent", model, self._tier(model, r.usage), r.usage) for r in rounds
        ]
        counters = _ONE_TURN if rounds else NO_TURNS
        modelled_turn = turn.index is not None and (turn.rewritten or turn.feed)
        cache = self._cache(session) if modelled_turn else None
        original: Prompt | None = None
        modelled = _NO_USAGE
        if cache is not None and turn.index is not None:
            original = prompt_of(turn.index, self.facts)
            modelled = cache.bill(original, turn.at)
        if not turn.rewritten:
            rows += [("estimate", m, t, u) for _, m, t, u in rows]
        else:
            est = None
            sent_tokens = self._sent_tokens(turn, sent)
            if original is not None and sent_tokens and rounds:
                first, last = rounds[0].usage, rounds[-1].usage
                k = first.prompt_tokens / sent_tokens
                s = modelled.scaled(k)
                est = Usage(
                    s.input_tokens, s.cache_write_tokens, s.cache_write_1h_tokens,
                    s.cache_read_tokens, last.output_tokens, 1,
                )  # fmt: skip
                rows.append(("estimate", model, self._tier(model, est), est))
            counters = LedgerTurns(
                turns=counters.turns,
                rewritten=1,
                tokens_not_sent=(original.tokens - sent_tokens)
                if original is not None and sent_tokens
                else 0,
                estimate_skipped=0 if est is not None else 1,
            )
        # Written when committed (the newest of a batch is all that is kept), not every answer.
        state = functools.partial(_dump, cache, turn.at) if cache is not None else None
        self.store.record_usage(session, rows, counters, state)
        self.tally.add(rows, counters)
        self._remember(session, turn, rows)
        return session

    def _remember(self, session: str, turn: Turn, rows: list[tuple[str, str, str, Usage]]) -> None:
        """One point of the dashboard's chart, priced when the chart is read (`chart`): the
        pricing was a tenth of the ledger's work per answer, for a page seldom open."""
        summ = self._summarizer_due.pop(session, 0.0)
        points = self.history.pop(session, None) or deque(maxlen=HISTORY_TURNS)
        self.history[session] = points
        while len(self.history) > self.max_sessions:
            self.history.popitem(last=False)
        points.append((turn.at, turn.rewritten, rows, summ))

    def chart(self, session: str | None = None) -> dict[str, list[dict[str, Any]]]:
        """Each session's latest turns (one session's, when given): what each was billed (with
        the summarizer calls since the turn before) and, ESTIMATE, what it would have been
        unrewritten."""
        return chart_of(self.history_copy(None if session is None else [session]), self.prices)

    def history_copy(self, sessions: Iterable[str] | None = None) -> dict[str, list[_Point]]:
        """The chart's points as they stand (those of `sessions`, when given), copied: the event
        loop appends to them while the dashboard prices them in a worker thread
        (`chart_of`)."""
        if sessions is None:
            return {sid: list(points) for sid, points in self.history.items()}
        found = ((sid, self.history.get(sid)) for sid in sessions)
        return {sid: list(points) for sid, points in found if points is not None}

    def summarizer_call(self, session: str, model: str, usage: Usage) -> None:
        """Record one summarizer answer's usage (SummarizerClient's `on_usage`)."""
        model = model or UNKNOWN_MODEL
        tier = self._tier(model, usage)
        self.store.record_usage(session, [("summarizer", model, tier, usage)])
        self.tally.add([("summarizer", model, tier, usage)])
        cost = self.prices.cost(model, usage, tier)
        due = self._summarizer_due.get(session, 0.0)
        self._summarizer_due[session] = None if cost is None or due is None else due + cost

    # -- reading --------------------------------------------------------------------------

    def report(self, session: str | None = None) -> dict[str, Any]:
        """`{"usage": {agent, summarizer}, "savings": {…}}` over the whole ledger or one
        session's rows."""
        return report(self.store, self.prices, session)

    # -- helpers --------------------------------------------------------------------------

    def session_of(self, turn: Turn, headers: Mapping[str, str]) -> str:
        if turn.session:
            return turn.session
        if turn.index is not None:
            return session_of(headers, turn.index).id
        for name in ("x-context-guru-session", "x-claude-code-session-id"):
            v = (headers.get(name) or "").strip()
            if valid_session_id(v):
                return v
        return UNIDENTIFIED

    def _tier(self, model: str, u: Usage) -> str:
        return self.prices.tier(model, u.prompt_tokens)

    def _sent_tokens(self, turn: Turn, sent: bytes | None) -> int:
        """Our token count of the body that went upstream (`_tokens` of it), from the client's
        index and what the rewrite made of it (`turn.shape`): the kept messages' memoised
        facts, the summary's, and the prelude's with the expand tool in it. Indexing the sent
        body again to count it was ~3% of the addon's CPU on a reuse turn under load. Without
        a shape, or with a message cut (rare: counted on the message as cut), it is indexed."""
        shape, index = turn.shape, turn.index
        if shape is not None and index is not None:
            try:
                counted = self._shape_tokens(index, shape)
            except Exception:  # noqa: BLE001 - a shape not as expected: count the bytes sent
                counted = None
            if counted is not None:
                return counted
        return self._tokens(turn.dialect, sent)

    def _shape_tokens(self, index: BodyIndex, shape: SentShape) -> int | None:
        """`_sent_tokens` from the shape, or None when a message was cut."""
        facts = self.facts.all(index)
        total = self.facts.prelude(index).tokens + self._tool_tokens(index, shape.tool)
        for p in shape.plan:
            if isinstance(p, Keep):
                total += facts[p.index].tokens
            elif isinstance(p, Insert | Edit):  # the summary, a masked message: as written
                total += self.facts.written(p.json, p.view).tokens
            else:
                return None
        return total

    def _tool_tokens(self, index: BodyIndex, tool: tuple[int, bytes] | None) -> int:
        """What the expand tool adds to the prelude's token count: the `tools` array counted
        with it and without (`FactsCache.prelude` counts each member's text), or the new
        `tools` member's array. Memoised on the index, which a warm next turn inherits (its
        bytes outside the messages are these)."""
        if tool is None:
            return 0
        at, part = tool
        tools = index.members.get("tools")
        start = index.byte_offset(tools.start) if tools is not None else at
        key = (part, at - start)
        owner, known = index.memo.tool_tokens
        if owner is self.facts and known is not None and known[0] == key:
            return int(known[1])
        count = self.facts.tokens.count_text
        if tools is None:  # a new member, `,"tools":[...]`: its value is the array
            added = count(part[part.index(b"[") :].decode())
        else:
            was = index.raw[start : index.byte_offset(tools.end)]
            if not 0 < at - start < len(was):
                raise ValueError(f"the tool's place {at} is not inside the tools array")
            now = was[: at - start] + part + was[at - start :]
            added = count(now.decode()) - count(was.decode())
        index.memo.tool_tokens = (self.facts, (key, added))
        return added

    def _tokens(self, dialect: str, body: bytes | None) -> int:
        """Our token count of a request body (the prompt-cache shape's total), 0 if unreadable.
        Indexed on the ledger's own message cache of sent bodies, never the addon's: a
        rewritten body must not replace the client's message list that the next turn is
        matched against."""
        if not body:
            return 0
        try:
            return prompt_of(index_body(body, DIALECTS[dialect], self._sent), self.facts).tokens
        except (BodyRejected, KeyError):
            return 0

    def _cache(self, session: str) -> PromptCache:
        cache = self._caches.get(session)
        if cache is not None:
            self._caches.move_to_end(session)
            return cache
        cache = _load(self.store.cache_state(session))
        self._caches[session] = cache
        while len(self._caches) > self.max_sessions:
            self._caches.popitem(last=False)  # its state is in the store already
        return cache


def chart_of(
    history: Mapping[str, Sequence[_Point]],
    prices: PriceTable,
    sessions: Iterable[str] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """The chart's points priced (`Ledger.history_copy`): every session's, or those named, in
    that order."""
    order = list(history) if sessions is None else [s for s in sessions if s in history]
    return {sid: [_priced(sid, p, prices) for p in history[sid]] for sid in order}


def _priced(session: str, point: _Point, prices: PriceTable) -> dict[str, Any]:
    at, rewritten, rows, summ = point
    ledger = [UsageRow(session, *row) for row in rows]
    billed = rows_cost((r for r in ledger if r.kind == "agent"), prices)
    without = rows_cost((r for r in ledger if r.kind == "estimate"), prices)
    if billed is not None:
        billed = None if summ is None else billed + summ
    return {
        "at": at,
        "rewritten": rewritten,
        "billed_usd": billed,
        "without_rewrite_usd": without,
        "summarizer_usd": summ,
    }


def _dump(cache: PromptCache, now: float) -> str:
    """The cache's newest live entries as JSON: the latest expiry first, and among equals the
    latest written (the longest prefixes of the last request)."""
    live = [(k, e) for k, e in cache.entries.items() if e[0] > now]
    if len(live) > STATE_ENTRIES:
        # The newest by (expiry, place), compared as tuples in C: an OpenAI session holds an
        # entry per message, and a sort keyed by a Python lambda is slower.
        exps = [e[0] for _, e in live]
        top = heapq.nlargest(STATE_ENTRIES, zip(exps, range(len(live)), strict=True))
        live = [live[i] for i in sorted(i for _, i in top)]
    return json.dumps({"v": 1, "entries": [[k.hex(), exp, ttl] for k, (exp, ttl) in live]})


def _load(state: str | None) -> PromptCache:
    """A cache from stored state; an unreadable state is an empty (cold) cache."""
    cache = PromptCache()
    if not state:
        return cache
    try:
        doc = json.loads(state)
        for key, exp, ttl in doc.get("entries", []):
            cache.entries[bytes.fromhex(key)] = (float(exp), float(ttl))
    except (ValueError, TypeError, AttributeError):
        cache.entries.clear()
    return cache
