"""A fake model for `context-guru eval`: it answers a probe from what its own request holds.

`Prober` is a `FakeProvider.responder`. It reads the probe (the last user text that starts
`[context-guru eval]`), finds its target in the request's transcript by the rule the question
states, and answers with it; what it cannot find, it does not know. So a fact the rewrite lost
is a wrong answer, and one the summary message carries verbatim is right:

    "… user's message that began with 'W'"   a user text of the transcript starting with W, or
                                             W inside a summary message's text (the rest of
                                             that text from W on)
    "… the n-th call of the `T` tool …"      the n-th call of T among the transcript's calls;
                                             the file paths of its input, its command's first
                                             line, or its output's text. A transcript whose
                                             middle a History Summary replaced cannot be
                                             counted: not known, unless expanded

When the target is not found, the request offers `context_guru_expand` (and its tool_choice
allows a call) and carries a `<<cg:KEY>>` marker not yet expanded, it calls the tool with KEY;
the continuation's tool result (the stashed messages, `[n] {json}` each) then stands where the
summary stood. Written apart from `cg.eval.probes`: it shares the questions' wording, not code.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

from tests.support.fakeprovider import Recorded, Reply

PROBE = "[context-guru eval]"
TOOL = "context_guru_expand"
HEADER = "=== History Summary ==="
DONT_KNOW = "I do not know."
_USER_Q = re.compile(r"Quote verbatim the user's message that began with '(.*?)'\. Answer", re.S)
_CALL_Q = re.compile(r"the (\d+)(?:st|nd|rd|th) call of the `([^`]+)` tool")
_MARKER = re.compile(r"<<cg:([A-Za-z0-9_-]+)>>")
_ITEM = re.compile(r"\n\n\[[A-Za-z0-9_-]+#(\d+)\] ")
_PATCH = re.compile(r"\*\*\* (?:Add|Update|Delete) File: ([^\r\n]+)")
FILE_KEYS = ("file_path", "path", "notebook_path", "filename")


def dialect_of(path: str) -> str:
    bare = path.split("?", 1)[0].rstrip("/")
    if bare.endswith("/v1/messages"):
        return "anthropic"
    return "responses" if bare.endswith("/v1/responses") else "openai"


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [
            b["text"]
            for b in content
            if isinstance(b, dict)
            and b.get("type") in ("text", "input_text")
            and isinstance(b.get("text"), str)
        ]
    return []


def _output_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)
        )
    return ""


class _Calls:
    """A transcript's tool calls (name, id, input) and outputs (id -> text), in order."""

    def __init__(self, dialect: str) -> None:
        self.dialect = dialect
        self.calls: list[tuple[Any, Any, Any]] = []
        self.outputs: dict[Any, str] = {}

    def read(self, m: Any) -> None:
        if not isinstance(m, dict):
            return
        if self.dialect == "anthropic":
            content = m.get("content")
            for b in content if isinstance(content, list) else []:
                if not isinstance(b, dict):
                    continue
                if b.get("type") == "tool_use":
                    self.calls.append((b.get("name"), b.get("id"), b.get("input")))
                elif b.get("type") == "tool_result":
                    self.outputs[b.get("tool_use_id")] = _output_text(b.get("content"))
        elif self.dialect == "openai":
            for c in m.get("tool_calls") or []:
                fn = c.get("function") or {}
                self.calls.append((fn.get("name"), c.get("id"), _json(fn.get("arguments"))))
            if m.get("role") == "tool":
                self.outputs[m.get("tool_call_id")] = _output_text(m.get("content"))
        else:
            kind = m.get("type")
            if kind in ("function_call", "custom_tool_call", "local_shell_call"):
                args = m.get("arguments", m.get("input", m.get("action")))
                self.calls.append((m.get("name") or kind, m.get("call_id"), _json(args)))
            elif isinstance(kind, str) and kind.endswith("_call_output"):
                self.outputs[m.get("call_id")] = _output_text(m.get("output"))


def _json(v: Any) -> Any:
    if isinstance(v, str):
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v


def _norm(text: str) -> str:
    return " ".join(text.split())


def _is_user(dialect: str, m: Any) -> bool:
    return isinstance(m, dict) and m.get("role") == "user" and m.get("type", "message") == "message"


def expansion(text: str) -> list[Any]:
    """The messages of an expand tool result (`[KEY#N] {json}` each)."""
    out = []
    dec = json.JSONDecoder()
    for m in _ITEM.finditer(text):
        try:
            value, _ = dec.raw_decode(text, m.end())
        except ValueError:
            continue
        out.append(value)
    return out


class Prober:
    """The responder; `asked` counts the probes it answered, by how (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.expand_calls = 0
        self.keys_seen: list[str] = []

    def __call__(self, rec: Recorded) -> Reply | None:
        if rec.method != "POST":
            return None
        dialect = dialect_of(rec.path)
        req = rec.json()
        with self.lock:
            self.keys_seen.append(rec.header("x-api-key") or rec.header("authorization") or "")
        key = "messages" if dialect != "responses" else "input"
        items = list(req.get(key) or [])
        question, transcript, summary, pending = self._transcript(dialect, items)
        if question is None:
            return None
        found = self._answer(dialect, question, transcript, summary)
        if found is not None:
            return answer(dialect, req, found)
        choice = req.get("tool_choice")
        allowed = choice not in ("none",) and not (
            isinstance(choice, dict) and choice.get("type") == "none"
        )
        if pending is not None and allowed and _declares(dialect, req.get("tools")):
            with self.lock:
                self.expand_calls += 1
            return answer(dialect, req, None, call={"id": pending})
        return answer(dialect, req, DONT_KNOW)

    def _transcript(
        self, dialect: str, items: list[Any]
    ) -> tuple[str | None, list[Any], str | None, str | None]:
        """(the question, the transcript with any expansion in place of its summary, the
        summary's text when it stands unexpanded, the marker key still to expand)."""
        question = None
        expand_ids: set[str] = set()
        results: dict[str, str] = {}
        for m in items:  # our tool's calls and results: the continuation's, not the transcript's
            calls = _Calls(dialect)
            calls.read(m)
            for name, cid, _ in calls.calls:
                if name == TOOL:
                    expand_ids.add(cid)
            results.update({k: v for k, v in calls.outputs.items() if k in expand_ids})
        out: list[Any] = []
        summary = pending = None
        expanded = list(results.values())
        for m in items:
            calls = _Calls(dialect)
            calls.read(m)
            if any(cid in expand_ids for _, cid, _ in calls.calls) or any(
                k in expand_ids for k in calls.outputs
            ):
                continue
            if _is_user(dialect, m):
                texts = _texts(m.get("content"))
                probe = [t for t in texts if t.startswith(PROBE)]
                if probe:
                    question = probe[-1]
                head = next((t for t in texts if t.lstrip().startswith(HEADER)), None)
                if head is not None:
                    if expanded:
                        out += [x for t in expanded for x in expansion(t)]
                        continue
                    summary = head
                    keys = _MARKER.findall(head)
                    pending = keys[-1] if keys else None
            out.append(m)
        return question, out, summary, pending

    def _answer(
        self, dialect: str, question: str, transcript: list[Any], summary: str | None
    ) -> str | None:
        user = _USER_Q.search(question)
        if user is not None:
            prefix = user.group(1)
            for m in transcript:
                if not _is_user(dialect, m):
                    continue
                for t in _texts(m.get("content")):
                    if _norm(t).startswith(prefix) and not t.startswith(PROBE):
                        return t
            text = _norm(summary or "")
            return text[text.index(prefix) :] if prefix in text else None
        call = _CALL_Q.search(question)
        if call is None or summary is not None:
            return None  # a summarized middle: the calls cannot be counted
        n, tool = int(call.group(1)), call.group(2)
        calls = _Calls(dialect)
        for m in transcript:
            calls.read(m)
        mine = [c for c in calls.calls if c[0] == tool]
        if len(mine) < n:
            return None
        _, cid, args = mine[n - 1]
        if question.startswith(f"{PROBE} Which file"):
            paths = [args[k] for k in FILE_KEYS if isinstance(args, dict) and k in args]
            paths += _PATCH.findall(json.dumps(args))
            return "\n".join(map(str, paths)) or None
        if "shell command" in question:
            cmd = args.get("command", args.get("cmd")) if isinstance(args, dict) else None
            cmd = " ".join(cmd) if isinstance(cmd, list) else cmd
            return cmd.strip().split("\n", 1)[0] if isinstance(cmd, str) else None
        return calls.outputs.get(cid)


def _declares(dialect: str, tools: Any) -> bool:
    for t in tools if isinstance(tools, list) else []:
        name = t.get("name") if dialect != "openai" else (t.get("function") or {}).get("name")
        if name == TOOL:
            return True
    return False


def answer(
    dialect: str, req: dict[str, Any], text: str | None, call: dict[str, Any] | None = None
) -> Reply:
    """A non-streaming answer in `dialect`: `text`, or a call of the expand tool with `call`,
    with a usage that grows with the request (4 bytes a token)."""
    model = str(req.get("model", "fake-model"))
    size = max(1, len(json.dumps(req)) // 4)
    out = max(1, len(text or "") // 4)
    args = json.dumps(call)
    if dialect == "anthropic":
        content: list[Any] = (
            [{"type": "text", "text": text}]
            if call is None
            else [{"type": "tool_use", "id": "toolu_eval", "name": TOOL, "input": call}]
        )
        doc: dict[str, Any] = {
            "id": "msg_eval",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": "end_turn" if call is None else "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": size, "output_tokens": out},
        }
    elif dialect == "openai":
        message: dict[str, Any] = (
            {"role": "assistant", "content": text}
            if call is None
            else {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_eval",
                        "type": "function",
                        "function": {"name": TOOL, "arguments": args},
                    }
                ],
            }
        )
        doc = {
            "id": "chatcmpl-eval",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "stop" if call is None else "tool_calls",
                }
            ],
            "usage": {"prompt_tokens": size, "completion_tokens": out, "total_tokens": size + out},
        }
    else:
        item: dict[str, Any] = (
            {
                "type": "message",
                "id": "msg_eval",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
            if call is None
            else {
                "type": "function_call",
                "id": "fc_eval",
                "call_id": "call_eval",
                "name": TOOL,
                "arguments": args,
                "status": "completed",
            }
        )
        doc = {
            "id": "resp_eval",
            "object": "response",
            "status": "completed",
            "model": model,
            "output": [item],
            "usage": {"input_tokens": size, "output_tokens": out, "total_tokens": size + out},
        }
    return Reply.json(200, doc)
