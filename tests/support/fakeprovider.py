"""A fake LLM provider on 127.0.0.1 that speaks the real Anthropic and OpenAI wire formats.

    POST …/v1/messages           Anthropic Messages: a `message` JSON, or SSE when "stream": true
                                 (also as Vertex AI serves it: …/publishers/anthropic/models/
                                 M:rawPredict and :streamRawPredict)
    POST …/v1/chat/completions   OpenAI Chat Completions: a `chat.completion`, or chunk SSE
    POST …/v1/responses          OpenAI Responses: a `response` JSON, or its event stream
                                 (`response.created` … `response.completed`); like the API, a
                                 400 for an input whose calls, outputs or reasoning items do not
                                 pair (`responses_problem`)
    POST …/backend-api/codex/responses   the same, as ChatGPT's Codex backend, once `chatgpt`
                                 is set: its checks and rate-limit headers
                                 (tests/support/signin.py)
    POST …/models/M:generateContent, …:streamGenerateContent
                                 the Gemini API (tests/support/gemini_api.py): a
                                 GenerateContentResponse, or its SSE; a 400 in the API's words
                                 for contents it refuses (`contents_problem`)
    GET  anything else           200, a JSON echo of method and path (HEAD: its headers only)
    other                        404, a JSON error

Every request is recorded (method, path, headers, the raw body bytes as received, and a
gzip-decoded copy). Tests wait for requests on a condition variable, never on sleeps. Replies to
the two provider endpoints can be scripted with `FakeProvider.script(Reply(...))`; unscripted
requests get a normal answer whose text is `Reply.text`'s default — or, when a `responder` is
set, whatever it returns (an agent's whole scripted session, see tests/support/agent_script.py).

Requests carrying `x-context-guru: summarize` (context-guru's own summarizer calls) are scripted
apart, with `FakeProvider.script_summarizer(...)`: agent replies and summarizer replies never
consume each other's queue. An unscripted summarizer request gets a numbered summary
(`summary_answer(n)`), so every summary a test provokes has distinct bytes. A second instance
serves as a dedicated "cheap model" endpoint.

The prompt cache is modelled as the providers bill it (tests/support/promptcache.py, on the injectable
`clock`): every 200 answer to a JSON request is billed when its status line is written (the cache
entry exists from then) and reports that usage (Anthropic `input_tokens`,
`cache_creation_input_tokens`, `cache_read_input_tokens`, `cache_creation`; OpenAI
`prompt_tokens_details.cached_tokens`; Responses `input_tokens_details.cached_tokens`). `FakeProvider.billed` is the fake's own accounting, one
`Billed` per request it billed. The cache is scoped by the request's credential, like a
provider's organisation. Every request and every answer's start takes a number from one sequence
(`Recorded.seq`, `Reply.began`), so a test can tell which came first.
"""

from __future__ import annotations

import itertools
import json
import re
import ssl
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cg.wire import decode
from tests.support import gemini_api
from tests.support.promptcache import Bill, PromptCache, TooManyBreakpoints
from tests.support.signin import CHATGPT_PATH, ChatGPTAccount, ClaudeOAuth

DEFAULT_TEXT = "Hello from the fake provider, streamed in pieces."
# Claude on Vertex AI: the Messages API at `…/publishers/anthropic/models/M:rawPredict`.
_VERTEX_CLAUDE = re.compile(r"/publishers/anthropic/models/[^/:]+:(?:stream)?[rR]awPredict$")
GATE_TIMEOUT = 5.0
DECODED_MAX = 64 * 1024 * 1024  # a gzip body decoded further than this is recorded undecoded
SUMMARIZER_HEADER = "x-context-guru"


def summary_answer(n: int) -> str:
    """The text of the n-th unscripted summarizer answer (1-based)."""
    return f"<summary>Fake summary #{n}: the agent listed files and fixed the bug.</summary>"


@dataclass(frozen=True)
class Recorded:
    """One request as the provider received it."""

    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes
    decoded: bytes | None = None  # the body with a gzip content-encoding undone, else None
    seq: int = 0  # its place in the provider's one sequence of requests and answer starts

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in self.headers if k.lower() == name), None)

    def json(self) -> Any:
        return json.loads(self.decoded if self.decoded is not None else self.body)

    @property
    def is_summarizer(self) -> bool:
        """Sent by context-guru's summarizer (`x-context-guru: summarize`), not by an agent."""
        return (self.header(SUMMARIZER_HEADER) or "").strip() == "summarize"


@dataclass
class Reply:
    """A scripted answer for the next provider request.

    `body` set: sent as is with `status` and `headers`. Otherwise a normal (JSON or SSE) answer
    in the request's dialect carrying `text`. `gate`: an SSE answer stops after its first text
    delta until the gate is set (or GATE_TIMEOUT passes, which sets `gate_timed_out`) — a test
    that the proxy streams instead of buffering. `hold`: nothing at all is sent (not even the
    status line) until the hold is set or `hold_timeout` passes (which sets `hold_timed_out`) —
    a hanging server. `answered` is set once the reply has been written (or the peer was gone).
    `frames`: an SSE answer written as is, one chunk per frame (flushed), with `status` and
    `headers` over the SSE defaults. `usage`: the answer's `usage` object instead of the one the
    prompt-cache model bills (JSON: as is; Anthropic SSE: `message_delta.usage`, with
    `message_start` carrying its input side; OpenAI SSE: the usage chunk, sent only when the
    request asked `include_usage`). `began`: the sequence number taken when the status line
    was written (compare `Recorded.seq`). `after_headers`: called (on the handler thread) once
    the status line and headers are out and before any of the body — a test's gate that lets
    the proxy see the answer begin while its client still waits for it. `drip`: the answer's
    bytes are written one at a time, this many seconds apart (a slow server). `reset_after`:
    after this many SSE frames the connection is reset (RST), mid-answer. `gate_after`: with
    `frames`, after this many frames the answer stops until `gate` is set (or GATE_TIMEOUT
    passes, which sets `gate_timed_out`).
    """

    status: int = 200
    text: str = DEFAULT_TEXT
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    gate: threading.Event | None = None
    gate_timed_out: bool = False
    hold: threading.Event | None = None
    hold_timeout: float = GATE_TIMEOUT
    hold_timed_out: bool = False
    answered: threading.Event = field(default_factory=threading.Event)
    frames: list[bytes] | None = None
    usage: dict[str, Any] | None = None
    began: int | None = None
    after_headers: Callable[[], None] | None = None
    drip: float | None = None
    reset_after: int | None = None
    gate_after: int | None = None

    @classmethod
    def json(cls, status: int, payload: Any) -> Reply:
        return cls(status, body=_dumps(payload).encode(), headers=_JSON)


def anthropic_error(status: int, kind: str, message: str) -> Reply:
    return Reply.json(status, {"type": "error", "error": {"type": kind, "message": message}})


def openai_error(status: int, kind: str, message: str) -> Reply:
    return Reply.json(
        status, {"error": {"message": message, "type": kind, "param": None, "code": None}}
    )


def responses_error(status: int, message: str, param: str | None = "input") -> Reply:
    return Reply.json(
        status,
        {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": param,
                "code": None,
            }
        },
    )


_CALLS = {"function_call": "function call", "custom_tool_call": "custom tool call"}
_OUTPUTS = {
    "function_call_output": "function call output",
    "custom_tool_call_output": "custom tool call output",
}
_MODEL_ITEMS = ("function_call", "custom_tool_call", "web_search_call", "reasoning")


def responses_problem(body: Any) -> str | None:
    """The message of the 400 the Responses API answers to an `input` whose function or custom
    calls and outputs do not pair, or whose reasoning item lacks its following item; None when
    it would accept it. Written from the API's own error texts, apart from `cg.wire.shape`."""
    items = body.get("input") if isinstance(body, dict) else None
    if not isinstance(items, list):
        return None
    calls: dict[Any, str] = {}
    answered: set[Any] = set()
    for i, it in enumerate(items):
        if not isinstance(it, dict):
            continue
        kind = it.get("type")
        if kind in _CALLS:
            calls[it.get("call_id")] = kind
        elif kind in _OUTPUTS:
            if it.get("call_id") not in calls:
                return f"No tool call found for {_OUTPUTS[kind]} with call_id {it.get('call_id')}."
            answered.add(it.get("call_id"))
        elif kind == "reasoning":
            nxt = items[i + 1] if i + 1 < len(items) else None
            if not (
                isinstance(nxt, dict)
                and (nxt.get("type") in _MODEL_ITEMS or nxt.get("role") == "assistant")
            ):
                return (
                    f"Item '{it.get('id')}' of type 'reasoning' was provided without its "
                    "required following item."
                )
    for cid, kind in calls.items():
        if cid not in answered:
            return f"No tool output found for {_CALLS[kind]} {cid}."
    return None


_JSON = {"content-type": "application/json"}
_SSE = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}
_ids = itertools.count(1)


def _dumps(value: Any) -> str:
    """Compact JSON with raw UTF-8, as both providers send it."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _pieces(text: str) -> list[str]:
    """Split text into a few deltas the way a model streams it (words with their spaces)."""
    words = text.split(" ")
    return [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)] or [""]


def _out_tokens(text: str) -> int:
    return max(1, len(text) // 4)


def _anthropic_events(model: str, text: str, bill: Bill) -> Iterator[tuple[str, Any]]:
    out_tokens = _out_tokens(text)
    start = bill.anthropic_usage(1)
    yield (
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": f"msg_fake{next(_ids):06d}",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": start,
            },
        },
    )
    yield (
        "content_block_start",
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    )
    yield "ping", {"type": "ping"}
    for piece in _pieces(text):
        yield (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": piece},
            },
        )
    yield "content_block_stop", {"type": "content_block_stop", "index": 0}
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            # Cumulative counts: the input side again, and the output so far.
            "usage": {
                "input_tokens": start["input_tokens"],
                "cache_creation_input_tokens": start["cache_creation_input_tokens"],
                "cache_read_input_tokens": start["cache_read_input_tokens"],
                "output_tokens": out_tokens,
            },
        },
    )
    yield "message_stop", {"type": "message_stop"}


def _anthropic_message(model: str, text: str, bill: Bill) -> dict[str, Any]:
    return {
        "id": f"msg_fake{next(_ids):06d}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": bill.anthropic_usage(_out_tokens(text)),
    }


def _openai_completion(model: str, text: str, bill: Bill) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-fake{next(_ids):06d}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": bill.openai_usage(_out_tokens(text)),
        "system_fingerprint": "fp_fake",
    }


def _openai_chunks(model: str, text: str, bill: Bill, usage: bool) -> Iterator[Any]:
    base = {
        "id": f"chatcmpl-fake{next(_ids):06d}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": "fp_fake",
    }
    extra: dict[str, Any] = {"usage": None} if usage else {}

    def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {**base, "choices": [choice], **extra}

    yield chunk({"role": "assistant", "content": "", "refusal": None}, None)
    for piece in _pieces(text):
        yield chunk({"content": piece}, None)
    yield chunk({}, "stop")
    if usage:
        yield {**base, "choices": [], "usage": bill.openai_usage(_out_tokens(text))}
    yield "[DONE]"


def _response(req: dict[str, Any], model: str, status: str = "in_progress") -> dict[str, Any]:
    """A `response` object as the API writes one, echoing the request's settings."""
    return {
        "id": f"resp_fake{next(_ids):06d}",
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": req.get("instructions"),
        "max_output_tokens": req.get("max_output_tokens"),
        "model": model,
        "output": [],
        "parallel_tool_calls": req.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": req.get("store", True),
        "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": req.get("tool_choice", "auto"),
        "tools": req.get("tools", []),
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": None,
        "metadata": {},
    }


def _output_message(text: str) -> dict[str, Any]:
    return {
        "id": f"msg_fake{next(_ids):06d}",
        "type": "message",
        "status": "completed",
        "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": text}],
        "role": "assistant",
    }


def _responses_json(req: dict[str, Any], model: str, text: str, bill: Bill) -> dict[str, Any]:
    out = _response(req, model, "completed")
    out["output"] = [_output_message(text)]
    out["usage"] = bill.responses_usage(_out_tokens(text))
    return out


def _responses_events(
    req: dict[str, Any], model: str, text: str, bill: Bill
) -> Iterator[tuple[str, Any]]:
    """The event stream of a one-message answer, as the API streams it."""
    seq = itertools.count()
    start = _response(req, model)
    item = _output_message(text)
    iid = item["id"]
    part = item["content"][0]

    def ev(kind: str, **data: Any) -> tuple[str, Any]:
        return kind, {"type": kind, "sequence_number": next(seq), **data}

    yield ev("response.created", response=start)
    yield ev("response.in_progress", response=start)
    yield ev(
        "response.output_item.added",
        output_index=0,
        item={**item, "status": "in_progress", "content": []},
    )
    at = {"item_id": iid, "output_index": 0, "content_index": 0}
    yield ev("response.content_part.added", **at, part={**part, "text": ""})
    for piece in _pieces(text):
        yield ev("response.output_text.delta", **at, delta=piece, logprobs=[], obfuscation="fk")
    yield ev("response.output_text.done", **at, text=text, logprobs=[])
    yield ev("response.content_part.done", **at, part=part)
    yield ev("response.output_item.done", output_index=0, item=item)
    done = {**start, "status": "completed", "output": [item]}
    done["usage"] = bill.responses_usage(_out_tokens(text))
    yield ev("response.completed", response=done)


_INPUT_SIDE = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def _with_usage(data: Any, usage: dict[str, Any] | None) -> Any:
    """An event or chunk carrying `usage` instead of its own (see `Reply.usage`)."""
    if usage is None or not isinstance(data, dict):
        return data
    if data.get("type") == "message_start":
        start = {k: v for k, v in usage.items() if k in _INPUT_SIDE or k == "cache_creation"}
        return {**data, "message": {**data["message"], "usage": {**start, "output_tokens": 1}}}
    if data.get("type") == "response.completed":
        return {**data, "response": {**data["response"], "usage": usage}}
    if data.get("type") == "message_delta" or data.get("usage") is not None:
        return {**data, "usage": usage}
    return data


def _has_content(chunk: Any) -> bool:
    return isinstance(chunk, dict) and any(
        c.get("delta", {}).get("content") for c in chunk.get("choices", [])
    )


@dataclass(frozen=True)
class Billed:
    """One request as the fake billed it: what it read from, wrote to and missed the cache."""

    request: Recorded
    bill: Bill


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default backlog is 5: 64 agents connecting at once would be refused (a
    # proxy turns that into 502s), as no real provider does.
    request_queue_size = 256
    provider: FakeProvider

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-request (a proxy killed by a test) is not an error."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()  # deferred from accept(): in this thread, not the server's
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._handle()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_GET

    # -- request -----------------------------------------------------------------------------

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            parts: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("content-length") or 0))

    def _handle(self) -> None:
        body = self._read_body()
        decoded = None
        if self.headers.get("content-encoding", "").strip().lower() == "gzip":
            try:  # (bounded: a test may send a decompression bomb through the proxy)
                decoded = decode.decode(body, "gzip", DECODED_MAX)
            except ValueError:
                decoded = None
        provider = self.server.provider
        rec = Recorded(
            self.command, self.path, list(self.headers.items()), body, decoded, provider._next_seq()
        )
        provider._record(rec)
        bare = self.path.split("?", 1)[0].rstrip("/")
        chatgpt = provider.chatgpt if bare.endswith(CHATGPT_PATH) else None
        if self.command == "POST" and (
            bare.endswith(
                (
                    "/v1/messages",
                    "/v1/chat/completions",
                    "/v1/responses",
                    ":generateContent",
                    ":streamGenerateContent",
                )
            )
            or _VERTEX_CLAUDE.search(bare) is not None
            or chatgpt is not None
        ):
            dialect = (
                "anthropic"
                if bare.endswith("/v1/messages") or _VERTEX_CLAUDE.search(bare) is not None
                else "responses"
                if bare.endswith("/v1/responses") or chatgpt is not None
                else "gemini"
                if bare.endswith((":generateContent", ":streamGenerateContent"))
                else "openai"
            )
            refused = self._signin_refusal(provider, dialect, chatgpt, rec)
            if refused is not None:
                self._send(refused.status, refused.headers, refused.body or b"")
                return
            reply = provider._next_reply(rec)
            if dialect == "anthropic" and provider.claude_oauth is not None:
                reply.headers = {**provider.claude_oauth.answer_headers(), **reply.headers}
            elif chatgpt is not None:
                reply.headers = {**chatgpt.answer_headers(), **reply.headers}
            try:
                if reply.hold is not None:
                    reply.hold_timed_out = not reply.hold.wait(reply.hold_timeout)
                self._provider(dialect, rec, reply)
            except OSError:
                self.close_connection = True  # the client gave up waiting: nothing to answer
            finally:
                reply.answered.set()
        elif self.command in ("GET", "HEAD"):
            side = provider._side_reply(rec)
            if side is not None and side.body is not None:
                self._send(side.status, side.headers or _JSON, side.body)
            else:
                self._send(200, _JSON, _dumps({"echo": True, "path": self.path}))
        else:
            msg = f"no route for {self.command} {bare}"
            self._send(404, _JSON, _dumps({"error": {"type": "not_found", "message": msg}}))

    def _signin_refusal(
        self, provider: FakeProvider, dialect: str, chatgpt: ChatGPTAccount | None, rec: Recorded
    ) -> Reply | None:
        """The 4xx a signed-in route answers a request its real counterpart refuses."""
        headers = {k.lower(): v for k, v in rec.headers}
        if chatgpt is not None:
            try:
                body = rec.json()
            except ValueError:
                body = None
            why = chatgpt.problem(headers, body)
            return None if why is None else responses_error(why[0], why[1], None)
        if dialect == "anthropic" and provider.claude_oauth is not None:
            why = provider.claude_oauth.problem(headers)
            return None if why is None else anthropic_error(why[0], "authentication_error", why[1])
        return None

    # -- response ----------------------------------------------------------------------------

    def _send(
        self,
        status: int,
        headers: dict[str, str],
        body: bytes | str,
        after_headers: Callable[[], None] | None = None,
    ) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        if after_headers is not None:
            after_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _provider(self, dialect: str, rec: Recorded, reply: Reply) -> None:
        try:
            req = rec.json()
        except ValueError as e:
            req = f"invalid JSON: {e}"
        bill = Bill(dialect, 0, 0, 0, 0)
        problem = responses_problem(req) if dialect == "responses" else None
        if problem is not None:
            bad = responses_error(400, problem)
            reply.began = self.server.provider._next_seq()
            self._send(bad.status, bad.headers, bad.body or b"")
            return
        if dialect == "gemini":
            self._gemini(rec, req, reply)
            return
        if reply.status == 200 and isinstance(req, dict):
            try:
                bill = self.server.provider._bill(dialect, rec, req)
            except TooManyBreakpoints as e:
                bad = anthropic_error(400, "invalid_request_error", str(e))
                reply.began = self.server.provider._next_seq()
                self._send(bad.status, bad.headers, bad.body or b"")
                return
        reply.began = self.server.provider._next_seq()
        if reply.drip is not None:
            self._drip(reply, dialect, req, bill)
            return
        if reply.body is not None:
            self._send(reply.status, reply.headers or _JSON, reply.body, reply.after_headers)
            return
        if reply.frames is not None:
            self.send_response(reply.status)
            for k, v in {**_SSE, **reply.headers}.items():
                self.send_header(k, v)
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            if reply.after_headers is not None:
                reply.after_headers()
            for n, data in enumerate(reply.frames):
                if n == reply.gate_after and reply.gate is not None:
                    reply.gate_timed_out = not reply.gate.wait(GATE_TIMEOUT)
                self._chunk(data)
            self._chunk(b"")
            return
        if not isinstance(req, dict):
            why = req if isinstance(req, str) else "the body must be a JSON object"
            err = anthropic_error if dialect == "anthropic" else openai_error
            bad = err(400, "invalid_request_error", why)
            self._send(bad.status, bad.headers, bad.body or b"")
            return
        model = str(req.get("model", "fake-model"))
        if req.get("stream") is not True:
            if dialect == "responses":
                doc = _responses_json(req, model, reply.text, bill)
            else:
                make = _anthropic_message if dialect == "anthropic" else _openai_completion
                doc = make(model, reply.text, bill)
            self._send(
                reply.status,
                {**_JSON, **reply.headers},
                _dumps(_with_usage(doc, reply.usage)),
                reply.after_headers,
            )
            return
        self.send_response(reply.status)
        for k, v in {**_SSE, **reply.headers}.items():
            self.send_header(k, v)
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        if reply.after_headers is not None:
            reply.after_headers()
        if dialect in ("anthropic", "responses"):
            events = (
                _anthropic_events(model, reply.text, bill)
                if dialect == "anthropic"
                else _responses_events(req, model, reply.text, bill)
            )
            frames = [
                (
                    f"event: {name}\ndata: {_dumps(_with_usage(data, reply.usage))}\n\n",
                    name in ("content_block_delta", "response.output_text.delta"),
                )
                for name, data in events
            ]
        else:
            opts = req.get("stream_options")
            usage = isinstance(opts, dict) and opts.get("include_usage") is True
            frames = [
                (
                    f"data: {_dumps(_with_usage(c, reply.usage)) if c != '[DONE]' else c}\n\n",
                    _has_content(c),
                )
                for c in _openai_chunks(model, reply.text, bill, usage)
            ]
        gated = reply.gate is not None
        for n, (frame, is_delta) in enumerate(frames):
            if reply.reset_after is not None and n == reply.reset_after:
                self._reset()
                return
            self._chunk(frame.encode())
            if gated and is_delta and reply.gate is not None:
                gated = False
                reply.gate_timed_out = not reply.gate.wait(GATE_TIMEOUT)
        self._chunk(b"")

    def _gemini(self, rec: Recorded, req: Any, reply: Reply) -> None:
        """The Gemini API: the model and the stream from the path, the cache billed like
        OpenAI's (implicit), a 400 in the API's words for contents it refuses."""
        provider = self.server.provider
        # Code Assist (`…/v1internal:…`): `{"model", "project", "request": {…}}`, answered
        # wrapped in `response`.
        wrapped = isinstance(req, dict) and "contents" not in req and "request" in req
        envelope: dict[str, Any] = {}
        if wrapped:
            envelope, req = req, req["request"]
        problem = gemini_api.contents_problem(req)
        if problem is not None:
            reply.began = provider._next_seq()
            self._send(400, gemini_api.JSON_HEADERS, _dumps(gemini_api.error_payload(400, problem)))
            return
        model = gemini_api.model_of(rec.path) or "gemini-fake"
        if wrapped and isinstance(envelope.get("model"), str):
            model = envelope["model"]
        bill = Bill("gemini", 0, 0, 0, 0)
        if reply.status == 200:
            bill = provider._bill("gemini", rec, {**req, "model": model})
        reply.began = provider._next_seq()
        stream = gemini_api.is_stream(rec.path)
        if reply.body is not None:
            self._send(reply.status, reply.headers or _JSON, reply.body, reply.after_headers)
            return
        if reply.frames is not None:
            frames = reply.frames
        else:
            usage = reply.usage or bill.gemini_usage(_out_tokens(reply.text))
            doc = gemini_api.response(model, [{"text": reply.text}], usage)
            if not stream:
                headers = {**gemini_api.JSON_HEADERS, **reply.headers}
                sent = gemini_api.code_assist(doc) if wrapped else doc
                self._send(reply.status, headers, _dumps(sent), reply.after_headers)
                return
            frames = list(gemini_api.stream_frames(doc))
            if wrapped:
                frames = list(gemini_api.code_assist_frames(iter(frames)))
        self.send_response(reply.status)
        for k, v in {**gemini_api.SSE_HEADERS, **reply.headers}.items():
            self.send_header(k, v)
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        if reply.after_headers is not None:
            reply.after_headers()
        for data in frames:
            self._chunk(data)
        self._chunk(b"")

    def _drip(self, reply: Reply, dialect: str, req: Any, bill: Bill) -> None:
        """The answer (its `body`, or the normal JSON one) one byte at a time."""
        if reply.body is not None:
            data = reply.body
        else:
            model = str(req.get("model", "fake-model")) if isinstance(req, dict) else "m"
            make = _anthropic_message if dialect == "anthropic" else _openai_completion
            data = _dumps(make(model, reply.text, bill)).encode()
        self.send_response(reply.status)
        for k, v in {**_JSON, **reply.headers}.items():
            self.send_header(k, v)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        pause = threading.Event()  # never set: a bounded pause between bytes
        for i in range(len(data)):
            self.wfile.write(data[i : i + 1])
            self.wfile.flush()
            pause.wait(reply.drip or 0)  # cg: allow-sleep: a deliberately slow server

    def _reset(self) -> None:
        """Reset the connection now: an RST, not an orderly close."""
        import socket
        import struct

        self.wfile.flush()
        sock = self.connection
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        sock.close()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


class FakeProvider:
    """`with FakeProvider() as p:` serves on `p.url` until the block ends.

    `tls`: serve HTTPS with this server context (`p.url` is then `https://…`). `responder`: asked
    for the reply to each agent request the script queue does not answer, and to each GET or
    HEAD (a `Reply` with `body`); None means the default answer. `clock`: the prompt cache's
    clock (default `time.monotonic`); pass a `tests.support.promptcache.Clock` to move time by hand.
    """

    def __init__(
        self, tls: ssl.SSLContext | None = None, clock: Callable[[], float] | None = None
    ) -> None:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.provider = self
        self.scheme = "http"
        if tls is not None:
            self.scheme = "https"
            self._server.socket = tls.wrap_socket(
                self._server.socket, server_side=True, do_handshake_on_connect=False
            )
        self.responder: Callable[[Recorded], Reply | None] | None = None
        # The sign-ins (tests/support/signin.py): ChatGPT's Codex backend is served once set;
        # with `claude_oauth`, `/v1/messages` wants that OAuth bearer and beta.
        self.chatgpt: ChatGPTAccount | None = None
        self.claude_oauth: ClaudeOAuth | None = None
        # Asked for the reply to each summarizer request the script does not answer.
        self.summarizer_responder: Callable[[Recorded], Reply | None] | None = None
        self._cond = threading.Condition()
        self._requests: list[Recorded] = []
        self._replies: deque[Reply] = deque()
        self._summarizer_replies: deque[Reply] = deque()
        self._summaries = 0
        self._seq = itertools.count(1)
        self.cache = PromptCache(clock or time.monotonic)
        self._billed: list[Billed] = []
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="fake-provider", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def start(self) -> FakeProvider:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> FakeProvider:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- scripting ---------------------------------------------------------------------------

    def script(self, *replies: Reply) -> None:
        """Queue replies for the next agent (non-summarizer) requests, in order."""
        with self._cond:
            self._replies.extend(replies)

    def script_summarizer(self, *replies: Reply) -> None:
        """Queue replies for the next requests carrying `x-context-guru: summarize`, in order."""
        with self._cond:
            self._summarizer_replies.extend(replies)

    def clear_script(self) -> None:
        with self._cond:
            self._replies.clear()
            self._summarizer_replies.clear()

    def _next_reply(self, rec: Recorded | None = None) -> Reply:
        with self._cond:
            if rec is not None and rec.is_summarizer:
                if self._summarizer_replies:
                    return self._summarizer_replies.popleft()
                self._summaries += 1
                n, summarizer = self._summaries, self.summarizer_responder
                responder = None
            else:
                if self._replies:
                    return self._replies.popleft()
                n, summarizer, responder = 0, None, self.responder
        if rec is not None and rec.is_summarizer:
            mine = summarizer(rec) if summarizer is not None else None
            return mine or Reply(text=summary_answer(n))
        return (responder(rec) if responder is not None and rec is not None else None) or Reply()

    def _side_reply(self, rec: Recorded) -> Reply | None:
        responder = self.responder
        return responder(rec) if responder is not None else None

    # -- the prompt cache --------------------------------------------------------------------

    def _next_seq(self) -> int:
        with self._cond:
            return next(self._seq)

    def _bill(self, dialect: str, rec: Recorded, body: dict[str, Any]) -> Bill:
        scope = (
            rec.header("x-api-key")
            or rec.header("authorization")
            or rec.header("x-goog-api-key")
            or rec.path.partition("key=")[2].split("&", 1)[0]
        )
        bill = self.cache.bill(dialect, body, scope)
        with self._cond:
            self._billed.append(Billed(rec, bill))
            self._cond.notify_all()
        return bill

    @property
    def billed(self) -> list[Billed]:
        """Every request this provider billed (answered 200 to a JSON object), in order."""
        with self._cond:
            return list(self._billed)

    def bill_of(self, rec: Recorded) -> Bill:
        """What `rec` was billed; KeyError when it was not billed (yet)."""
        for b in self.billed:
            if b.request is rec:
                return b.bill
        raise KeyError(f"request #{rec.seq} was not billed")

    # -- recording ---------------------------------------------------------------------------

    def _record(self, rec: Recorded) -> None:
        with self._cond:
            self._requests.append(rec)
            self._cond.notify_all()

    @property
    def requests(self) -> list[Recorded]:
        with self._cond:
            return list(self._requests)

    @property
    def summarizer_requests(self) -> list[Recorded]:
        """The requests context-guru's summarizer sent here, in arrival order."""
        with self._cond:
            return [r for r in self._requests if r.is_summarizer]

    def wait_for(
        self,
        n: int,
        timeout: float = 10.0,
        where: Callable[[Recorded], bool] | None = None,
    ) -> list[Recorded]:
        """Block until at least `n` recorded requests match `where` (all, if None); return them."""

        def matching() -> list[Recorded]:
            return [r for r in self._requests if where is None or where(r)]

        with self._cond:
            if not self._cond.wait_for(lambda: len(matching()) >= n, timeout):
                raise TimeoutError(
                    f"fake provider: {len(matching())} of {n} requests in {timeout}s"
                )
            return matching()
