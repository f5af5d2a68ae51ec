"""The OpenAI Responses API as the provider speaks it, for fakes: an independent oracle.

Written from the API's reference and real traffic (tests/fixtures/codex-0.169.0/), never from
`cg/`, so a test can check the proxy's Responses handling against it.

    response = response_object(model, output_items, usage)    # the `response` object
    frames = list(stream_frames(response))                    # its SSE, event by event
    problems = input_problems(body["input"])                  # what the API refuses, in its words
    payload = error_payload("No tool output found ...")       # the 400 body

The stream is the API's: `response.created` and `response.in_progress` (the response without
output or usage), then per output item `response.output_item.added`, its parts and deltas
(`response.reasoning_summary_part.added` / `_text.delta` / `_text.done` / `_part.done` for a
reasoning item's summary; `response.content_part.added`, `response.output_text.delta` /
`.done`, `response.content_part.done` for a message; `response.function_call_arguments.delta`
/ `.done` for a function call; `response.custom_tool_call_input.delta` / `.done` for a custom
tool call) and `response.output_item.done` with the whole item, and last `response.completed`
carrying the full response with its `usage`. Every event has `type` and a `sequence_number`
counting from 0, and is written as `event: TYPE` / `data: JSON`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

Json = Any
SSE_HEADERS = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}
JSON_HEADERS = {"content-type": "application/json"}
CALLS = {"function_call": "function_call_output", "custom_tool_call": "custom_tool_call_output"}
OUTPUTS = {v: k for k, v in CALLS.items()}


def dumps(value: Json) -> str:
    """Compact JSON with raw UTF-8, as the API sends it."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def pieces(text: str, size: int = 12) -> list[str]:
    """A text cut into the deltas a model streams it in."""
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


# -- the response object ------------------------------------------------------------------------


def usage(
    input_tokens: int, output_tokens: int, cached: int = 0, reasoning: int = 0, written: int = 0
) -> Json:
    """A `usage` object: `input_tokens` counts the cached (read) and written parts too
    (`cache_write_tokens`: GPT-5.6 and later), `total_tokens` is input + output."""
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": written},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": input_tokens + output_tokens,
    }


def response_object(
    response_id: str,
    model: str,
    output: list[Json],
    usage_: Json | None,
    request: Json | None = None,
    status: str = "completed",
) -> Json:
    """The `response` object (`object: "response"`) the API returns for `request`."""
    req = request if isinstance(request, dict) else {}
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": req.get("instructions"),
        "max_output_tokens": req.get("max_output_tokens"),
        "model": model,
        "output": output,
        "parallel_tool_calls": req.get("parallel_tool_calls", True),
        "previous_response_id": req.get("previous_response_id"),
        "prompt_cache_key": req.get("prompt_cache_key"),
        "reasoning": req.get("reasoning") or {"effort": None, "summary": None},
        "service_tier": "default",
        "store": req.get("store", True),
        "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": req.get("tool_choice", "auto"),
        "tools": req.get("tools") or [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage_,
        "user": None,
        "metadata": {},
    }


def reasoning_item(item_id: str, summary: str, encrypted: str | None) -> Json:
    item: Json = {"id": item_id, "type": "reasoning", "summary": []}
    if summary:
        item["summary"] = [{"type": "summary_text", "text": summary}]
    if encrypted is not None:
        item["encrypted_content"] = encrypted
    return item


def message_item(item_id: str, text: str) -> Json:
    return {
        "id": item_id,
        "type": "message",
        "status": "completed",
        "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": text}],
        "role": "assistant",
    }


def function_call_item(item_id: str, call_id: str, name: str, arguments: str) -> Json:
    return {
        "id": item_id,
        "type": "function_call",
        "status": "completed",
        "arguments": arguments,
        "call_id": call_id,
        "name": name,
    }


# -- the event stream ---------------------------------------------------------------------------


def stream_events(response: Json) -> Iterator[Json]:
    """The events of a streamed `response` (its final form), in the API's order."""
    seq = iter(range(1_000_000))

    def ev(kind: str, **fields: Json) -> Json:
        return {"type": kind, "sequence_number": next(seq), **fields}

    opening = {**response, "status": "in_progress", "output": [], "usage": None}
    yield ev("response.created", response=opening)
    yield ev("response.in_progress", response=opening)
    for index, item in enumerate(response["output"]):
        kind = item.get("type")
        iid = item.get("id")
        at = {"item_id": iid, "output_index": index}
        if kind == "reasoning":
            yield ev("response.output_item.added", output_index=index, item={**item, "summary": []})
            for k, part in enumerate(item.get("summary") or []):
                text = part.get("text", "")
                empty = {"type": "summary_text", "text": ""}
                yield ev("response.reasoning_summary_part.added", **at, summary_index=k, part=empty)
                for p in pieces(text):
                    yield ev(
                        "response.reasoning_summary_text.delta",
                        **at,
                        summary_index=k,
                        delta=p,
                        obfuscation="xx",
                    )
                yield ev("response.reasoning_summary_text.done", **at, summary_index=k, text=text)
                yield ev("response.reasoning_summary_part.done", **at, summary_index=k, part=part)
        elif kind == "message":
            added = {**item, "status": "in_progress", "content": []}
            yield ev("response.output_item.added", output_index=index, item=added)
            for c, part in enumerate(item.get("content") or []):
                text = part.get("text", "")
                yield ev(
                    "response.content_part.added", **at, content_index=c, part={**part, "text": ""}
                )
                for p in pieces(text):
                    yield ev(
                        "response.output_text.delta",
                        **at,
                        content_index=c,
                        delta=p,
                        logprobs=[],
                        obfuscation="xx",
                    )
                yield ev("response.output_text.done", **at, content_index=c, text=text, logprobs=[])
                yield ev("response.content_part.done", **at, content_index=c, part=part)
        elif kind == "function_call":
            added = {**item, "status": "in_progress", "arguments": ""}
            yield ev("response.output_item.added", output_index=index, item=added)
            args = item.get("arguments", "")
            for p in pieces(args, 9):
                yield ev("response.function_call_arguments.delta", **at, delta=p, obfuscation="x")
            name = item.get("name")
            yield ev("response.function_call_arguments.done", **at, name=name, arguments=args)
        elif kind == "custom_tool_call":
            added = {**item, "status": "in_progress", "input": ""}
            yield ev("response.output_item.added", output_index=index, item=added)
            text = item.get("input", "")
            for p in pieces(text, 9):
                yield ev("response.custom_tool_call_input.delta", **at, delta=p, obfuscation="x")
            yield ev("response.custom_tool_call_input.done", **at, input=text)
        else:
            yield ev("response.output_item.added", output_index=index, item=item)
        yield ev("response.output_item.done", output_index=index, item=item)
    yield ev("response.completed", response=response)


def stream_frames(response: Json) -> Iterator[str]:
    """`stream_events` as SSE frames (`event:` and `data:` lines, a blank line after each)."""
    for event in stream_events(response):
        yield f"event: {event['type']}\ndata: {dumps(event)}\n\n"


# -- errors -------------------------------------------------------------------------------------


def error_payload(
    message: str,
    kind: str = "invalid_request_error",
    param: str | None = "input",
    code: str | None = None,
) -> Json:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def input_problems(items: Json) -> list[str]:
    """What the API refuses in an `input` array, each in the API's own words (400
    `invalid_request_error`, `param: "input"`): a call with no output after it, an output with
    no call before it, a reasoning item not followed by the item it came with (here: followed by
    nothing, another reasoning item or a non-assistant message), a message with no content."""
    if not isinstance(items, list):
        return []
    out: list[str] = []
    calls_seen: set[str] = set()
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            out.append(f"Invalid value for 'input[{i}]': expected an object.")
            continue
        kind = item.get("type", "message")
        if kind in CALLS:
            cid = item.get("call_id")
            answered = any(
                isinstance(x, dict) and x.get("type") == CALLS[kind] and x.get("call_id") == cid
                for x in items[i + 1 :]
            )
            if not answered:
                noun = "function call" if kind == "function_call" else "custom tool call"
                out.append(f"No tool output found for {noun} {cid}.")
            calls_seen.add(str(cid))
        elif kind in OUTPUTS:
            cid = item.get("call_id")
            if str(cid) not in calls_seen:
                noun = "function call" if kind == "function_call_output" else "custom tool call"
                out.append(f"No tool call found for {noun} output with call_id {cid}.")
        elif kind == "reasoning":
            nxt = items[i + 1] if i + 1 < len(items) else None
            ok = (
                isinstance(nxt, dict)
                and nxt.get("type", "message") != "reasoning"
                and not (nxt.get("type", "message") == "message" and nxt.get("role") != "assistant")
            )
            if not ok:
                out.append(
                    f"Item '{item.get('id')}' of type 'reasoning' was provided without its "
                    "required following item."
                )
        elif kind == "message":
            content = item.get("content")
            blank = content in (None, "", []) or (
                isinstance(content, list)
                and any(
                    isinstance(c, dict)
                    and c.get("type") in ("input_text", "output_text")
                    and not c.get("text")
                    for c in content
                )
            )
            if blank:
                out.append(f"Invalid 'input[{i}].content': empty content is not allowed.")
    return out
