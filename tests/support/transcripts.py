"""Long transcripts grown from the real Claude Code captures, and a driver for the two-turn path.

The `summarize` component commissions its summary off the hot path: the turn that first
qualifies forwards untouched, `complete()` runs the summarizer, and a later turn splices. `Driver`
plays that loop synchronously: `send()` runs one request through `rewrite_body` with an injected
clock and session header and keeps the commissions it returns; `drain()` completes them with an
in-process fake summarizer. Nothing sleeps.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cg.pipeline.rewrite import ExpandPolicy, Rewrite, rewrite_body
from cg.state import Store
from cg.state.facts import strip_cache_control
from cg.state.tokens import TokenCounter
from cg.summarize.component import Commission, Summarize, SummarizerError, SummarizerTimeout
from cg.summarize.config import SummarizeConfig, parse_summarize
from cg.wire.body import MessageCache, index_body
from cg.wire.dialects import DIALECTS, Dialect

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CC16 = "claude_code_2.1.197_turn16.json"
CC_TOOL_USE = "claude_code_anthropic_tool_use.json"
MARKER_RE = re.compile(r"<<cg:([0-9a-f]{24})>>")
EPHEMERAL = {"type": "ephemeral"}

# One token counter for the whole test session: loading the encoding is the slow part.
TOKENS = TokenCounter()

# Gates that would keep a small test transcript from the acting path, opened explicitly. Tests
# that rely on them still assert that the summary was commissioned (a vacuity guard).
ACTING: dict[str, Any] = {
    "min_tokens": 0,
    "cache_state": "any",
    "trigger": {"min_request_frac": 0, "min_request_tokens": 0, "min_messages": 0},
}

Json = Any


def fixture_body(name: str) -> dict[str, Json]:
    """A fixture's request body (the `{"provider", "body"}` wrapper, if any, removed)."""
    data: dict[str, Json] = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    return data["body"] if "body" in data and "messages" not in data else data


def fixture_headers(name: str) -> dict[str, str]:
    """The captured request headers of a fixture (credentials left out)."""
    path = FIXTURES / name.replace(".json", ".headers.json")
    pairs = json.loads(path.read_text(encoding="utf-8"))["headers"]
    return {k: v for k, v in pairs if k.lower() not in ("x-api-key", "authorization")}


def cc_dumps(body: Json) -> bytes:
    """Serialise like Claude Code (JavaScript's `JSON.stringify`: compact, non-ASCII as is)."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def config(**over: Any) -> SummarizeConfig:
    """A config on the acting path (`ACTING`), with `over` merged in (nested dicts merged)."""
    raw: dict[str, Any] = copy.deepcopy(ACTING)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(raw.get(k), dict):
            raw[k] = {**raw[k], **v}
        else:
            raw[k] = v
    return parse_summarize(raw, env={})


# --------------------------------------------------------------------------------------------
# Growing Claude Code transcripts
# --------------------------------------------------------------------------------------------


def move_cache_control(messages: list[Json]) -> list[Json]:
    """What Claude Code does every turn: the breakpoint leaves every message and lands on the
    last block of the last message."""
    out = [strip_cache_control(m) for m in messages]
    last = out[-1]
    if isinstance(last["content"], str):
        last["content"] = [{"type": "text", "text": last["content"]}]
    last["content"][-1]["cache_control"] = dict(EPHEMERAL)
    return out


def tool_turn(n: int, output_words: int = 120) -> list[Json]:
    """One Claude Code tool exchange: assistant (thinking, text, Bash tool_use) + its result."""
    tid = f"toolu_grown{n:04d}"
    output = " ".join(f"line{n}-{k}" for k in range(output_words))
    return [
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": f"Step {n}: next command.", "signature": "c2ln"},
                {"type": "text", "text": f"Running grown step {n}."},
                {
                    "type": "tool_use",
                    "id": tid,
                    "name": "Bash",
                    "input": {"command": f"echo grown {n}", "description": f"grown step {n}"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"tool_use_id": tid, "type": "tool_result", "content": output, "is_error": False}
            ],
        },
    ]


def grow(base: dict[str, Json], turns: int, output_words: int = 120) -> list[dict[str, Json]]:
    """The bodies of `turns` further Claude Code requests after `base`, one tool exchange each,
    the `cache_control` breakpoint moved to the last message each time. Every earlier message
    keeps its exact content (only the breakpoint moves), as in a real session."""
    msgs = [strip_cache_control(m) for m in base["messages"]]
    out: list[dict[str, Json]] = []
    for n in range(turns):
        msgs = msgs + tool_turn(n, output_words)
        body = dict(base)
        body["messages"] = move_cache_control(msgs)
        out.append(body)
    return out


def openai_transcript(exchanges: int, task: str = "TASK: port the parser to Rust.") -> list[Json]:
    """An OpenAI-shaped agent transcript: [system, task, (assistant call, tool result)...,
    assistant, user]."""
    msgs: list[Json] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": task},
    ]
    for n in range(exchanges):
        cid = f"call_{n:03d}"
        msgs.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": cid,
                        "type": "function",
                        "function": {"name": "shell", "arguments": json.dumps({"cmd": f"ls {n}"})},
                    }
                ],
            }
        )
        msgs.append({"role": "tool", "tool_call_id": cid, "content": f"out{n} " * 60})
    msgs.append({"role": "assistant", "content": "Done with the listing."})
    msgs.append({"role": "user", "content": "Now write the tests."})
    return msgs


# --------------------------------------------------------------------------------------------
# The fake summarizer and the driver
# --------------------------------------------------------------------------------------------


@dataclass
class FakeSummarizer:
    """An in-process summarizer. By default it answers a distinct summary per call, naming the
    span size, so two summaries' bytes differ; `answer` overrides (a string, None, or an
    exception to raise)."""

    answer: str | BaseException | Callable[[str, Commission], str | None] | None = "default"
    calls: list[tuple[str, Commission]] = field(default_factory=list)

    async def __call__(self, prompt: str, job: Commission) -> str | None:
        self.calls.append((prompt, job))
        a = self.answer
        if isinstance(a, BaseException):
            raise a
        if callable(a):
            return a(prompt, job)
        if a == "default":
            return f"<summary>summary #{len(self.calls)} of {len(job.sources)} messages</summary>"
        return a


SHARED = "<summary>the shared summary</summary>"


@dataclass
class SharedFake(FakeSummarizer):
    """The standalone fake plus `shared()`; `seen` records, per shared call, whether the
    commissioning answer had begun when it was made."""

    shared_answer: str | BaseException | None = SHARED
    shared_calls: list[tuple[bytes, Commission]] = field(default_factory=list)
    seen: list[bool] = field(default_factory=list)

    async def shared(self, body: bytes, job: Commission) -> str | None:
        self.shared_calls.append((body, job))
        self.seen.append(job.began is None or job.began.is_set())
        if isinstance(self.shared_answer, BaseException):
            raise self.shared_answer
        return self.shared_answer


def summarizer_raising(kind: str) -> FakeSummarizer:
    if kind == "error":
        return FakeSummarizer(SummarizerError("502 from upstream"))
    return FakeSummarizer(SummarizerTimeout("no answer within 30 s"))


@dataclass
class Driver:
    """One session's requests through `rewrite_body` with the component alone."""

    component: Summarize
    dialect: Dialect
    summarizer: FakeSummarizer = field(default_factory=FakeSummarizer)
    session: str | None = "sess-1"
    now: float = field(default_factory=time.time)  # the store's clock is real time too
    tick: float = 1.0
    pending: list[Commission] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)
    cache: MessageCache | None = None  # the proxy's warm index, when a test wants one
    tenant: str = ""  # who sends (`cg.state.tenant.fingerprint`), as the addon passes it
    expand: ExpandPolicy | None = None  # when the expand tool may go in (None: never asked)

    def send(self, body: bytes | dict[str, Json], **headers: str) -> Rewrite:
        raw = body if isinstance(body, bytes) else cc_dumps(body)
        h = dict(self.headers)
        if self.session is not None:
            h["x-context-guru-session"] = self.session
        h.update(headers)
        r = rewrite_body(
            raw, self.dialect, [self.component], headers=h, now=self.now, cache=self.cache,
            expand=self.expand, tenant=self.tenant,
        )  # fmt: skip
        self.now += self.tick
        for comp, job in r.commissions:
            assert comp is self.component
            self.pending.append(job)
        return r

    def drain(self) -> list[str]:
        """Complete every pending commission with the fake; the outcomes in order."""
        jobs, self.pending = self.pending, []
        return [str(asyncio.run(self.component.complete(job, self.summarizer))) for job in jobs]


def make(
    cfg: SummarizeConfig,
    store: Store,
    dialect: str = "anthropic",
    summarizer: FakeSummarizer | None = None,
    **kw: Any,
) -> Driver:
    comp = Summarize(cfg, store, TOKENS, kw.pop("model_windows", None))
    return Driver(comp, DIALECTS[dialect], summarizer or FakeSummarizer(), **kw)


def record(r: Rewrite) -> dict[str, Json]:
    """The summarize component's decision record of one request."""
    recs: list[dict[str, Json]] = r.record["components"]
    assert len(recs) == 1 and recs[0]["component"] == "summarize", r.record
    return recs[0]


def sources(raw: bytes, dialect: Dialect) -> list[str]:
    """The exact source text of every message of a body."""
    index = index_body(raw, dialect)
    return [index.source(i) for i in range(len(index.messages))]


def out_messages(r: Rewrite) -> list[Json]:
    assert r.body is not None, r.record
    msgs: list[Json] = json.loads(r.body)["messages"]
    return msgs


def summary_of(r: Rewrite) -> tuple[int, str]:
    """(index, source text) of the one summary message in a rewritten body."""
    assert r.body is not None, r.record
    dialect = DIALECTS[r.record["dialect"]]
    srcs = sources(r.body, dialect)
    found = [(i, s) for i, s in enumerate(srcs) if "=== History Summary ===" in s]
    assert len(found) == 1, found
    return found[0]


def two_turns(
    d: Driver, first: bytes | dict[str, Json], second: bytes | dict[str, Json] | None = None
) -> Rewrite:
    """The real path: turn 1 commissions and forwards untouched, the summary completes, turn 2
    (the same body when `second` is None) splices. Asserts each step, so a fixture that stops
    reaching the acting path fails here instead of passing vacuously."""
    r1 = d.send(first)
    assert r1.outcome == "passed_through" and r1.body is None, r1.record
    assert len(d.pending) == 1, record(r1)  # vacuity guard: the trigger fired, a span existed
    assert d.drain() == ["completed"]
    r2 = d.send(first if second is None else second)
    assert r2.outcome == "rewritten", r2.record
    return r2
