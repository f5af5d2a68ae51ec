"""Google's Gemini API: `POST …/v1beta/models/MODEL:generateContent` and
`:streamGenerateContent` (`?alt=sse`), the transcript in `contents`, the system prompt in the
top-level `systemInstruction`.

Requests: a read-only view of each content. A content's role is `user` or `model`; its `parts`
hold one datum each (`text`, `inlineData`, `fileData`, `functionCall`, `functionResponse`,
`executableCode`, `codeExecutionResult`) beside modifiers (`thought`, `thoughtSignature`, …).
The view calls a `model` content an `assistant` message, so the dialect-blind layers (a turn's
tool calls, the spans) read it as they read the other three formats; what is sent keeps the
client's bytes, `model` included.

A `functionCall` is answered by a `functionResponse` in the next `user` content: by `id` where
the call has one, else by name and order. Both sides are named `NAME@ID` or `NAME#K` (the K-th
call of NAME in its content) so the shape rules pair them as they pair the other dialects' ids,
and a continuation knows the function a result answers (a `functionResponse` must name it).
Function names cannot hold `@` or `#`.

Answers: a `GenerateContentResponse` (`candidates[].content`, `usageMetadata`, `modelVersion`),
JSON or rebuilt from its stream: each SSE event is a whole response holding the parts that are
new, the last carrying `finishReason`. Usage: `promptTokenCount` less `cachedContentTokenCount`
as input, the cached part as cache reads, `candidatesTokenCount` + `thoughtsTokenCount` as
output.

A stream carries no position for a part, so a streamed answer cannot be resumed after a tool call
of the proxy's own (`call_begins` finds none): a stream the expand tool is offered in is read
whole before it is answered.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar, Literal, cast
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

from cg.wire.dialects.base import (
    BlockView,
    Dialect,
    MessageShapeError,
    MessageView,
    Pairing,
    ToolCall,
    ToolOutput,
    UsageReader,
    message_role,
)
from cg.wire.jsonspan import Member
from cg.wire.reply import (
    Call,
    Json,
    JsonObject,
    ProviderError,
    ResponseParseError,
    as_object,
    clone,
    dumps,
    loads_json,
    sse_events,
)
from cg.wire.usage import Usage, UsageError

# The one datum a part holds; a part with any key outside these and `MODIFIERS` passes the
# request through untouched (an unknown part may carry a pairing rule of its own).
DATA_KEYS = frozenset(
    {
        "text",
        "inlineData",
        "fileData",
        "functionCall",
        "functionResponse",
        "executableCode",
        "codeExecutionResult",
    }
)
MODIFIERS = frozenset({"thought", "thoughtSignature", "videoMetadata", "partMetadata"})

_MODEL_IN_PATH = re.compile(r"/models/([^/:?]+):(?:stream)?[gG]enerateContent$")

# How a call and its response are named for pairing (module docstring).
_BY_ID = "@"
_BY_ORDER = "#"


def call_key(name: str, call_id: Any, k: int) -> str:
    """The pairing name of the k-th call (or response) of function `name` in its content."""
    if isinstance(call_id, str) and call_id:
        return f"{name}{_BY_ID}{call_id}"
    return f"{name}{_BY_ORDER}{k}"


def key_function(key: str) -> tuple[str, str | None]:
    """(the function's name, the call's own id or None) of a `call_key`."""
    for i, ch in enumerate(key):
        if ch == _BY_ID:
            return key[:i], key[i + 1 :]
        if ch == _BY_ORDER:
            return key[:i], None
    return key, None


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _ordinal(seen: dict[str, int], name: str) -> int:
    """How many parts named `name` came before this one (counted in `seen`)."""
    k = seen.get(name, 0)
    seen[name] = k + 1
    return k


def _keyed(parts: list[Any], member: str) -> Iterator[tuple[int, dict[str, Any], str]]:
    """(index, the part's `member` object, its `call_key`) for every part holding one: the one
    place calls and responses are named for pairing outside `Gemini.view`."""
    seen: dict[str, int] = {}
    for n, p in enumerate(parts):
        obj = p.get(member) if isinstance(p, dict) else None
        if isinstance(obj, dict):
            name = _str(obj.get("name"))
            yield n, obj, call_key(name, obj.get("id"), _ordinal(seen, name))


def _datum(part: Any) -> str:
    """The data key of a request's part, or MessageShapeError (the body passes through)."""
    if not isinstance(part, dict):
        raise MessageShapeError("a part is not an object")
    data = [k for k in part if k in DATA_KEYS]
    unknown = [k for k in part if k not in DATA_KEYS and k not in MODIFIERS]
    if unknown:
        raise MessageShapeError(f"unknown part member {unknown[0]!r}")
    if len(data) > 1:
        raise MessageShapeError(f"a part holds both {data[0]!r} and {data[1]!r}")
    # A bare `thoughtSignature` part (a stream's last piece, sent back as it came) holds none.
    return data[0] if data else "thoughtSignature"


def _response_text(fr: Mapping[str, Any]) -> str:
    response = fr.get("response")
    if isinstance(response, dict):
        out = response.get("output")
        if isinstance(out, str):
            return out
        return dumps(response)
    return ""


class GeminiReader:
    """Every event carries the usage so far (`usageMetadata`, cumulative): the last wins."""

    def __init__(self) -> None:
        self.raw: Any = None
        self.model: str | None = None

    def event(self, name: str | None, obj: Any) -> None:
        obj = _unwrap(obj)
        if not isinstance(obj, dict):
            return
        if obj.get("usageMetadata") is not None:
            self.raw = obj["usageMetadata"]
        version = obj.get("modelVersion")
        if isinstance(version, str) and version:
            self.model = version


def from_gemini(u: Any) -> Usage:
    """`usageMetadata` in the provider-neutral names (cg.wire.usage)."""
    if not isinstance(u, dict) or not u:
        raise UsageError("usageMetadata is not a non-empty object")

    def count(key: str) -> int:
        v = u.get(key)
        if v is None:
            return 0
        if type(v) is int and v >= 0:
            return v
        raise UsageError(f"usageMetadata.{key} is {v!r}, not a count")

    prompt, cached = count("promptTokenCount"), count("cachedContentTokenCount")
    if cached > prompt:
        raise UsageError(f"usageMetadata: {cached} cached tokens of a {prompt}-token prompt")
    return Usage(
        input_tokens=prompt - cached,
        cache_read_tokens=cached,
        output_tokens=count("candidatesTokenCount") + count("thoughtsTokenCount"),
        requests=1,
    )


class Gemini(Dialect):
    name: ClassVar[str] = "gemini"
    path_suffix: ClassVar[str] = ":generateContent"
    # The same request, answered as an event stream (`?alt=sse`).
    stream_suffix: ClassVar[str] = ":streamGenerateContent"
    wire_roles: ClassVar[frozenset[str]] = frozenset({"user", "model"})

    @property
    def view_roles(self) -> frozenset[str]:
        return _VIEW_ROLES

    array_key: ClassVar[str] = "contents"
    pairing: ClassVar[Pairing] = "next"
    auto_cache: ClassVar[bool] = True  # implicit caching of a prompt's prefixes (Gemini 2.5 on)
    usage_key: ClassVar[str] = "usageMetadata"
    model_key: ClassVar[str] = "modelVersion"
    tool_choice_member: ClassVar[str] = "toolConfig"
    envelope: ClassVar[str | None] = "request"  # Code Assist (`…/v1internal:generateContent`)
    buffers_expand: ClassVar[bool] = True
    default_base: ClassVar[str] = "https://generativelanguage.googleapis.com"
    key_env: ClassVar[str] = "GEMINI_API_KEY"

    def matches(self, bare_path: str) -> bool:
        """A `…:generateContent` or `…:streamGenerateContent` path (query removed)."""
        return bare_path.endswith(self.path_suffix) or bare_path.endswith(self.stream_suffix)

    def url_model(self, path: str) -> str | None:
        """`…/models/MODEL:generateContent` (the Gemini API, Vertex AI's publisher models)."""
        m = _MODEL_IN_PATH.search(path.split("?", 1)[0])
        return unquote(m.group(1)) if m else None

    def url_streams(self, path: str) -> bool:
        return path.split("?", 1)[0].rstrip("/").endswith(self.stream_suffix)

    def standalone_url(self, url: str, model: str) -> str:
        """The same endpoint's `…/models/MODEL:generateContent`, its query kept (a `key`) but
        `alt=sse`."""
        parts = urlsplit(url)
        path = _MODEL_IN_PATH.sub(f"/models/{quote(model, safe='')}:generateContent", parts.path)
        query = urlencode([(k, v) for k, v in parse_qsl(parts.query) if k != "alt"])
        return urlunsplit((parts.scheme, parts.netloc, path, query, ""))

    def standalone_path(self, model: str) -> str:
        return f"/v1beta/models/{quote(model, safe='')}:generateContent"

    def answer_body(self, doc: Any) -> Any:
        """Code Assist answers `{"response": GenerateContentResponse, "traceId": …}`."""
        return _unwrap(doc)

    def content_blocks_key(self) -> str:
        return "parts"

    def conversation_system(self, top_level: Mapping[str, Any], messages: Sequence[Any]) -> object:
        return top_level.get("systemInstruction")

    def refuse(self, members: Mapping[str, Any]) -> str | None:
        if "cachedContent" in members:
            return (
                "cachedContent: part of the conversation is in a cached content the proxy "
                "cannot see"
            )
        return None

    def role_error(self, message: Any) -> str | None:
        role = message.get("role") if isinstance(message, dict) else None
        if role in self.wire_roles:
            return None
        return "Please use a valid role: user, model."

    def user_message(self, text: str) -> dict[str, Any]:
        return {"role": "user", "parts": [{"text": text}]}

    def view(self, message: Any) -> MessageView:
        role = message_role(message)
        parts = message.get("parts")
        if parts is None:
            return MessageView(_role(role), "", "missing", (), (), (), True)
        if not isinstance(parts, list):
            raise MessageShapeError(f"'parts' is not an array (got {type(parts).__name__})")
        blocks: list[BlockView] = []
        calls: list[str] = []
        results: list[str] = []
        seen_calls: dict[str, int] = {}
        seen_results: dict[str, int] = {}
        for p in parts:
            kind = _datum(p)
            if kind == "text":
                t = p["text"]
                if not isinstance(t, str):
                    raise MessageShapeError("a text part's 'text' is not a string")
                # An empty text part (a stream's piece with only a signature) is accepted.
                blocks.append(BlockView("thinking" if p.get("thought") is True else "text", t))
            elif kind == "functionCall":
                fc = p["functionCall"]
                if not isinstance(fc, dict) or not isinstance(fc.get("name"), str):
                    raise MessageShapeError("a functionCall has no string 'name'")
                name = fc["name"]
                calls.append(call_key(name, fc.get("id"), _ordinal(seen_calls, name)))
                blocks.append(BlockView(kind, f"[functionCall {name}] {dumps(fc.get('args'))}"))
            elif kind == "functionResponse":
                fr = p["functionResponse"]
                if not isinstance(fr, dict) or not isinstance(fr.get("name"), str):
                    raise MessageShapeError("a functionResponse has no string 'name'")
                name = fr["name"]
                key = call_key(name, fr.get("id"), _ordinal(seen_results, name))
                results.append(key)
                blocks.append(BlockView(kind, _response_text(fr), False, key))
            else:
                blocks.append(BlockView(kind, f"[{kind}]" if kind != "thoughtSignature" else ""))
        return MessageView(
            _role(role), None, "blocks", tuple(blocks), tuple(calls), tuple(results), not parts
        )

    def tool_outputs(self, message: Mapping[str, Any]) -> tuple[ToolOutput, ...]:
        """Each `functionResponse`'s `response.output` when it is a string (Gemini CLI's form);
        any other response is not text."""
        parts = message.get("parts")
        if not isinstance(parts, list):
            return ()
        out: list[ToolOutput] = []
        for n, fr, key in _keyed(parts, "functionResponse"):
            response = fr.get("response")
            text: Literal["string", "none"] = (
                "string"
                if isinstance(response, dict) and isinstance(response.get("output"), str)
                else "none"
            )
            path: tuple[str | int, ...] = ("parts", n, "functionResponse", "response", "output")
            out.append(ToolOutput(key, path, text))
        return tuple(out)

    def tool_calls(self, message: Mapping[str, Any]) -> tuple[ToolCall, ...]:
        parts = message.get("parts")
        if not isinstance(parts, list):
            return ()
        return tuple(
            ToolCall(key, _str(fc.get("name")), fc.get("args"))
            for _, fc, key in _keyed(parts, "functionCall")
        )

    # Provider wording (the Gemini API's 400 INVALID_ARGUMENT messages).
    def msg_unanswered(self, i: int, ids: list[str], view: MessageView | None = None) -> str:
        return (
            f"contents[{i}]: Please ensure that the number of function response parts is equal "
            "to the number of function call parts of the function call turn "
            f"(unanswered: {', '.join(ids)})."
        )

    def msg_unpaired(self, i: int, ids: list[str], view: MessageView | None = None) -> str:
        return (
            f"contents[{i}]: Please ensure that function response turn comes immediately after "
            f"a function call turn (unpaired: {', '.join(ids)})."
        )

    def msg_blank(self, i: int) -> str:
        return f"* GenerateContentRequest.contents[{i}].parts: contents.parts must not be empty."

    def msg_system_position(self, i: int) -> str:
        return "Please use a valid role: user, model."

    # -- the summarizer and the expand tool ------------------------------------------------------

    def summarizer_headers(self, headers: Mapping[str, str]) -> dict[str, str]:
        return dict(headers)

    def auth_headers(self, key: str, bearer: bool) -> dict[str, str]:
        if not key:
            return {}
        return {"authorization": f"Bearer {key}"} if bearer else {"x-goog-api-key": key}

    def summary_request(self, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
        """The model is in the URL (`…/models/MODEL:generateContent`), not the body."""
        return {
            "contents": [self.user_message(prompt)],
            "generationConfig": {"maxOutputTokens": max_tokens},
        }

    def answer_text(self, doc: JsonObject) -> str:
        parts = _candidate_parts(doc)
        if parts is None:
            raise ResponseParseError("the answer has no 'candidates[0].content.parts'")
        return "".join(
            p["text"]
            for p in parts
            if isinstance(p, dict)
            and isinstance(p.get("text"), str)
            and p.get("thought") is not True
        )

    def summary_limits(self, members: Mapping[str, Member], budget: int) -> dict[str, Any]:
        """`generationConfig.maxOutputTokens` raised to the budget when the agent set a lower
        one (thinking counts against it); never added (the model's default is its maximum)."""
        config = members.get("generationConfig")
        if config is None or not isinstance(config.value, dict):
            return {}
        limit = config.value.get("maxOutputTokens")
        if type(limit) is int and limit < budget:
            return {"generationConfig": {**config.value, "maxOutputTokens": budget}}
        return {}

    def forces_a_tool(self, tool_choice: Any) -> bool:
        return _mode(tool_choice) == "ANY"

    def tool_choice(self, mode: Literal["auto", "none"]) -> Any:
        return {"functionCallingConfig": {"mode": mode.upper()}}

    def fixed_tool_choice(self, tool_choice: Any) -> bool:
        fcc = tool_choice.get("functionCallingConfig") if isinstance(tool_choice, dict) else None
        if not isinstance(fcc, dict):
            return False
        return fcc.get("mode") in ("ANY", "NONE") or "allowedFunctionNames" in fcc

    def tool_name(self, tool: JsonObject) -> object:
        """The name of a `tools` entry declaring exactly one function (the expand tool's own
        entry is one), else None."""
        decls = tool.get("functionDeclarations")
        if isinstance(decls, list) and len(decls) == 1 and isinstance(decls[0], dict):
            return decls[0].get("name")
        return None

    def function_tool(self, name: str, description: str, schema: JsonObject) -> JsonObject:
        return {
            "functionDeclarations": [
                {"name": name, "description": description, "parameters": schema}
            ]
        }

    def usage(self, u: Any) -> Usage:
        return from_gemini(u)

    def usage_reader(self) -> UsageReader:
        return GeminiReader()

    # -- answers --------------------------------------------------------------------------------

    input_usage_keys: ClassVar[tuple[str, ...]] = (
        "promptTokenCount",
        "cachedContentTokenCount",
        "promptTokensDetails",
        "cacheTokensDetails",
    )

    def settle_usage(self, usage: JsonObject) -> None:
        """`totalTokenCount` is the prompt, the candidates, the thoughts and the tool-use
        prompt together."""
        if "totalTokenCount" not in usage:
            return
        parts = [
            usage.get(k, 0)
            for k in (
                "promptTokenCount",
                "candidatesTokenCount",
                "thoughtsTokenCount",
                "toolUsePromptTokenCount",
            )
        ]
        if all(type(v) is int for v in parts):
            usage["totalTokenCount"] = sum(cast(list[int], parts))

    def answer_error(self, doc: JsonObject) -> bool:
        return bool(doc.get("error"))

    def check_answer(self, doc: JsonObject) -> None:
        candidates = doc.get("candidates")
        if not isinstance(candidates, list) or not candidates:
            raise ResponseParseError("response body: 'candidates' is not a non-empty list")
        for i, c in enumerate(candidates):
            content = as_object(c, f"candidates[{i}]").get("content")
            if content is None:
                continue  # a candidate stopped for safety carries none
            parts = as_object(content, f"candidates[{i}].content").get("parts", [])
            if not isinstance(parts, list):
                raise ResponseParseError(f"candidates[{i}].content.parts is not a list")

    def parse_stream(self, body: bytes) -> JsonObject:
        return _parse_sse(body)

    def calls(self, message: JsonObject) -> list[Call]:
        """The first candidate's calls, each id a `call_key`."""
        out: list[Call] = []
        for _, fc, key in _keyed(_candidate_parts(message) or [], "functionCall"):
            args = fc.get("args")
            out.append(
                Call(
                    key,
                    _str(fc.get("name")),
                    clone(args) if isinstance(args, dict) else dumps(args),
                )
            )
        return out

    def strip_calls(self, message: JsonObject, name: str) -> None:
        """A content left with no part keeps one empty text part (`parts` is never empty)."""
        for c in message.get("candidates") or []:
            content = c.get("content") if isinstance(c, dict) else None
            parts = content.get("parts") if isinstance(content, dict) else None
            if not isinstance(parts, list):
                continue
            kept = [
                p
                for p in parts
                if not (
                    isinstance(p, dict)
                    and isinstance(p.get("functionCall"), dict)
                    and p["functionCall"].get("name") == name
                )
            ]
            cast(JsonObject, content)["parts"] = kept or [{"text": ""}]

    def assistant_turn(self, message: JsonObject) -> JsonObject:
        """The first candidate's content as returned: thought parts and every
        `thoughtSignature` go back with their parts (the API asks for them on a function call's
        turn)."""
        parts = _candidate_parts(message) or []
        return {"role": "model", "parts": [clone(p) for p in parts] or [{"text": ""}]}

    def result_turns(self, results: list[tuple[str, str]]) -> list[JsonObject]:
        """Every call of a turn answered in the one user content that follows it, each response
        naming its function (and the call's id when it had one)."""
        if not results:
            return []
        parts: list[JsonObject] = []
        for key, text in results:
            name, call_id = key_function(key)
            fr: JsonObject = {"name": name, "response": {"output": text}}
            if call_id is not None:
                fr["id"] = call_id
            parts.append({"functionResponse": fr})
        return [{"role": "user", "parts": parts}]

    def frames(self, message: JsonObject) -> Iterator[str]:
        return _frames(message)

    def call_begins(self, obj: JsonObject, name: str) -> tuple[int, int | None] | None:
        return None  # no part position on the wire (module docstring): the stream is read whole

    def continued(self, first: JsonObject, final: JsonObject, at: int, rounds: int) -> None:
        """The first candidate's parts: the first answer's up to `at` (0: a stream held whole,
        `buffers_expand`), then the new round's, or with no new round the first's own rest."""
        fparts = _candidate_parts(first) or []
        parts = _candidate_parts(final)
        if parts is None:
            return
        joined = [clone(p) for p in fparts[:at]] + (parts[at:] if rounds == 0 else parts)
        cast(JsonObject, final["candidates"][0]["content"])["parts"] = joined or [{"text": ""}]

    def resumed_event(self, obj: JsonObject, at: int) -> bool:
        return True  # every event of the rendered rest is new to the client (it held none)


_VIEW_ROLES = frozenset({"user", "assistant"})


def _unwrap(doc: Any) -> Any:
    inner = doc.get("response") if isinstance(doc, dict) and "candidates" not in doc else None
    return inner if isinstance(inner, dict) else doc


def _role(role: str) -> str:
    return "assistant" if role == "model" else role


def _mode(tool_config: Any) -> object:
    fcc = tool_config.get("functionCallingConfig") if isinstance(tool_config, dict) else None
    return fcc.get("mode") if isinstance(fcc, dict) else None


def _candidate_parts(doc: JsonObject) -> list[Json] | None:
    candidates = doc.get("candidates")
    if not isinstance(candidates, list) or not candidates or not isinstance(candidates[0], dict):
        return None
    content = candidates[0].get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    return parts if isinstance(parts, list) else None


# -- answers --------------------------------------------------------------------------------------


def _joins(last: Json, part: JsonObject) -> bool:
    """Whether a streamed text part continues the one before (the same kind of text, the one
    before not closed by a signature)."""
    return (
        isinstance(last, dict)
        and set(last) <= {"text", "thought"}
        and isinstance(last.get("text"), str)
        and isinstance(part.get("text"), str)
        and set(part) <= {"text", "thought", "thoughtSignature"}
        and last.get("thought") is part.get("thought")
    )


def _parse_sse(body: bytes) -> JsonObject:
    """The events as one response: each candidate's new parts appended (consecutive text of
    one kind joined), the other candidate keys and the top-level keys the latest non-null
    value, `usageMetadata` the last (it is cumulative). A candidate without a `finishReason`
    at the end means the stream was cut."""
    top: JsonObject = {}
    candidates: dict[int, JsonObject] = {}
    events = 0
    for n, (_name, data) in enumerate(sse_events(body), 1):
        where = f"SSE event {n}"
        obj = as_object(_unwrap(loads_json(data, where)), where)
        if obj.get("error"):
            raise ProviderError(f"provider error event: {dumps(obj['error'])[:300]}", obj)
        events += 1
        for k, v in obj.items():
            if k != "candidates" and v is not None:
                top[k] = clone(v)
        raw = obj.get("candidates") or []
        if not isinstance(raw, list):
            raise ResponseParseError(f"{where}: 'candidates' is not a list")
        for c in raw:
            c = as_object(c, f"{where}.candidates[]")
            idx = c.get("index", 0)
            if not isinstance(idx, int) or isinstance(idx, bool) or idx < 0:
                raise ResponseParseError(f"{where}: candidate index {idx!r}")
            acc = candidates.setdefault(idx, {"content": {"role": "model", "parts": []}})
            for k, v in c.items():
                if k == "content":
                    content = as_object(v, f"{where}.content")
                    parts = content.get("parts", [])
                    if not isinstance(parts, list):
                        raise ResponseParseError(f"{where}: content.parts is not a list")
                    have = acc["content"]["parts"]
                    for p in parts:
                        p = as_object(p, f"{where}.parts[]")
                        if have and _joins(have[-1], p):
                            joined = dict(have[-1])
                            joined["text"] += p["text"]
                            if "thoughtSignature" in p:
                                joined["thoughtSignature"] = p["thoughtSignature"]
                            have[-1] = joined
                        else:
                            have.append(clone(p))
                    if isinstance(content.get("role"), str):
                        acc["content"]["role"] = content["role"]
                elif v is not None:
                    acc[k] = clone(v)
    if not events:
        raise ResponseParseError("no events: not a Gemini answer stream")
    unfinished = sorted(i for i, c in candidates.items() if "finishReason" not in c)
    if unfinished:
        raise ResponseParseError(f"candidate(s) {unfinished} never got a finishReason (truncated)")
    out: JsonObject = {}
    if candidates:
        out["candidates"] = [{**candidates[i], "index": i} for i in sorted(candidates)]
    out.update(top)
    return out


def _frames(m: JsonObject) -> Iterator[str]:
    """One event per part of each candidate, the last of each carrying its `finishReason`; the
    top-level keys on every event, `usageMetadata` on the last only."""
    top = {k: clone(v) for k, v in m.items() if k not in ("candidates", "usageMetadata")}
    candidates = [c for c in m.get("candidates") or [] if isinstance(c, dict)]
    events: list[JsonObject] = []
    for n, c in enumerate(candidates):
        content = c.get("content") if isinstance(c.get("content"), dict) else {}
        parts = list(cast(JsonObject, content).get("parts") or [])
        role = cast(JsonObject, content).get("role", "model")
        rest = {k: clone(v) for k, v in c.items() if k not in ("content", "index")}
        idx = c.get("index", n)
        for j, p in enumerate(parts or [None]):
            cand: JsonObject = {"index": idx}
            if p is not None:
                cand["content"] = {"role": role, "parts": [clone(p)]}
            if j == max(len(parts), 1) - 1:
                cand.update(rest)
            events.append({**top, "candidates": [cand]})
    if not events:
        events.append(dict(top))
    if "usageMetadata" in m:
        events[-1]["usageMetadata"] = clone(m["usageMetadata"])
    for e in events:
        yield f"data: {dumps(e)}\r\n\r\n"


__all__ = ["Gemini", "GeminiReader", "call_key", "from_gemini", "key_function"]
