"""The simulator's corpus: long Claude Code- and Codex-shaped sessions, and the real capture cut
into turns.

    python -m bench.sessions OUT_DIR [--only NAME]…

writes one JSONL trace per session (`{"t", "headers", "body"}` per request,
docs/behaviour.md#usage-cost-and-savings) to OUT_DIR. Everything is deterministic: the same command
writes the same bytes, so the traces (tens to hundreds of MB) are regenerated, never committed.

- **Generated sessions** grow a transcript with `bench.corpus`'s machinery (thinking with
  signatures, Bash/Read/Grep/Edit calls, multi-KB tool outputs, system reminders re-injected
  mid-array, a few new human prompts) on the real capture's system and tools (~16k tokens), and
  cut it at every turn boundary (a request ends where the next assistant message begins), with
  `cache_control` on the last message as Claude Code puts it. Tool outputs are scaled so a tool
  round is `tokens_per_round` tokens. Gaps between turns: seconds for a tool round, minutes
  before a human prompt, and now and then longer than the 5-minute cache TTL. Every fact kind
  retention counts occurs all through a session (`bench.facts`: human prompts that state
  constraints, failing runs, edits and commands).
- **Codex sessions** (`dialect: responses`) are the same kind of transcript rendered as Codex
  0.169.0 sends it (`bench.codex`), each request ending where the model's next output begins.
- **The capture** (`claude_code_2.1.197_turn16.json`, 16 requests of one real session, each a
  prefix of the next) is cut the same way, with its own headers and plausible timestamps.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import codex
from bench.corpus import FIXTURE, _dumps, _head, _render_anthropic, transcript
from cg.simulate.trace import dumps_line
from cg.state.facts import FactsCache
from cg.state.tokens import TokenCounter
from cg.wire.body import index_body
from cg.wire.dialects import ANTHROPIC, RESPONSES
from cg.wire.jsonspan import walk_document

HEADERS = (
    FIXTURE.parent.parent.parent / "tests" / "fixtures" / "claude_code_2.1.197_turn16.headers.json"
)
T0 = 1_764_500_000.0  # 2025-11-30, a Sunday morning
BETA_1M = "context-1m-2025-08-07"
DROPPED_HEADERS = {"content-length", "host", "x-api-key", "authorization"}


@dataclass(frozen=True, slots=True)
class Spec:
    """One generated session."""

    name: str
    model: str
    context_1m: bool
    rounds: int
    tokens_per_round: int
    seed: int
    cold_gap_p: float = 0.07
    dialect: str = "anthropic"  # or "responses": Codex-shaped (`bench.codex`)


SESSIONS = (
    Spec("cc200-60", "claude-sonnet-4-5", False, 60, 2000, 1),
    Spec("cc200-100", "claude-sonnet-4-5", False, 100, 2000, 2),
    Spec("cc200-140", "claude-sonnet-4-5", False, 140, 2000, 3),
    Spec("cc1m-100", "claude-opus-4-8", True, 100, 2000, 4),
    Spec("cc1m-140", "claude-opus-4-8", True, 140, 2000, 5),
    Spec("cc1m-heavy", "claude-opus-4-8", True, 150, 6500, 6),
    Spec("codex-60", "gpt-6.1-sol", False, 60, 2000, 7, dialect="responses"),
    Spec("codex-140", "gpt-6.1-sol", False, 140, 2000, 8, dialect="responses"),
)


def fixture_headers(context_1m: bool = True) -> dict[str, str]:
    """The capture's own headers, less length, host and credential; context-1m on or off."""
    pairs = json.loads(HEADERS.read_text(encoding="utf-8"))["headers"]
    out = {k: v for k, v in pairs if k.lower() not in DROPPED_HEADERS}
    betas = [b for b in out["anthropic-beta"].split(",") if not b.startswith("context-1m")]
    if context_1m:
        betas.insert(1, BETA_1M)
    out["anthropic-beta"] = ",".join(betas)
    return out


def _with_breakpoint(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with `cache_control` only on the last block of the last message that has
    blocks (a string-content system reminder cannot carry one)."""
    out = [dict(m) for m in messages]
    for m in out:
        if isinstance(m["content"], list) and any("cache_control" in b for b in m["content"]):
            m["content"] = [
                {k: v for k, v in b.items() if k != "cache_control"} for b in m["content"]
            ]
    for m in reversed(out):
        if isinstance(m["content"], list) and m["content"]:
            blocks = list(m["content"])
            blocks[-1] = {**blocks[-1], "cache_control": {"type": "ephemeral"}}
            m["content"] = blocks
            break
    return out


def turn_bounds(messages: list[dict[str, Any]]) -> list[int]:
    """The message count of each request: a request ends where an assistant message begins."""
    ends = [i for i in range(1, len(messages)) if messages[i]["role"] == "assistant"]
    return [*ends, len(messages)]


def _frame(model: str | None) -> tuple[str, str]:
    """The capture's body text before and after its `messages` array (model swapped)."""
    text = FIXTURE.read_text(encoding="utf-8")
    msgs = next(m for m in walk_document(text, arrays=("messages",)) if m.key == "messages")
    before, after = text[: msgs.start], text[msgs.end :]
    if model is not None:
        before = before.replace('"model":"claude-opus-4-8"', f'"model":"{model}"', 1)
        after = after.replace('"model":"claude-opus-4-8"', f'"model":"{model}"', 1)
    return before, after


def _gap(rng: random.Random, human: bool, cold_p: float) -> float:
    if rng.random() < cold_p:
        return rng.uniform(330.0, 1800.0)  # away, or a long build: past the 5-minute TTL
    if human:
        return min(max(rng.lognormvariate(math.log(90.0), 0.8), 10.0), 290.0)
    return min(max(rng.lognormvariate(math.log(15.0), 0.7), 2.0), 240.0)


def requests(
    messages: list[dict[str, Any]], model: str | None, seed: int, cold_p: float
) -> Iterator[tuple[float, str]]:
    """(time, body text) of every request of a growing transcript."""
    before, after = _frame(model)
    rng = random.Random(seed * 7919)
    t = T0 + seed * 86_400
    for n in turn_bounds(messages):
        prefix = _with_breakpoint(messages[:n])
        yield t, before + _dumps(prefix) + after
        human = (
            n < len(messages)
            and messages[n - 1]["role"] == "user"
            and all(b.get("type") == "text" for b in messages[n - 1]["content"])
        )
        t = round(t + _gap(rng, human, cold_p), 3)


def _tokens(messages: list[dict[str, Any]], facts: FactsCache, dialect: str) -> int:
    if dialect == "responses":
        body = ('{"input":' + _dumps(messages) + "}").encode()
        return sum(f.tokens for f in facts.all(index_body(body, RESPONSES)))
    body = ('{"messages":' + _dumps(messages) + "}").encode()
    return sum(f.tokens for f in facts.all(index_body(body, ANTHROPIC)))


def generated(spec: Spec, facts: FactsCache | None = None) -> list[dict[str, Any]]:
    """The whole transcript of `spec` (messages, or Codex's input items), tool outputs scaled
    to its tokens per round."""
    facts = facts or FactsCache(TokenCounter())
    doc = json.loads(FIXTURE.read_text(encoding="utf-8"))
    head, tail_system, reminder = _head(doc)
    n_messages = round(spec.rounds * 2.12) + 2
    target = spec.rounds * spec.tokens_per_round
    codex_head = codex.frame(spec.model, spec.seed)[2] if spec.dialect == "responses" else []

    def build(scale: float) -> list[dict[str, Any]]:
        if spec.dialect == "responses":  # Codex's own head; call ids in OpenAI's style
            events = transcript([], "", "", "openai", n_messages, scale, spec.seed, facts=True)
            return codex_head + codex.render(events)
        events = transcript(
            head, tail_system, reminder, "anthropic", n_messages, scale, seed=spec.seed, facts=True
        )
        return _render_anthropic(events)

    scale = 1.0
    msgs = build(scale)
    fixed = _tokens(build(0.0), facts, spec.dialect)
    for _ in range(4):
        got = _tokens(msgs, facts, spec.dialect)
        if abs(got - target) <= target // 50:
            break
        scale *= max(target - fixed, 1) / max(got - fixed, 1)
        msgs = build(scale)
    return msgs


def codex_requests(items: list[dict[str, Any]], spec: Spec) -> Iterator[tuple[float, str]]:
    """(time, body text) of every request of a Codex session's growing `input`."""
    before, after, _ = codex.frame(spec.model, spec.seed)
    rng = random.Random(spec.seed * 7919)
    t = T0 + spec.seed * 86_400
    for n in codex.turn_bounds(items):
        yield t, before + _dumps(items[:n]) + after
        last = items[n - 1]
        human = n < len(items) and last["type"] == "message" and last["role"] == "user"
        t = round(t + _gap(rng, human, spec.cold_gap_p), 3)


def capture_messages() -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = json.loads(FIXTURE.read_text(encoding="utf-8"))["messages"]
    return copy.deepcopy(messages)


def write(out: Path, only: list[str] | None = None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    facts = FactsCache(TokenCounter())
    written: list[Path] = []
    jobs: list[tuple[str, list[dict[str, Any]], str | None, dict[str, str], int, float]] = [
        ("claude_code_2.1.197", capture_messages(), None, fixture_headers(True), 0, 0.0)
    ]
    for spec in SESSIONS:
        if only and spec.name not in only:
            continue
        if spec.dialect == "responses":
            path = out / f"{spec.name}.jsonl"
            with path.open("w", encoding="utf-8") as f:
                for t, body in codex_requests(generated(spec, facts), spec):
                    line = dumps_line(t, codex.headers(spec.seed), body)
                    f.write(line[:-1] + ', "path": "/v1/responses"}\n')
            written.append(path)
            continue
        headers = fixture_headers(spec.context_1m)
        headers["x-claude-code-session-id"] = str(uuid.UUID(int=spec.seed, version=4))
        jobs.append((spec.name, [], spec.model, headers, spec.seed, spec.cold_gap_p))
    for name, msgs, model, headers, seed, cold_p in jobs:
        if only and name not in only:
            continue
        if not msgs:
            msgs = generated(next(s for s in SESSIONS if s.name == name), facts)
        path = out / f"{name}.jsonl"
        with path.open("w", encoding="utf-8") as f:
            for t, body in requests(msgs, model, seed, cold_p):
                f.write(dumps_line(t, headers, body) + "\n")
        written.append(path)
    return written


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--only", action="append", help="a session name (repeatable)")
    args = p.parse_args()
    for path in write(args.out, args.only):
        print(path, path.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
