"""The Anthropic Messages API: `POST …/v1/messages`, system prompt in the top-level `system`."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from cg.wire.dialects.base import (
    BlockView,
    ContentForm,
    Dialect,
    MessageShapeError,
    MessageView,
    is_blank_text,
    message_role,
)

# `json.dumps(x, ensure_ascii=False)` builds a new encoder per call; this one gives the same text.
_ENCODER = json.JSONEncoder(ensure_ascii=False)


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", ""))
            if isinstance(p, dict) and p.get("type") == "text"
            else f"[{p.get('type')}]"
            if isinstance(p, dict)
            else ""
            for p in content
        )
    return ""


def _block(block: Any) -> BlockView:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise MessageShapeError("a content block is not an object with a string 'type'")
    kind: str = block["type"]
    if kind == "text":
        text = block.get("text")
        return BlockView(kind, text if isinstance(text, str) else "", is_blank_text(text))
    if kind == "thinking":
        thinking = block.get("thinking")
        return BlockView(
            kind, thinking if isinstance(thinking, str) else "", is_blank_text(thinking)
        )
    if kind == "tool_use":
        tid = block.get("id")
        rendered = f"[tool_use {block.get('name')}] {_ENCODER.encode(block.get('input'))}"
        return BlockView(kind, rendered, tool_call_id=tid if isinstance(tid, str) else "")
    if kind == "tool_result":
        rid = block.get("tool_use_id")
        return BlockView(
            kind,
            _result_text(block.get("content")),
            tool_result_id=rid if isinstance(rid, str) else "",
        )
    # redacted_thinking, image, document, server tools and anything newer: kept, never dropped.
    return BlockView(kind, f"[{kind}]")


class Anthropic(Dialect):
    name: ClassVar[str] = "anthropic"
    path_suffix: ClassVar[str] = "/v1/messages"
    wire_roles: ClassVar[frozenset[str]] = frozenset({"user", "assistant", "system"})

    def view(self, message: Any) -> MessageView:
        role = message_role(message)
        content = message.get("content", None) if "content" in message else None
        form: ContentForm
        if "content" not in message:
            return MessageView(role, "", "missing", (), (), (), True)
        if content is None:
            return MessageView(role, "", "null", (), (), (), True)
        if isinstance(content, str):
            return MessageView(role, content, "string", (), (), (), is_blank_text(content))
        if not isinstance(content, list):
            raise MessageShapeError(
                f"'content' is not a string or an array (got {type(content).__name__})"
            )
        form = "blocks"
        blocks = tuple([_block(b) for b in content])
        texts: list[str] = []
        calls: list[str] = []
        results: list[str] = []
        blank = not blocks
        for b in blocks:  # one pass: this runs for every message of every request
            if b.text:
                texts.append(b.text)
            if b.tool_call_id is not None:
                calls.append(b.tool_call_id)
            if b.tool_result_id is not None:
                results.append(b.tool_result_id)
            if b.blank:
                blank = True
        return MessageView(
            role=role,
            text="\n".join(texts),
            form=form,
            blocks=blocks,
            tool_call_ids=tuple(calls),
            tool_result_ids=tuple(results),
            blank=blank,
        )

    def msg_unanswered(self, i: int, ids: list[str]) -> str:
        return (
            f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately "
            f"after: {', '.join(ids)}. Each `tool_use` block must have a corresponding "
            "`tool_result` block in the next message."
        )

    def msg_unpaired(self, i: int, ids: list[str]) -> str:
        return (
            f"messages.{i}.content: unexpected `tool_use_id` found in `tool_result` blocks: "
            f"{', '.join(ids)}. Each `tool_result` block must have a corresponding `tool_use` "
            "block in the previous message."
        )

    def msg_blank(self, i: int) -> str:
        return (
            f"messages.{i}: all messages must have non-empty content except for the optional "
            "final assistant message"
        )

    def blank_allowed(self, view: MessageView, is_last: bool) -> bool:
        # An empty final assistant message is a legal (empty) prefill; blank blocks never are.
        empty = (view.form == "string" and view.text == "") or (
            view.form == "blocks" and not view.blocks
        )
        return is_last and view.role == "assistant" and empty
