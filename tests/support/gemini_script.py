"""A scripted Gemini model for the fake provider: it drives Gemini CLI's own tools step by step.

    script = GeminiScript(tag, n)          # n steps of `echo step K`, then a final text
    fake.responder = script                # tests/support/fakeprovider.py

A request is the session's when its first two contents hold `tag` somewhere (or, once it
began, any later one: Gemini CLI may have compressed the task away) and it declares
Gemini CLI's `run_shell_command`; anything else (a side request) gets the fake's default answer
(None). The step is read from the contents, not counted: the last `run_shell_command` call in
them says `echo step K` (`command(K)` must hold it), so the answer is step K+1 (step 1 when
there is none) — a spliced history that summarized the early calls still names the newest. Each step is a
`functionCall` of `run_shell_command` (Gemini CLI's name and arguments: `command`,
`description`), after step n the final text. The answer is SSE on `:streamGenerateContent`,
JSON otherwise (tests/support/gemini_api.py). `results` keeps what the CLI sent back for each
call (its `functionResponse`), `refusals` every request the API would refuse (the oracle's
`contents_problem`; the fake answers it 400). With `expand` set, the first turn that offers
`context_guru_expand` beside a summary marker is answered with a call of it (once);
`expansions` keeps what the proxy answered it with. `usage(rec)` (if set) gives the answer's
`usageMetadata` (a test pads `promptTokenCount` to make the CLI think its window is full).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.support import gemini_api
from tests.support.fakeprovider import Recorded, Reply

SHELL = "run_shell_command"
EXPAND_TOOL = "context_guru_expand"
STEP = re.compile(r"echo step (\d+)")
MARKER = re.compile(r"<<cg:([0-9a-f]+)>>")


@dataclass
class Answer:
    step: int  # the step answered (n+1: the final text)
    stream: bool
    expand: str | None = None  # the marker asked for, on an expand call


@dataclass
class GeminiScript:
    tag: str
    steps: int
    expand: bool = False
    # Called once a step's answer has its status line and headers out, before its body (a
    # test's gate: the proxy sees the answer begin).
    before: Callable[[int], None] | None = None
    usage: Callable[[Recorded], dict[str, Any]] | None = None
    command: Callable[[int], str] = lambda k: f"echo step {k}"  # step K's command
    answers: list[Answer] = field(default_factory=list)
    results: dict[int, str] = field(default_factory=dict)
    refusals: list[str] = field(default_factory=list)
    expansions: list[str] = field(default_factory=list)

    @property
    def final_text(self) -> str:
        return f"All {self.steps} steps of {self.tag} ran."

    def mine(self, doc: Any) -> bool:
        if not isinstance(doc, dict):
            return False
        names = {
            f.get("name")
            for t in doc.get("tools") or []
            for f in t.get("functionDeclarations") or []
        }
        contents = doc.get("contents") or []
        # Once the session has begun, its tag may be gone: Gemini CLI compressed its history.
        tagged = bool(contents) and self.tag in json.dumps(contents[:2])
        return SHELL in names and (tagged or bool(self.answers))

    def __call__(self, rec: Recorded) -> Reply | None:
        if rec.is_summarizer:
            return None
        try:
            doc = rec.json()
        except ValueError:
            return None
        if not self.mine(doc):
            return None
        problem = gemini_api.contents_problem(doc)
        if problem is not None:
            self.refusals.append(problem)
            return None  # the fake answers it 400
        contents = doc["contents"]
        last = 0
        for c in contents:
            for p in c.get("parts", []):
                call = p.get("functionCall")
                if call and call.get("name") == SHELL:
                    m = STEP.search(str(call.get("args", {}).get("command", "")))
                    last = int(m.group(1)) if m else last
                resp = p.get("functionResponse")
                if resp and resp.get("name") == SHELL and last:
                    self.results[last] = json.dumps(resp.get("response"))
                if resp and resp.get("name") == EXPAND_TOOL:
                    text = json.dumps(resp.get("response"))
                    if text not in self.expansions:
                        self.expansions.append(text)
        step = last + 1
        stream = gemini_api.is_stream(rec.path)
        offered = EXPAND_TOOL in json.dumps(doc.get("tools"))
        marker = MARKER.search(json.dumps(contents))
        if self.expand and offered and marker and not any(a.expand for a in self.answers):
            self.answers.append(Answer(step, stream, marker.group(1)))
            call = {"functionCall": {"name": EXPAND_TOOL, "args": {"id": marker.group(1)}}}
            return self._reply(rec, [call], stream)
        self.answers.append(Answer(step, stream))
        if step > self.steps:
            reply = self._reply(rec, [{"text": self.final_text}], stream)
        else:
            args = {"command": self.command(step), "description": f"Run step {step}."}
            reply = self._reply(rec, [{"functionCall": {"name": SHELL, "args": args}}], stream)
        if self.before is not None:
            reply.after_headers = functools.partial(self.before, step)
        return reply

    def _reply(self, rec: Recorded, parts: list[Any], stream: bool) -> Reply:
        n = len(rec.body) // 4
        usage = (
            self.usage(rec)
            if self.usage is not None
            else {"promptTokenCount": n, "candidatesTokenCount": 10, "totalTokenCount": n + 10}
        )
        model = gemini_api.model_of(rec.path) or "gemini-fake"
        doc = gemini_api.response(model, parts, usage)
        if stream:
            return Reply(frames=list(gemini_api.stream_frames(doc)))
        return Reply(body=gemini_api.dumps(doc).encode(), headers=dict(gemini_api.JSON_HEADERS))
