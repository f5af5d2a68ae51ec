"""OpenAI Chat Completions: `POST …/v1/chat/completions`, system prompt is `messages[0]`."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from cg.wire.dialects.base import (
    BlockView,
    Dialect,
    MessageShapeError,
    MessageView,
    is_blank_text,
    message_role,
)


def _part(part: Any) -> BlockView:
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        raise MessageShapeError("a content part is not an object with a string 'type'")
    kind: str = part["type"]
    if kind == "text":
        text = part.get("text")
        return BlockView(kind, text if isinstance(text, str) else "", is_blank_text(text))
    if kind == "refusal":
        text = part.get("refusal")
        return BlockView(kind, text if isinstance(text, str) else "", is_blank_text(text))
    return BlockView(kind, f"[{kind}]")


def _call_text(name: Any, arguments: Any) -> str:
    return (
        f"[tool_call {name}] {arguments if isinstance(arguments, str) else json.dumps(arguments)}"
    )


class OpenAI(Dialect):
    name: ClassVar[str] = "openai"
    path_suffix: ClassVar[str] = "/v1/chat/completions"
    wire_roles: ClassVar[frozenset[str]] = frozenset(
        {"system", "developer", "user", "assistant", "tool", "function"}
    )

    def view(self, message: Any) -> MessageView:
        role = message_role(message)
        content = message.get("content")
        texts: list[str] = []
        blocks: tuple[BlockView, ...] = ()
        if "content" not in message:
            form, blank = "missing", True
        elif content is None:
            form, blank = "null", True
        elif isinstance(content, str):
            form, blank = "string", is_blank_text(content)
            texts.append(content)
        elif isinstance(content, list):
            blocks = tuple(_part(p) for p in content)
            form, blank = "blocks", not blocks or any(b.blank for b in blocks)
            texts.extend(b.text for b in blocks if b.text)
        else:
            raise MessageShapeError(
                f"'content' is not a string or an array (got {type(content).__name__})"
            )

        calls: list[str] = []
        raw_calls = message.get("tool_calls")
        if raw_calls is not None:
            if not isinstance(raw_calls, list):
                raise MessageShapeError("'tool_calls' is not an array")
            for c in raw_calls:
                if not isinstance(c, dict):
                    raise MessageShapeError("a tool call is not an object")
                cid = c.get("id")
                calls.append(cid if isinstance(cid, str) else "")
                fn = c.get("function")
                fn = fn if isinstance(fn, dict) else {}
                texts.append(_call_text(fn.get("name"), fn.get("arguments")))
        fcall = message.get("function_call")
        if isinstance(fcall, dict):
            texts.append(_call_text(fcall.get("name"), fcall.get("arguments")))

        results: tuple[str, ...] = ()
        if role == "tool":
            tcid = message.get("tool_call_id")
            results = (tcid if isinstance(tcid, str) else "",)

        if (
            role == "assistant"
            and (calls or isinstance(fcall, dict))
            and form in ("null", "missing")
        ):
            blank = False
        if role == "assistant" and (calls or isinstance(fcall, dict)) and content == "":
            blank = False
        return MessageView(
            role=role,
            text="\n".join(texts),
            form=form,  # type: ignore[arg-type]
            blocks=blocks,
            tool_call_ids=tuple(calls),
            tool_result_ids=results,
            blank=blank,
        )

    def msg_unanswered(self, i: int, ids: list[str]) -> str:
        return (
            f"messages.[{i}]: An assistant message with 'tool_calls' must be followed by tool "
            "messages responding to each 'tool_call_id'. The following tool_call_ids did not "
            f"have response messages: {', '.join(ids)}"
        )

    def msg_unpaired(self, i: int, ids: list[str]) -> str:
        return (
            f"messages.[{i}].role: Invalid parameter: messages with role 'tool' must be a "
            "response to a preceeding message with 'tool_calls'."
        )

    def msg_blank(self, i: int) -> str:
        return (
            f"messages.[{i}].content: Invalid value: content must be a non-empty string or array."
        )
