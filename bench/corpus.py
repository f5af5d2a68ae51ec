"""Deterministic ~1 MiB, 400-message request bodies for the benchmarks, grown from a real capture.

The Anthropic body keeps every byte outside `messages` exactly as Claude Code 2.1.197 sent it in
`bench/fixtures/claude_code_2.1.197_turn16.json` (model, system, tools, metadata, thinking,
context_management, …); only the `messages` array is replaced by a longer transcript in the
same style: thinking blocks with signatures, short text, `Bash`/`Read`/`Grep`/`Edit` tool_use
blocks (some parallel), multi-KB tool_result outputs (ANSI escapes, box drawing, code, the odd
emoji), `system` messages re-injected mid-array, a few new human prompts, and `cache_control` on
the last message. The
transcript ends like the capture does: `system`, `assistant` (one tool_use), `user` (its result).

The OpenAI body is the same transcript in Chat Completions form: the capture's system prompt as
`messages[0]`, `tool_calls` with JSON-string arguments, one `role: tool` message per result, the
capture's tools as function tools. Thinking has no Chat Completions equivalent and is dropped.

Both are serialised the way a JavaScript client does (`JSON.stringify`: compact, non-ASCII kept),
like the capture itself. The same arguments always give the same bytes.
"""

from __future__ import annotations

import base64
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import facts as bench_facts
from cg.wire.jsonspan import walk_document

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "claude_code_2.1.197_turn16.json"

TARGET_BYTES = 1 << 20
TARGET_MESSAGES = 400
SEED = 20261130


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


# -- an abstract transcript, rendered per dialect ----------------------------------------------


@dataclass
class Call:
    id: str
    name: str
    input: dict[str, Any]


@dataclass
class Result:
    call_id: str
    content: str | list[dict[str, Any]]
    is_error: bool = False


@dataclass
class Event:
    kind: str  # "user" | "system" | "assistant" | "results"
    texts: list[str] = field(default_factory=list)
    thinking: tuple[str, str] | None = None  # (thinking, signature)
    calls: list[Call] = field(default_factory=list)
    results: list[Result] = field(default_factory=list)


_PROSE = (
    "the test fails because the fixture path is resolved relative to the working directory so "
    "I should check how conftest sets it up then run the suite again with verbose output and "
    "look at the traceback which points into the parser where a None slips through when the "
    "config file is empty; next I will read the module, grep for callers, patch the guard and "
    "re-run only the failing tests before the whole suite"
)
_WORDS = _PROSE.split()

_FILES = (
    "src/app/config.py",
    "src/app/parser.py",
    "src/app/cli.py",
    "src/app/store/sqlite.py",
    "tests/test_parser.py",
    "tests/conftest.py",
    "pyproject.toml",
    "README.md",
)

_CODE = [
    "from __future__ import annotations",
    "",
    "import json",
    "from dataclasses import dataclass, field",
    "from pathlib import Path",
    "",
    "",
    "@dataclass",
    "class Config:",
    '    """Settings read once at start-up; see docs/config.md."""',
    "",
    '    path: Path = Path("~/.app/config.toml")',
    "    retries: int = 3",
    "    hosts: list[str] = field(default_factory=list)",
    "",
    "    @classmethod",
    "    def load(cls, text: str) -> Config:",
    "        data = json.loads(text) if text.strip() else {}",
    '        if not isinstance(data, dict):  # "null" or a list',
    '            raise ValueError(f"config must be an object, not {type(data).__name__}")',
    "        return cls(**data)",
    "",
    "    def describe(self) -> str:",
    "        return f\"{self.path} — {self.retries} retries, hosts: {', '.join(self.hosts)}\"",
]

_PYTEST = [
    "\x1b[1m============================= test session starts ==============================\x1b[0m",
    "platform linux -- Python 3.11.7, pytest-8.3.3, pluggy-1.5.0",
    "rootdir: /home/dev/project",
    "collected 214 items",
    "",
    "tests/test_cli.py \x1b[32m........\x1b[0m\x1b[32m                                        [  3%]\x1b[0m",
    "tests/test_config.py \x1b[32m..........\x1b[0m\x1b[31mF\x1b[0m\x1b[32m..\x1b[0m\x1b[31m                                [  9%]\x1b[0m",
    "tests/test_parser.py \x1b[32m....................................\x1b[0m\x1b[32m          [ 26%]\x1b[0m",
    "",
    "=================================== FAILURES ===================================",
    "\x1b[31m\x1b[1m___________________________ test_load_empty_file ____________________________\x1b[0m",
    "",
    "    def test_load_empty_file(tmp_path):",
    '        p = tmp_path / "c.json"',
    '        p.write_text("")',
    ">       cfg = Config.load(p.read_text())",
    "\x1b[1m\x1b[31mE       TypeError: 'NoneType' object is not iterable\x1b[0m",
    "",
    "\x1b[1m\x1b[31msrc/app/config.py\x1b[0m:21: TypeError",
    "\x1b[31m========================= \x1b[31m\x1b[1m1 failed\x1b[0m, \x1b[32m213 passed\x1b[0m\x1b[31m in 4.21s\x1b[0m\x1b[31m =========================\x1b[0m",
]

_TREE = [
    ".",
    "├── pyproject.toml",
    "├── README.md",
    "├── src",
    "│   └── app",
    "│       ├── __init__.py",
    "│       ├── cli.py",
    "│       ├── config.py",
    "│       ├── parser.py",
    "│       └── store",
    "│           ├── __init__.py",
    "│           └── sqlite.py",
    "└── tests",
    "    ├── conftest.py",
    "    ├── test_cli.py",
    "    ├── test_config.py",
    "    └── test_parser.py",
]

_GIT = [
    "commit 3f9c2e1a7b4d5e6f708192a3b4c5d6e7f8091a2b",
    "Author: Dev <dev@example.com>",
    "Date:   Mon Nov 30 09:14:02 2026 +0000",
    "",
    "    Guard Config.load against an empty file",
    "",
    "    🤖 Generated with [Claude Code](https://claude.com/claude-code)",
    "",
    "    Co-Authored-By: Claude <noreply@anthropic.com>",
    "",
    " src/app/config.py   | 4 +++-",
    " tests/test_config.py | 6 ++++++",
    ' 2 files changed, 9 insertions(+), 1 deletion(-) — "small" fix',
]


def _sentence(rng: random.Random, n: int) -> str:
    words = [rng.choice(_WORDS) for _ in range(n)]
    return " ".join(words).capitalize() + "."


def _paragraphs(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    size = 0
    while size < chars:
        s = _sentence(rng, rng.randint(8, 24))
        out.append(s)
        size += len(s) + 1
    return " ".join(out)


def _lines_to(rng: random.Random, source: list[str], chars: int, numbered: bool) -> str:
    out: list[str] = []
    size = 0
    n = rng.randrange(len(source))
    while size < chars:
        line = source[n % len(source)]
        if numbered:
            line = f"{n + 1:>6}\t{line}"
        out.append(line)
        size += len(line) + 1
        n += 1
    return "\n".join(out)


def _tool_id(rng: random.Random, prefix: str, n: int) -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
    return prefix + "".join(rng.choice(alphabet) for _ in range(n))


def _call(rng: random.Random, step: int, dialect: str) -> tuple[Call, str]:
    """A tool call and the kind of output it produces."""
    cid = _tool_id(rng, "toolu_01", 22) if dialect == "anthropic" else _tool_id(rng, "call_", 24)
    kind = rng.choices(("pytest", "read", "grep", "tree", "git", "edit"), (4, 4, 2, 1, 1, 2))[0]
    f = rng.choice(_FILES)
    if kind == "pytest":
        return Call(
            cid,
            "Bash",
            {
                "command": "cd /home/dev/project && python -m pytest -x -q tests/ 2>&1 "
                f"| head -{rng.randint(80, 400)}",
                "description": f"Run the test suite (step {step})",
            },
        ), kind
    if kind == "read":
        return Call(cid, "Read", {"file_path": f"/home/dev/project/{f}"}), kind
    if kind == "grep":
        return Call(
            cid,
            "Grep",
            {"pattern": r"def (load|parse)\(", "path": "/home/dev/project/src", "-n": True},
        ), kind
    if kind == "tree":
        return Call(cid, "Bash", {"command": "tree -L 3", "description": "Show the layout"}), kind
    if kind == "git":
        return Call(
            cid, "Bash", {"command": "git log -1 --stat", "description": "Show the last commit"}
        ), kind
    return Call(
        cid,
        "Edit",
        {
            "file_path": f"/home/dev/project/{f}",
            "old_string": "        data = json.loads(text)\n",
            "new_string": "        data = json.loads(text) if text.strip() else {}\n"
            '        # "" means defaults\n',
        },
    ), kind


def _fact_call(rng: random.Random, step: int, dialect: str, facts: bool) -> tuple[Call, str]:
    """`_call`, or (with `facts`, now and then) one of `bench.facts`'s calls."""
    if facts and rng.random() < bench_facts.P_FACT_CALL:
        cid = (
            _tool_id(rng, "toolu_01", 22) if dialect == "anthropic" else _tool_id(rng, "call_", 24)
        )
        kind, name, args = bench_facts.call(rng, step)
        return Call(cid, name, args), kind
    return _call(rng, step, dialect)


def _output(rng: random.Random, kind: str, chars: int) -> str:
    if kind == "pytest":
        return _lines_to(rng, _PYTEST, chars, numbered=False)
    if kind == "read":
        return _lines_to(rng, _CODE, chars, numbered=True)
    if kind == "grep":
        return _lines_to(
            rng,
            [f"{f}:{i * 7 + 3}:    def load(cls, text)" for i, f in enumerate(_FILES)],
            chars,
            False,
        )
    if kind == "tree":
        return _lines_to(rng, _TREE, chars, numbered=False)
    if kind == "git":
        return _lines_to(rng, _GIT, chars, numbered=False)
    return (
        f"The file /home/dev/project/{rng.choice(_FILES)} has been updated. "
        "Here's the result of running `cat -n` on a snippet:\n"
        + _lines_to(rng, _CODE, max(0, chars - 120), numbered=True)
    )


def _output_size(rng: random.Random, scale: float) -> int:
    # Mostly a few hundred bytes to a few KB, with a long tail of 10-20 KB outputs.
    base = min(rng.lognormvariate(7.4, 0.9), 20_000.0)
    return max(40, int(base * scale))


def transcript(
    head: list[Event],
    tail_system: str,
    reminder: str,
    dialect: str,
    n_messages: int,
    scale: float,
    seed: int = SEED,
    facts: bool = False,
) -> list[Event]:
    """Events that render to exactly `n_messages` messages in `dialect`. `facts`: with the
    human constraints, failing runs, edits and commands of `bench.facts` mixed in (the
    simulator's corpus); without, the bytes the benchmarks have always measured."""

    def count(e: Event) -> int:
        return len(e.results) if (e.kind == "results" and dialect == "openai") else 1

    rng = random.Random(seed)
    events = list(head)
    used = sum(count(e) for e in events)
    step = 0
    tail = 3  # system, assistant (one call), its result

    def turn(max_calls: int) -> None:
        nonlocal used, step
        step += 1
        crng = random.Random(seed * 1_000_003 + step)  # content, independent of the structure
        n_calls = 1 if max_calls == 1 else rng.choices((1, 2, 3), (80, 14, 6))[0]
        n_calls = min(n_calls, max_calls)
        calls, kinds = zip(
            *(_fact_call(crng, step, dialect, facts) for _ in range(n_calls)), strict=True
        )
        sig = base64.b64encode(crng.randbytes(crng.randint(280, 900))).decode()
        thinking = _paragraphs(crng, crng.randint(120, 1400))
        text = (
            [f"Step {step}: {_sentence(crng, crng.randint(4, 14))}"] if rng.random() < 0.5 else []
        )
        events.append(Event("assistant", texts=text, thinking=(thinking, sig), calls=list(calls)))
        results = []
        for c, k in zip(calls, kinds, strict=True):
            size = _output_size(crng, scale)
            if k in bench_facts.KINDS:
                out = bench_facts.output(crng, k, c.input, size)
            else:
                out = _output(crng, k, size)
            content: str | list[dict[str, Any]] = out
            if crng.random() < 0.08:
                content = [{"type": "text", "text": out}]
            failed = crng.random() < 0.05 or k in bench_facts.FAILING
            results.append(Result(c.id, content, is_error=failed))
        events.append(Event("results", results=results))
        used += 1 + (n_calls if dialect == "openai" else 1)

    while True:
        left = n_messages - used - tail
        if left <= 0:
            break
        if left < 10:
            # Land exactly: single-call turns, one reminder if the count is odd.
            if left % 2 == 1:
                events.append(Event("system", texts=[reminder]))
                used += 1
            turn(1)
            continue
        r = rng.random()
        if r < 0.04:
            # The agent ends its turn; the human writes a new prompt.
            crng = random.Random(seed * 7 + used)
            events.append(Event("assistant", texts=[_paragraphs(crng, crng.randint(200, 900))]))
            said = _sentence(crng, crng.randint(6, 20))
            if facts:
                said = bench_facts.constraint(crng)
            events.append(Event("user", texts=[said]))
            used += 2
        elif r < 0.10:
            # A reminder re-injected mid-array; like the capture's, followed by an assistant turn.
            events.append(Event("system", texts=[reminder]))
            used += 1
            turn(3)
        else:
            turn(3)
    events.append(Event("system", texts=[tail_system]))
    turn(1)
    return events


def _render_anthropic(events: list[Event]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for e in events:
        if e.kind == "system":
            out.append({"role": "system", "content": e.texts[0]})
        elif e.kind == "user":
            out.append({"role": "user", "content": [{"type": "text", "text": t} for t in e.texts]})
        elif e.kind == "assistant":
            blocks: list[dict[str, Any]] = []
            if e.thinking:
                blocks.append(
                    {"type": "thinking", "thinking": e.thinking[0], "signature": e.thinking[1]}
                )
            blocks += [{"type": "text", "text": t} for t in e.texts]
            blocks += [
                {"type": "tool_use", "id": c.id, "name": c.name, "input": c.input} for c in e.calls
            ]
            out.append({"role": "assistant", "content": blocks})
        else:
            out.append(
                {
                    "role": "user",
                    "content": [
                        {
                            "tool_use_id": r.call_id,
                            "type": "tool_result",
                            "content": r.content,
                            "is_error": r.is_error,
                        }
                        for r in e.results
                    ],
                }
            )
    last = out[-1]["content"][-1]
    last["cache_control"] = {"type": "ephemeral"}
    return out


def _render_openai(events: list[Event]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for e in events:
        if e.kind == "system":
            out.append({"role": "system", "content": e.texts[0]})
        elif e.kind == "user":
            out.append({"role": "user", "content": [{"type": "text", "text": t} for t in e.texts]})
        elif e.kind == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": "\n\n".join(e.texts) or None}
            if e.calls:
                msg["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": _dumps(c.input)},
                    }
                    for c in e.calls
                ]
            out.append(msg)
        else:
            for r in e.results:
                content = r.content if isinstance(r.content, str) else r.content[0]["text"]
                out.append({"role": "tool", "tool_call_id": r.call_id, "content": content})
    return out


@dataclass(frozen=True)
class Corpus:
    anthropic: bytes
    openai: bytes


def _fixture() -> tuple[str, dict[str, Any]]:
    text = FIXTURE.read_text(encoding="utf-8")
    return text, json.loads(text)


def _head(doc: dict[str, Any]) -> tuple[list[Event], str, str]:
    msgs = doc["messages"]
    first = Event("user", texts=[b["text"] for b in msgs[0]["content"]])
    systems = [m["content"] for m in msgs if m["role"] == "system"]
    return [first, Event("system", texts=[systems[0]])], systems[-1], systems[1 % len(systems)]


def anthropic_body(
    n_messages: int = TARGET_MESSAGES, target: int = TARGET_BYTES, seed: int = SEED
) -> bytes:
    text, doc = _fixture()
    msgs = next(m for m in walk_document(text, arrays=("messages",)) if m.key == "messages")
    head, tail_system, reminder = _head(doc)

    def build(scale: float) -> bytes:
        events = transcript(head, tail_system, reminder, "anthropic", n_messages, scale, seed)
        array = _dumps(_render_anthropic(events))
        return (text[: msgs.start] + array + text[msgs.end :]).encode("utf-8")

    return _fit(build, target)


def openai_body(
    n_messages: int = TARGET_MESSAGES, target: int = TARGET_BYTES, seed: int = SEED
) -> bytes:
    _, doc = _fixture()
    head, tail_system, reminder = _head(doc)
    system = "\n\n".join(b["text"] for b in doc["system"])
    tools = [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t["description"],
                "parameters": t["input_schema"],
            },
        }
        for t in doc["tools"]
    ]

    def build(scale: float) -> bytes:
        events = transcript(head, tail_system, reminder, "openai", n_messages - 1, scale, seed)
        body = {
            "model": "gpt-4.1",
            "messages": [{"role": "system", "content": system}, *_render_openai(events)],
            "tools": tools,
            "tool_choice": "auto",
            "parallel_tool_calls": True,
            "max_completion_tokens": 32000,
            "stream": True,
            "stream_options": {"include_usage": True},
            "user": doc["metadata"]["user_id"],
        }
        return _dumps(body).encode("utf-8")

    return _fit(build, target)


def _fit(build: Any, target: int) -> bytes:
    """Scale the tool outputs until the body is within 0.5% of `target` bytes."""
    scale = 1.0
    body: bytes = build(scale)
    for _ in range(8):
        if abs(len(body) - target) <= target // 200:
            break
        fixed = len(build(0.0))
        scale *= max(target - fixed, 1) / max(len(body) - fixed, 1)
        body = build(scale)
    return body


def corpus() -> Corpus:
    return Corpus(anthropic_body(), openai_body())


if __name__ == "__main__":
    from cg.wire.body import index_body
    from cg.wire.dialects import ANTHROPIC, OPENAI

    c = corpus()
    for name, raw, d in (("anthropic", c.anthropic, ANTHROPIC), ("openai", c.openai, OPENAI)):
        idx = index_body(raw, d)
        print(name, len(raw), "bytes", len(idx.messages), "messages")
