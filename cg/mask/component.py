"""The `mask` component: decide per request; stash, checkpoint and edit in one step.

Per request the decision is one of

    pass    nothing masked (the reason says why: too few rounds, too little to mask, the
            trigger did not fire, the store does not persist)
    reuse   the conversation's checkpoint, whose covered prefix is intact, re-applied: every
            stub it lists put back byte for byte (the provider's prompt cache stays warm)
    roll    the outputs older than the last `keep_last_rounds` rounds that are not masked yet
            hold more than `remask_tokens`: they are masked together, in one step, beside the
            stubs already there (which keep their bytes, so the cached prefix up to the first
            new stub stays valid)

A roll writes its stash (the masked messages' original sources) and then the checkpoint
synchronously, here in `apply`, before the plan that carries their ids is returned: an id never
reaches the wire before its stash is in the store, and a store that refuses the write means no
stub this turn. Why not commission it off the hot path as `summarize` does: masking calls no
model, so there is nothing to wait for, and the commission machinery is a summary's (the runner
keeps one job per session, so a mask job and a summary job of one conversation would displace
each other; the jobs are counted and logged as summaries; offline callers such as the simulator
run only summary jobs). A roll costs one stash and one checkpoint write, every
`remask_tokens`; a reuse turn reads the checkpoint and asks that its stashes exist.

The checkpoint is `cg.state`'s record under the conversation's key with a `~mask` suffix: its
covered prefix (`covered_count` messages from the first, hashed as summarize hashes its own),
the newest stash's key, and in `meta` every masked output (message, output, stash key, N, the
stub). A prefix that no longer hashes the same (edited history, the agent's own compaction)
invalidates it. A stash the store lost is written again from the request, which still carries
every original; so a stub's id always resolves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cg.mask.config import MaskConfig
from cg.mask.outputs import Call, Scan, scans
from cg.mask.stub import stub
from cg.pipeline.contract import RequestContext, Step
from cg.state import Checkpoint, Store, StoreError, stash_key
from cg.state.facts import FactsCache, MessageFacts
from cg.state.records import span_bytes
from cg.state.session import header
from cg.state.tokens import TokenCounter
from cg.summarize.component import conversation_key, prefix_hash
from cg.summarize.triggers import (
    CACHE_TTL_DEFAULT,
    RequestFacts,
    WindowTable,
    evaluate,
    resolve_window,
    shipped_windows,
)
from cg.wire.body import BodyIndex
from cg.wire.dialects import MessageView
from cg.wire.reply import dumps
from cg.wire.splice import Edit, Plan, identity, is_identity

SUFFIX = "~mask"  # a mask checkpoint's key: the conversation's key and this
META_VERSION = 1
CHECKPOINTS_MAX = 256  # conversations whose checkpoint's list a component remembers


@dataclass(frozen=True, slots=True, order=True)
class Masked:
    """One masked output: output `k` of message `at`, stashed as message `n` of stash `key`,
    shown as `stub`."""

    at: int
    k: int
    key: str
    n: int
    stub: str

    def to_json(self) -> list[Any]:
        return [self.at, self.k, self.key, self.n, self.stub]


def tool_rounds(views: Sequence[MessageView]) -> list[int]:
    """Where each tool round begins: a round is a run of consecutive messages (items) that
    carry tool outputs (an Anthropic user message of `tool_result` blocks, OpenAI's `tool`
    messages after one assistant turn, Responses output items after their calls: parallel
    calls are one round)."""
    starts: list[int] = []
    before = False
    for i, v in enumerate(views):
        here = bool(v.tool_result_ids)
        if here and not before:
            starts.append(i)
        before = here
    return starts


def mask_key(session: str, first: bytes, tenant: str) -> str:
    """The mask checkpoint's key of a conversation (beside its summary's)."""
    return conversation_key(session, first, tenant) + SUFFIX


class Mask:
    name = "mask"

    def __init__(
        self,
        cfg: MaskConfig,
        store: Store,
        tokens: TokenCounter,
        model_windows: Mapping[str, int] | None = None,
        table: WindowTable | None = None,
        facts: FactsCache | None = None,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.tokens = tokens
        self.model_windows = dict(model_windows or {})
        self.table = table or shipped_windows()
        self.facts = facts or FactsCache(tokens)
        self.facts.backing = store
        # Each conversation's checkpoint as last read: its mark and masked outputs.
        self._read: dict[str, tuple[tuple[str, float, str | None], list[Masked] | None]] = {}
        self._counted: tuple[Sequence[Masked], int] | None = None

    def invalidate(self, req: RequestContext) -> str | None:
        """The agent is compacting this conversation itself: the masked prefix is gone."""
        if not req.index.messages:
            return None
        key = mask_key(req.session, self.facts.of(req.index, 0).digest, req.tenant)
        return f"checkpoint of {key}" if self.store.delete_checkpoint(key) else None

    def apply(self, req: RequestContext, plan: Plan) -> Step:
        index = req.index
        n = len(index.messages)
        if not is_identity(plan, n):
            return Step(None, "mask runs first: an earlier component changed the plan")
        if not n:
            return Step(None, "no messages")
        if not self.store.persistent:
            return Step(None, "the store does not persist: a masked output could not come back")
        stats = self.facts.all(index)
        found = scans(index)
        conv = mask_key(req.session, stats[0].digest, req.tenant)
        rounds = tool_rounds(index.views)
        keep = self.cfg.keep_last_rounds
        boundary = n if keep == 0 else (rounds[-keep] if len(rounds) >= keep else 0)
        detail: dict[str, Any] = {"conversation": conv, "rounds": len(rounds), "before": boundary}

        masked, ce = self._checkpoint(index, stats, found, conv, req.tenant, detail)
        done = {(m.at, m.k) for m in masked}
        floor = self.cfg.min_output_tokens
        pending = [
            (i, k)
            for i in range(boundary)
            for k, o in enumerate(found[i].outputs)
            if o.why_not is None
            and not o.breakpoint
            and (i, k) not in done
            and _tokens(stats[i], k) >= max(floor, 1)
        ]
        waiting = sum(_tokens(stats[i], k) for i, k in pending)
        detail["unmasked_tokens"] = waiting
        reason = "reused the masked prefix" if masked else "nothing masked"
        if waiting > self.cfg.remask_tokens:
            fire = True
            if not masked:
                trig = evaluate(self.cfg, self._facts(index, req, stats))
                detail["trigger"] = trig.to_json()
                fire = trig.fire
                if not fire:
                    reason = "trigger did not fire"
            if fire:
                rolled = self._roll(index, req, conv, stats, found, pending, masked, ce)
                if isinstance(rolled, str):
                    detail["stash"] = rolled
                    if not masked:
                        return Step(None, f"nothing masked: {rolled}", detail)
                else:
                    added = len(rolled) - len(masked)
                    masked = rolled
                    detail["checkpoint"] = "rolled forward" if done else "first mask"
                    reason = f"masked {added} more tool output{'s' if added != 1 else ''}"
        elif not masked:
            reason = (
                f"nothing masked: {waiting} tokens of old tool outputs <= remask_tokens"
                if pending
                else f"nothing to mask before the last {keep} tool rounds"
            )
        if not masked:
            return Step(None, reason, detail)
        if detail.get("checkpoint") is None:
            detail["checkpoint"] = "reused"
        try:
            restored = self._restore(index, req, masked)
        except (StoreError, ValueError) as e:
            return Step(None, f"the masked outputs' stashes cannot be checked: {e}", detail)
        if restored:
            detail["stash"] = f"written again: {', '.join(restored)}"
        # An output the client now marks with a breakpoint goes as it came while it does.
        shown = [m for m in masked if not found[m.at].outputs[m.k].breakpoint]
        if len(shown) < len(masked):
            detail["breakpoint"] = f"{len(masked) - len(shown)} masked outputs sent whole"
            masked = shown
        out = self._plan(index, found, masked)
        saved = sum(_tokens(stats[m.at], m.k) for m in masked) - self._stub_tokens(masked)
        tokens = sum(f.tokens for f in stats) + self.facts.prelude(index).tokens
        detail.update(
            masked=len(masked),
            messages=len({m.at for m in masked}),
            tokens_saved=saved,
            tokens=tokens,
            tokens_after=tokens - saved,
            keys=sorted({m.key for m in masked}),
        )
        return Step(out, reason, detail)

    # -- the checkpoint ----------------------------------------------------------------------

    def _checkpoint(
        self,
        index: BodyIndex,
        stats: Sequence[MessageFacts],
        found: Sequence[Scan],
        conv: str,
        tenant: str,
        detail: dict[str, Any],
    ) -> tuple[list[Masked], int]:
        """The outputs the conversation's checkpoint masks and the prefix it covers, or
        ([], 0) with none (a diverged one is deleted)."""
        cp = self.store.get_checkpoint(conv, tenant)
        if cp is None:
            return [], 0
        ce = cp.covered_count
        masked = self._entries(cp)
        intact = (
            masked is not None
            and ce <= len(stats)
            and prefix_hash([f.digest for f in stats[:ce]]) == cp.covered_hash
            and all(
                m.at < ce
                and m.k < len(found[m.at].outputs)
                and found[m.at].outputs[m.k].why_not is None
                for m in masked
            )
        )
        if not intact or masked is None:
            self.store.delete_checkpoint(conv)
            detail["diverged"] = "the covered prefix changed: checkpoint invalidated"
            return [], 0
        return masked, ce

    def _entries(self, cp: Checkpoint) -> list[Masked] | None:
        """`_entries` of a checkpoint's `meta`, remembered per checkpoint as written (a reuse
        turn reads the same one; a long session's list is thousands of rows)."""
        mark = (cp.covered_hash, cp.updated, cp.key)
        known = self._read.get(cp.session)
        if known is not None and known[0] == mark:
            return known[1]
        masked = _entries(cp.meta)
        if len(self._read) >= CHECKPOINTS_MAX:
            self._read.clear()
        self._read[cp.session] = (mark, masked)
        return masked

    def _roll(
        self,
        index: BodyIndex,
        req: RequestContext,
        conv: str,
        stats: Sequence[MessageFacts],
        found: Sequence[Scan],
        pending: Sequence[tuple[int, int]],
        masked: Sequence[Masked],
        ce: int,
    ) -> list[Masked] | str:
        """Mask `pending` beside `masked`: their messages stashed, then the checkpoint written.
        The new list, or why nothing was written (the old checkpoint stands)."""
        at = sorted({i for i, _ in pending})
        bound = self.store.max_stash_bytes
        while at and len(span_bytes([index.source(i) for i in at])) > bound:
            at.pop()  # the newest wait for the next turn's stash
        if not at:
            return f"one message's outputs are over the stash bound ({bound} bytes)"
        sources = [index.source(i) for i in at]
        key = stash_key(sources)
        n_of = {i: n for n, i in enumerate(at, 1)}
        calls = _calls(found)
        new = [
            Masked(i, k, key, n_of[i], stub(calls.get(o.call), o, key, n_of[i]))
            for i, k in pending
            if i in n_of and (o := found[i].outputs[k])
        ]
        entries = sorted([*masked, *new])
        end = max(ce, at[-1] + 1)
        try:
            self.store.put_stash(key, req.session, sources, index.dialect.name, req.tenant)
            self.store.put_checkpoint(
                Checkpoint(
                    session=conv,
                    summary="",
                    head_count=0,
                    covered_count=end,
                    covered_hash=prefix_hash([f.digest for f in stats[:end]]),
                    key=key,
                    message="",
                    meta={"v": META_VERSION, "masked": [m.to_json() for m in entries]},
                    tenant=req.tenant,
                )
            )
        except (StoreError, ValueError) as e:
            return f"not written ({type(e).__name__}: {e})"
        return entries

    def _restore(
        self, index: BodyIndex, req: RequestContext, masked: Sequence[Masked]
    ) -> list[str]:
        """Every stash the stubs name, written again from this request where the store lost
        it (evicted, expired): the request still carries each original. The keys written."""
        by_key: dict[str, dict[int, int]] = {}
        for m in masked:
            by_key.setdefault(m.key, {})[m.n] = m.at
        out: list[str] = []
        for key, at in by_key.items():
            if self.store.has_stash(key, req.session, req.tenant):
                continue
            if sorted(at) != list(range(1, len(at) + 1)):
                raise ValueError(f"stash {key} cannot be rebuilt: not every message is masked")
            sources = [index.source(at[n]) for n in sorted(at)]
            self.store.put_stash(key, req.session, sources, index.dialect.name, req.tenant)
            out.append(key)
        return out

    # -- the plan ----------------------------------------------------------------------------

    def _plan(self, index: BodyIndex, found: Sequence[Scan], masked: Sequence[Masked]) -> Plan:
        """One piece per message: kept, or edited with its stubs in place of its outputs."""
        by_at: dict[int, list[Masked]] = {}
        for m in masked:
            by_at.setdefault(m.at, []).append(m)
        plan: Plan = list(identity(len(index.messages)))
        for i, ms in by_at.items():
            scan = found[i]
            want = tuple((m.k, m.stub) for m in sorted(ms))
            edit = scan.edits.get(want)
            if edit is None:
                values = [
                    (scan.outputs[k].start, scan.outputs[k].end, dumps(text)) for k, text in want
                ]
                edit = Edit.of(index, i, values)
                scan.edits[want] = edit
            plan[i] = edit
        return plan

    def _stub_tokens(self, masked: Sequence[Masked]) -> int:
        """The stubs' tokens, remembered for the list last counted (a reuse turn's is the
        same list)."""
        known = self._counted
        if known is not None and known[0] is masked:
            return known[1]
        n = sum(self.tokens.count_text(m.stub) for m in masked)
        self._counted = (masked, n)
        return n

    def _facts(
        self, index: BodyIndex, req: RequestContext, stats: Sequence[MessageFacts]
    ) -> RequestFacts:
        """What the trigger reads of this request (its first mask only)."""
        outputs = [t for f in stats for t in f.outputs]
        model = index.model
        return RequestFacts(
            messages=len(stats),
            request_tokens=sum(f.tokens for f in stats) + self.facts.prelude(index).tokens,
            output_tokens=sum(outputs),
            max_output_tokens=max(outputs, default=0),
            window=resolve_window(
                model, header(req.headers, "anthropic-beta") or "", self.model_windows, self.table
            ),
            last_request=None,
            now=req.now,
            ttl=CACHE_TTL_DEFAULT,
        )


def _tokens(facts: MessageFacts, k: int) -> int:
    return facts.outputs[k] if k < len(facts.outputs) else 0


def _calls(found: Sequence[Scan]) -> dict[str, Call]:
    return {c.id: c for s in found for c in s.calls}


def _entries(meta: Mapping[str, Any]) -> list[Masked] | None:
    """A checkpoint's masked outputs, or None when its `meta` is not a mask's."""
    rows = meta.get("masked")
    if meta.get("v") != META_VERSION or not isinstance(rows, list):
        return None
    out: list[Masked] = []
    for r in rows:
        if not (
            isinstance(r, list)
            and len(r) == 5
            and all(isinstance(x, int) and not isinstance(x, bool) for x in (r[0], r[1], r[3]))
            and isinstance(r[2], str)
            and isinstance(r[4], str)
        ):
            return None
        out.append(Masked(r[0], r[1], r[2], r[3], r[4]))
    return sorted(out)
