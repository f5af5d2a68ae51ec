"""The Anthropic Messages API: `POST …/v1/messages`, system prompt in the top-level `system`.

Requests: a read-only view of each message. Answers: the `message` object, JSON or rebuilt from
its event stream (`message_start`, `content_block_*`, `message_delta`, `message_stop`), edited
and streamed back as the API streams it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar, Literal, cast
from urllib.parse import quote, unquote, urlsplit

from cg.wire.dialects.base import (
    BlockView,
    Dialect,
    MessageShapeError,
    MessageView,
    Pairing,
    ToolCall,
    ToolOutput,
    UsageReader,
    answer_model,
    is_blank_text,
    message_role,
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
    as_text,
    clone,
    dumps,
    json_pieces,
    loads_json,
    pieces,
    sse_event,
    sse_events,
)
from cg.wire.usage import Usage, from_anthropic


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


# The content block types of a request's messages that the addon knows, and knows to be safe to
# keep or summarize with the message they sit in: every pairing rule among them is one the shape
# rules model (tool_use/tool_result across messages; a server tool's use and result within one
# assistant message). A block type not listed here may carry a pairing rule of its own (a new
# server-side block is exactly where the next provider 400 comes from), so a request holding one
# anywhere passes through untouched (docs/behaviour.md#errors-and-bad-input). `tool_result` contents
# are not checked: they go wherever their block goes.
KNOWN_BLOCKS = frozenset(
    {
        "text",
        "image",
        "document",
        "search_result",
        "thinking",
        "redacted_thinking",
        "tool_use",
        "tool_result",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "container_upload",
        "mcp_tool_use",
        "mcp_tool_result",
    }
)


def _block(block: Any) -> BlockView:
    """A block that `Anthropic.view`'s inline cases (text, thinking, tool_use, tool_result)
    did not take: a known type shown by name, or the reason the body passes through."""
    kind = block.get("type") if isinstance(block, dict) else None
    if not isinstance(kind, str):
        raise MessageShapeError("a content block is not an object with a string 'type'")
    if kind not in KNOWN_BLOCKS:
        raise MessageShapeError(f"unknown content block type {kind!r}")
    # redacted_thinking, image, document, server tools: kept with their message, never dropped.
    return BlockView(kind, f"[{kind}]")


ANTHROPIC_VERSION = "2023-06-01"
# Claude on Vertex AI: `…/publishers/anthropic/models/MODEL:rawPredict` (`:streamRawPredict`),
# the model in the path (not the body) and the API version in the body. Vertex's token counter
# (`models/count-tokens:rawPredict`) is not a turn.
VERTEX_VERSION = "vertex-2023-10-16"
_VERTEX = re.compile(r"/publishers/anthropic/models/([^/:?]+):(stream)?[rR]awPredict$")


def _vertex_model(path: str) -> str | None:
    m = _VERTEX.search(path.split("?", 1)[0].rstrip("/"))
    if m is None or m.group(1) == "count-tokens":
        return None
    return unquote(m.group(1))


def _id(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class AnthropicReader:
    """`message_start.message.usage`, then `message_delta.usage`: cumulative totals, a
    non-null value replacing the one before."""

    def __init__(self) -> None:
        self.raw: Any = None
        self.model: str | None = None

    def event(self, name: str | None, obj: Any) -> None:
        if not isinstance(obj, dict):
            return
        kind = name or obj.get("type")
        if kind == "message_start":
            msg = obj.get("message")
            usage = msg.get("usage") if isinstance(msg, dict) else None
            self.model = answer_model(msg) or self.model
            self.raw = dict(usage) if isinstance(usage, dict) else usage
        elif kind == "message_delta" and "usage" in obj:
            usage = obj["usage"]
            if not isinstance(usage, dict) or not isinstance(self.raw, dict):
                self.raw = dict(usage) if isinstance(usage, dict) else usage
                return
            # Cumulative totals: they replace, and an omitted (null) count leaves the one before.
            for k, v in usage.items():
                if v is not None or k not in self.raw:
                    self.raw[k] = v


class Anthropic(Dialect):
    name: ClassVar[str] = "anthropic"
    path_suffix: ClassVar[str] = "/v1/messages"
    wire_roles: ClassVar[frozenset[str]] = frozenset({"user", "assistant", "system"})
    pairing: ClassVar[Pairing] = "next"
    auto_cache: ClassVar[bool] = False
    metadata_member: ClassVar[str | None] = "metadata"
    default_base: ClassVar[str] = "https://api.anthropic.com"
    key_env: ClassVar[str] = "ANTHROPIC_API_KEY"

    def conversation_system(self, top_level: Mapping[str, Any], messages: Sequence[Any]) -> object:
        return top_level.get("system")

    def matches(self, bare_path: str) -> bool:
        return super().matches(bare_path) or _vertex_model(bare_path) is not None

    def url_model(self, path: str) -> str | None:
        return _vertex_model(path)

    def url_streams(self, path: str) -> bool:
        return _vertex_model(path) is not None and path.split("?", 1)[0].endswith(
            ":streamRawPredict"
        )

    def standalone_url(self, url: str, model: str) -> str:
        """On Vertex: the same endpoint's `models/MODEL:rawPredict` (no stream)."""
        head, sep, query = url.partition("?")
        if _vertex_model(head) is None:
            return url
        return _VERTEX.sub(
            f"/publishers/anthropic/models/{quote(model, safe='@')}:rawPredict", head
        ) + (sep + query if sep else "")

    def standalone_body(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        """On Vertex the model is the path's, and the body says the API version."""
        if _vertex_model(urlsplit(url).path) is None:
            return body
        out = {k: v for k, v in body.items() if k != "model"}
        out.setdefault("anthropic_version", VERTEX_VERSION)
        return out

    def summarizer_headers(self, headers: Mapping[str, str]) -> dict[str, str]:
        out = dict(headers)
        out.setdefault("anthropic-version", ANTHROPIC_VERSION)
        return out

    def auth_headers(self, key: str, bearer: bool) -> dict[str, str]:
        out = {"anthropic-version": ANTHROPIC_VERSION}
        if key:
            if bearer:
                out["authorization"] = f"Bearer {key}"
            else:
                out["x-api-key"] = key
        return out

    def summary_request(self, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
        messages = [{"role": "user", "content": prompt}]
        return {"model": model, "max_tokens": max_tokens, "messages": messages}

    def answer_text(self, doc: JsonObject) -> str:
        blocks = doc.get("content")
        if not isinstance(blocks, list):
            raise ResponseParseError("the answer has no 'content' array")
        return "".join(
            b["text"] for b in blocks if isinstance(b, dict) and isinstance(b.get("text"), str)
        )

    def summary_limits(self, members: Mapping[str, Member], budget: int) -> dict[str, Any]:
        """`max_tokens`: the budget; with thinking on, the agent's own limit when larger (it is
        already > budget_tokens, which the API requires, and known to fit this model)."""
        out: dict[str, Any] = {}
        limit = members.get("max_tokens")
        if limit is None or not _int(limit.value):
            return out
        thinking = members.get("thinking")
        kind = thinking.value.get("type") if thinking and isinstance(thinking.value, dict) else None
        want = max(limit.value, budget) if kind not in (None, "disabled") else budget
        if want != limit.value:
            out["max_tokens"] = want
        return out

    def forces_a_tool(self, tool_choice: Any) -> bool:
        return isinstance(tool_choice, dict) and tool_choice.get("type") in ("any", "tool")

    def tool_choice(self, mode: Literal["auto", "none"]) -> Any:
        return {"type": mode}

    def fixed_tool_choice(self, tool_choice: Any) -> bool:
        return isinstance(tool_choice, dict) and tool_choice.get("type") in ("any", "tool", "none")

    def function_tool(self, name: str, description: str, schema: JsonObject) -> JsonObject:
        return {"name": name, "description": description, "input_schema": schema}

    def usage(self, u: Any) -> Usage:
        return from_anthropic(u)

    def usage_reader(self) -> UsageReader:
        return AnthropicReader()

    def call_begins(self, obj: JsonObject, name: str) -> tuple[int, int | None] | None:
        """A `content_block_start` of a `tool_use` block: its block index."""
        block = obj.get("content_block")
        if (
            obj.get("type") == "content_block_start"
            and isinstance(block, dict)
            and block.get("type") == "tool_use"
            and block.get("name") == name
            and isinstance(obj.get("index"), int)
        ):
            return cast(int, obj["index"]), None
        return None

    def continued(self, first: JsonObject, final: JsonObject, at: int, rounds: int) -> None:
        tail = list(cast(list[Json], final.get("content") or []))
        final["content"] = list(cast(list[Json], first.get("content") or []))[:at] + (
            tail[at:] if rounds == 0 else tail
        )

    def resumed_event(self, obj: JsonObject, at: int) -> bool:
        if obj.get("type") == "message_start":
            return False
        idx = obj.get("index")
        return not (isinstance(idx, int) and idx < at)

    def tool_outputs(self, message: Mapping[str, Any]) -> tuple[ToolOutput, ...]:
        """Each `tool_result` block's `content` (a string or text blocks)."""
        content = message.get("content")
        if not isinstance(content, list):
            return ()
        return tuple(
            ToolOutput(_id(b.get("tool_use_id")), ("content", n, "content"))
            for n, b in enumerate(content)
            if isinstance(b, dict) and b.get("type") == "tool_result"
        )

    def tool_calls(self, message: Mapping[str, Any]) -> tuple[ToolCall, ...]:
        content = message.get("content")
        if not isinstance(content, list):
            return ()
        return tuple(
            ToolCall(_id(b.get("id")), _id(b.get("name")), b.get("input"))
            for b in content
            if isinstance(b, dict) and b.get("type") == "tool_use"
        )

    def view(self, message: Any) -> MessageView:
        # Every message of a cold body comes through here (400 for a 1 MB Claude Code turn):
        # one pass over the blocks, the four common types inline, nothing rendered (a block's
        # and the message's `text` are built when read).
        role = message_role(message)
        if "content" not in message:
            return MessageView(role, "", "missing", (), (), (), True)
        content = message["content"]
        if content is None:
            return MessageView(role, "", "null", (), (), (), True)
        if isinstance(content, str):
            return MessageView(role, content, "string", (), (), (), is_blank_text(content))
        if not isinstance(content, list):
            raise MessageShapeError(
                f"'content' is not a string or an array (got {type(content).__name__})"
            )
        blocks: list[BlockView] = []
        calls: list[str] = []
        results: list[str] = []
        blank = not content
        for b in content:
            kind = b.get("type") if isinstance(b, dict) else None
            if kind == "text" or kind == "thinking":
                t = b.get(kind)
                if isinstance(t, str) and t and not t.isspace():
                    blocks.append(BlockView(kind, t))
                else:
                    blank = True
                    blocks.append(BlockView(kind, t if isinstance(t, str) else "", True))
            elif kind == "tool_use":
                tid = b.get("id")
                tid = tid if isinstance(tid, str) else ""
                calls.append(tid)
                blocks.append(BlockView(kind, "", False, None, b))
            elif kind == "tool_result":
                rid = b.get("tool_use_id")
                rid = rid if isinstance(rid, str) else ""
                results.append(rid)
                blocks.append(BlockView(kind, _result_text(b.get("content")), False, rid))
            else:
                blocks.append(_block(b))
        return MessageView(role, None, "blocks", tuple(blocks), tuple(calls), tuple(results), blank)

    def msg_unanswered(self, i: int, ids: list[str], view: MessageView | None = None) -> str:
        return (
            f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately "
            f"after: {', '.join(ids)}. Each `tool_use` block must have a corresponding "
            "`tool_result` block in the next message."
        )

    def msg_unpaired(self, i: int, ids: list[str], view: MessageView | None = None) -> str:
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

    # -- answers --------------------------------------------------------------------------------

    input_usage_keys: ClassVar[tuple[str, ...]] = (
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
        "cache_creation",
    )

    def answer_error(self, doc: JsonObject) -> bool:
        return doc.get("type") == "error"

    def check_answer(self, doc: JsonObject) -> None:
        if doc.get("type") != "message":
            raise ResponseParseError(f"response body: 'type' is {doc.get('type')!r}, not 'message'")
        content = doc.get("content")
        if not isinstance(content, list):
            raise ResponseParseError("response body: 'content' is not a list")
        for i, block in enumerate(content):
            as_text(as_object(block, f"content[{i}]").get("type"), f"content[{i}].type")

    def parse_stream(self, body: bytes) -> JsonObject:
        return _parse_sse(body)

    def calls(self, message: JsonObject) -> list[Call]:
        out: list[Call] = []
        for b in message.get("content") or []:
            if isinstance(b, dict) and b.get("type") == "tool_use":
                inp = b.get("input")
                out.append(
                    Call(
                        str(b.get("id", "")),
                        str(b.get("name", "")),
                        clone(inp) if isinstance(inp, dict) else dumps(inp),
                    )
                )
        return out

    def strip_calls(self, message: JsonObject, name: str) -> None:
        """A `tool_use` stop reason with no call left becomes `end_turn`."""
        content = message.get("content")
        if not isinstance(content, list):
            return
        message["content"] = [
            b
            for b in content
            if not (isinstance(b, dict) and b.get("type") == "tool_use" and b.get("name") == name)
        ]
        if message.get("stop_reason") == "tool_use" and not any(
            isinstance(b, dict) and b.get("type") == "tool_use" for b in message["content"]
        ):
            message["stop_reason"] = "end_turn"

    def assistant_turn(self, message: JsonObject) -> JsonObject:
        """The content blocks as returned — thinking blocks go back with their signatures
        untouched — but blank text blocks, which the API refuses in a request ("text content
        blocks must contain non-whitespace text") though it may stream them."""
        blocks = [
            clone(b)
            for b in message.get("content") or []
            if not (
                isinstance(b, dict)
                and b.get("type") == "text"
                and (not isinstance(b.get("text"), str) or not b["text"].strip())
            )
        ]
        return {"role": "assistant", "content": blocks}

    def result_turns(self, results: list[tuple[str, str]]) -> list[JsonObject]:
        """Every call of a turn answered in the one user message that follows it."""
        if not results:
            return []
        return [
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": i, "content": text}
                    for i, text in results
                ],
            }
        ]

    def frames(self, message: JsonObject) -> Iterator[str]:
        return _frames(message)


# -- answers --------------------------------------------------------------------------------------


def _parse_sse(body: bytes) -> JsonObject:
    msg: JsonObject | None = None
    blocks: list[JsonObject] = []
    open_: set[int] = set()
    partial: dict[int, list[str]] = {}  # block index -> input_json_delta pieces
    stopped = False
    for n, (name, data) in enumerate(sse_events(body), 1):
        where = f"SSE event {n} ({name or 'unnamed'})"
        obj = as_object(loads_json(data, where), where)
        kind = name or obj.get("type")
        if name and "type" in obj and obj["type"] != name:
            raise ResponseParseError(f"{where}: data has type {obj['type']!r}")
        if stopped or kind == "ping":
            continue  # anything after message_stop is not part of the message
        if kind == "error":
            raise ProviderError(f"provider error event: {dumps(obj.get('error'))[:300]}", obj)
        if kind == "message_start":
            if msg is not None:
                raise ResponseParseError(f"{where}: a second message_start")
            msg = as_object(obj.get("message"), f"{where}.message")
            content = msg.get("content", [])
            if not isinstance(content, list):
                raise ResponseParseError(f"{where}: message.content is not a list")
            blocks = [as_object(b, f"{where}.message.content[]") for b in content]
            continue
        if kind not in (
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ):
            continue  # new event types may appear; the API asks clients to ignore them
        if msg is None:
            raise ResponseParseError(f"{where}: {kind} before message_start")
        if kind == "content_block_start":
            i = as_index(obj.get("index"), where)
            if i != len(blocks):
                raise ResponseParseError(
                    f"{where}: content_block_start index {i}, expected {len(blocks)}"
                )
            block = as_object(obj.get("content_block"), f"{where}.content_block")
            as_text(block.get("type"), f"{where}.content_block.type")
            blocks.append(block)
            open_.add(i)
        elif kind == "content_block_delta":
            i = as_index(obj.get("index"), where)
            if i not in open_:
                raise ResponseParseError(f"{where}: delta for block {i}, which is not open")
            _apply_delta(
                blocks[i], as_object(obj.get("delta"), f"{where}.delta"), partial, i, where
            )
        elif kind == "content_block_stop":
            i = as_index(obj.get("index"), where)
            if i not in open_:
                raise ResponseParseError(f"{where}: stop for block {i}, which is not open")
            open_.discard(i)
            if i in partial:
                text = "".join(partial.pop(i))
                blocks[i]["input"] = loads_json(text, f"block {i} tool input") if text else {}
        elif kind == "message_delta":
            msg.update(as_object(obj.get("delta", {}), f"{where}.delta"))
            usage = obj.get("usage")
            if usage is not None:
                have = msg.get("usage")
                if not isinstance(have, dict):
                    have = msg["usage"] = {}
                # Counts here are cumulative totals: they replace, and an omitted (null)
                # optional count leaves message_start's value standing.
                for k, v in as_object(usage, f"{where}.usage").items():
                    if v is not None or k not in have:
                        have[k] = v
        else:  # message_stop
            if open_:
                raise ResponseParseError(
                    f"{where}: message_stop with block(s) {sorted(open_)} open"
                )
            stopped = True
    if msg is None:
        raise ResponseParseError("no message_start event: not an Anthropic message stream")
    if not stopped:
        raise ResponseParseError("the stream ended before message_stop (truncated)")
    msg["content"] = blocks
    return msg


def _apply_delta(
    block: JsonObject, delta: JsonObject, partial: dict[int, list[str]], i: int, where: str
) -> None:
    kind = delta.get("type")
    btype = block.get("type")

    def need(*types: str) -> None:
        if btype not in types:
            raise ResponseParseError(f"{where}: {kind} for a {btype} block")

    def have(key: str) -> str:
        # The text so far: what content_block_start announced must be a string to extend.
        return as_text(block.get(key, ""), f"{where}: the block's {key}")

    if kind == "text_delta":
        need("text")
        block["text"] = have("text") + as_text(delta.get("text"), f"{where}.text")
    elif kind == "citations_delta":
        need("text")
        citation = as_object(delta.get("citation"), f"{where}.citation")
        if isinstance(block.get("citations"), list):
            block["citations"].append(citation)
        else:
            block["citations"] = [citation]
    elif kind == "thinking_delta":
        need("thinking")
        block["thinking"] = have("thinking") + as_text(delta.get("thinking"), f"{where}.thinking")
    elif kind == "signature_delta":
        need("thinking")
        # One delta carries the whole signature; the SDKs assign rather than append.
        block["signature"] = as_text(delta.get("signature"), f"{where}.signature")
    elif kind == "input_json_delta":
        if "input" not in block and not str(btype).endswith("tool_use"):
            raise ResponseParseError(f"{where}: input_json_delta for a {btype} block")
        partial.setdefault(i, []).append(
            as_text(delta.get("partial_json"), f"{where}.partial_json")
        )
    else:
        # Ignoring it would hand the client a message with a piece silently missing.
        raise ResponseParseError(f"{where}: unknown delta type {kind!r}")


# message_delta carries these message keys; message_start announces them as null.
_DELTA_KEYS = ("stop_reason", "stop_sequence")
_DELTA_OPTIONAL = ("stop_details", "container")


def _frames(m: JsonObject) -> Iterator[str]:
    start = {k: clone(v) for k, v in m.items()}
    start["content"] = []
    for k in (*_DELTA_KEYS, *(k for k in _DELTA_OPTIONAL if k in m)):
        start[k] = None
    usage = m.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("output_tokens"), int):
        # message_start reports the input side; the output count so far is the first token.
        start["usage"]["output_tokens"] = min(1, usage["output_tokens"])
    yield sse_event("message_start", {"type": "message_start", "message": start})
    for i, block in enumerate(m.get("content") or []):
        yield from _block_frames(i, block)
    delta = {k: m.get(k) for k in _DELTA_KEYS}
    delta.update({k: m[k] for k in _DELTA_OPTIONAL if k in m})
    end: JsonObject = {"type": "message_delta", "delta": delta}
    if isinstance(usage, dict):
        # Cumulative totals, as the API sends them now; older SDKs read only output_tokens
        # here and keep message_start's input side, which carries the same numbers.
        end["usage"] = clone(usage)
    yield sse_event("message_delta", end)
    yield sse_event("message_stop", {"type": "message_stop"})


def _block_frames(i: int, block: Json) -> Iterator[str]:
    def delta(d: JsonObject) -> str:
        return sse_event(
            "content_block_delta", {"type": "content_block_delta", "index": i, "delta": d}
        )

    deltas: list[str] = []
    start = clone(block)
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text" and isinstance(block.get("text"), str):
        start["text"] = ""
        cites = block.get("citations")
        if isinstance(cites, list) and cites:
            start["citations"] = []
            deltas += [delta({"type": "citations_delta", "citation": c}) for c in cites]
        if block["text"]:
            deltas += [delta({"type": "text_delta", "text": p}) for p in pieces(block["text"])]
    elif kind == "thinking" and isinstance(block.get("thinking"), str):
        start["thinking"] = ""
        if block["thinking"]:
            deltas += [
                delta({"type": "thinking_delta", "thinking": p}) for p in pieces(block["thinking"])
            ]
        if "signature" in block:
            start["signature"] = ""
            if isinstance(block["signature"], str) and block["signature"]:
                deltas.append(delta({"type": "signature_delta", "signature": block["signature"]}))
    elif kind in ("tool_use", "server_tool_use") and isinstance(block.get("input"), dict):
        # The SDKs track input_json_delta for these two block types only; others (mcp_tool_use,
        # tool results, redacted_thinking) go out whole in content_block_start.
        start["input"] = {}
        deltas += [
            delta({"type": "input_json_delta", "partial_json": p})
            for p in json_pieces(dumps(block["input"]))
        ]
    yield sse_event(
        "content_block_start", {"type": "content_block_start", "index": i, "content_block": start}
    )
    yield from deltas
    yield sse_event("content_block_stop", {"type": "content_block_stop", "index": i})
