"""Scripted sessions on the official SDKs through a real proxy, for the end-to-end tests that
drive the addon turn by turn (expand, summarize, shared cache, ledger, the SDKs' pass-through):

- `SdkClient`: one `anthropic`/`openai` client through the proxy with its own session
  (`x-context-guru-session`), keeping every request it puts on the wire (a `Capture` hook);
  `call` sends SDK arguments as they are, `turn` an agent's turn (model, system prompt) around
  a transcript. Each send carries a fresh `x-e2e-id` and comes back as an `Exchange`.
  `sdk_client` is the bare SDK client (sync or async) on an httpx client of the test's own.
- the transcripts: `anthropic_messages`, `openai_messages`, `responses_items` (`messages` picks
  by dialect) — a tagged task, one tool exchange, then steps and notes; every step names the
  tag, so two sessions' summarized spans (and their stash keys) differ.
- the scripted model's answers: `provider_message` (a provider's message, completion or
  Responses `response`, with text and tool calls) and `answer` (it, as JSON or SSE as the
  request asked).

The real agents (Claude Code, the SDK agent loop) and their audit live in tests/e2e/agents.py;
the proxy process, its config and the wire-level checks in tests/e2e/harness.py.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal, Self, overload

import anthropic
import httpx
import openai
from openai.lib.streaming.chat import ChatCompletionStreamState

from cg.wire.answers import Reply as Message
from cg.wire.answers import render_json, render_sse
from tests.e2e.harness import Capture, Proxy, new_id
from tests.support.fakeprovider import Recorded, Reply

SYSTEM = 'You are a coding agent. Ünïcödé, "quotes", </script> and 🚀 survive byte-for-byte.'
BIG = " ".join(f"detail-{i}" for i in range(300))  # a message worth far more than 200 tokens
EPHEMERAL = {"type": "ephemeral"}


# -- transcripts -------------------------------------------------------------------------------


def anthropic_messages(tag: str, n: int, big_at: int | None = None) -> list[Any]:
    """n messages (n odd: the last is a user turn): the task, one tool exchange at [1, 2], then
    assistant steps (odd) and user notes (even); the step at `big_at` carries BIG."""
    out: list[Any] = [
        {"role": "user", "content": f"Task {tag}: make the parser tests pass. Ünïcödé ✓"}
    ]
    call = {"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {"cmd": "pytest"}}
    out.append(
        {"role": "assistant", "content": [{"type": "text", "text": "Running the tests."}, call]}
    )
    result = {"type": "tool_result", "tool_use_id": "toolu_01", "content": "FAILED test_nested"}
    out.append({"role": "user", "content": [result]})
    for i in range(3, n):
        if i % 2:
            text = f"Step {i}: I read parser.py around line {10 * i} for {tag[:8]}."
            out.append({"role": "assistant", "content": text + (" " + BIG if i == big_at else "")})
        else:
            out.append({"role": "user", "content": f'Note {i}: keep going, "carefully" ✓.'})
    return out[:n]


def openai_messages(tag: str, n: int) -> list[Any]:
    """[system, task, call, tool result, ...], n even: the last is a user turn; then assistant
    steps (even) and user notes (odd)."""
    out: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Task {tag}: make the parser tests pass. Ünïcödé ✓"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_01",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"cmd": "pytest"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_01", "content": "FAILED test_nested"},
    ]
    for i in range(4, n):
        if i % 2:
            out.append({"role": "user", "content": f"Note {i}: keep going ✓."})
        else:
            out.append(
                {"role": "assistant", "content": f"Step {i}: I read parser.py for {tag[:8]}."}
            )
    return out[:n]


def responses_items(tag: str, n: int) -> list[Any]:
    """A Responses `input` of n items (n even: the last is a user turn): the system prompt as a
    developer message item, the task, one tool round (reasoning, call, output) at [2, 5), then
    assistant steps (even) and user notes (odd), in the typed item form Codex sends."""
    out: list[Any] = [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": SYSTEM}],
        },
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": f"Task {tag}: make the parser tests pass. Ünïcödé ✓"}
            ],
        },
        {
            "type": "reasoning",
            "id": "rs_e2e01",
            "summary": [{"type": "summary_text", "text": "**Running the tests**"}],
            "encrypted_content": "gAAAAAe2e",
        },
        {
            "type": "function_call",
            "id": "fc_e2e01",
            "call_id": "call_01",
            "name": "bash",
            "arguments": '{"cmd": "pytest"}',
            "status": "completed",
        },
        {"type": "function_call_output", "call_id": "call_01", "output": "FAILED test_nested"},
    ]
    for i in range(5, n):
        if i % 2:
            out.append(
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": f"Note {i}: keep going ✓."}],
                }
            )
        else:
            text = f"Step {i}: I read parser.py for {tag[:8]}."
            out.append(
                {
                    "type": "message",
                    "id": f"msg_e2e{i:02d}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "annotations": [], "text": text}],
                }
            )
    return out[:n]


def messages(dialect: str, tag: str, n: int) -> list[Any]:
    if dialect == "responses":
        return responses_items(tag, n)
    return (anthropic_messages if dialect == "anthropic" else openai_messages)(tag, n)


# -- an SDK client through the proxy -------------------------------------------------------------


@overload
def sdk_client(
    dialect: Literal["anthropic"], proxy: Proxy, http: httpx.Client, *, key: str
) -> anthropic.Anthropic: ...
@overload
def sdk_client(
    dialect: Literal["anthropic"], proxy: Proxy, http: httpx.AsyncClient, *, key: str
) -> anthropic.AsyncAnthropic: ...
@overload
def sdk_client(
    dialect: Literal["openai"], proxy: Proxy, http: httpx.Client, *, key: str
) -> openai.OpenAI: ...
@overload
def sdk_client(
    dialect: Literal["openai"], proxy: Proxy, http: httpx.AsyncClient, *, key: str
) -> openai.AsyncOpenAI: ...
@overload
def sdk_client(
    dialect: Literal["responses"], proxy: Proxy, http: httpx.Client, *, key: str
) -> openai.OpenAI: ...
@overload
def sdk_client(
    dialect: Literal["responses"], proxy: Proxy, http: httpx.AsyncClient, *, key: str
) -> openai.AsyncOpenAI: ...
@overload
def sdk_client(
    dialect: str,
    proxy: Proxy,
    http: httpx.Client | httpx.AsyncClient,
    *,
    key: str,
    headers: dict[str, str] | None = None,
) -> Any: ...
def sdk_client(
    dialect: str,
    proxy: Proxy,
    http: httpx.Client | httpx.AsyncClient,
    *,
    key: str,
    headers: dict[str, str] | None = None,
) -> Any:
    """The official SDK client of `dialect` at `proxy` (openai's, for `openai` and `responses`,
    under `/v1`) on `http`, without retries, with `headers` on every request; async when `http`
    is."""
    kw: dict[str, Any] = {
        "api_key": key,
        "http_client": http,
        "max_retries": 0,
        "default_headers": headers,
    }
    is_async = isinstance(http, httpx.AsyncClient)
    if dialect == "anthropic":
        return (anthropic.AsyncAnthropic if is_async else anthropic.Anthropic)(
            base_url=proxy.url, **kw
        )
    return (openai.AsyncOpenAI if is_async else openai.OpenAI)(base_url=f"{proxy.url}/v1", **kw)


@dataclass
class Exchange:
    """One request an `SdkClient` sent, and what the SDK made of the answer."""

    dialect: str
    eid: str  # its x-e2e-id
    request: httpx.Request  # as it went on the wire: the exact body bytes and headers
    result: dict[str, Any]  # the SDK's final message / completion, as a dict
    chunks: list[Any]  # streamed events (anthropic) or chunks (openai), as dicts
    seconds: float  # how long the SDK call took

    @property
    def text(self) -> str:
        """The answer's text."""
        if self.dialect == "anthropic":
            return "".join(b["text"] for b in self.result["content"] if b["type"] == "text")
        if self.dialect == "responses":
            return "".join(
                p["text"]
                for item in self.result["output"]
                if item["type"] == "message"
                for p in item["content"]
                if p["type"] == "output_text"
            )
        return str(self.result["choices"][0]["message"]["content"])


class SdkClient:
    """One sync SDK client of `dialect` through `proxy`, in its own session (`session`, or a
    fresh one), keeping every request it sends in `capture`. `model` defaults to the fake
    provider's (`claude-test`, `gpt-test`); `breakpoint` puts a cache breakpoint on the system
    prompt of an anthropic turn, as agents that want the prompt cache set one."""

    def __init__(
        self,
        proxy: Proxy,
        dialect: str,
        *,
        key: str = "sk-e2e",
        session: str | None = None,
        model: str | None = None,
        breakpoint: bool = False,
    ) -> None:
        self.proxy = proxy
        self.dialect = dialect
        self.session = session or uuid.uuid4().hex
        self.model = model or ("claude-test" if dialect == "anthropic" else "gpt-test")
        self.breakpoint = breakpoint
        self.capture = Capture()
        self.http = httpx.Client(trust_env=False, event_hooks=self.capture.hooks(), timeout=30)
        headers = {"x-context-guru-session": self.session}
        self.sdk = sdk_client(dialect, proxy, self.http, key=key, headers=headers)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    def turn(self, messages: list[Any], *, stream: bool = False, **extra: Any) -> Exchange:
        """An agent's turn with `messages`: this client's model; on anthropic 64 output tokens
        and SYSTEM as the system prompt, on openai a stream that asks for usage; `extra` SDK
        arguments on top."""
        if self.dialect == "responses":
            kw: dict[str, Any] = {"model": self.model, "input": messages, "store": False}
            return self.call(stream, **{**kw, **extra})
        kw = {"model": self.model, "messages": messages}
        if self.dialect == "anthropic":
            kw["max_tokens"] = 64
            kw["system"] = (
                [{"type": "text", "text": SYSTEM, "cache_control": EPHEMERAL}]
                if self.breakpoint
                else SYSTEM
            )
        elif stream:
            kw["stream_options"] = {"include_usage": True}
        return self.call(stream, **{**kw, **extra})

    def call(self, stream: bool = False, **kw: Any) -> Exchange:
        """One request of SDK arguments `kw` as they are, tagged with a fresh `x-e2e-id`;
        streamed (read to the end) or not."""
        eid = new_id()
        kw["extra_headers"] = {"x-e2e-id": eid}
        chunks: list[Any] = []
        t0 = time.monotonic()
        if self.dialect == "responses":
            if stream:
                # `warnings=False`: the SDK's parsed-response generics make pydantic warn on
                # serialisation, though the values are exactly what was streamed.
                with self.sdk.responses.stream(**kw) as rs:
                    chunks = [ev.to_dict(warnings=False) for ev in rs]
                    result = rs.get_final_response().to_dict(warnings=False)
            else:
                result = self.sdk.responses.create(**kw).to_dict()
        elif self.dialect == "anthropic":
            if stream:
                with self.sdk.messages.stream(**kw) as s:
                    chunks = [ev.to_dict() for ev in s]
                    result = s.get_final_message().to_dict()
            else:
                result = self.sdk.messages.create(**kw).to_dict()
        elif stream:
            state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
            for chunk in self.sdk.chat.completions.create(**kw, stream=True):
                chunks.append(chunk.to_dict())
                state.handle_chunk(chunk)
            result = state.current_completion_snapshot.to_dict()
        else:
            result = self.sdk.chat.completions.create(**kw).to_dict()
        seconds = time.monotonic() - t0
        sent = self.capture.sent[-1]
        assert sent.headers["x-e2e-id"] == eid
        return Exchange(self.dialect, eid, sent, result, chunks, seconds)


# -- the scripted model's answers ---------------------------------------------------------------


def provider_message(
    dialect: str,
    n: int,
    text: str | None,
    calls: list[tuple[str, str, Any]],
    usage: tuple[int, int],
    *,
    thinking: bool = True,
) -> dict[str, Any]:
    """A provider's answer number `n`: an anthropic message or an openai chat completion with
    `text` and tool `calls` (id, name, input), `usage` (input, output tokens). An anthropic
    message with calls opens with a signed thinking block unless `thinking` is off."""
    if dialect == "anthropic":
        content: list[Any] = []
        if calls and thinking:
            content.append(
                {"type": "thinking", "thinking": f"I need detail {n}.", "signature": "c2ln"}
            )
        if text is not None:
            content.append({"type": "text", "text": text})
        content += [{"type": "tool_use", "id": i, "name": nm, "input": inp} for i, nm, inp in calls]
        return {
            "id": f"msg_e2e{n}",
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": content,
            "stop_reason": "tool_use" if calls else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
        }
    if dialect == "responses":
        return responses_message(n, text, calls, usage, reasoning=thinking)
    msg: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if calls:
        msg["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": nm, "arguments": json.dumps(inp)}}
            for i, nm, inp in calls
        ]
    return {
        "id": f"chatcmpl-e2e{n}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "gpt-test",
        "choices": [
            {
                "index": 0,
                "message": msg,
                "logprobs": None,
                "finish_reason": "tool_calls" if calls else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": sum(usage),
        },
    }


def responses_message(
    n: int,
    text: str | None,
    calls: list[tuple[str, str, Any]],
    usage: tuple[int, int],
    *,
    reasoning: bool = True,
) -> dict[str, Any]:
    """A Responses `response` number `n`: a reasoning item (with encrypted content) before any
    calls unless `reasoning` is off, a message with `text`, and a function call per
    (call id, name, input)."""
    output: list[Any] = []
    if calls and reasoning:
        output.append(
            {
                "id": f"rs_e2e{n}",
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": f"I need detail {n}."}],
                "encrypted_content": f"gAAAAenc{n}",
            }
        )
    if text is not None:
        output.append(
            {
                "id": f"msg_e2eout{n}",
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [
                    {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
                ],
            }
        )
    output += [
        {
            "id": f"fc_{i}",
            "type": "function_call",
            "status": "completed",
            "call_id": i,
            "name": nm,
            "arguments": json.dumps(inp),
        }
        for i, nm, inp in calls
    ]
    return {
        "id": f"resp_e2e{n}",
        "object": "response",
        "created_at": 1_700_000_000,
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "model": "gpt-test",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": usage[0],
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": usage[1],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": sum(usage),
        },
    }


_JSON = {"content-type": "application/json"}
_SSE = {"content-type": "text/event-stream; charset=utf-8"}


def answer(rec: Recorded, message: dict[str, Any], dialect: str) -> Reply:
    """`message` (a provider message) sent the way the request asked: SSE or JSON."""
    body = rec.json()
    if body.get("stream") is not True:
        return Reply(body=render_json(Message(dialect, message)), headers=_JSON)
    opts = body.get("stream_options")
    if dialect == "openai" and not (isinstance(opts, dict) and opts.get("include_usage")):
        message = {k: v for k, v in message.items() if k != "usage"}
    return Reply(body=render_sse(Message(dialect, message)), headers=_SSE)
