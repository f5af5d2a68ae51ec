"""The shared-cache summarizer request (docs/behaviour.md#summarize-the-summarizer-call): the
agent's own request, as it was forwarded upstream, plus one user instruction.

The provider has cached that request's prompt by the time its answer begins. A request that
repeats those bytes — `model`, `system`, `tools`, `tool_choice`, `thinking`, every message, every
`cache_control` — and appends one message reads the whole transcript back at the cache-read
price (0.1x the input price on Anthropic) instead of paying full price for a masked copy, and
the summarizer sees the tool outputs too. So nothing of the forwarded body is re-serialised: the
instruction is spliced in after the last message (as `cg.expand.continuation.append_messages` does),
and at most one other member's value changes, never one that is part of the cached prompt:

    max_tokens (anthropic)   the level's budget (`MAX_TOKENS`); with thinking on, the agent's own
                             limit when larger (it is already > budget_tokens, which the API
                             requires, and known to fit this model and window). Agents send
                             limits from 64 (too short for a summary) to 64,000 (which must fit
                             under the window beside the input).
    max_tokens / max_completion_tokens (openai), max_output_tokens (responses)
                             raised to the level's budget when the agent's is lower; never added.
    stream (openai)          false when the agent streamed without `stream_options`: an OpenAI
                             stream reports no usage without `include_usage`, and
                             `stream_options` is refused without `stream: true`, so it can be
                             neither added nor left alone once streaming is off.

An Anthropic or Responses stream stays a stream (its events carry the usage); the summarizer
reads either form whole. The Responses instruction is a typed user message item, like the
summary (`Dialect.user_message`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cg.summarize.prompt import MAX_TOKENS, SUMMARY_HEADER, build_instruction
from cg.wire.body import BodyRejected, index_body
from cg.wire.dialects import DIALECTS
from cg.wire.jsonspan import Member


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the span sits in a forwarded body of `count` messages: after the first `head`,
    before the last `tail`. `summary_at`: the position of an earlier summary that the same turn
    spliced in (a roll-forward), which must be there for this layout to apply."""

    count: int
    head: int
    tail: int
    summary_at: int | None = None


@dataclass(frozen=True, slots=True)
class SharedRequest:
    """The bytes to send, where the span was found, and what changed besides the new message."""

    body: bytes
    layout: Layout
    changed: dict[str, Any]


def forces_a_tool(dialect: str, tool_choice: Any) -> bool:
    """A tool_choice under which the answer must be a tool call (so it can hold no summary).

    `none` is not one: it forbids tools, which is what the instruction asks anyway."""
    return tool_choice is not None and DIALECTS[dialect].forces_a_tool(tool_choice)


def output_limits(dialect: str, members: Mapping[str, Member], level: str) -> dict[str, Any]:
    """The members whose values the shared request changes, and their new values
    (`Dialect.summary_limits`, for the level's budget)."""
    return DIALECTS[dialect].summary_limits(members, MAX_TOKENS[level])


def build(
    forwarded: bytes,
    dialect: str,
    layouts: Sequence[Layout],
    *,
    level: str = "regular",
    custom_prompt: str | None = None,
    refuse_forced_tool: bool = True,
) -> SharedRequest | str:
    """The shared request for `forwarded`, or why there is none (a reason for the log)."""
    if dialect not in DIALECTS:
        return f"no shared-cache request for the {dialect} dialect"
    try:
        index = index_body(forwarded, DIALECTS[dialect])
    except BodyRejected as e:
        return f"the forwarded body cannot be read ({e})"
    views = index.views
    n = len(views)
    layout = next(
        (
            lay
            for lay in layouts
            if lay.count == n
            and (lay.summary_at is None or views[lay.summary_at].text.startswith(SUMMARY_HEADER))
        ),
        None,
    )
    if layout is None:
        return "the forwarded messages do not match the commissioned span"
    if not 0 <= layout.head < n - layout.tail <= n:
        return "the span is empty in the forwarded body"
    choice = index.members.get(index.dialect.tool_choice_member)
    if refuse_forced_tool and choice is not None and forces_a_tool(dialect, choice.value):
        return "tool_choice forces a tool call, so the answer could hold no summary"
    text = build_instruction(
        head=layout.head,
        tail=layout.tail,
        total=n,
        first=views[layout.head],
        last=views[n - layout.tail - 1],
        previous=layout.summary_at is not None,
        level=level,
        custom_prompt=custom_prompt,
    )
    message = json.dumps(
        DIALECTS[dialect].user_message(text), ensure_ascii=False, separators=(",", ":")
    )
    changed = output_limits(dialect, index.members, level)
    src = index.text
    els = index.array.elements
    sep = src[els[0].end : els[1].start] if len(els) >= 2 else ","
    # (start, end, replacement), applied from the end so earlier offsets stay valid.
    edits = [(els[-1].end, els[-1].end, sep + message)]
    edits += [
        (index.members[k].start, index.members[k].end, json.dumps(v)) for k, v in changed.items()
    ]
    out = src
    for start, end, new in sorted(edits, reverse=True):
        out = out[:start] + new + out[end:]
    return SharedRequest(out.encode("utf-8"), layout, changed)
