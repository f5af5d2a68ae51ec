"""The addon's side of the usage ledger: what each provider flow's answers reported, booked.

    request hook          `note`      what the request knew (dialect, session, the client's
                                      body as indexed, whether what went upstream differs)
    responseheaders hook  `stream`    a 2xx SSE answer gets a `UsageTap`: it streams on
    response hook         `answered`  the usage of the answer (tapped, or read from the body),
                                      or of every round of an expand continuation, to the ledger
    error hook            `failed`    a cut stream: what it reported before the cut
    SummarizerClient      `summarizer`  each summarizer answer's usage

Every provider flow (routed and host-allowed, whatever the pipeline did with it) is metered.
A missing or malformed usage is skipped and counted (`Stats.usage_reads`), never an error; no
method here raises, so a metering bug can never touch an answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from mitmproxy import http

from cg.billing.ledger import Ledger, Round, Turn
from cg.billing.plan import PlanBook, plan_report
from cg.billing.tap import UNDECODABLE, UsageTap, usage_of_json
from cg.pipeline.rewrite import Record
from cg.proxy.flowstate import Flows
from cg.proxy.message import bounded_content, content, content_type
from cg.proxy.stats import UsageCounts
from cg.wire.answers import Reply, model_of, usage_of
from cg.wire.body import MAX_MESSAGES, BodyIndex, index_body
from cg.wire.dialects import DIALECTS
from cg.wire.splice import SentShape
from cg.wire.usage import Usage, UsageError, from_provider

log = logging.getLogger("context_guru")

SSE = "text/event-stream"


def _ok(status: int) -> bool:
    return 200 <= status < 300


class Meter:
    def __init__(self, counts: UsageCounts, flows: Flows) -> None:
        self.counts = counts
        self.ledger: Ledger | None = None
        self._plans: PlanBook | None = None  # on the ledger's store (`plans`)
        self.flows = flows  # each flow's `turn` and `readable` (`cg.proxy.flowstate`)
        self.max_messages = MAX_MESSAGES  # (the addon's cg_max_messages)
        self.max_body = 32 * 1024 * 1024  # (the addon's cg_max_body_mb, as noted last)
        self._timer: asyncio.TimerHandle | None = None  # commits held bookings (`flush`)

    # -- hooks ------------------------------------------------------------------------------

    def note(
        self,
        flow: http.HTTPFlow,
        record: Record,
        index: BodyIndex | None,
        max_body: int,
        shape: SentShape | None = None,
    ) -> None:
        """The request hook's part: O(1), everything costly waits for the answer. `shape`:
        what a rewritten body is made of (the ledger counts its tokens from it)."""
        raw = flow.request.raw_content
        self.max_body = max_body
        rewritten = record.get("outcome") == "rewritten"
        st = self.flows.begin(flow)
        st.turn = Turn(
            str(record.get("dialect")),
            record.get("session") if isinstance(record.get("session"), str) else None,
            index,
            rewritten,
            flow.request.timestamp_start,
            feed="components" in record,
            shape=shape if rewritten else None,
        )
        if index is None and raw is not None and len(raw) <= max_body and "bound" not in record:
            st.readable = True  # (a body over a bound is not read after the fact either)

    @property
    def turns(self) -> dict[str, Turn]:
        """The turns of the flows in flight, by flow id (a view: the flows' state holds them)."""
        return {st.flow.id: st.turn for st in self.flows if st.turn is not None}

    def stream(self, flow: http.HTTPFlow) -> UsageTap | bool:
        """What `flow.response.stream` becomes for a streamed answer: a tap for a 2xx answer
        of a metered flow, else plain streaming."""
        st = self.flows.get(flow.id)
        turn = st.turn if st is not None else None
        if turn is None or flow.response is None or not _ok(flow.response.status_code):
            return True
        try:
            tap = UsageTap(turn.dialect, flow.response.headers.get("content-encoding", ""))
        except Exception:  # noqa: BLE001 - an unknown dialect: stream without reading
            return True
        if tap.state == UNDECODABLE:
            self.counts.undecodable += 1
        return tap

    def answered(
        self, flow: http.HTTPFlow, record: Record, replies: list[Reply] | None = None
    ) -> None:
        """Book the answer. `replies`: every round of an expand continuation (the first answer
        included), each booked once; else the answer in `flow.response` is read."""
        turn = self._forget(flow.id)
        if turn is None or self.ledger is None or flow.response is None:
            return
        try:
            if replies is not None:
                rounds = [r for r in (self._convert(turn.dialect, usage_of(x), model_of(x))
                          for x in replies) if r is not None]  # fmt: skip
            elif not _ok(flow.response.status_code):
                return  # an error answer reports no usage, and is not billed
            else:
                one = self._read(flow, turn.dialect)
                rounds = [one] if one is not None else []
            if not rounds:
                return
            self._book(flow, record, turn, rounds)
        except Exception as e:  # noqa: BLE001 - metering must never reach the answer
            self.counts.tap_errors += 1
            log.warning("context-guru: reading usage failed: %s", type(e).__name__)

    def failed(self, flow: http.HTTPFlow, record: Record) -> None:
        """The flow errored: a stream cut after it reported usage is booked (and counted
        truncated); anything else is forgotten."""
        turn = self._forget(flow.id)
        resp = flow.response
        tap = resp.stream if resp is not None else None
        if turn is None or self.ledger is None or not isinstance(tap, UsageTap):
            return
        try:
            tap.finish(cut=True)
            self.counts.truncated += 1
            one = self._convert(turn.dialect, tap.result(), tap.model, missing=False)
            if one is not None:
                self._book(flow, record, turn, [one])
        except Exception as e:  # noqa: BLE001
            self.counts.tap_errors += 1
            log.warning("context-guru: reading usage failed: %s", type(e).__name__)

    def late(self, flow: http.HTTPFlow) -> tuple[Turn, str] | None:
        """The flow's turn when its answer will need its body indexed after the fact (a
        bypassed flow: for its session), and the dialect; else None."""
        st = self.flows.get(flow.id)
        turn = st.turn if st is not None else None
        if st is None or turn is None or turn.index is not None or not st.readable:
            return None
        return turn, turn.dialect

    def tried_late(self, flow: http.HTTPFlow) -> None:
        """The flow's body was read after the fact (or that failed): not again on the loop."""
        st = self.flows.get(flow.id)
        if st is not None:
            st.readable = False

    def summarizer(self, session: str, model: str, usage: Usage) -> None:
        """SummarizerClient's `on_usage`: book one summarizer answer."""
        if self.ledger is None:
            return
        try:
            self.ledger.summarizer_call(session, model, usage)
            self.counts.summarizer_read += 1
        except Exception as e:  # noqa: BLE001
            self._unwritten(e)
        self.arm()

    def arm(self) -> None:
        """What the store holds (a booking, a session's clock) is committed within its delay,
        even when no turn follows to do it: one timer at a time, on the running loop (none:
        at once). Called after each booking and each request hook."""
        if self._timer is not None or self.ledger is None:
            return
        store = self.ledger.store
        if not store.held():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        self._timer = loop.call_later(store.batch_delay, self.flush)

    def flush(self) -> None:
        """Commit the bookings the store holds (`cg_store_batch_ms`); the timer's callback.
        A commit that fails is counted, and tried again after another delay."""
        self._timer = None
        if self.ledger is None:
            return
        try:
            self.ledger.store.flush_held()
        except Exception as e:  # noqa: BLE001
            self._unwritten(e)
            with contextlib.suppress(RuntimeError):  # no loop: the next booking tries again
                asyncio.get_running_loop()
                self.arm()

    def plans(self) -> PlanBook:
        """The subscription sessions' book, on the ledger's store (made anew when the store
        is: a changed `cg_db`)."""
        assert self.ledger is not None
        if self._plans is None or self._plans.store is not self.ledger.store:
            self._plans = PlanBook(self.ledger.store)
        return self._plans

    def armed(self) -> bool:
        """Whether a commit of held bookings is scheduled."""
        return self._timer is not None

    def close(self) -> None:
        """At exit: no timer left behind (closing the store commits what it holds)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def report(self, session: str | None = None) -> dict[str, Any]:
        """`usage` and `savings` for `/_cg/stats` (None, with the reason, when unreadable)."""
        if self.ledger is None:
            return {"usage": None, "savings": None}
        try:
            out = self.ledger.report(session)
            plans = plan_report(self.ledger.store, session)
            return {**out, "plans": plans} if plans else out
        except Exception as e:  # noqa: BLE001 - an unreadable store must not break /_cg/stats
            return {"usage": None, "savings": None, "ledger_error": str(e)}

    # -- helpers ----------------------------------------------------------------------------

    def _unwritten(self, e: Exception) -> None:
        self.counts.store_errors += 1
        log.warning("context-guru: the usage ledger could not be written: %s", e)

    def _forget(self, flow_id: str) -> Turn | None:
        """The flow's turn, taken: booked (or dropped) once."""
        st = self.flows.get(flow_id)
        if st is None:
            return None
        turn, st.turn, st.readable = st.turn, None, False
        return turn

    def _read(self, flow: http.HTTPFlow, dialect: str) -> Round | None:
        """The usage of a 2xx answer: from its tap if it streamed, else from its body."""
        assert flow.response is not None
        tap = flow.response.stream
        if tap is True:
            # Streamed by mitmproxy itself (`stream_large_bodies`): nothing was read.
            self.counts.missing += 1
            return None
        if isinstance(tap, UsageTap):
            tap.finish()
        elif content_type(flow.response).startswith(SSE):
            # Read whole (a buffered answer: the expand tool was offered), the same way.
            tap = UsageTap(dialect)
            tap(content(flow.response, strict=False) or b"")
            tap.finish()
        else:
            try:
                raw, model = usage_of_json(content(flow.response, strict=False) or b"", dialect)
            except ValueError:
                self.counts.malformed += 1
                return None
            return self._convert(dialect, raw, model)
        if tap.state != "reading":
            if tap.state != UNDECODABLE:
                self.counts.tap_errors += 1
            return None
        self.counts.malformed += tap.malformed
        if tap.truncated:
            self.counts.truncated += 1
        return self._convert(dialect, tap.result(), tap.model, missing=not tap.truncated)

    def _convert(self, dialect: str, raw: Any, model: Any, missing: bool = True) -> Round | None:
        if raw is None:
            if missing:
                self.counts.missing += 1
            return None
        try:
            usage = from_provider(dialect, raw)
        except UsageError:
            self.counts.malformed += 1
            return None
        return Round(usage, model if isinstance(model, str) and model else None)

    def _book(self, flow: http.HTTPFlow, record: Record, turn: Turn, rounds: list[Round]) -> None:
        assert self.ledger is not None
        if record.get("outcome") == "retried_original":
            turn.rewritten = False  # the client's own bytes were what got billed
        st = self.flows.get(flow.id)
        if turn.index is None and st is not None and st.readable:
            turn.index = late_index(flow, turn.dialect, self.max_body, self.max_messages)
        sent = content(flow.request, strict=False) if turn.rewritten else None
        try:
            session = self.ledger.agent_turn(turn, rounds, flow.request.headers, sent)
        except Exception as e:  # noqa: BLE001
            self._unwritten(e)
            return
        if flow.response is not None:
            try:  # a subscription session labelled, with its plan's rate-limit readings
                self.plans().book(session, flow.request.path, flow.request.headers,
                                  flow.response.headers)  # fmt: skip
            except Exception as e:  # noqa: BLE001
                self._unwritten(e)
        self.arm()
        self.counts.read += len(rounds)
        total = rounds[0].usage  # (one round but for an expand continuation)
        for r in rounds[1:]:
            total = total + r.usage
        record["ledger"] = {"session": session, "rounds": len(rounds), "usage": total.to_json()}


def late_index(
    flow: http.HTTPFlow, dialect: str, max_body: int, max_messages: int
) -> BodyIndex | None:
    """The client's body indexed after the fact (a bypassed flow), within the bounds the
    request path keeps (decoded size, messages); None if it cannot be."""
    try:
        raw = bounded_content(flow.request, max_body)
        return index_body(raw, DIALECTS[dialect], max_messages=max_messages) if raw else None
    except (ValueError, KeyError):  # (BodyRejected, TooLarge and Undecodable are ValueErrors)
        return None
