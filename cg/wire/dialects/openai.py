"""OpenAI Chat Completions: `POST …/v1/chat/completions`, system prompt is `messages[0]`.

Requests: a read-only view of each message. Answers: the `chat.completion` object, JSON or
rebuilt from its chunk stream (deltas merged per choice, tool calls by index, the usage chunk
of `stream_options.include_usage`), edited and streamed back as chunks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

from cg.wire.dialects.base import (
    SYSTEM_ROLES,
    BlockView,
    Dialect,
    MessageShapeError,
    MessageView,
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
    call_input,
    clone,
    dumps,
    json_pieces,
    loads_json,
    pieces,
    sse_events,
)

# The content part types of Chat Completions messages; a request holding any other part type
# passes through untouched (docs/behaviour.md#errors-and-bad-input: unknown content is never cut).
KNOWN_PARTS = frozenset({"text", "image_url", "input_audio", "file", "refusal"})


def _part(part: Any) -> BlockView:
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        raise MessageShapeError("a content part is not an object with a string 'type'")
    kind: str = part["type"]
    if kind not in KNOWN_PARTS:
        raise MessageShapeError(f"unknown content part type {kind!r}")
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


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class OpenAIChatReader:
    """The chunk with a non-null `usage` (present only when the client asked
    `stream_options.include_usage`; the request is never changed to ask for it)."""

    def __init__(self) -> None:
        self.raw: Any = None
        self.model: str | None = None

    def event(self, name: str | None, obj: Any) -> None:
        if isinstance(obj, dict) and obj.get("usage") is not None:
            self.raw = obj["usage"]
            self.model = answer_model(obj) or self.model


class OpenAI(Dialect):
    name: ClassVar[str] = "openai"
    path_suffix: ClassVar[str] = "/v1/chat/completions"
    wire_roles: ClassVar[frozenset[str]] = frozenset(
        {"system", "developer", "user", "assistant", "tool", "function"}
    )

    auto_cache: ClassVar[bool] = True
    default_base: ClassVar[str] = "https://api.openai.com"
    key_env: ClassVar[str] = "OPENAI_API_KEY"

    def conversation_system(self, top_level: Mapping[str, Any], messages: Sequence[Any]) -> object:
        """`messages[0]` when its role is system or developer."""
        if messages and isinstance(messages[0], dict) and messages[0].get("role") in SYSTEM_ROLES:
            return messages[0]
        return None

    def summary_request(self, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
        return {"model": model, "messages": [{"role": "user", "content": prompt}]}

    def answer_text(self, doc: JsonObject) -> str:
        choices = doc.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ResponseParseError("the answer has no 'choices'")
        message = choices[0].get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            content = "".join(
                p["text"]
                for p in content
                if isinstance(p, dict)
                and p.get("type") == "text"
                and isinstance(p.get("text"), str)
            )
        return content if isinstance(content, str) else ""

    def summary_limits(self, members: Mapping[str, Member], budget: int) -> dict[str, Any]:
        """`max_tokens` / `max_completion_tokens` raised to the budget (never added); `stream`
        false when the agent streamed without `stream_options`: a stream reports no usage
        without `include_usage`, and `stream_options` is refused without `stream: true`."""
        out: dict[str, Any] = {}
        for key in ("max_tokens", "max_completion_tokens"):
            limit = members.get(key)
            if limit is not None and _int(limit.value) and limit.value < budget:
                out[key] = budget
        stream = members.get("stream")
        if stream is not None and stream.value is True and "stream_options" not in members:
            out["stream"] = False
        return out

    def tool_name(self, tool: JsonObject) -> object:
        return cast(JsonObject, tool.get("function") or {}).get("name")

    def function_tool(self, name: str, description: str, schema: JsonObject) -> JsonObject:
        return {
            "type": "function",
            "function": {"name": name, "description": description, "parameters": schema},
        }

    def usage_reader(self) -> UsageReader:
        return OpenAIChatReader()

    def call_begins(self, obj: JsonObject, name: str) -> tuple[int, int | None] | None:
        """A chunk opening a tool call: its `tool_calls` index."""
        for choice in cast(list[Json], obj.get("choices") or []):
            delta = choice.get("delta") if isinstance(choice, dict) else None
            calls = delta.get("tool_calls") if isinstance(delta, dict) else None
            for tc in calls if isinstance(calls, list) else []:
                fn = tc.get("function") if isinstance(tc, dict) else None
                if isinstance(fn, dict) and fn.get("name") == name:
                    idx = tc.get("index")
                    return (idx if isinstance(idx, int) else 0), None
        return None

    def continued(self, first: JsonObject, final: JsonObject, at: int, rounds: int) -> None:
        final["id"] = first.get("id", final.get("id"))
        choices = cast(list[Json], final.get("choices") or [])
        fchoices = cast(list[Json], first.get("choices") or [])
        if choices and isinstance(choices[0], dict) and isinstance(choices[0].get("message"), dict):
            msg = cast(JsonObject, choices[0]["message"])
            fmsg = fchoices[0].get("message") if fchoices and isinstance(fchoices[0], dict) else {}
            fcalls = list(cast(list[Json], (fmsg or {}).get("tool_calls") or []))[:at]
            calls = list(cast(list[Json], msg.get("tool_calls") or []))
            calls = fcalls + (calls[at:] if rounds == 0 else calls)
            if rounds == 0:
                msg["content"] = None  # sent already: text streams before the calls
            if calls:
                msg["tool_calls"] = calls
            else:
                msg.pop("tool_calls", None)

    def resumed_event(self, obj: JsonObject, at: int) -> bool:
        choices = cast(list[Json], obj.get("choices") or [])
        delta = choices[0].get("delta") if choices and isinstance(choices[0], dict) else None
        if isinstance(delta, dict):
            if "role" in delta:
                rest_of = {k: v for k, v in delta.items() if k != "role" and v not in ("", None)}
                if not rest_of:
                    return False
                delta.pop("role")
            deltas = delta.get("tool_calls")
            if isinstance(deltas, list) and any(
                isinstance(c, dict) and isinstance(c.get("index"), int) and c["index"] < at
                for c in deltas
            ):
                return False
        return True

    def tool_outputs(self, message: Mapping[str, Any]) -> tuple[ToolOutput, ...]:
        """A `tool` message's `content` (a string or text parts)."""
        if message.get("role") != "tool":
            return ()
        cid = message.get("tool_call_id")
        return (ToolOutput(cid if isinstance(cid, str) else "", ("content",)),)

    def tool_calls(self, message: Mapping[str, Any]) -> tuple[ToolCall, ...]:
        out: list[ToolCall] = []
        for c in message.get("tool_calls") or ():
            if isinstance(c, dict):
                fn = c.get("function")
                fn = fn if isinstance(fn, dict) else {}
                cid, name = c.get("id"), fn.get("name")
                out.append(
                    ToolCall(
                        cid if isinstance(cid, str) else "",
                        name if isinstance(name, str) else "",
                        fn.get("arguments"),
                    )
                )
        return tuple(out)

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
            shown="\n".join(texts),
            form=form,  # type: ignore[arg-type]
            blocks=blocks,
            tool_call_ids=tuple(calls),
            tool_result_ids=results,
            blank=blank,
        )

    def msg_unanswered(self, i: int, ids: list[str], view: MessageView | None = None) -> str:
        return (
            f"messages.[{i}]: An assistant message with 'tool_calls' must be followed by tool "
            "messages responding to each 'tool_call_id'. The following tool_call_ids did not "
            f"have response messages: {', '.join(ids)}"
        )

    def msg_unpaired(self, i: int, ids: list[str], view: MessageView | None = None) -> str:
        return (
            f"messages.[{i}].role: Invalid parameter: messages with role 'tool' must be a "
            "response to a preceeding message with 'tool_calls'."
        )

    def msg_blank(self, i: int) -> str:
        return (
            f"messages.[{i}].content: Invalid value: content must be a non-empty string or array."
        )

    # -- answers --------------------------------------------------------------------------------

    input_usage_keys: ClassVar[tuple[str, ...]] = ("prompt_tokens", "prompt_tokens_details")
    usage_total_of: ClassVar[tuple[str, str] | None] = ("prompt_tokens", "completion_tokens")

    def answer_error(self, doc: JsonObject) -> bool:
        return bool(doc.get("error"))

    def check_answer(self, doc: JsonObject) -> None:
        choices = doc.get("choices")
        if not isinstance(choices, list) or not choices:
            raise ResponseParseError("response body: 'choices' is not a non-empty list")
        for i, choice in enumerate(choices):
            msg = as_object(
                as_object(choice, f"choices[{i}]").get("message"), f"choices[{i}].message"
            )
            calls = msg.get("tool_calls")
            if calls is not None and not isinstance(calls, list):
                # What the loop reads calls from: anything but a list (or null) is unreadable.
                raise ResponseParseError(f"choices[{i}].message.tool_calls is not a list")

    def parse_stream(self, body: bytes) -> JsonObject:
        return _parse_sse(body)

    def calls(self, message: JsonObject) -> list[Call]:
        """The first choice's calls: the continuation loop follows the first choice only.
        Arguments that are not a JSON object (models do emit broken JSON) stay a string."""
        out: list[Call] = []
        for tc in (_first_message(message) or {}).get("tool_calls") or []:
            if not isinstance(tc, dict):
                continue
            name, args = _call_name(tc)
            out.append(Call(str(tc.get("id", "")), name, call_input(args)))
        return out

    def strip_calls(self, message: JsonObject, name: str) -> None:
        """A `tool_calls` finish reason with no call left becomes `stop`, and a message left
        with neither calls nor content gets `content: ""` (clients read a `stop` message's
        content as a string)."""
        for choice in message.get("choices") or []:
            msg = choice.get("message") if isinstance(choice, dict) else None
            if not isinstance(msg, dict) or not isinstance(msg.get("tool_calls"), list):
                continue
            kept = [
                tc
                for tc in msg["tool_calls"]
                if not (isinstance(tc, dict) and _call_name(tc)[0] == name)
            ]
            if kept:
                msg["tool_calls"] = kept
                continue
            del msg["tool_calls"]
            if choice.get("finish_reason") == "tool_calls":
                choice["finish_reason"] = "stop"
            if msg.get("content") is None:
                msg["content"] = ""

    def assistant_turn(self, message: JsonObject) -> JsonObject:
        """Content, with null for empty content beside tool calls, and the tool calls."""
        m = _first_message(message) or {}
        calls = [
            {k: clone(v) for k, v in tc.items() if k != "index"}
            for tc in m.get("tool_calls") or []
            if isinstance(tc, dict)
        ]
        content = m.get("content")
        out: JsonObject = {"role": "assistant", "content": clone(content)}
        if calls:
            if not content:
                out["content"] = None
            out["tool_calls"] = calls
        elif content is None:
            out["content"] = ""
        return out

    def result_turns(self, results: list[tuple[str, str]]) -> list[JsonObject]:
        """One `tool` message per call, in a run."""
        return [{"role": "tool", "tool_call_id": i, "content": text} for i, text in results]

    def frames(self, message: JsonObject) -> Iterator[str]:
        return _frames(message)


# -- answers --------------------------------------------------------------------------------------

# OpenAI deltas: these keys are set by the first chunk that carries them (some servers repeat
# them in every chunk; concatenating would double a tool call's id or name).
_ONCE = frozenset({"role", "id", "type", "name"})


def _merge(acc: JsonObject, delta: JsonObject) -> None:
    """Fold one OpenAI delta object into the accumulated one: strings concatenate, objects
    merge, lists extend, `_ONCE` keys keep their first value, nulls change nothing."""
    for k, v in delta.items():
        cur = acc.get(k)
        if v is None:
            acc.setdefault(k, None)
        elif cur is None or (k in _ONCE and not cur):
            acc[k] = clone(v)
        elif k in _ONCE:
            continue
        elif isinstance(cur, str) and isinstance(v, str):
            acc[k] = cur + v
        elif isinstance(cur, dict) and isinstance(v, dict):
            _merge(cur, v)
        elif isinstance(cur, list) and isinstance(v, list):
            cur.extend(clone(v))
        else:
            acc[k] = clone(v)


_CHUNK_KEYS = frozenset({"object", "choices", "usage", "obfuscation"})
_CHOICE_KEYS = frozenset({"index", "delta", "logprobs", "finish_reason"})


@dataclass
class _Choice:
    message: JsonObject
    calls: dict[int, JsonObject]
    logprobs: JsonObject | None = None
    finish_reason: str | None = None
    extra: JsonObject = field(default_factory=dict)  # choice keys beyond the standard four


def _parse_sse(body: bytes) -> JsonObject:
    top: JsonObject = {}
    usage: Json = None
    has_usage = False
    choices: dict[int, _Choice] = {}
    done = False
    for n, (_name, data) in enumerate(sse_events(body), 1):
        where = f"SSE chunk {n}"
        if data.strip() == "[DONE]":
            done = True
            break
        chunk = as_object(loads_json(data, where), where)
        if chunk.get("error"):
            raise ProviderError(f"provider error chunk: {dumps(chunk['error'])[:300]}", chunk)
        for k, v in chunk.items():
            # First non-empty value: Azure's opening chunk has an empty id and model.
            if k not in _CHUNK_KEYS and (k not in top or (v and not top[k])):
                top[k] = clone(v)
        if "usage" in chunk:
            has_usage = True
            if chunk["usage"] is not None:
                usage = clone(chunk["usage"])
        raw = chunk.get("choices") or []
        if not isinstance(raw, list):
            raise ResponseParseError(f"{where}: 'choices' is not a list")
        for c in raw:
            _choice(choices, as_object(c, f"{where}.choices[]"), where)
    if not done:
        raise ResponseParseError("the stream ended without 'data: [DONE]' (truncated)")
    if not choices:
        raise ResponseParseError("the stream carried no choices")
    unfinished = sorted(i for i, c in choices.items() if c.finish_reason is None)
    if unfinished:
        raise ResponseParseError(f"choice(s) {unfinished} never got a finish_reason")
    out: JsonObject = {
        "id": top.pop("id", None),
        "object": "chat.completion",
        "created": top.pop("created", None),
        "model": top.pop("model", None),
        "choices": [],
    }
    for i in sorted(choices):
        c = choices[i]
        message: JsonObject = {"role": "assistant", "content": None, "refusal": None}
        message.update(c.message)
        if c.calls:
            message["tool_calls"] = [c.calls[j] for j in sorted(c.calls)]
        choice = {"index": i, "message": message, "logprobs": c.logprobs}
        choice["finish_reason"] = c.finish_reason
        choice.update(c.extra)
        out["choices"].append(choice)
    if has_usage:
        out["usage"] = usage
    out.update(top)
    return out


def _choice(choices: dict[int, _Choice], c: JsonObject, where: str) -> None:
    i = as_index(c.get("index"), f"{where}.choices[]")
    st = choices.get(i)
    if st is None:
        st = choices[i] = _Choice(message={}, calls={})
    delta = c.get("delta")
    if delta is not None:
        delta = dict(as_object(delta, f"{where}.choices[{i}].delta"))
        calls = delta.pop("tool_calls", None)
        _merge(st.message, delta)
        if calls is not None:
            if not isinstance(calls, list):
                raise ResponseParseError(f"{where}.choices[{i}].delta.tool_calls is not a list")
            for tc in calls:
                tc = dict(as_object(tc, f"{where}.tool_calls[]"))
                j = as_index(tc.pop("index", None), f"{where}.tool_calls[]")
                _merge(st.calls.setdefault(j, {}), tc)
    lp = c.get("logprobs")
    if lp is not None:
        lp = as_object(lp, f"{where}.choices[{i}].logprobs")
        if st.logprobs is None:
            st.logprobs = clone(lp)
        else:
            for key in ("content", "refusal"):
                if isinstance(lp.get(key), list):
                    have = st.logprobs.get(key)
                    st.logprobs[key] = (have if isinstance(have, list) else []) + lp[key]
    if c.get("finish_reason") is not None:
        st.finish_reason = as_text(c["finish_reason"], f"{where}.choices[{i}].finish_reason")
    for k, v in c.items():
        if k not in _CHOICE_KEYS and (v is not None or k not in st.extra):
            st.extra[k] = clone(v)


def _first_message(message: JsonObject) -> JsonObject | None:
    """choices[0].message: the continuation loop follows the first choice only."""
    choices = message.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        m = choices[0].get("message")
        return m if isinstance(m, dict) else None
    return None


def _call_name(tc: JsonObject) -> tuple[str, Json]:
    """(name, raw arguments) of an OpenAI tool call: `function` calls, or `custom` ones."""
    for key, arg in (("function", "arguments"), ("custom", "input")):
        body = tc.get(key)
        if isinstance(body, dict):
            return str(body.get("name", "")), body.get(arg, "")
    return "", ""


def _frames(m: JsonObject) -> Iterator[str]:
    base: JsonObject = {
        "id": m.get("id"),
        "object": "chat.completion.chunk",
        "created": m.get("created"),
        "model": m.get("model"),
    }
    base.update(
        {
            k: clone(v)
            for k, v in m.items()
            if k not in ("id", "object", "created", "model", "choices", "usage")
        }
    )
    if "usage" in m:
        base["usage"] = None  # as with stream_options.include_usage: null until the last chunk

    def chunk(choice: JsonObject) -> str:
        return f"data: {dumps({**base, 'choices': [choice]})}\n\n"

    for n, choice in enumerate(m.get("choices") or []):
        if not isinstance(choice, dict):
            continue
        idx = choice.get("index", n)
        raw = choice.get("message")
        msg: JsonObject = raw if isinstance(raw, dict) else {}

        def part(d: JsonObject, idx: Json = idx) -> str:
            return chunk({"index": idx, "delta": d, "logprobs": None, "finish_reason": None})

        first: JsonObject = {"role": msg.get("role", "assistant")}
        later: list[JsonObject] = []
        for key, value in msg.items():
            if key in ("role", "tool_calls"):
                continue
            if key in ("content", "refusal") and isinstance(value, str):
                first[key] = ""
                later += [{key: p} for p in pieces(value)] if value else []
            else:
                first[key] = clone(value)
        yield chunk(
            {
                "index": idx,
                "delta": first,
                "logprobs": clone(choice.get("logprobs")),
                "finish_reason": None,
            }
        )
        for d in later:
            yield part(d)
        for j, tc in enumerate(msg.get("tool_calls") or []):
            if not isinstance(tc, dict):
                continue
            head: JsonObject = {"index": j}
            head.update({k: clone(v) for k, v in tc.items() if k != "index"})
            fn = tc.get("function")
            args = fn.get("arguments") if isinstance(fn, dict) else None
            if isinstance(fn, dict) and isinstance(args, str):
                head["function"] = {**clone(fn), "arguments": ""}
                yield part({"tool_calls": [head]})
                for p in json_pieces(args) if args else []:
                    yield part({"tool_calls": [{"index": j, "function": {"arguments": p}}]})
            else:
                yield part({"tool_calls": [head]})
        end: JsonObject = {"index": idx, "delta": {}, "logprobs": None}
        end["finish_reason"] = choice.get("finish_reason")
        end.update({k: clone(v) for k, v in choice.items() if k not in _CHOICE_KEYS | {"message"}})
        yield chunk(end)
    if m.get("usage") is not None:
        yield f"data: {dumps({**base, 'choices': [], 'usage': m['usage']})}\n\n"
    yield "data: [DONE]\n\n"
