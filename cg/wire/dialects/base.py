"""Read-only views over one message of either wire format, and the dialect interface.

A view is derived from the parsed message for reading only: the pipeline decides with views,
and the splice works from the original bytes. Nothing here is ever serialised back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar, Literal, NamedTuple, Protocol, cast

from cg.wire.jsonspan import Member
from cg.wire.reply import Call, JsonObject, is_count
from cg.wire.usage import Usage, from_openai

ContentForm = Literal["string", "blocks", "null", "missing", "other"]
# How a tool result finds its call: in the next message (anthropic), in the run of `tool`
# messages after the calling message (openai), or by id anywhere earlier (responses items).
Pairing = Literal["next", "run", "id"]

SYSTEM_ROLES = frozenset({"system", "developer"})

# `json.dumps(x, ensure_ascii=False)` builds a new encoder per call; this one gives the same text.
_ENCODER = json.JSONEncoder(ensure_ascii=False)


class UsageReader(Protocol):
    """Follows one dialect's usage-carrying SSE events (`cg.billing.tap`): `raw` is the usage
    object seen so far, `model` the model the answer names (None if it names none)."""

    raw: Any
    model: str | None

    def event(self, name: str | None, obj: Any) -> None: ...


def answer_model(obj: Any) -> str | None:
    """The non-empty `model` string of an answer object, or None."""
    m = obj.get("model") if isinstance(obj, dict) else None
    return m if isinstance(m, str) and m else None


# What may stand in a tool output's place, and what of it is text: `parts` a string or an array
# of text parts (both read as text), `string` a string only, `none` no text at all (a
# screenshot, an approval).
OutputText = Literal["parts", "string", "none"]


class ToolOutput(NamedTuple):
    """Where one tool output lies in a request message (`Dialect.tool_outputs`): the call it
    answers, the path of member keys and array indices from the message to its value, and
    what text its value is (`OutputText`)."""

    call: str
    path: tuple[str | int, ...]
    text: OutputText = "parts"


class ToolCall(NamedTuple):
    """One tool call of a request message (`Dialect.tool_calls`): its id, the tool's name,
    its input as sent (an object, or the string a custom tool or JSON arguments arrive in)."""

    id: str
    name: str
    input: Any


class MessageShapeError(ValueError):
    """A message is not an object, or its role is not a string: the body passes through."""


class BlockView(NamedTuple):
    """One content block (anthropic) or content part (openai).

    Views are immutable tuples rather than frozen dataclasses: a frozen dataclass's `__init__`
    sets each field through `object.__setattr__`, several times a tuple's cost, and a cold 1 MB
    body builds ~750 blocks and 400 messages.

    `text` is read off the hot path only (token counts, the summarizer's prompt), so a block
    whose rendering costs work keeps what it needs in `call` and renders on demand: an
    Anthropic `tool_use` block's input re-encoded was a large part of every cold body's views."""

    type: str
    shown: str = ""  # the text, when it is at hand (`call` unset)
    blank: bool = False
    tool_result_id: str | None = None
    call: Mapping[str, Any] | None = None  # a `tool_use` block, rendered by `text`

    @property
    def text(self) -> str:
        """A readable rendering for summaries and token counts."""
        call = self.call
        if call is None:
            return self.shown
        return f"[tool_use {call.get('name')}] {_ENCODER.encode(call.get('input'))}"


class MessageView(NamedTuple):
    """What the pipeline may know about a message.

    `text` is a readable rendering for summaries and token counts, built on demand from the
    blocks when `shown` is None (views are made for every message of a cold body; the text is
    read only off the hot path). `blank` follows docs/behaviour.md#shape-rules rule 4: blank content
    as a whole, or any text/thinking block that is blank.

    Responses items add three facts (the defaults fit a chat message): `kind`, the item's
    `type` (`message`, `reasoning`, `function_call`, …) and `item_id`, its `id`, for the
    provider's wording; `binds_next`, an item the provider refuses without the item right after
    it (a `reasoning` item), so no cut may fall between the two; `pinned`, an item that must
    never be summarized away (an `additional_tools` item: the tools it declares are available
    from it on).
    """

    role: str
    shown: str | None
    form: ContentForm
    blocks: tuple[BlockView, ...]
    tool_call_ids: tuple[str, ...]
    tool_result_ids: tuple[str, ...]
    blank: bool
    kind: str = "message"
    item_id: str | None = None
    binds_next: bool = False
    pinned: bool = False

    @property
    def text(self) -> str:
        shown = self.shown
        if shown is not None:
            return shown
        return "\n".join([t for b in self.blocks if (t := b.text)])

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
    # Other routes that speak this dialect (a sign-in's own backend: Codex signed in with
    # ChatGPT posts to `…/backend-api/codex/responses`).
    extra_suffixes: ClassVar[tuple[str, ...]] = ()
    wire_roles: ClassVar[frozenset[str]]
    # The top-level key of the transcript array: `messages`, or the Responses API's `input`.
    array_key: ClassVar[str] = "messages"
    pairing: ClassVar[Pairing] = "run"
    # A request that already breaks a shape rule passes through untouched (the provider answers
    # it as it would) instead of being rewritten around the breakage.
    strict_input: ClassVar[bool] = False

    # The roles a view may have: the wire's, but where the view names a role in the neutral
    # words (Gemini's `model` is an `assistant` message).
    @property
    def view_roles(self) -> frozenset[str]:
        return self.wire_roles

    # The member a request may wrap its body in (Code Assist's `{"model", "project", "request":
    # {…}}`), read as the body when the transcript is not at the top (`cg.wire.body`).
    envelope: ClassVar[str | None] = None

    def answer_body(self, doc: Any) -> Any:
        """The answer object inside what the provider sent (an envelope undone)."""
        return doc

    # Where an answer reports its usage and its model (top-level keys of the answer object),
    # and the request member that says which tools the model may call.
    usage_key: ClassVar[str] = "usage"
    model_key: ClassVar[str] = "model"
    tool_choice_member: ClassVar[str] = "tool_choice"
    # A stream of this format says nowhere where a part of the answer sits, so a stream the
    # expand tool is offered in is read whole before it is answered (`cg.expand.stream`).
    buffers_expand: ClassVar[bool] = False

    def matches(self, bare_path: str) -> bool:
        """Whether a request path (query removed) is this format's: its suffix, or another
        route to it (`extra_suffixes`)."""
        return bare_path.endswith(self.path_suffix) or (
            bool(self.extra_suffixes) and bare_path.endswith(self.extra_suffixes)
        )

    def url_model(self, path: str) -> str | None:
        """The model a request's path names, or None: its body's `model` names it."""
        return None

    def url_streams(self, path: str) -> bool:
        """Whether the path asks for a stream (where the body's `stream` does not say)."""
        return False

    def standalone_url(self, url: str, model: str) -> str:
        """The URL of a standalone summarizer request (one prompt, no stream) for `model`, to
        the endpoint the agent's request at `url` went to."""
        return url

    def standalone_body(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        """The standalone summarizer request's body as the endpoint at `url` takes it."""
        return body

    def standalone_path(self, model: str) -> str:
        """The path of a standalone summarizer request for `model`, after a base URL."""
        return self.path_suffix

    def answer_model(self, doc: Any) -> str | None:
        """The model an answer object names, or None."""
        m = doc.get(self.model_key) if isinstance(doc, dict) else None
        return m if isinstance(m, str) and m else None

    def view(self, message: Any) -> MessageView:
        raise NotImplementedError

    def refuse(self, members: Mapping[str, Any]) -> str | None:
        """Why a whole request (its top-level members, `cg.wire.jsonspan.Member`s by key) is
        not one to rewrite, or None: history the addon cannot see, say."""
        return None

    def role_error(self, message: Any) -> str | None:
        """What is wrong with the role of one element of the transcript array as sent (read
        from the final bytes), or None when the provider accepts it."""
        role = message.get("role") if isinstance(message, dict) else None
        if role in self.wire_roles:
            return None
        allowed = " or ".join(repr(r) for r in sorted(self.wire_roles))
        return f"role: Input should be {allowed}"

    def user_message(self, text: str) -> dict[str, Any]:
        """A new user message carrying `text` (the summary, the summarizer's instruction)."""
        return {"role": "user", "content": text}

    def tool_outputs(self, message: Mapping[str, Any]) -> tuple[ToolOutput, ...]:
        """Where the message's tool outputs lie, in the order its view lists their call ids
        (the `mask` component replaces their values)."""
        raise NotImplementedError

    def tool_calls(self, message: Mapping[str, Any]) -> tuple[ToolCall, ...]:
        """The message's tool calls (what a masked output's stub names)."""
        raise NotImplementedError

    def content_blocks_key(self) -> str:
        """The key whose array holds a message's blocks; block cuts happen inside it."""
        return "content"

    # Provider wording for the shape rules, so a refusal reads like the 400 it prevents.
    def msg_system_position(self, i: int) -> str:
        return f"messages.{i}: role 'system' must precede an 'assistant' message or end the array"

    def msg_unanswered(self, i: int, ids: list[str], view: MessageView | None = None) -> str:
        raise NotImplementedError

    def msg_unpaired(self, i: int, ids: list[str], view: MessageView | None = None) -> str:
        raise NotImplementedError

    def msg_blank(self, i: int) -> str:
        raise NotImplementedError

    def msg_reasoning(self, i: int, view: MessageView) -> str:
        return f"input[{i}]: a reasoning item was provided without its required following item"

    def msg_separated(self, i: int, view: MessageView) -> str:
        return f"input[{i}]: an item was provided without its required reasoning item"

    def msg_duplicate(self, i: int, item_id: str) -> str:
        return f"input[{i}]: duplicate item id {item_id}"

    def msg_duplicate_call(self, i: int, call_id: str) -> str:
        return f"input[{i}]: duplicate call id {call_id}"

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

    def assistant_turns(self, message: JsonObject) -> list[JsonObject]:
        """Everything of the answer to append for a continuation round: one assistant message
        in a chat dialect; every output item (reasoning included) in the Responses API."""
        return [self.assistant_turn(message)]

    def result_turns(self, results: list[tuple[str, str]]) -> list[JsonObject]:
        """The messages answering tool calls, `(call id, text)` each."""
        raise NotImplementedError

    def frames(self, message: JsonObject) -> Iterator[str]:
        """The answer as the provider streams it, event by event."""
        raise NotImplementedError

    # The (input, output) usage keys whose sum `total_tokens` is, when the dialect reports one.
    usage_total_of: ClassVar[tuple[str, str] | None] = None

    def settle_usage(self, usage: JsonObject) -> None:
        """Make derived counts agree after a continuation's usage was assembled (in place):
        a `total_tokens` the answer has becomes the sum of `usage_total_of`'s counts."""
        if self.usage_total_of is None or "total_tokens" not in usage:
            return
        a, b = (usage.get(k) for k in self.usage_total_of)
        if is_count(a) and is_count(b):
            usage["total_tokens"] = cast(int, a) + cast(int, b)

    # -- what the layers above ask of a wire format -------------------------------------------

    # The provider caches a prompt's prefixes by itself (OpenAI); without it, only up to the
    # request's `cache_control` breakpoints (Anthropic).
    auto_cache: ClassVar[bool]
    # The top-level member whose `user_id` may name the session (Anthropic's `metadata`), and
    # the one that names it outright (the Responses API's `prompt_cache_key`).
    metadata_member: ClassVar[str | None] = None
    cache_key_member: ClassVar[str | None] = None
    # A bare `session-id` header names a Codex CLI session (the name is generic; Codex speaks
    # only the Responses API).
    codex_session_header: ClassVar[bool] = False
    # A reasoning item of an answer binds the item after it, so a stream holds it back until
    # that item begins (`cg.expand.stream.ExpandGate`).
    held_reasoning: ClassVar[bool] = False
    # The summarizer's own endpoint when `model.source` is `config`: the provider's base URL
    # and the environment variable of its key.
    default_base: ClassVar[str]
    key_env: ClassVar[str]

    def conversation_system(self, top_level: Mapping[str, Any], messages: Sequence[Any]) -> object:
        """The system prompt of a parsed body, for the session's head hash (`top_level` maps
        top-level keys to parsed values; `messages` are the parsed messages)."""
        raise NotImplementedError

    def summarizer_headers(self, headers: Mapping[str, str]) -> dict[str, str]:
        """The agent's reused headers as a summarizer request to the same endpoint needs them."""
        return dict(headers)

    def route_headers(self, url: str) -> tuple[str, ...]:
        """The agent's headers besides its credential that a summarizer call to `url` keeps
        (a sign-in's backend reads them: ChatGPT's `chatgpt-account-id`)."""
        return ()

    def streams_only(self, url: str) -> bool:
        """Whether the endpoint at `url` answers only a streamed request (ChatGPT's Codex
        backend refuses `stream: false`), so the standalone summarizer request streams too."""
        return False

    def streamed(self, body: dict[str, Any]) -> dict[str, Any]:
        """The standalone summarizer request as a streams-only endpoint takes it."""
        return {**body, "stream": True}

    def auth_headers(self, key: str, bearer: bool) -> dict[str, str]:
        """The headers of a summarizer request of our own carrying `key` (`bearer`: the config
        asks for `Authorization: Bearer` where the provider has another form)."""
        return {"authorization": f"Bearer {key}"} if key else {}

    def summary_request(self, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
        """The standalone summarizer request: `prompt` as one user turn."""
        raise NotImplementedError

    def answer_text(self, doc: JsonObject) -> str:
        """The text of a non-streaming answer ("" when it has none); ResponseParseError when
        the answer has not the shape that holds text."""
        raise NotImplementedError

    def summary_limits(self, members: Mapping[str, Member], budget: int) -> dict[str, Any]:
        """The members whose values the shared summarizer request changes (the output limit,
        and what it takes for the answer to report its usage), and their new values."""
        raise NotImplementedError

    def forces_a_tool(self, tool_choice: Any) -> bool:
        """A (non-None) tool_choice under which the answer must be a tool call. This form is
        OpenAI's (Chat Completions and Responses)."""
        return tool_choice == "required" or isinstance(tool_choice, dict)

    def tool_choice(self, mode: Literal["auto", "none"]) -> Any:
        """The `tool_choice` that lets the model call a tool or not (`auto`), or forbids it
        (`none`). This form is OpenAI's."""
        return mode

    def fixed_tool_choice(self, tool_choice: Any) -> bool:
        """A (non-None) tool_choice that says exactly what the model may (not) call, so a tool
        must not be added to it. This form is OpenAI's."""
        if isinstance(tool_choice, str):
            return tool_choice in ("required", "none")
        return isinstance(tool_choice, dict)  # a named function

    def tool_name(self, tool: JsonObject) -> object:
        """The name a `tools` entry declares."""
        return tool.get("name")

    def function_tool(self, name: str, description: str, schema: JsonObject) -> JsonObject:
        """A client-side tool declaration, as the `tools` array holds it."""
        raise NotImplementedError

    def usage(self, u: Any) -> Usage:
        """The usage object of an answer (`cg.wire.usage`); UsageError when it is not one."""
        return from_openai(u)

    def usage_reader(self) -> UsageReader:
        """A fresh follower of a streamed answer's usage-carrying events."""
        raise NotImplementedError

    # -- resuming a stream whose start the client holds (`cg.expand.stream`) --------------------

    def call_begins(self, obj: JsonObject, name: str) -> tuple[int, int | None] | None:
        """(the position the call takes in the answer, the event's sequence number) when this
        SSE event's data starts a call to tool `name`; else None."""
        raise NotImplementedError

    def reasoning_begins(self, event: bytes) -> tuple[int, int | None] | None:
        """(output index, sequence number) when this SSE event adds a reasoning item that
        `held_reasoning` holds back; else None."""
        return None

    def continued(self, first: JsonObject, final: JsonObject, at: int, rounds: int) -> None:
        """Make `final` (a copy the caller owns) the answer whose stream completes one the
        client holds `first` of up to position `at` (in place): after `rounds` >= 1 a new
        round's whole content follows what was sent; with 0, `final` is `first` stripped and
        its entries from `at` on follow. The message's identity stays the first answer's."""
        raise NotImplementedError

    def resumed_event(self, obj: JsonObject, at: int) -> bool:
        """Whether an event of `continued`'s rendered stream goes to a client that holds the
        stream up to position `at` (it may be edited in place to fit)."""
        raise NotImplementedError


def message_role(message: Any) -> str:
    if not isinstance(message, dict):
        raise MessageShapeError(f"a message is a {type(message).__name__}, not an object")
    role = message.get("role")
    if not isinstance(role, str):
        raise MessageShapeError("a message has no string 'role'")
    return role
