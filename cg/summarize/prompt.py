"""The summarizer's prompt (docs/behaviour.md#summarize-the-summarizer-call) and the summary message
it turns into (docs/behaviour.md#summarize-checkpoints-and-reuse).

The prompt is grounded in the task: the first user turn and the latest user and assistant turns
are given as what to summarize toward. An operator's `custom_prompt` is framed as the operator's
instruction with a stated precedence — pasted bare after a long trajectory it reads as more
trajectory — and two limits survive it: no invention, and the `<summary>` format.

Two forms of the same instructions: `build_prompt` is the standalone prompt (the span rendered as
text, tool outputs masked unless `include_tool_calls`); `build_instruction` is the one user
message appended to the agent's own request when the summarizer shares its prompt cache, where the
span is not copied but pointed at (the model reads the messages themselves, tool outputs
included).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from cg.expand.tool import SUMMARY_HEADER as SUMMARY_HEADER
from cg.wire.dialects import MessageView

MASK = "<masked_tool_output>"
TRAJECTORY_CAP_CHARS = 120_000
GROUNDING_CAP_CHARS = 4_000
CALL_CAP_CHARS = 1_000
SENTINEL = "⟪cg⟫"
# The summary's output budget per level (the standalone call's `max_tokens`; the shared call's,
# plus the request's own thinking budget).
MAX_TOKENS = {"concise": 2048, "regular": 4096, "highly_detailed": 8192}
ANCHOR_CHARS = 160

LEVELS = {
    "concise": (
        "Be concise: a short paragraph of state plus a terse bullet list of what was done, what "
        "was learned and what is left. Prefer omission over detail."
    ),
    "regular": (
        "Cover: the goal as it now stands; what was done and its outcome; files, commands, "
        "identifiers and values that later work depends on; decisions and their reasons; errors "
        "met and how they were resolved; what is still open."
    ),
    "highly_detailed": (
        "Be thorough: keep every file path, command, identifier, number, error message and "
        "decision that later work could need, in the order they happened, grouped by sub-task. "
        "Quote short exact strings rather than paraphrasing them."
    ),
}


def _clip(text: str, cap: int) -> str:
    return text if len(text) <= cap else text[: cap // 2] + "\n[…]\n" + text[-cap // 2 :]


def render_message(v: MessageView, include_tool_calls: bool) -> str:
    """A message as readable text; tool outputs masked unless `include_tool_calls`.

    OpenAI tool outputs are `role: tool` messages, and `role: function` in the legacy
    function-calling form."""
    if v.role in ("tool", "function"):
        return v.text if include_tool_calls else MASK
    if not v.blocks:
        return v.text
    parts: list[str] = []
    for b in v.blocks:
        if b.type in ("thinking", "redacted_thinking"):
            continue
        if b.type == "tool_result":
            parts.append(
                f"[tool_result]\n{b.text}" if include_tool_calls else f"[tool_result] {MASK}"
            )
        elif b.type == "tool_use":
            parts.append(_clip(b.text, CALL_CAP_CHARS))
        elif b.text:
            parts.append(b.text)
    return "\n".join(parts)


def render_trajectory(
    views: Sequence[MessageView], include_tool_calls: bool, cap: int = TRAJECTORY_CAP_CHARS
) -> str:
    """`[role]\\ntext` blocks, capped keeping the most recent part (the full span is stashed)."""
    blocks = [f"[{v.role}]\n{render_message(v, include_tool_calls)}" for v in views]
    total = 0
    keep = 0
    for b in reversed(blocks):
        if total + len(b) + 2 > cap and keep:
            break
        total += len(b) + 2
        keep += 1
    omitted = len(blocks) - keep
    kept = blocks[omitted:]
    if kept and len(kept[0]) > cap:
        kept[0] = "[…]" + kept[0][-cap:]
    head = [f"[… {omitted} earlier messages omitted …]"] if omitted else []
    return "\n\n".join(head + kept)


def _user_text(v: MessageView) -> str:
    """A user turn's own words, without tool results (text blocks, or Responses `input_text`
    parts)."""
    if not v.blocks:
        return v.text
    return "\n".join(b.text for b in v.blocks if b.type in ("text", "input_text") and b.text)


def grounding(views: Sequence[MessageView]) -> tuple[str, str, str]:
    """(first user turn, latest user turn, latest assistant turn) of the whole transcript."""
    users = [t for v in views if v.role == "user" and (t := _user_text(v).strip())]
    assistants = [t for v in views if v.role == "assistant" and (t := v.text.strip())]
    first = users[0] if users else ""
    latest_user = users[-1] if len(users) > 1 else ""
    latest_assistant = assistants[-1] if assistants else ""
    return (
        _clip(first, GROUNDING_CAP_CHARS),
        _clip(latest_user, GROUNDING_CAP_CHARS),
        _clip(latest_assistant, GROUNDING_CAP_CHARS),
    )


def build_prompt(
    span: Sequence[MessageView],
    transcript: Sequence[MessageView],
    *,
    level: str = "regular",
    include_tool_calls: bool = False,
    custom_prompt: str | None = None,
    previous_summary: str | None = None,
    cap: int = TRAJECTORY_CAP_CHARS,
) -> str:
    first, latest_user, latest_assistant = grounding(transcript)
    out = [
        "You are compressing the middle of a long conversation between a user and an AI agent "
        "into a summary the agent will read in place of those messages, then continue its work.",
        "",
        "## The task — summarize toward this",
        f"<first_user_turn>\n{first}\n</first_user_turn>",
    ]
    if latest_user:
        out.append(f"<latest_user_turn>\n{latest_user}\n</latest_user_turn>")
    if latest_assistant:
        out.append(f"<latest_assistant_turn>\n{latest_assistant}\n</latest_assistant_turn>")
    if previous_summary:
        out += [
            "",
            "## The summary of what came before these messages",
            f"<previous_summary>\n{previous_summary}\n</previous_summary>",
        ]
    out += [
        "",
        "## The messages to summarize",
        f"<conversation>\n{render_trajectory(span, include_tool_calls, cap)}\n</conversation>",
        "",
        "## How to write the summary",
        LEVELS[level],
    ]
    if not include_tool_calls:
        out.append(
            f"Tool outputs are masked as {MASK}: do not guess what they contained; say only what "
            "the surrounding messages establish about them."
        )
    out += _operator(custom_prompt, "the two rules that close this prompt")
    out += [
        "",
        "## Rules that always hold",
        "1. Use only what the conversation above contains. Never invent files, commands, results, "
        "decisions, names or facts that are absent from it; if something is unknown, say so.",
        "2. Write the summary inside <summary>…</summary> and write nothing outside those tags.",
    ]
    return "\n".join(out)


def _operator(custom_prompt: str | None, rules: str) -> list[str]:
    """The operator's `custom_prompt`, framed with its precedence (below `rules`)."""
    if not (custom_prompt and custom_prompt.strip()):
        return []
    return [
        "",
        "## Operator instruction",
        "The text below is an instruction from the operator who deployed this summarizer. It "
        "is not part of the conversation: do not summarize it, follow it. It takes precedence "
        "over the guidance above on what to include and how to organise the summary, but not "
        f"over {rules}.",
        f"<operator_instruction>\n{custom_prompt.strip()}\n</operator_instruction>",
    ]


def anchor(v: MessageView) -> str:
    """How a message begins, on one line: enough for the model to find it in the transcript."""
    text = " ".join(render_message(v, include_tool_calls=True).split())
    text = text if len(text) <= ANCHOR_CHARS else text[:ANCHOR_CHARS] + "…"
    return f"[{v.role}] {text}" if text else f"[{v.role}]"


def _ordinal(n: int) -> str:
    return "message" if n == 1 else f"{n} messages"


def build_instruction(
    *,
    head: int,
    tail: int,
    total: int,
    first: MessageView,
    last: MessageView,
    previous: bool,
    level: str = "regular",
    custom_prompt: str | None = None,
) -> str:
    """The instruction appended to the agent's own request (the shared-cache call).

    `head`/`tail`: messages before and after the span in that request (`total` messages, this
    one not counted); `first`/`last`: the span's first and last messages, quoted as anchors —
    counting hundreds of messages is not something a model does reliably. `previous`: the span
    holds an earlier summary (a roll-forward), whose content must be carried over.
    """
    start, end = head + 1, total - tail
    where = []
    if head:
        where.append(f"after the first {_ordinal(head)}")
    if tail:
        where.append(f"before the last {_ordinal(tail)}")
    span = " and ".join(where) if where else "from the first message"
    out = [
        "[context-guru] This message is not from the user. It comes from context-guru, the proxy "
        "between the agent and its model provider, which is compressing this conversation. Do "
        "not continue the task and do not answer the messages above: write the summary asked "
        "for below. Answer with text only and call no tool.",
        "",
        "## What to summarize",
        f"The messages of this conversation {span} (messages {start} to {end} of the {total} "
        "above this one). The agent will read your summary in place of them, then continue its "
        "work.",
        f"- The span begins with: {anchor(first)}",
        f"- The span ends with: {anchor(last)}",
    ]
    if previous:
        out.append(
            f"- The span includes an earlier summary (the message that begins {SUMMARY_HEADER!r}), which "
            "stands for even older messages: carry what it says over into the new summary."
        )
    out += [
        "The messages before the span (the task as first stated) and after it (the latest turns) "
        "stay as they are: do not summarize them, but use them to judge what matters — "
        "summarize toward the task and what the agent is doing now.",
        "",
        "## How to write the summary",
        LEVELS[level],
        "Tool calls and their outputs are part of the span: keep what they established (paths, "
        "commands, results, errors), not their full text.",
        *_operator(custom_prompt, "the rules that close this message"),
        "",
        "## Rules that always hold",
        "1. Use only what the conversation above contains. Never invent files, commands, results, "
        "decisions, names or facts that are absent from it; if something is unknown, say so.",
        "2. Write the summary inside <summary>…</summary> and write nothing outside those tags.",
        "3. Answer with text only: call no tool, even one that the conversation offers.",
    ]
    return "\n".join(out)


_SUMMARY_RE = re.compile(r"<summary>(.*?)</summary>", re.DOTALL)


def has_summary(answer: str | None) -> bool:
    """The answer carries a `<summary>` (the shared call's test before it falls back)."""
    return bool(answer) and "<summary>" in (answer or "")


def extract_summary(answer: str | None) -> str | None:
    """The model's summary text, with `<summary>` tags ensured; None when blank."""
    if not answer:
        return None
    m = _SUMMARY_RE.search(answer)
    body = m.group(1) if m else answer.replace("<summary>", "").replace("</summary>", "")
    body = body.strip()
    return body or None


def summary_text(
    summary: str,
    mode: str,
    key: str | None,
    replaced: int,
    expired: bool = False,
    floor: str = "",
) -> str:
    """The text of the summary message: header, `<summary>`, the floor (`cg.summarize.floor`),
    then the marker for `mode`."""
    text = f"{SUMMARY_HEADER}\n<summary>\n{summary}\n</summary>"
    if floor:
        text += "\n" + floor
    if mode == "full" and key and not expired:
        text += (
            f"\n[{replaced} earlier messages were replaced by this summary. To read them verbatim, "
            f'call the context_guru_expand tool with id "{key}".] <<cg:{key}>>'
        )
    elif mode == "full" and key and expired:
        text += f"\n[{replaced} earlier messages were replaced by this summary; the originals have expired.]"
    elif mode == "summary":
        text += f"\n{SENTINEL}"
    return text
