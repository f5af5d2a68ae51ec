"""A scripted model that drives a real agent (Claude Code, or an SDK loop) through a session.

    script = AgentScript(tag, steps=session(12, parallel_at=(3,), read_at={5: path}))
    provider.responder = script          # tests/support/fakeprovider.py asks it for every agent reply

Each agent request is answered by looking at the transcript it carries, so the answer depends on
what the agent sent, not on how many requests came before:

    no tool result of ours yet                 -> step 0
    the latest tool results answer step k      -> step k + 1
    the latest results answer our expand call  -> the step that call stood in for
    step == len(steps)                         -> the final answer (`final_text`), no tool calls

A step is thinking (with a signature the script remembers), a line of text and its tool calls —
several in one turn are parallel calls. The reply is in the request's dialect, streamed exactly
as the provider streams (`message_start`, `content_block_*` with `thinking_delta` /
`signature_delta` / `input_json_delta`, `message_delta`, `message_stop`; OpenAI chunks with
`tool_calls` deltas) when the request asks for a stream, else the whole message as JSON.

Like the provider, the script refuses (400 `invalid_request_error`) a transcript a provider would
refuse: a role it does not know, a system message mid-array not followed by an assistant turn, an
unanswered tool call, a tool result answering nothing, blank content, and — the signed-thinking
rule — a thinking block whose signature it did not issue for exactly that thinking text. Every
refusal is kept in `refusals`, so a test asserts there were none.

`expand=True`: the first time a request declares `context_guru_expand` and carries a
`<<cg:KEY>>` marker, the model calls the tool with KEY instead of taking its step; the result
(which context-guru answers, never the agent) is kept in `expansions`, then the step is taken.

Requests that are not this session's (no `tag` in the first user message: an agent's side
requests, a title, a quota probe) get None: the fake provider's default answer. Claude Code's
start-up GETs to the first-party API (`/api/claude_code/policy_limits`, `…/settings`, sent when
its base URL is api.anthropic.com) get the 404 an API key without managed policy gets, which it
reads as "no restrictions" (anything else it retries for seconds).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.support.fakeprovider import Recorded, Reply, anthropic_error, openai_error

EXPAND_TOOL = "context_guru_expand"
MARKER = re.compile(r"<<cg:([0-9a-f]+)>>")
_B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_JSON = {"content-type": "application/json"}


@dataclass(frozen=True)
class Call:
    name: str
    input: dict[str, Any]


@dataclass(frozen=True)
class Step:
    calls: tuple[Call, ...]
    text: str
    thinking: str


def bash(n: int, part: int = 1) -> Call:
    return Call("Bash", {"command": f"echo step {n}", "description": f"Run step {n} part {part}"})


def read(path: str) -> Call:
    return Call("Read", {"file_path": path})


def session(
    n: int, parallel_at: tuple[int, ...] = (), read_at: dict[int, str] | None = None
) -> list[Step]:
    """n steps of `echo step K` (1-based K); two parallel echoes at `parallel_at`, a Read of a
    file at `read_at`."""
    out = []
    for k in range(1, n + 1):
        calls: tuple[Call, ...] = (bash(k),)
        if k in parallel_at:
            calls = (bash(k, 1), Call("Bash", {**bash(k, 2).input, "command": f"echo step {k}b"}))
        if read_at and k in read_at:
            calls = (read(read_at[k]),)
        out.append(Step(calls, f"Running step {k}.", f"Step {k}: I need to run the next command."))
    return out


def _b62(seed: str, n: int) -> str:
    digest = int.from_bytes(hashlib.sha256(seed.encode()).digest(), "big")
    chars = []
    for _ in range(n):
        digest, r = divmod(digest, 62)
        chars.append(_B62[r])
    return "".join(chars)


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _pieces(text: str, size: int = 12) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


# -- what a provider refuses ---------------------------------------------------------------------


def _blank(content: Any) -> bool:
    if isinstance(content, str):
        return not content.strip()
    if isinstance(content, list):
        if not content:
            return True
        for b in content:
            if not isinstance(b, dict):
                return True
            if b.get("type") == "text" and not str(b.get("text", "")).strip():
                return True
            if b.get("type") == "thinking" and not b.get("thinking"):
                return True
        return False
    return content is None


def _calls(dialect: str, m: dict[str, Any]) -> list[str]:
    if m.get("role") != "assistant":
        return []
    if dialect == "anthropic":
        c = m.get("content")
        return [b["id"] for b in c if b.get("type") == "tool_use"] if isinstance(c, list) else []
    return [t["id"] for t in m.get("tool_calls") or []]


def _results(dialect: str, m: dict[str, Any]) -> list[str]:
    if dialect == "anthropic":
        c = m.get("content")
        if m.get("role") != "user" or not isinstance(c, list):
            return []
        return [b["tool_use_id"] for b in c if b.get("type") == "tool_result"]
    return [m["tool_call_id"]] if m.get("role") == "tool" else []


def shape_problems(dialect: str, messages: list[Any]) -> list[str]:
    """What a provider would refuse in this message list, in its own kind of words. Written
    apart from cg.wire.shape, as the provider's side of the wire."""
    roles = {"user", "assistant", "system"} | (
        {"tool", "developer"} if dialect == "openai" else set()
    )
    out: list[str] = []
    n = len(messages)
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role not in roles:
            out.append(f"messages.{i}.role: unexpected role {role!r}")
            continue
        late_system = role in ("system", "developer") and 0 < i < n - 1
        if late_system and messages[i + 1].get("role") != "assistant":
            out.append(f"messages.{i}: a system message must be followed by an assistant turn")
        calls = _calls(dialect, m)
        content = m.get("content")
        if not (dialect == "openai" and calls and content in (None, "")) and _blank(content):
            out.append(f"messages.{i}: content must be non-empty")
        if calls:
            answered: set[str] = set()
            j = i + 1
            if dialect == "anthropic":
                if j < n:
                    answered = set(_results(dialect, messages[j]))
            else:
                while j < n and messages[j].get("role") == "tool":
                    answered |= set(_results(dialect, messages[j]))
                    j += 1
            missing = [c for c in calls if c not in answered]
            if missing:
                out.append(f"messages.{i}: tool_use ids without tool_result blocks: {missing}")
        for rid in _results(dialect, m):
            k = i - 1
            if dialect == "openai":
                while k >= 0 and messages[k].get("role") == "tool":
                    k -= 1
            if k < 0 or rid not in _calls(dialect, messages[k]):
                out.append(f"messages.{i}: unexpected tool_use_id {rid!r} in tool_result")
    return out


# -- the script ----------------------------------------------------------------------------------


@dataclass
class Answer:
    """One reply the script made: which step, and the marker key if it called the expand tool."""

    step: int
    expand: str | None


@dataclass
class AgentScript:
    tag: str
    steps: list[Step]
    final_text: str = "All scripted steps are done."
    expand: bool = False
    # Called with the step number once that step's answer has begun (status and headers sent)
    # and before its body (a test's gate): the proxy sees the answer begin — a shared-cache
    # summary waits for that — while the agent still waits. It runs on the provider's handler
    # thread, so it may wait on a condition.
    before: Callable[[int], None] | None = None
    answers: list[Answer] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    expansions: list[str] = field(default_factory=list)
    results: dict[str, Any] = field(default_factory=dict)  # tool call id -> its result content
    _signatures: dict[str, str] = field(default_factory=dict)
    _ids: dict[str, tuple[int, str | None]] = field(default_factory=dict)  # id -> (step, key)
    _expanded: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, rec: Recorded) -> Reply | None:
        if rec.method in ("GET", "HEAD"):
            if rec.path.startswith("/api/claude_code/"):
                return anthropic_error(404, "not_found_error", "Not Found")
            return None
        try:
            body = rec.json()
        except ValueError:
            return None
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return None
        dialect = "openai" if rec.path.split("?")[0].endswith("/chat/completions") else "anthropic"
        messages: list[Any] = body["messages"]
        if not self._mine(dialect, messages):
            return None
        with self._lock:
            problems = shape_problems(dialect, messages) + self._signature_problems(messages)
            if problems:
                self.refusals.extend(problems)
                err = anthropic_error if dialect == "anthropic" else openai_error
                return err(400, "invalid_request_error", "; ".join(problems))
            step, key = self._position(dialect, messages, body)
        stream = body.get("stream") is True
        with self._lock:
            self.answers.append(Answer(step, key))
            message = self._message(dialect, step, key, str(body.get("model", "fake-model")), rec)
        reply = _reply(dialect, message, stream, body)
        if key is None and self.before is not None:
            reply.after_headers = functools.partial(self.before, step)
        return reply

    # -- reading the request -------------------------------------------------------------------

    def _mine(self, dialect: str, messages: list[Any]) -> bool:
        first = next((m for m in messages if isinstance(m, dict) and m.get("role") == "user"), None)
        return first is not None and self.tag in _dumps(first.get("content"))

    def _signature_problems(self, messages: list[Any]) -> list[str]:
        out = []
        for i, m in enumerate(messages):
            content = m.get("content") if m.get("role") == "assistant" else None
            for j, b in enumerate(content if isinstance(content, list) else []):
                thinking = isinstance(b, dict) and b.get("type") == "thinking"
                if thinking and self._signatures.get(b.get("signature", "")) != b.get("thinking"):
                    out.append(f"messages.{i}.content.{j}: Invalid `signature` in `thinking`")
        return out

    def _position(
        self, dialect: str, messages: list[Any], body: dict[str, Any]
    ) -> tuple[int, str | None]:
        """(the step to take, the marker key to expand instead of taking it, if any)."""
        for m in messages:
            for rid, content in self._result_contents(dialect, m):
                if rid in self._ids:
                    self.results[rid] = content
        step = 0
        for m in reversed(messages):
            known = [r for r in _results(dialect, m) if r in self._ids]
            if known:
                issued, key = self._ids[known[0]]
                step = issued if key is not None else issued + 1
                if key is not None and m is messages[-1]:  # the continuation: our call answered
                    self.expansions.append(_text(self.results[known[0]]))
                break
        if self.expand and self._declares_expand(dialect, body):
            for key in MARKER.findall(_dumps(messages)):
                if key not in self._expanded:
                    self._expanded.add(key)
                    return step, key
        return step, None

    @staticmethod
    def _result_contents(dialect: str, m: dict[str, Any]) -> Iterator[tuple[str, Any]]:
        if dialect == "openai":
            if m.get("role") == "tool":
                yield m["tool_call_id"], m.get("content")
            return
        for b in m.get("content") or []:
            if isinstance(b, dict) and b.get("type") == "tool_result":
                yield b["tool_use_id"], b.get("content")

    @staticmethod
    def _declares_expand(dialect: str, body: dict[str, Any]) -> bool:
        for t in body.get("tools") or []:
            name = (
                t.get("name") if dialect == "anthropic" else (t.get("function") or {}).get("name")
            )
            if name == EXPAND_TOOL:
                return True
        return False

    # -- writing the reply ---------------------------------------------------------------------

    def _sign(self, thinking: str) -> str:
        sig = (
            "Eq"
            + base64.b64encode(
                hashlib.sha512(f"{self.tag}|{thinking}".encode()).digest() * 2
            ).decode()
        )
        self._signatures[sig] = thinking
        return sig

    def _call_id(self, dialect: str, step: int, k: int, key: str | None) -> str:
        seed = f"{self.tag}|{step}|{k}|{key}"
        cid = (
            ("toolu_01" + _b62(seed, 22)) if dialect == "anthropic" else ("call_" + _b62(seed, 24))
        )
        self._ids[cid] = (step, key)
        return cid

    def _message(
        self, dialect: str, step: int, key: str | None, model: str, rec: Recorded
    ) -> dict[str, Any]:
        if key is not None:
            thinking = f"Step {step + 1}: the summary hides a detail; I will expand {key}."
            calls: tuple[Call, ...] = (Call(EXPAND_TOOL, {"id": key}),)
            text = "Let me restore the summarized history first."
        elif step < len(self.steps):
            s = self.steps[step]
            thinking, calls, text = s.thinking, s.calls, s.text
        else:
            thinking, calls, text = "Everything ran; time to report.", (), self.final_text
        in_tokens = len(rec.decoded or rec.body) // 4
        ids = [self._call_id(dialect, step, k, key) for k in range(len(calls))]
        if dialect == "anthropic":
            content: list[dict[str, Any]] = [
                {"type": "thinking", "thinking": thinking, "signature": self._sign(thinking)},
                {"type": "text", "text": text},
            ]
            content += [
                {"type": "tool_use", "id": i, "name": c.name, "input": c.input}
                for i, c in zip(ids, calls, strict=True)
            ]
            return {
                "id": "msg_01" + _b62(f"{self.tag}|msg|{len(self.answers)}", 22),
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": content,
                "stop_reason": "tool_use" if calls else "end_turn",
                "stop_sequence": None,
                "usage": {
                    "input_tokens": in_tokens,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 0,
                    "output_tokens": 20 + 15 * len(calls),
                    "service_tier": "standard",
                },
            }
        msg: dict[str, Any] = {"role": "assistant", "content": None if calls else text}
        if calls:
            msg["tool_calls"] = [
                {
                    "id": i,
                    "type": "function",
                    "function": {"name": c.name, "arguments": _dumps(c.input)},
                }
                for i, c in zip(ids, calls, strict=True)
            ]
        msg["refusal"] = None
        msg["annotations"] = []
        out = 20 + 15 * len(calls)
        return {
            "id": "chatcmpl-" + _b62(f"{self.tag}|msg|{len(self.answers)}", 29),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": msg,
                    "logprobs": None,
                    "finish_reason": "tool_calls" if calls else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": in_tokens,
                "completion_tokens": out,
                "total_tokens": in_tokens + out,
            },
            "service_tier": "default",
            "system_fingerprint": "fp_script",
        }


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return ""


def _reply(dialect: str, message: dict[str, Any], stream: bool, body: dict[str, Any]) -> Reply:
    if not stream:
        return Reply(body=_dumps(message).encode(), headers=_JSON)
    if dialect == "anthropic":
        frames = list(anthropic_frames(message))
    else:
        opts = body.get("stream_options")
        usage = isinstance(opts, dict) and opts.get("include_usage") is True
        frames = list(openai_frames(message, usage))
    return Reply(frames=[f.encode() for f in frames])


# -- the wire formats, as the providers stream them ----------------------------------------------


def _event(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {_dumps(data)}\n\n"


def anthropic_frames(m: dict[str, Any]) -> Iterator[str]:
    start = {**m, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {**m["usage"], "output_tokens": 1}
    yield _event("message_start", {"type": "message_start", "message": start})
    for i, block in enumerate(m["content"]):

        def delta(d: dict[str, Any], i: int = i) -> str:
            return _event(
                "content_block_delta", {"type": "content_block_delta", "index": i, "delta": d}
            )

        kind = block["type"]
        first: dict[str, Any]
        if kind == "thinking":
            first = {"type": "thinking", "thinking": "", "signature": ""}
        elif kind == "text":
            first = {"type": "text", "text": ""}
        else:
            first = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        yield _event(
            "content_block_start",
            {"type": "content_block_start", "index": i, "content_block": first},
        )
        if i == 0:
            yield 'event: ping\ndata: {"type": "ping"}\n\n'
        if kind == "thinking":
            for p in _pieces(block["thinking"]):
                yield delta({"type": "thinking_delta", "thinking": p})
            yield delta({"type": "signature_delta", "signature": block["signature"]})
        elif kind == "text":
            for p in _pieces(block["text"]):
                yield delta({"type": "text_delta", "text": p})
        else:
            yield delta({"type": "input_json_delta", "partial_json": ""})
            for p in _pieces(_dumps(block["input"]), 9):
                yield delta({"type": "input_json_delta", "partial_json": p})
        yield _event("content_block_stop", {"type": "content_block_stop", "index": i})
    usage = {k: v for k, v in m["usage"].items() if k != "service_tier"}
    yield _event(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": m["stop_reason"], "stop_sequence": None},
            "usage": usage,
        },
    )
    yield _event("message_stop", {"type": "message_stop"})


def openai_frames(c: dict[str, Any], usage: bool) -> Iterator[str]:
    base = {k: c[k] for k in ("id", "object", "created", "model", "service_tier")}
    base["object"] = "chat.completion.chunk"
    base["system_fingerprint"] = c["system_fingerprint"]
    extra: dict[str, Any] = {"usage": None} if usage else {}
    msg = c["choices"][0]["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return f"data: {_dumps({**base, 'choices': [choice], **extra})}\n\n"

    calls = msg.get("tool_calls") or []
    if calls:
        for k, call in enumerate(calls):
            head = {
                "index": k,
                "id": call["id"],
                "type": "function",
                "function": {"name": call["function"]["name"], "arguments": ""},
            }
            if k == 0:
                yield chunk(
                    {"role": "assistant", "content": None, "tool_calls": [head], "refusal": None}
                )
            else:
                yield chunk({"tool_calls": [head]})
            for p in _pieces(call["function"]["arguments"], 9):
                yield chunk({"tool_calls": [{"index": k, "function": {"arguments": p}}]})
    else:
        yield chunk({"role": "assistant", "content": "", "refusal": None})
        for p in _pieces(msg["content"]):
            yield chunk({"content": p})
    yield chunk({}, c["choices"][0]["finish_reason"])
    if usage:
        yield f"data: {_dumps({**base, 'choices': [], 'usage': c['usage']})}\n\n"
    yield "data: [DONE]\n\n"
