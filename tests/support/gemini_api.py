"""Google's Gemini API as the provider speaks it, for fakes: an independent oracle.

Written from the API's reference (`models.generateContent`, `models.streamGenerateContent`,
`Content`, `Part`, `UsageMetadata`) and the 400s it answers, never from `cg/`, so a test can check
the proxy's Gemini handling against it.

    doc = response(model, parts, usage)              # a GenerateContentResponse
    frames = list(stream_frames(doc))                # its SSE (`?alt=sse`), event by event
    problem = contents_problem(body)                 # what the API refuses, in its words
    payload = error_payload(400, problem)            # the 400 body

The stream is the API's: every event is a whole `GenerateContentResponse` holding the parts that
are new (text cut in pieces, a function call whole), `modelVersion` and `responseId` on each, the
last with the candidate's `finishReason` and the final `usageMetadata`. Events are written
`data: JSON` followed by CRLF CRLF, as the API writes them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

Json = Any
SSE_HEADERS = {"content-type": "text/event-stream", "cache-control": "no-cache"}
JSON_HEADERS = {"content-type": "application/json; charset=UTF-8"}
DATA = {"text", "inlineData", "fileData", "functionCall", "functionResponse", "executableCode",
        "codeExecutionResult"}  # fmt: skip


def dumps(value: Json) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def pieces(text: str, size: int = 12) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def model_of(path: str) -> str | None:
    """`…/models/MODEL:generateContent` → MODEL."""
    bare = path.split("?", 1)[0]
    if "/models/" not in bare or ":" not in bare.rsplit("/", 1)[-1]:
        return None
    return bare.rsplit("/models/", 1)[1].split(":", 1)[0]


def is_stream(path: str) -> bool:
    return path.split("?", 1)[0].endswith(":streamGenerateContent")


def response(model: str, parts: list[Json], usage: Json, response_id: str = "fake-r") -> Json:
    return {
        "candidates": [
            {"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}
        ],
        "usageMetadata": usage,
        "modelVersion": model,
        "responseId": response_id,
    }


def stream_frames(doc: Json) -> Iterator[bytes]:
    """The response as the API streams it: text in pieces, other parts whole, the finish
    reason and the usage on the last event."""
    cand = doc["candidates"][0]
    head = {"modelVersion": doc["modelVersion"], "responseId": doc["responseId"]}
    parts: list[Json] = []
    for p in cand["content"]["parts"]:
        if set(p) <= {"text", "thought"} and isinstance(p.get("text"), str):
            parts += [{**p, "text": t} for t in pieces(p["text"])]
        else:
            parts.append(p)
    for n, p in enumerate(parts):
        c: Json = {"content": {"role": "model", "parts": [p]}, "index": 0}
        event: Json = {"candidates": [c], **head}
        if n == len(parts) - 1:
            c["finishReason"] = cand["finishReason"]
            event["usageMetadata"] = doc["usageMetadata"]
        else:
            event["usageMetadata"] = {"promptTokenCount": doc["usageMetadata"]["promptTokenCount"]}
        yield b"data: " + dumps(event).encode() + b"\r\n\r\n"


def code_assist(doc: Json) -> Json:
    """An answer as Code Assist (`…/v1internal:…`) sends it: wrapped in `response`."""
    return {"response": doc, "traceId": "fake-trace"}


def code_assist_frames(frames: Iterator[bytes]) -> Iterator[bytes]:
    for f in frames:
        event = json.loads(f.removeprefix(b"data: "))
        yield b"data: " + dumps(code_assist(event)).encode() + b"\r\n\r\n"


def error_payload(code: int, message: str) -> Json:
    status = {400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 429: "RESOURCE_EXHAUSTED"}
    return {"error": {"code": code, "message": message, "status": status.get(code, "UNKNOWN")}}


def contents_problem(body: Json) -> str | None:
    """Why the API would answer 400 to this request body, in its words, or None."""
    if not isinstance(body, dict):
        return "Invalid JSON payload received."
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        return "* GenerateContentRequest.contents: contents is not specified"
    calls_before: list[str] | None = None  # the function names the previous model turn called
    for i, c in enumerate(contents):
        if not isinstance(c, dict):
            return f"Invalid value at 'contents[{i}]'"
        role = c.get("role", "user")
        if role not in ("user", "model"):
            return "Please use a valid role: user, model."
        parts = c.get("parts")
        if not isinstance(parts, list) or not parts:
            return (
                f"* GenerateContentRequest.contents[{i}].parts: contents.parts must not be empty."
            )
        for j, p in enumerate(parts):
            if not isinstance(p, dict) or len(set(p) & DATA) != 1:
                return f"* GenerateContentRequest.contents[{i}].parts[{j}].data: required oneof field 'data' must have one initialized field"
        calls = [p["functionCall"]["name"] for p in parts if "functionCall" in p]
        responses = [p["functionResponse"]["name"] for p in parts if "functionResponse" in p]
        if responses and (calls_before is None or role != "user"):
            return "Please ensure that function response turn comes immediately after a function call turn."
        if calls_before is not None and sorted(responses) != sorted(calls_before):
            return (
                "Please ensure that the number of function response parts is equal to the "
                "number of function call parts of the function call turn."
            )
        if calls and role != "model":
            return "Please ensure that function call turn comes immediately after a user turn or after a function response turn."
        calls_before = calls or None
    return None
