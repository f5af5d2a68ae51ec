"""The OpenAI Responses API: `POST …/v1/responses`; the transcript is the `input` array of items.
Codex signed in with ChatGPT speaks it to `POST …/backend-api/codex/responses` (ChatGPT's Codex
backend), which answers only streamed, unstored requests.

Requests: a read-only view of each input item. The system prompt is the top-level `instructions`
or the leading developer/system items (Codex sends no `instructions`: its first item is a
`developer` message). Calls and their outputs are separate items paired by `call_id`, answered
anywhere later (parallel calls come as all calls, then all outputs); a `reasoning` item is bound
to the item right after it (the provider refuses either without the other).

What passes through untouched, with the reason: a string `input` (one user turn: nothing to
summarize), a `previous_response_id` or a `conversation` (the history lives at the provider), an
`item_reference` or a `compaction` item (an item the addon cannot read), and any item type,
message role or content part type the addon does not know (it may carry a pairing rule of its
own: unknown content is never cut).

Answers: the `response` object, JSON or rebuilt from its event stream (`response.created`,
`response.output_item.added` / `.done`, the text, argument, input and reasoning deltas,
`response.completed` / `.incomplete` / `.failed`, `error`), edited, and streamed back as the API
streams it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar, cast

from cg.wire.dialects.base import (
    SYSTEM_ROLES,
    BlockView,
    Dialect,
    MessageShapeError,
    MessageView,
    OutputText,
    Pairing,
    ToolCall,
    ToolOutput,
    UsageReader,
    answer_model,
    is_blank_text,
)
from cg.wire.jsonspan import Member
from cg.wire.reply import (
    Call,
    Json,
    JsonObject,
    ProviderError,
    ResponseParseError,
    as_index,
    as_object,
    call_input,
    clone,
    dumps,
    event_json,
    json_pieces,
    loads_json,
    pieces,
    sse_event,
    sse_events,
)

CHATGPT_SUFFIX = "/backend-api/codex/responses"
# What Codex 0.171.0 signed in with ChatGPT sends besides its bearer, that a summarizer call on
# its behalf keeps there: the account the bearer acts for, the caller (`originator`, `version`),
# the session and thread, the beta. Only that route's calls carry them.
CHATGPT_HEADERS = (
    "chatgpt-account-id",
    "originator",
    "version",
    "openai-beta",
    "session_id",
    "session-id",
    "thread-id",
)
MESSAGE_ROLES = frozenset({"user", "assistant", "system", "developer"})
# Client-side calls, each answered by an output item carrying its call id, and how the
# provider names them in its refusals ("No tool output found for function call call_…").
CALLS = {
    "function_call": "function call",
    "custom_tool_call": "custom tool call",
    "local_shell_call": "local shell call",
    "shell_call": "shell call",
    "apply_patch_call": "apply patch call",
    "computer_call": "computer call",
    "mcp_approval_request": "MCP approval request",
}
OUTPUTS = {
    "function_call_output": "function call output",
    "custom_tool_call_output": "custom tool call output",
    "local_shell_call_output": "local shell call output",
    "shell_call_output": "shell call output",
    "apply_patch_call_output": "apply patch call output",
    "computer_call_output": "computer call output",
    "mcp_approval_response": "MCP approval response",
}
# Where each call or output item keeps the id that pairs it (an MCP approval pairs by the
# request's own `id`; a local shell output names its call in `call_id`, older ones in `id`).
_CALL_ID = {"mcp_approval_request": ("id",)}
_OUTPUT_ID = {
    "mcp_approval_response": ("approval_request_id",),
    "local_shell_call_output": ("call_id", "id"),
}
# What may stand in each output item's `output` (`ToolOutput.text`): a string or text parts, a
# string only; any other output item's is not text (a screenshot, a list of shell results).
OUTPUT_TEXT: dict[str, OutputText] = {
    "function_call_output": "parts",
    "custom_tool_call_output": "parts",
    "local_shell_call_output": "string",
    "apply_patch_call_output": "string",
}
# Items the provider ran itself (no output item answers them): kept or summarized like text.
SERVER_ITEMS = frozenset(
    {
        "web_search_call",
        "file_search_call",
        "image_generation_call",
        "code_interpreter_call",
        "mcp_call",
        "mcp_list_tools",
    }
)
# History the addon cannot read: the request passes through untouched.
HIDDEN_ITEMS = {
    "item_reference": "an item_reference (the item lives at the provider; the addon cannot see it)",
    "compaction": "a compaction item (encrypted history the addon cannot read)",
    "compaction_trigger": "a compaction_trigger (a compaction request)",
}
KNOWN_PARTS = frozenset(
    {"input_text", "input_image", "input_file", "input_audio", "output_text", "refusal"}
)
# The answer's client-side calls, which the client (or the continuation loop) must answer.
CLIENT_CALLS = frozenset(CALLS) - {"mcp_approval_request"}


def _text_of_part(part: Any) -> BlockView:
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        raise MessageShapeError("a content part is not an object with a string 'type'")
    kind: str = part["type"]
    if kind not in KNOWN_PARTS:
        raise MessageShapeError(f"unknown content part type {kind!r}")
    if kind in ("input_text", "output_text"):
        text = part.get("text")
        return BlockView(kind, text if isinstance(text, str) else "", is_blank_text(text))
    if kind == "refusal":
        text = part.get("refusal")
        return BlockView(kind, text if isinstance(text, str) else "", is_blank_text(text))
    return BlockView(kind, f"[{kind}]")


def _output_text(output: Any) -> str:
    """A tool output as text: a string, or the text of its parts (images named, not shown)."""
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        out = []
        for p in output:
            if isinstance(p, dict) and isinstance(p.get("text"), str):
                out.append(p["text"])
            elif isinstance(p, dict):
                out.append(dumps(p) if "stdout" in p or "outcome" in p else f"[{p.get('type')}]")
        return "\n".join(out)
    return dumps(output) if output is not None else ""


def _id_at(item: dict[str, Any], keys: tuple[str, ...], kind: str) -> str:
    for k in keys:
        v = item.get(k)
        if isinstance(v, str) and v:
            return v
    raise MessageShapeError(f"a {kind} item has no string {keys[0]!r}")


def _call_text(item: dict[str, Any], kind: str) -> str:
    if kind == "function_call":
        return f"[tool_call {item.get('name')}] {_str(item.get('arguments'))}"
    if kind == "custom_tool_call":
        return f"[tool_call {item.get('name')}] {_str(item.get('input'))}"
    if kind == "mcp_approval_request":
        return f"[mcp_approval_request {item.get('name')}] {_str(item.get('arguments'))}"
    body = {k: v for k, v in item.items() if k in ("action", "operation")}
    return f"[tool_call {kind.removesuffix('_call')}] {dumps(body)}"


def _str(v: Any) -> str:
    return v if isinstance(v, str) else dumps(v)


def _message(item: dict[str, Any], kind: str, item_id: str | None) -> MessageView:
    role = item.get("role")
    if not isinstance(role, str):
        raise MessageShapeError("a message item has no string 'role'")
    if role not in MESSAGE_ROLES:
        raise MessageShapeError(f"unknown role {role!r}")
    content = item.get("content")
    if isinstance(content, str):
        return MessageView(
            role, content, "string", (), (), (), is_blank_text(content), kind, item_id
        )
    if not isinstance(content, list):
        raise MessageShapeError(
            f"a message's 'content' is not a string or an array (got {type(content).__name__})"
        )
    blocks = tuple(_text_of_part(p) for p in content)
    blank = all(b.blank or (b.type in ("input_text", "output_text") and not b.text) for b in blocks)
    text = "\n".join(b.text for b in blocks if b.text)
    return MessageView(role, text, "blocks", blocks, (), (), blank, kind, item_id)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class ResponsesReader:
    """`response.completed` / `.incomplete` / `.failed`: `response.usage`."""

    FINAL: ClassVar[frozenset[str]] = frozenset(
        {"response.completed", "response.incomplete", "response.failed"}
    )

    def __init__(self) -> None:
        self.raw: Any = None
        self.model: str | None = None

    def event(self, name: str | None, obj: Any) -> None:
        if not isinstance(obj, dict) or (name or obj.get("type")) not in self.FINAL:
            return
        resp = obj.get("response")
        if isinstance(resp, dict) and resp.get("usage") is not None:
            self.raw = resp["usage"]
            self.model = answer_model(resp) or self.model


def _item_added(obj: Any, kind: str, name: str | None = None) -> tuple[int, int | None] | None:
    """(output index, sequence number) when `obj` is a `response.output_item.added` of an item
    of type `kind` (and, if given, named `name`); else None."""
    item = obj.get("item") if isinstance(obj, dict) else None
    if (
        isinstance(obj, dict)
        and obj.get("type") == "response.output_item.added"
        and isinstance(item, dict)
        and item.get("type") == kind
        and (name is None or item.get("name") == name)
        and isinstance(obj.get("output_index"), int)
    ):
        seq = obj.get("sequence_number")
        return obj["output_index"], seq if isinstance(seq, int) else None
    return None


class Responses(Dialect):
    name: ClassVar[str] = "responses"
    path_suffix: ClassVar[str] = "/v1/responses"
    extra_suffixes: ClassVar[tuple[str, ...]] = (CHATGPT_SUFFIX,)
    wire_roles: ClassVar[frozenset[str]] = MESSAGE_ROLES
    array_key: ClassVar[str] = "input"
    pairing: ClassVar[Pairing] = "id"
    strict_input: ClassVar[bool] = True
    auto_cache: ClassVar[bool] = True
    cache_key_member: ClassVar[str | None] = "prompt_cache_key"
    codex_session_header: ClassVar[bool] = True
    held_reasoning: ClassVar[bool] = True
    default_base: ClassVar[str] = "https://api.openai.com"
    key_env: ClassVar[str] = "OPENAI_API_KEY"

    def conversation_system(self, top_level: Mapping[str, Any], messages: Sequence[Any]) -> object:
        """`instructions` and the leading developer/system items."""
        lead = []
        for m in messages:
            if not (isinstance(m, dict) and m.get("role") in SYSTEM_ROLES):
                break
            lead.append(m)
        return [top_level.get("instructions"), lead]

    def summary_request(self, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
        # One user turn; nothing of it is kept at the provider.
        return {"model": model, "input": prompt, "store": False}

    def streams_only(self, url: str) -> bool:
        """ChatGPT's Codex backend (Codex signed in with ChatGPT) answers only `stream: true`."""
        return url.split("?", 1)[0].rstrip("/").endswith(CHATGPT_SUFFIX)

    def route_headers(self, url: str) -> tuple[str, ...]:
        return CHATGPT_HEADERS if self.streams_only(url) else ()

    def streamed(self, body: dict[str, Any]) -> dict[str, Any]:
        """The standalone request as that backend takes it, in the shape Codex itself sends
        there: the prompt as one user message item, streamed, unstored."""
        prompt = body.get("input")
        if isinstance(prompt, str):
            part = {"type": "input_text", "text": prompt}
            body = {**body, "input": [{"type": "message", "role": "user", "content": [part]}]}
        return {**body, "stream": True, "store": False}

    def answer_text(self, doc: JsonObject) -> str:
        output = doc.get("output")
        if not isinstance(output, list):
            raise ResponseParseError("the answer has no 'output' array")
        return "".join(
            p["text"]
            for item in output
            if isinstance(item, dict) and item.get("type") == "message"
            for p in cast(list[Json], item.get("content") or [])
            if isinstance(p, dict)
            and p.get("type") == "output_text"
            and isinstance(p.get("text"), str)
        )

    def summary_limits(self, members: Mapping[str, Member], budget: int) -> dict[str, Any]:
        """`max_output_tokens` raised to the budget (never added). A stream reports its usage
        in `response.completed` whatever the request asked."""
        out: dict[str, Any] = {}
        limit = members.get("max_output_tokens")
        if limit is not None and _int(limit.value) and limit.value < budget:
            out["max_output_tokens"] = budget
        return out

    def function_tool(self, name: str, description: str, schema: JsonObject) -> JsonObject:
        """Flat, and strict unless told otherwise: a strict schema closes its objects
        (`additionalProperties: false`) and requires every property."""
        return {
            "type": "function",
            "name": name,
            "description": description,
            "parameters": {**schema, "additionalProperties": False},
            "strict": True,
        }

    def usage_reader(self) -> UsageReader:
        return ResponsesReader()

    def call_begins(self, obj: JsonObject, name: str) -> tuple[int, int | None] | None:
        """A `response.output_item.added` of a `function_call`: its output index."""
        return _item_added(obj, "function_call", name)

    def reasoning_begins(self, event: bytes) -> tuple[int, int | None] | None:
        if b"response.output_item.added" not in event or b"reasoning" not in event:
            return None
        return _item_added(event_json(event), "reasoning")

    def continued(self, first: JsonObject, final: JsonObject, at: int, rounds: int) -> None:
        final["id"] = first.get("id", final.get("id"))
        tail = list(cast(list[Json], final.get("output") or []))
        final["output"] = list(cast(list[Json], first.get("output") or []))[:at] + (
            tail[at:] if rounds == 0 else tail
        )

    def resumed_event(self, obj: JsonObject, at: int) -> bool:
        if obj.get("type") in ("response.created", "response.in_progress"):
            return False
        idx = obj.get("output_index")
        return not (isinstance(idx, int) and idx < at)

    def refuse(self, members: Mapping[str, Any]) -> str | None:
        for key, what in (
            ("previous_response_id", "the history lives at the provider"),
            ("conversation", "the history lives in a provider-side conversation"),
        ):
            m = members.get(key)
            if m is not None and m.value is not None:
                return f"{key} is set: {what}, which the addon cannot see"
        inp = members.get("input")
        if inp is not None and isinstance(inp.value, str):
            return "'input' is a string: a single user turn, nothing to summarize"
        return None

    def tool_outputs(self, message: Mapping[str, Any]) -> tuple[ToolOutput, ...]:
        """An output item's `output`."""
        kind = message.get("type")
        if not isinstance(kind, str) or kind not in OUTPUTS:
            return ()
        keys = _OUTPUT_ID.get(kind, ("call_id",))
        cid = next((v for k in keys if isinstance(v := message.get(k), str) and v), "")
        return (ToolOutput(cid, ("output",), OUTPUT_TEXT.get(kind, "none")),)

    def tool_calls(self, message: Mapping[str, Any]) -> tuple[ToolCall, ...]:
        kind = message.get("type")
        if not isinstance(kind, str) or kind not in CALLS:
            return ()
        keys = _CALL_ID.get(kind, ("call_id",))
        cid = next((v for k in keys if isinstance(v := message.get(k), str) and v), "")
        name = message.get("name")
        if kind == "function_call" or kind == "mcp_approval_request":
            given = message.get("arguments")
        elif kind == "custom_tool_call":
            given = message.get("input")
        else:
            given = {k: v for k, v in message.items() if k in ("action", "operation")}
        tool = name if isinstance(name, str) and name else kind.removesuffix("_call")
        return (ToolCall(cid, tool, given),)

    def view(self, item: Any) -> MessageView:
        if not isinstance(item, dict):
            raise MessageShapeError(f"an input item is a {type(item).__name__}, not an object")
        kind = item.get("type")
        raw_id = item.get("id")
        item_id = raw_id if isinstance(raw_id, str) else None
        if kind is None:
            if "role" not in item:
                raise MessageShapeError("an input item has neither 'type' nor 'role'")
            return _message(item, "message", item_id)  # an EasyInputMessage: {role, content}
        if not isinstance(kind, str):
            raise MessageShapeError("an input item's 'type' is not a string")
        if kind == "message":
            return _message(item, kind, item_id)
        if kind == "reasoning":
            summary = item.get("summary")
            texts = [
                s["text"]
                for s in summary or []
                if isinstance(s, dict) and isinstance(s.get("text"), str)
            ]
            text = "[reasoning] " + "\n".join(texts) if texts else "[reasoning]"
            return MessageView(
                "assistant", text, "other", (), (), (), False, kind, item_id, binds_next=True
            )
        if kind in CALLS:
            cid = _id_at(item, _CALL_ID.get(kind, ("call_id",)), kind)
            return MessageView(
                "assistant", _call_text(item, kind), "other", (), (cid,), (), False, kind, item_id
            )
        if kind in OUTPUTS:
            cid = _id_at(item, _OUTPUT_ID.get(kind, ("call_id",)), kind)
            out = item.get("output", item.get("approve"))
            return MessageView(
                "tool", _output_text(out), "other", (), (), (cid,), False, kind, item_id
            )
        if kind in SERVER_ITEMS:
            detail = item.get("action") or item.get("arguments") or item.get("code") or ""
            text = f"[{kind}] {_str(detail)}" if detail else f"[{kind}]"
            return MessageView("assistant", text, "other", (), (), (), False, kind, item_id)
        if kind == "additional_tools":
            tools = item.get("tools")
            names = [
                str(t.get("name") or t.get("type")) for t in tools or [] if isinstance(t, dict)
            ]
            return MessageView(
                "developer",
                "[additional_tools] " + ", ".join(names),
                "other",
                (),
                (),
                (),
                False,
                kind,
                item_id,
                pinned=True,
            )
        if kind in HIDDEN_ITEMS:
            raise MessageShapeError(HIDDEN_ITEMS[kind])
        raise MessageShapeError(f"unknown item type {kind!r}")

    def role_error(self, item: Any) -> str | None:
        if not isinstance(item, dict):
            return "an input item is not an object"
        if item.get("type") not in (None, "message"):
            return None  # calls, outputs, reasoning: no role to check
        return super().role_error(item)

    def user_message(self, text: str) -> dict[str, Any]:
        """A typed message item with one `input_text` part: the form Codex sends its own user
        turns in, which every Responses server accepts."""
        return {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": text}],
        }

    # -- the provider's wording (param "input"; see docs/agents.md "Shape rules" for the sources) -----

    def msg_unanswered(self, i: int, ids: list[str], view: MessageView | None = None) -> str:
        what = CALLS.get(view.kind if view else "", "function call")
        return f"No tool output found for {what} {', '.join(ids)}."

    def msg_unpaired(self, i: int, ids: list[str], view: MessageView | None = None) -> str:
        what = OUTPUTS.get(view.kind if view else "", "function call output")
        return f"No tool call found for {what} with call_id {', '.join(ids)}."

    def msg_blank(self, i: int) -> str:
        return f"Invalid 'input[{i}].content': a message item must have non-empty content."

    def msg_reasoning(self, i: int, view: MessageView) -> str:
        return (
            f"Item '{view.item_id or f'input[{i}]'}' of type 'reasoning' was provided without "
            "its required following item."
        )

    def msg_separated(self, i: int, view: MessageView) -> str:
        return (
            f"Item '{view.item_id or f'input[{i}]'}' of type '{view.kind}' was provided "
            "without its required 'reasoning' item."
        )

    def msg_duplicate(self, i: int, item_id: str) -> str:
        return (
            f"Duplicate item found with id {item_id}. Remove duplicate items from your input "
            "and try again."
        )

    def msg_duplicate_call(self, i: int, call_id: str) -> str:
        return f"input[{i}]: call_id {call_id} is used by an earlier item of the same kind."

    # -- answers --------------------------------------------------------------------------------

    input_usage_keys: ClassVar[tuple[str, ...]] = ("input_tokens", "input_tokens_details")
    usage_total_of: ClassVar[tuple[str, str] | None] = ("input_tokens", "output_tokens")

    def answer_error(self, doc: JsonObject) -> bool:
        """An error body (`{"error": {…}}`), or a response object that failed."""
        return bool(doc.get("error")) or doc.get("status") == "failed"

    def check_answer(self, doc: JsonObject) -> None:
        if doc.get("object") != "response":
            raise ResponseParseError(
                f"response body: 'object' is {doc.get('object')!r}, not 'response'"
            )
        output = doc.get("output")
        if not isinstance(output, list):
            raise ResponseParseError("response body: 'output' is not a list")
        for i, item in enumerate(output):
            if not isinstance(as_object(item, f"output[{i}]").get("type"), str):
                raise ResponseParseError(f"output[{i}]: 'type' is not a string")

    def parse_stream(self, body: bytes) -> JsonObject:
        return _parse_sse(body)

    def calls(self, message: JsonObject) -> list[Call]:
        """The client-side calls among the output items (function, custom, shell, patch,
        computer); a function call's arguments that are not a JSON object stay a string."""
        out: list[Call] = []
        for item in message.get("output") or []:
            if not isinstance(item, dict) or item.get("type") not in CLIENT_CALLS:
                continue
            kind = item["type"]
            cid = str(item.get("call_id", ""))
            if kind == "function_call":
                args = call_input(item.get("arguments", ""))
                out.append(Call(cid, str(item.get("name", "")), args))
            elif kind == "custom_tool_call":
                out.append(Call(cid, str(item.get("name", "")), _str(item.get("input", ""))))
            else:
                out.append(Call(cid, kind.removesuffix("_call"), dumps(item)))
        return out

    def strip_calls(self, message: JsonObject, name: str) -> None:
        """Drop the function calls to `name` from `output`, and the `reasoning` item right
        before each: the client would re-send it on its next turn, and the provider refuses a
        reasoning item without the item that followed it."""
        output = message.get("output")
        if not isinstance(output, list):
            return
        drop: set[int] = set()
        for i, item in enumerate(output):
            if (
                isinstance(item, dict)
                and item.get("type") == "function_call"
                and item.get("name") == name
            ):
                drop.add(i)
                j = i - 1
                while (
                    j >= 0 and isinstance(output[j], dict) and output[j].get("type") == "reasoning"
                ):
                    drop.add(j)
                    j -= 1
        if drop:
            message["output"] = [it for i, it in enumerate(output) if i not in drop]

    def assistant_turn(self, message: JsonObject) -> JsonObject:
        items = self.assistant_turns(message)
        if len(items) != 1:
            raise ValueError("a Responses answer is appended as its items (assistant_turns)")
        return items[0]

    def assistant_turns(self, message: JsonObject) -> list[JsonObject]:
        """Every output item as returned, reasoning (with its `encrypted_content`) included,
        the way a client continues a Responses tool loop by hand."""
        return [clone(item) for item in message.get("output") or [] if isinstance(item, dict)]

    def result_turns(self, results: list[tuple[str, str]]) -> list[JsonObject]:
        """One `function_call_output` item per call."""
        return [
            {"type": "function_call_output", "call_id": i, "output": text} for i, text in results
        ]

    def frames(self, message: JsonObject) -> Iterator[str]:
        return _frames(message)


# -- answers --------------------------------------------------------------------------------------

TERMINAL = ("response.completed", "response.incomplete", "response.failed")


def _parse_sse(body: bytes) -> JsonObject:
    """The response the stream describes: the terminal event's `response`, with its `output`
    taken from the `response.output_item.done` items when the terminal event carries none (some
    servers leave it empty). A stream without a terminal event is truncated."""
    start: JsonObject | None = None
    items: dict[int, JsonObject] = {}
    final: JsonObject | None = None
    for n, (name, data) in enumerate(sse_events(body), 1):
        where = f"SSE event {n} ({name or 'unnamed'})"
        if data.strip() == "[DONE]":
            continue
        obj = as_object(loads_json(data, where), where)
        kind = obj.get("type") or name
        if kind == "error":
            raise ProviderError(f"provider error event: {dumps(obj)[:300]}", obj)
        if final is not None:
            continue  # nothing after the terminal event belongs to the response
        if kind in ("response.created", "response.in_progress", "response.queued"):
            if start is None:
                start = as_object(obj.get("response"), f"{where}.response")
            continue
        if kind in ("response.output_item.added", "response.output_item.done"):
            if start is None:
                raise ResponseParseError(f"{where}: {kind} before response.created")
            i = as_index(obj.get("output_index"), f"{where}.output_index")
            item = as_object(obj.get("item"), f"{where}.item")
            if kind.endswith(".done") or i not in items:
                items[i] = clone(item)
            continue
        if kind in TERMINAL:
            final = clone(as_object(obj.get("response"), f"{where}.response"))
            if kind == "response.failed" or final.get("status") == "failed":
                raise ProviderError(f"response.failed: {dumps(final.get('error'))[:300]}", obj)
            continue
        # Deltas and the `.done` of parts: the item's `.done` and the terminal event carry the
        # whole; new event types may appear, and the API asks clients to ignore them.
    if final is None:
        raise ResponseParseError(
            "the stream ended before response.completed (truncated)"
            if start is not None
            else "no response.created event: not a Responses stream"
        )
    output = final.get("output")
    if (not isinstance(output, list) or not output) and items:
        final["output"] = [items[i] for i in sorted(items)]
    elif not isinstance(output, list):
        final["output"] = []
    return final


class _Seq:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self, kind: str, data: JsonObject) -> str:
        out = sse_event(kind, {"type": kind, "sequence_number": self.n, **data})
        self.n += 1
        return out


def _item_start(item: JsonObject) -> JsonObject:
    """An item as `response.output_item.added` announces it: in progress, its text empty."""
    start: JsonObject = clone(item)
    kind = item.get("type")
    if "status" in start:
        start["status"] = "in_progress"
    if kind == "message":
        start["content"] = []
    elif kind == "function_call":
        start["arguments"] = ""
    elif kind == "custom_tool_call":
        start["input"] = ""
    elif kind == "reasoning":
        start["summary"] = []
    return start


def _item_frames(seq: _Seq, i: int, item: Json) -> Iterator[str]:
    if not isinstance(item, dict):
        return
    kind = item.get("type")
    iid = item.get("id")
    at = {"output_index": i}
    yield seq("response.output_item.added", {**at, "item": _item_start(item)})
    where = {"item_id": iid, **at}
    if kind == "message":
        for c, part in enumerate(item.get("content") or []):
            if not isinstance(part, dict):
                continue
            ptype = part.get("type")
            text_key = (
                "text" if ptype == "output_text" else "refusal" if ptype == "refusal" else None
            )
            empty = clone(part)
            if text_key and isinstance(part.get(text_key), str):
                empty[text_key] = ""
            yield seq("response.content_part.added", {**where, "content_index": c, "part": empty})
            if ptype == "output_text" and isinstance(part.get("text"), str):
                for p in pieces(part["text"]) if part["text"] else []:
                    yield seq(
                        "response.output_text.delta",
                        {**where, "content_index": c, "delta": p, "logprobs": []},
                    )
                yield seq(
                    "response.output_text.done",
                    {**where, "content_index": c, "text": part["text"], "logprobs": []},
                )
            elif ptype == "refusal" and isinstance(part.get("refusal"), str):
                for p in pieces(part["refusal"]) if part["refusal"] else []:
                    yield seq("response.refusal.delta", {**where, "content_index": c, "delta": p})
                yield seq(
                    "response.refusal.done",
                    {**where, "content_index": c, "refusal": part["refusal"]},
                )
            yield seq("response.content_part.done", {**where, "content_index": c, "part": part})
    elif kind == "function_call" and isinstance(item.get("arguments"), str):
        args = item["arguments"]
        for p in json_pieces(args) if args else []:
            yield seq("response.function_call_arguments.delta", {**where, "delta": p})
        yield seq(
            "response.function_call_arguments.done",
            {**where, "name": item.get("name"), "arguments": args},
        )
    elif kind == "custom_tool_call" and isinstance(item.get("input"), str):
        inp = item["input"]
        for p in pieces(inp) if inp else []:
            yield seq("response.custom_tool_call_input.delta", {**where, "delta": p})
        yield seq("response.custom_tool_call_input.done", {**where, "input": inp})
    elif kind == "reasoning":
        for s, part in enumerate(item.get("summary") or []):
            if not isinstance(part, dict) or not isinstance(part.get("text"), str):
                continue
            at_s = {**where, "summary_index": s}
            yield seq(
                "response.reasoning_summary_part.added", {**at_s, "part": {**part, "text": ""}}
            )
            for p in pieces(part["text"]) if part["text"] else []:
                yield seq("response.reasoning_summary_text.delta", {**at_s, "delta": p})
            yield seq("response.reasoning_summary_text.done", {**at_s, "text": part["text"]})
            yield seq("response.reasoning_summary_part.done", {**at_s, "part": part})
    yield seq("response.output_item.done", {**at, "item": item})


def _frames(m: JsonObject) -> Iterator[str]:
    seq = _Seq()
    status = m.get("status")
    start = clone(m)
    start["status"] = "in_progress"
    start["output"] = []
    if "usage" in start:
        start["usage"] = None
    for key in ("incomplete_details", "error"):
        if key in start:
            start[key] = None
    yield seq("response.created", {"response": start})
    yield seq("response.in_progress", {"response": start})
    for i, item in enumerate(m.get("output") or []):
        yield from _item_frames(seq, i, item)
    end = {
        "incomplete": "response.incomplete",
        "failed": "response.failed",
    }.get(status if isinstance(status, str) else "", "response.completed")
    yield seq(end, {"response": m})
