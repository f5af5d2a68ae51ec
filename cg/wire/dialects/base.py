"""Read-only views over one message of either wire format, and the dialect interface.

A view is derived from the parsed message for reading only: the pipeline decides with views,
and the splice works from the original bytes. Nothing here is ever serialised back.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from cg.wire.reply import Call, JsonObject

ContentForm = Literal["string", "blocks", "null", "missing", "other"]

SYSTEM_ROLES = frozenset({"system", "developer"})


class MessageShapeError(ValueError):
    """A message is not an object, or its role is not a string: the body passes through."""


@dataclass(frozen=True, slots=True)
class BlockView:
    """One content block (anthropic) or content part (openai)."""

    type: str
    text: str = ""
    blank: bool = False
    tool_call_id: str | None = None
    tool_result_id: str | None = None


@dataclass(frozen=True, slots=True)
class MessageView:
    """What the pipeline may know about a message.

    `text` is a readable rendering for summaries and token counts. `blank` follows SPEC §4 rule
    4: blank content as a whole, or any text/thinking block that is blank.
    """

    role: str
    text: str
    form: ContentForm
    blocks: tuple[BlockView, ...]
    tool_call_ids: tuple[str, ...]
    tool_result_ids: tuple[str, ...]
    blank: bool

    @property
    def is_system(self) -> bool:
        return self.role in SYSTEM_ROLES

    @property
    def block_types(self) -> tuple[str, ...]:
        return tuple(b.type for b in self.blocks)

    @property
    def calls_tools(self) -> bool:
        return self.role == "assistant" and bool(self.tool_call_ids)


def is_blank_text(s: object) -> bool:
    # `isspace` stops at the first non-space character; `strip()` would copy the whole string.
    return not isinstance(s, str) or not s or s.isspace()


class Dialect:
    """One wire format. Subclasses are stateless singletons kept in `cg.wire.dialects.DIALECTS`."""

    name: ClassVar[str]
    path_suffix: ClassVar[str]
    wire_roles: ClassVar[frozenset[str]]

    def view(self, message: Any) -> MessageView:
        raise NotImplementedError

    def content_blocks_key(self) -> str:
        """The key whose array holds a message's blocks; block cuts happen inside it."""
        return "content"

    # Provider wording for the shape rules, so a refusal reads like the 400 it prevents.
    def msg_system_position(self, i: int) -> str:
        return f"messages.{i}: role 'system' must precede an 'assistant' message or end the array"

    def msg_unanswered(self, i: int, ids: list[str]) -> str:
        raise NotImplementedError

    def msg_unpaired(self, i: int, ids: list[str]) -> str:
        raise NotImplementedError

    def msg_blank(self, i: int) -> str:
        raise NotImplementedError

    def blank_allowed(self, view: MessageView, is_last: bool) -> bool:
        """A blank message the provider nevertheless accepts (dialect-specific exceptions)."""
        return False

    # -- answers: `cg.wire.answers` dispatches here -------------------------------------------

    # The usage keys that describe a request's input (after a continuation: the final round's).
    input_usage_keys: ClassVar[tuple[str, ...]] = ()

    def answer_error(self, doc: JsonObject) -> bool:
        """Whether a JSON answer body is the provider's error."""
        raise NotImplementedError

    def check_answer(self, doc: JsonObject) -> None:
        """Raise ResponseParseError unless `doc` is a well-formed non-streaming answer."""
        raise NotImplementedError

    def parse_stream(self, body: bytes) -> JsonObject:
        """A whole SSE body as the answer the request would have got without `stream`."""
        raise NotImplementedError

    def calls(self, message: JsonObject) -> list[Call]:
        """Every client-side tool call of an answer, in order."""
        raise NotImplementedError

    def strip_calls(self, message: JsonObject, name: str) -> None:
        """Remove the calls to tool `name` from `message` (a copy the caller owns), in place."""
        raise NotImplementedError

    def assistant_turn(self, message: JsonObject) -> JsonObject:
        """The assistant message to append to the request for a continuation round."""
        raise NotImplementedError

    def result_turns(self, results: list[tuple[str, str]]) -> list[JsonObject]:
        """The messages answering tool calls, `(call id, text)` each."""
        raise NotImplementedError

    def frames(self, message: JsonObject) -> Iterator[str]:
        """The answer as the provider streams it, event by event."""
        raise NotImplementedError

    def settle_usage(self, usage: JsonObject) -> None:
        """Make derived counts agree after a continuation's usage was assembled (in place)."""


def message_role(message: Any) -> str:
    if not isinstance(message, dict):
        raise MessageShapeError(f"a message is a {type(message).__name__}, not an object")
    role = message.get("role")
    if not isinstance(role, str):
        raise MessageShapeError("a message has no string 'role'")
    return role
