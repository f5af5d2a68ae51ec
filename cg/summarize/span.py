"""Where the summary goes: `[head | span | tail]`, and orphaned tool results after the splice.

The head retreats and the tail moves so that no tool exchange is split across a boundary and the
user-role summary never follows a mid-array system message (docs/behaviour.md#summarize-the-span).
Orphan repair (docs/behaviour.md#summarize-orphaned-tool-results) is the safety net behind those
rules: it cuts a tool result whose call is gone, block by block, and never invents a placeholder.

Responses items (`_select_items`): the leading system items (developer/system messages, an
`additional_tools` item among them) are always kept and `keep_first` counts after them; no
boundary falls where it would separate a call from its output (by `call_id`, parallel calls and
their outputs included) or a `reasoning` item from the item after it; an `additional_tools`
item is never summarized.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cg.wire.body import BodyIndex
from cg.wire.dialects import MessageView
from cg.wire.dialects.base import Pairing
from cg.wire.splice import Cut, Edit, Keep, Piece, Plan, cut_edit, plan_views


@dataclass(frozen=True, slots=True)
class Span:
    """`messages[:head]` kept, `messages[head:end]` summarized, `messages[end:]` kept."""

    head: int
    end: int


def _is_result(v: MessageView) -> bool:
    return bool(v.tool_result_ids) and v.role in ("user", "tool")


def select_span(
    views: Sequence[MessageView], keep_first: int, keep_last: int, pairing: Pairing = "run"
) -> Span | str:
    """The span to summarize, or the reason there is none. `pairing` is the dialect's
    (`Dialect.pairing`): items that pair by id (the Responses API) follow `_select_items`."""
    n = len(views)
    if keep_first < 0 or keep_last < 0:
        raise ValueError("keep_first and keep_last must be >= 0")
    if pairing == "id":
        return _select_items(views, keep_first, keep_last)
    if n <= keep_first + keep_last:
        return f"transcript of {n} messages is within keep_first + keep_last"
    head = keep_first
    # A loop: consecutive tool-calling assistant messages are malformed input, and each would
    # emit an unanswered call; a mid-array system message must not be followed by the summary;
    # and a head ending inside a run of OpenAI `tool` messages would cut the rest of the run
    # (its parallel calls' answers) away from the call the head keeps.
    while head > 0 and (
        views[head - 1].calls_tools
        or (head - 1 > 0 and views[head - 1].is_system)
        or (_is_result(views[head - 1]) and _is_result(views[head]))
    ):
        head -= 1
    end = n - keep_last
    advanced = end
    while advanced < n and _is_result(views[advanced]):
        advanced += 1
    if advanced < n or keep_last == 0:
        end = advanced
    else:
        # Advancing would leave no tail at all (the latest turn is a tool result): keep the
        # latest exchange whole in the tail instead, by starting the tail at its call.
        while end > head and _is_result(views[end]):
            end -= 1
    if end <= head:
        return "no span between head and tail"
    return Span(head, end)


def leading_system(views: Sequence[MessageView]) -> int:
    """How many items open the list as its system prompt: developer/system messages and an
    `additional_tools` item among them."""
    n = 0
    while n < len(views) and views[n].is_system:
        n += 1
    return n


def crossings(views: Sequence[MessageView]) -> list[bool]:
    """`out[p]`: a cut before item p (between p - 1 and p, p = 0..len) would split a call from
    its output (an unanswered call reaches to the end) or a reasoning item from its successor."""
    n = len(views)
    answered: dict[str, list[int]] = {}
    for i, v in enumerate(views):
        for t in v.tool_result_ids:
            answered.setdefault(t, []).append(i)
    diff = [0] * (n + 2)
    for c, v in enumerate(views):
        for t in v.tool_call_ids:
            a = next((i for i in answered.get(t, ()) if i > c), n)
            diff[c + 1] += 1
            diff[a + 1] -= 1
    out: list[bool] = []
    open_ = 0
    for p in range(n + 1):
        open_ += diff[p]
        out.append(open_ > 0 or (p > 0 and views[p - 1].binds_next))
    return out


def _select_items(views: Sequence[MessageView], keep_first: int, keep_last: int) -> Span | str:
    """The span of a Responses `input`: `keep_first` counts after the leading system items
    (the system prompt is never summarized); each boundary moves off any cut that would split a
    call from its output or a reasoning item from its successor (the head back, the tail on);
    a span holding an `additional_tools` item is refused."""
    n = len(views)
    lead = leading_system(views)
    if n <= lead + keep_first + keep_last:
        return (
            f"transcript of {n} items is within its {lead} leading system items + keep_first "
            "+ keep_last"
        )
    cross = crossings(views)
    head = lead + keep_first
    while head > lead and cross[head]:
        head -= 1
    end = n - keep_last
    advanced = end
    while advanced < n and cross[advanced]:
        advanced += 1
    if advanced < n or keep_last == 0:
        end = advanced
    else:
        # Advancing would leave no tail: keep the latest exchange whole in the tail instead.
        while end > head and cross[end]:
            end -= 1
    if end <= head:
        return "no span between head and tail"
    pinned = next((i for i in range(head, end) if views[i].pinned), None)
    if pinned is not None:
        return f"input[{pinned}] ({views[pinned].kind}) lies in the span: it is never summarized"
    return Span(head, end)


def repair_orphans(index: BodyIndex, plan: Plan) -> Plan:
    """Cut every tool result whose call is not in the message that opens its run.

    Anthropic: the `tool_result` blocks are cut from the user message (a masked one's from its
    edited text), which is dropped whole if nothing else is left. OpenAI: the `role: tool`
    message is dropped.
    """
    views = plan_views(index, plan)
    if index.dialect.pairing == "id":
        return _repair_items(plan, views)
    anthropic = index.dialect.pairing == "next"
    out: list[Piece] = []
    opener_calls: set[str] = set()
    prev: MessageView | None = None
    for piece, v in zip(plan, views, strict=True):
        if anthropic:
            opener_calls = set(prev.tool_call_ids) if prev and prev.role == "assistant" else set()
        elif v.role != "tool":
            opener_calls = set(v.tool_call_ids) if v.role == "assistant" else set()
        if not v.tool_result_ids or all(r in opener_calls for r in v.tool_result_ids):
            out.append(piece)
            prev = v
            continue
        if not anthropic or not isinstance(piece, Keep | Cut | Edit):
            continue  # an orphaned `tool` message goes whole
        if isinstance(piece, Edit):  # a masked message: its orphans cut from its own text
            orphans = frozenset(
                n
                for n, b in enumerate(piece.view.blocks)
                if b.tool_result_id is not None and b.tool_result_id not in opener_calls
            )
            if len(orphans) < len(piece.view.blocks):
                out.append(cut_edit(piece, orphans, index.dialect))
                prev = v
            continue
        base = piece.drop if isinstance(piece, Cut) else frozenset()
        live = [n for n in range(len(index.messages[piece.index].view.blocks)) if n not in base]
        drop = set(base)
        for n in live:
            b = index.messages[piece.index].view.blocks[n]
            if b.tool_result_id is not None and b.tool_result_id not in opener_calls:
                drop.add(n)
        if len(drop) < len(index.messages[piece.index].view.blocks):
            out.append(Cut(piece.index, frozenset(drop)))
            prev = v
        # else: nothing left but orphans; the message is dropped whole
    return out


def _repair_items(plan: Plan, views: list[MessageView]) -> Plan:
    """Items paired by id: an output item whose call is not earlier in the plan goes whole."""
    out: list[Piece] = []
    called: set[str] = set()
    for piece, v in zip(plan, views, strict=True):
        called.update(v.tool_call_ids)
        if all(r in called for r in v.tool_result_ids):
            out.append(piece)
    return out
