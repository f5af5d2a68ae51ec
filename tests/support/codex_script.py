"""A scripted model that drives Codex CLI through a session over the OpenAI Responses API.

    script = CodexScript(tag, steps=session(10, parallel_at=(4,), preamble_at=(2, 7)))
    provider.responder = script          # tests/support/fakeprovider.py asks it for every agent reply

Each request is answered by looking at the `input` it carries (Codex re-sends the whole history
every turn, `store: false`), never by counting requests:

    no output of one of our calls yet                -> step 0 (or, after Codex compacted its
                                                        history, the step its summary names)
    the latest outputs answer step k                 -> step k + 1
    the latest output answers our expand call        -> the step that call stood in for
    step == len(steps)                               -> the final answer, no calls
    k steps done, k in `pause_at`, no new prompt     -> the turn ends (`pause_text`, no calls);
                                                        answer `-k` in `answers`

A step's answer is a `reasoning` item (a summary and `encrypted_content` the script remembers),
an optional assistant message (a preamble), and its `exec_command` function calls — several are
parallel calls — which Codex really runs. The answer is the API's event stream
(tests/support/responses_api.py) when the request says `stream: true`, else the `response` JSON; its
`usage` is as the bytes would bill it: the request's bytes / 4 input tokens, the output items'
bytes / 4 output tokens (plus `output_tokens`, to model a longer answer).

Like the API, the script answers 400 `invalid_request_error` (in the API's words) to a request
that has a call without its output, an output without its call, a reasoning item without the
item it was issued with right after it, or a reasoning item whose `encrypted_content` is not the
one the script issued for that id; a reasoning item sent without its id (as opencode's AI SDK
sends it with `store: false`) must carry encrypted content the script issued. Every refusal is
kept in `refusals`.

Codex's own compaction request (header `x-codex-turn-metadata` with `request_kind:
"compaction"`) is answered with a text summary naming how many steps are done, so the script
finds its place again in the compacted history that follows; each one is kept in
`compactions`.

`expand=True`: the first time a request declares `context_guru_expand` and carries a
`<<cg:KEY>>` marker, the model calls that tool with KEY instead of taking its step; the output
(which context-guru answers, never Codex) is kept in `expansions`, then the step is taken.

Requests that are not this session's (no `tag` in any user message, and a `prompt_cache_key`
never seen with one) get None: the fake provider's default answer.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.support import responses_api as api
from tests.support.fakeprovider import Recorded, Reply

EXPAND_TOOL = "context_guru_expand"
MARKER = re.compile(r"<<cg:([0-9a-f]+)>>")
COMPACTION_PROMPT = "You are performing a CONTEXT CHECKPOINT COMPACTION"
DONE = re.compile(r"CG-SCRIPT: (\d+) steps done")


@dataclass(frozen=True)
class Step:
    commands: tuple[str, ...]  # one exec_command call each; several are parallel calls
    summary: str  # the reasoning item's summary
    preamble: str | None = None  # an assistant message between the reasoning and the calls


def exec_command(command: str) -> tuple[str, dict[str, Any]]:
    """Codex's shell tool call for `command` (its name, its arguments)."""
    return "exec_command", {"cmd": command}


def session(
    n: int,
    parallel_at: tuple[int, ...] = (),
    preamble_at: tuple[int, ...] = (),
    command: Callable[[int], str] = lambda k: f"echo step {k}",
) -> list[Step]:
    """n steps running `command(k)` (1-based k); two parallel calls at `parallel_at` (the second
    `echo step Kb`), a preamble message at `preamble_at`."""
    out = []
    for k in range(1, n + 1):
        cmds: tuple[str, ...] = (command(k),)
        if k in parallel_at:
            cmds = (command(k), f"echo step {k}b")
        preamble = f"Preamble before step {k}: running a command." if k in preamble_at else None
        out.append(
            Step(cmds, f"**Planning step {k}**\n\nI need to run the next command.", preamble)
        )
    return out


def _hex(seed: str, n: int = 48) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()[:n]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(c.get("text", "")) for c in content if isinstance(c, dict) and "text" in c
        )
    return ""


def request_kind(rec: Recorded) -> str | None:
    """`request_kind` of Codex's `x-codex-turn-metadata` header ("turn", "compaction"), if any."""
    raw = rec.header("x-codex-turn-metadata")
    if raw is None:
        return None
    try:
        meta = json.loads(raw)
    except ValueError:
        return None
    kind = meta.get("request_kind") if isinstance(meta, dict) else None
    return kind if isinstance(kind, str) else None


def is_compaction(rec: Recorded, body: Any) -> bool:
    """Codex's own compaction request: by its header, or by its prompt as the last input item."""
    if request_kind(rec) == "compaction":
        return True
    items = body.get("input") if isinstance(body, dict) else None
    if isinstance(items, list) and items and isinstance(items[-1], dict):
        return _text(items[-1].get("content")).startswith(COMPACTION_PROMPT)
    return False


@dataclass
class Answer:
    """One reply the script made: which step, and the marker key if it called the expand tool."""

    step: int
    expand: str | None


@dataclass
class Compaction:
    """One compaction request of Codex's: its body's size and the steps done when it came."""

    request: Recorded
    tokens: int  # bytes / 4, as the fake bills it
    done: int


@dataclass
class CodexScript:
    tag: str
    steps: list[Step]
    final_text: str = "All scripted steps are done."
    expand: bool = False
    # Called with the step number once that step's answer has begun (status and headers sent)
    # and before its body: the proxy sees the answer begin while Codex still waits.
    before: Callable[[int], None] | None = None
    # Extra output tokens reported per answer (usage as a long answer would bill it).
    output_tokens: int = 0
    # End the turn (a message, no call) once this many steps are done; the next user message
    # (`codex exec resume --last PROMPT`) goes on from there.
    pause_at: tuple[int, ...] = ()
    pause_text: str = "Paused; say when to go on."
    # The function call a step's command is made as: Codex's `exec_command` unless another agent
    # is driven (opencode's `bash {command, description}`).
    call: Callable[[str], tuple[str, dict[str, Any]]] = exec_command
    answers: list[Answer] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    expansions: list[str] = field(default_factory=list)
    compactions: list[Compaction] = field(default_factory=list)
    results: dict[str, str] = field(default_factory=dict)  # call id -> the output Codex sent
    usages: list[dict[str, Any]] = field(default_factory=list)  # each answer's usage, in order
    _ids: dict[str, tuple[int, str | None]] = field(default_factory=dict)  # call -> (step, key)
    _reasoning: dict[str, tuple[str, str]] = field(default_factory=dict)  # rs id -> (enc, next)
    _expanded: set[str] = field(default_factory=set)
    _sessions: set[str] = field(default_factory=set)  # prompt_cache_keys seen with the tag
    _n: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, rec: Recorded) -> Reply | None:
        if rec.method != "POST" or not rec.path.split("?")[0].endswith("/responses"):
            return None
        try:
            body = rec.json()
        except ValueError:
            return None
        if not isinstance(body, dict) or not isinstance(body.get("input"), list):
            return None
        items: list[Any] = body["input"]
        if not self._mine(items, body.get("prompt_cache_key")):
            return None
        with self._lock:
            problems = api.input_problems(items) + self._issued_problems(items)
            if problems:
                self.refusals.extend(problems)
                code = "invalid_encrypted_content" if "encrypted content" in problems[0] else None
                payload = api.error_payload(problems[0], code=code)
                return Reply.json(400, payload)
            self._n += 1
            n = self._n
            if is_compaction(rec, body):
                done = self._done(items)
                self.compactions.append(Compaction(rec, len(rec.body) // 4, done))
                text = f"{self.tag} CG-SCRIPT: {done} steps done; continue with the next one."
                output = [api.message_item(f"msg_{_hex(f'{self.tag}|compact|{n}')}", text)]
                return self._reply(rec, body, output, n)
            step, key = self._position(items, body)
            self.answers.append(Answer(step, key))
            output = self._output(step, key, n)
        reply = self._reply(rec, body, output, n)
        if key is None and self.before is not None:
            reply.after_headers = functools.partial(self.before, step)
        return reply

    # -- reading the request -------------------------------------------------------------------

    def _mine(self, items: list[Any], cache_key: Any) -> bool:
        """A request of this session: the tag in a user message, or the `prompt_cache_key` (Codex's
        session id) of one that had it — the task may have been summarized away since."""
        tagged = any(
            isinstance(x, dict)
            and x.get("type", "message") == "message"
            and x.get("role") == "user"
            and self.tag in _text(x.get("content"))
            for x in items
        )
        if tagged and isinstance(cache_key, str):
            self._sessions.add(cache_key)
        return tagged or (isinstance(cache_key, str) and cache_key in self._sessions)

    def _issued_problems(self, items: list[Any]) -> list[str]:
        """A reasoning item of ours must come back with its encrypted content unchanged and the
        item it was issued with right after it."""
        out = []
        for i, x in enumerate(items):
            if not isinstance(x, dict) or x.get("type") != "reasoning":
                continue
            issued = self._reasoning.get(str(x.get("id")))
            enc = x.get("encrypted_content")
            if "id" not in x and any(enc == e for e, _ in self._reasoning.values()):
                continue  # sent by its content alone (the AI SDK's way with store: false)
            if issued is None:
                if enc is not None:  # not ours: the API could not decrypt it
                    out.append(f"The encrypted content {str(enc)[:4]}... could not be verified.")
                continue
            if enc != issued[0]:
                out.append(f"The encrypted content {str(enc)[:4]}... could not be verified.")
            nxt = items[i + 1] if i + 1 < len(items) else None
            if not isinstance(nxt, dict) or nxt.get("id") != issued[1]:
                out.append(
                    f"Item '{x.get('id')}' of type 'reasoning' was provided without its "
                    "required following item."
                )
        return out

    def _done(self, items: list[Any]) -> int:
        """How many steps this history shows done: from our latest answered call, else from a
        compaction summary of ours."""
        for x in reversed(items):
            if isinstance(x, dict) and x.get("type") == "function_call_output":
                known = self._ids.get(str(x.get("call_id")))
                if known is not None:
                    step, key = known
                    return step if key is not None else step + 1
        for x in reversed(items):
            if isinstance(x, dict) and x.get("role") == "user":
                m = DONE.search(_text(x.get("content")))
                if m:
                    return int(m.group(1))
        return 0

    def _position(self, items: list[Any], body: dict[str, Any]) -> tuple[int, str | None]:
        """(the step to take, the marker key to expand instead of taking it, if any)."""
        for x in items:
            if isinstance(x, dict) and x.get("type") == "function_call_output":
                cid = str(x.get("call_id"))
                if cid in self._ids:
                    self.results[cid] = _text(x.get("output"))
        last = items[-1] if items else None
        if isinstance(last, dict) and last.get("type") == "function_call_output":
            known = self._ids.get(str(last.get("call_id")))
            if known is not None and known[1] is not None:  # the continuation: our call answered
                self.expansions.append(_text(last.get("output")))
        step = self._done(items)
        if step in self.pause_at and isinstance(last, dict) and last.get("role") != "user":
            return -step, None  # the turn ends here: the pause message
        if self.expand and self._declares_expand(body):
            for key in MARKER.findall(api.dumps(items)):
                if key not in self._expanded:
                    self._expanded.add(key)
                    return step, key
        return step, None

    @staticmethod
    def _declares_expand(body: dict[str, Any]) -> bool:
        tools = body.get("tools")
        return any(
            isinstance(t, dict) and t.get("type") == "function" and t.get("name") == EXPAND_TOOL
            for t in (tools if isinstance(tools, list) else [])
        )

    # -- writing the reply ---------------------------------------------------------------------

    def _output(self, step: int, key: str | None, n: int) -> list[Any]:
        seed = f"{self.tag}|{step}|{key}"
        calls: list[tuple[str, dict[str, Any]]]
        preamble: str | None = None
        if key is not None:
            summary = f"**Expanding**\n\nThe summary hides a detail; I will expand {key}."
            calls = [(EXPAND_TOOL, {"id": key})]
        elif step < 0:
            summary, calls = f"**Pausing**\n\n{-step} steps ran; the user asked to stop.", []
        elif step < len(self.steps):
            s = self.steps[step]
            summary, preamble = s.summary, s.preamble
            calls = [self.call(c) for c in s.commands]
        else:
            summary, calls = "**Reporting**\n\nEverything ran; time to report.", []
        items: list[Any] = []
        rs_id = f"rs_{_hex(seed + '|rs')}"
        enc = "gAAAAA" + base64.urlsafe_b64encode(
            hashlib.sha512(f"{seed}|{summary}".encode()).digest() * 3
        ).decode("ascii")
        items.append(api.reasoning_item(rs_id, summary, enc))
        if preamble is not None:
            items.append(api.message_item(f"msg_{_hex(seed + '|pre')}", preamble))
        for k, (name, args) in enumerate(calls):
            cid = "call_" + _hex(f"{seed}|{k}", 24)
            self._ids[cid] = (step, key)
            fc = f"fc_{_hex(f'{seed}|fc|{k}')}"
            items.append(api.function_call_item(fc, cid, name, api.dumps(args)))
        if not calls:
            text = self.pause_text if step < 0 else self.final_text
            items.append(api.message_item(f"msg_{_hex(seed + '|final')}", text))
        self._reasoning[rs_id] = (enc, items[1]["id"])
        return items

    def _reply(self, rec: Recorded, body: dict[str, Any], output: list[Any], n: int) -> Reply:
        # Billed as the bytes go: the request's bytes / 4 in, the output items' bytes / 4 out.
        usage = api.usage(len(rec.body) // 4, len(api.dumps(output)) // 4 + self.output_tokens)
        self.usages.append(usage)
        response = api.response_object(
            f"resp_{_hex(f'{self.tag}|resp|{n}')}", str(body.get("model")), output, usage, body
        )
        if body.get("stream") is not True:
            return Reply(body=api.dumps(response).encode(), headers=dict(api.JSON_HEADERS))
        return Reply(frames=[f.encode() for f in api.stream_frames(response)])
