"""The floor every summary message carries: the span's user messages verbatim and its artifact
trail with `KEY#N` ids, within their budgets, byte-stable, carried over on a roll-forward; and
what it buys: retention 1.0 of what the span held, whatever the model's summary says."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cg.retention.facts import Found
from cg.retention.measure import of_plan, request_facts
from cg.state.sqlite import SqliteStore
from cg.state.tokens import TokenCounter
from cg.summarize.floor import build_floor, span_facts
from cg.wire.body import index_body
from cg.wire.dialects import DIALECTS
from tests.support.transcripts import cc_dumps, config, make, out_messages, summary_of, two_turns

ANTHROPIC = DIALECTS["anthropic"]
Json = dict[str, Any]
CONSTRAINTS = [
    "Do not touch the migrations directory, whatever the tests say.",
    "Keep the public API of parser.py unchanged; callers depend on it.",
    "Use tabs, not spaces, in the Makefile — the CI lints it.",
]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(tmp_path / "cg.sqlite3")
    yield s
    s.close()


def _exchange(n: int, tool: str, args: Json, output: str) -> list[Json]:
    tid = f"toolu_floor{n:04d}"
    return [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": f"Step {n}."},
                {"type": "tool_use", "id": tid, "name": tool, "input": args},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": tid, "content": output}],
        },
    ]


def transcript(steps: int = 12, filler: int = 150) -> list[Json]:
    """A Claude Code-shaped session whose middle holds every kind of fact: the user's
    constraints mid-session, edits, commands with exit codes, errors in outputs."""
    msgs: list[Json] = [{"role": "user", "content": "Port the tokenizer to the new parser."}]
    pad = " ".join(f"w{k}" for k in range(filler))
    for n in range(steps):
        if n % 4 == 0:
            out = f"Exit code 1\nFAILED tests/test_tok.py::test_{n} - AssertionError\n{pad}"
            msgs += _exchange(n, "Bash", {"command": f"pytest -x tests/test_tok.py -k t{n}"}, out)
        elif n % 4 == 1:
            msgs += _exchange(n, "Edit", {"file_path": f"/src/tok{n}.py", "old_string": "a"}, pad)
        elif n % 4 == 2:
            msgs += _exchange(n, "Read", {"file_path": f"/src/tok{n - 1}.py"}, pad)
        else:
            msgs += _exchange(n, "Bash", {"command": f"make lint{n}\necho done"}, f"ok\n{pad}")
        if n in (2, 5, 8):
            # The human's constraint, typed mid-session (a user text beside the tool result).
            msgs[-1]["content"].append({"type": "text", "text": CONSTRAINTS[(n - 2) // 3]})
    msgs.append({"role": "assistant", "content": [{"type": "text", "text": "Working on it."}]})
    msgs.append({"role": "user", "content": "Carry on with the next file, please."})
    return msgs


def body(msgs: list[Json]) -> bytes:
    return cc_dumps({"model": "claude-sonnet-4-5", "max_tokens": 1024, "messages": msgs})


def summary_content(r: Any) -> str:
    i, _ = summary_of(r)
    content = out_messages(r)[i]["content"]
    return content if isinstance(content, str) else content[0]["text"]


def test_the_floor_keeps_every_fact_of_the_span_that_the_model_left_out(
    store: SqliteStore,
) -> None:
    raw = body(transcript())
    d = make(config(), store)
    r = two_turns(d, raw)
    text = summary_content(r)
    model_part = text[: text.index("</summary>")]
    index = index_body(raw, ANTHROPIC)
    facts = request_facts(index)
    span_facts_ = [f for f in facts.values() if 1 <= f.at < len(index.messages) - 3]
    # Vacuity guard: the span holds every kind, and the stand-in wrote none of them.
    assert {f.kind for f in span_facts_} == {"user", "file", "command", "error"}
    assert not any(f.text in model_part for f in span_facts_)
    for f in span_facts_:
        assert f.text in text, f
    assert all(c in text for c in CONSTRAINTS)
    assert "- pytest -x tests/test_tok.py -k t0 → exit 1" in text
    assert "/src/tok1.py (Edit, Read)" in text
    # What the agent still sees: every fact of the request.
    sent = index_body(r.body or b"", ANTHROPIC)
    assert of_plan(index, r.shape.plan if r.shape else []).ratio == 1.0
    assert len(sent.messages) < len(index.messages)


def test_each_trail_id_expands_to_the_message_that_holds_its_fact(store: SqliteStore) -> None:
    raw = body(transcript())
    r = two_turns(make(config(), store), raw)
    text = summary_content(r)
    key = re.search(r"<<cg:([0-9a-f]+)>>", text)
    assert key is not None
    stash = store.get_stash(key.group(1))
    assert stash is not None
    srcs = stash.sources()
    trail = text[text.index("<artifact_trail>") : text.index("</artifact_trail>")]
    lines = [ln for ln in trail.split("\n") if ln.startswith("- ")]
    assert len(lines) >= 8  # vacuity guard: the trail has entries to check
    for line in lines:
        ids = re.findall(rf"{key.group(1)}#(\d+)", line)
        assert ids, line
        fact = line[2:].split(" (")[0].split(" → ")[0].split(" [")[0]
        for n in ids:
            assert json.dumps(fact)[1:-1] in srcs[int(n) - 1], (line, n)


def test_user_messages_over_their_budget_leave_out_the_oldest_and_say_so() -> None:
    found = [Found("user", f"constraint number {k}: " + "x" * 200, k) for k in range(10)]
    count = TokenCounter().count_text
    one = count(f"[id K#1]\n{found[0].text}")
    text = build_floor(
        found, "K", keep_user_tokens=one * 3 + 1, keep_artifact_tokens=0, count=count
    )
    kept = [f.text for f in found if f.text in text]
    assert kept == [f.text for f in found[-3:]]
    assert (
        '[7 earlier user messages left out for length (call context_guru_expand with id "K"' in text
    )
    assert "<artifact_trail>" not in text


def test_a_zero_budget_turns_its_section_off() -> None:
    found = [Found("user", "a" * 40, 0), Found("file", "/a.py", 1, "Edit")]
    count = TokenCounter().count_text
    assert build_floor(found, "K", keep_user_tokens=0, keep_artifact_tokens=0, count=count) == ""
    only = build_floor(found, "K", keep_user_tokens=0, keep_artifact_tokens=100, count=count)
    assert "<user_messages>" not in only and "- /a.py (Edit) [K#2]" in only


def test_the_trail_over_its_budget_drops_the_oldest_entries() -> None:
    found = [Found("command", f"make target{k}", k, "Bash") for k in range(40)]
    count = TokenCounter().count_text
    text = build_floor(found, None, keep_user_tokens=0, keep_artifact_tokens=60, count=count)
    assert "- make target39" in text and "- make target0\n" not in text
    assert re.search(r"\[(\d+) older entries left out for length\]", text)
    assert "#" not in text  # no stash, no ids


def test_a_roll_forward_carries_the_earlier_spans_facts_over(store: SqliteStore) -> None:
    first = transcript(12)
    d = make(config(resummarize_tokens=500), store)
    r = two_turns(d, body(first))
    assert CONSTRAINTS[0] in summary_content(r)
    grown = [
        *first[:-1],
        {"role": "user", "content": "Next: the lexer. Never rename the Token class."},
    ]
    n = 12
    for k in range(8):
        grown += _exchange(n + k, "Bash", {"command": f"cargo build -p lex{k}"}, "w " * 300)
    grown.append({"role": "assistant", "content": [{"type": "text", "text": "Done."}]})
    grown.append({"role": "user", "content": "And the tests?"})
    r2 = d.send(body(grown))
    assert d.pending, r2.record  # vacuity guard: the roll-forward was commissioned
    job = d.pending[0]
    assert job.previous_summary is not None and len(job.span) < len(job.sources)
    assert d.drain() == ["completed"]
    r3 = d.send(body(grown))
    text = summary_content(r3)
    # The model saw only the new part; the floor covers the whole span, old facts included.
    assert all(c in text for c in CONSTRAINTS)
    assert "Next: the lexer. Never rename the Token class." in text
    assert "- cargo build -p lex0" in text
    r4 = d.send(body(grown))
    assert summary_of(r4)[1] == summary_of(r3)[1]  # byte-stable for the checkpoint's life


def test_an_expired_stash_keeps_the_floor(store: SqliteStore) -> None:
    raw = body(transcript())
    d = make(config(), store)
    r = two_turns(d, raw)
    before = summary_content(r)
    key = re.search(r"<<cg:([0-9a-f]+)>>", before)
    assert key is not None
    store.delete_stash(key.group(1))
    after = summary_content(d.send(raw))
    assert "the originals have expired" in after
    floor = before[before.index("</summary>") : before.index("\n[", before.index("</artifact"))]
    assert floor in after


@pytest.mark.parametrize("dialect", ["openai", "responses"])
def test_the_floor_is_read_in_every_dialect(dialect: str) -> None:
    if dialect == "openai":
        msgs: list[Json] = [
            {"role": "user", "content": "Please keep every log line under 80 columns."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "shell", "arguments": '{"cmd": ["ls", "-la"]}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "fatal: not a git repository"},
        ]
    else:
        msgs = [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Please keep every log line short."}],
            },
            {
                "type": "custom_tool_call",
                "call_id": "c1",
                "name": "apply_patch",
                "input": "*** Begin Patch\n*** Update File: src/log.rs\n@@\n*** End Patch",
            },
            {"type": "custom_tool_call_output", "call_id": "c1", "output": "Exit code: 0"},
        ]
    found = span_facts(dialect, [json.dumps(m) for m in msgs])
    text = build_floor(
        found, "K", keep_user_tokens=100, keep_artifact_tokens=100, count=TokenCounter().count_text
    )
    if dialect == "openai":
        assert "Please keep every log line under 80 columns.\n" in text
        assert "- ls -la [K#2]" in text and "- fatal: not a git repository [K#3]" in text
    else:
        assert "- src/log.rs (apply_patch) [K#2]" in text
        assert "[id K#1]\nPlease keep every log line short." in text
