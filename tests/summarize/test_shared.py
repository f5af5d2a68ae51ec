"""cg.summarize.shared: the shared-cache summarizer request, built from the commissioning request
as forwarded — byte-identical but the appended instruction and the output limits — over real
Claude Code captures and OpenAI transcripts, with the span located in the forwarded body's own
terms (roll-forwards included)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cg.state.sqlite import SqliteStore
from cg.summarize.component import Commission
from cg.summarize.prompt import MAX_TOKENS, SUMMARY_HEADER, build_instruction
from cg.summarize.shared import Layout, SharedRequest, build, forces_a_tool, output_limits
from cg.wire.body import index_body
from cg.wire.dialects import DIALECTS
from tests.support.shared_request import split_shared
from tests.support.transcripts import (
    CC16,
    cc_dumps,
    config,
    fixture_body,
    grow,
    make,
    openai_transcript,
    record,
    two_turns,
)

Json = Any


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(tmp_path / "cg.sqlite3")
    yield s
    s.close()


def commissioned(
    store: SqliteStore, raw: bytes, dialect: str = "anthropic", **cfg: Any
) -> Commission:
    """The one job the component commissions for `raw` (a vacuity guard if none)."""
    d = make(config(**cfg), store, dialect)
    d.send(raw)
    assert len(d.pending) == 1
    return d.pending[0]


def built(job: Commission, raw: bytes, **kw: Any) -> SharedRequest:
    out = build(raw, job.dialect, job.layouts, **kw)
    assert isinstance(out, SharedRequest), out
    return out


def messages(raw: bytes) -> list[Json]:
    msgs: list[Json] = json.loads(raw)["messages"]
    return msgs


# -- byte identity -----------------------------------------------------------------------------


def test_a_claude_code_request_is_kept_byte_for_byte_but_the_instruction_and_max_tokens(store):
    body = grow(fixture_body(CC16), 3)[-1]
    raw = cc_dumps(body)
    job = commissioned(store, raw)
    out = built(job, raw)
    ask, changed = split_shared(raw, out.body, "anthropic")
    # Claude Code thinks (adaptive) with max_tokens 64000: a larger limit than a summary needs,
    # already known to fit, so it stays; system, tools, thinking, cache_control all untouched.
    assert body["thinking"] == {"type": "adaptive"} and body["max_tokens"] == 64000
    assert changed == {} and out.changed == {}
    assert ask == {"role": "user", "content": ask["content"]}
    assert "cache_control" not in ask
    sent = json.loads(out.body)
    for key in ("system", "tools", "thinking", "stream", "metadata", "context_management"):
        assert sent[key] == body[key], key
    assert raw.count(b'"cache_control"') == out.body.count(b'"cache_control"') == 3
    n = len(body["messages"])
    assert out.layout == Layout(n, job.head, n - job.end)


def test_an_openai_request_is_kept_byte_for_byte_but_the_instruction(store):
    msgs = openai_transcript(30)
    body = {"model": "gpt-x", "messages": msgs, "tools": [{"type": "function", "function": {}}]}
    raw = json.dumps(body, indent=1).encode()  # pretty-printed: the separators must survive
    job = commissioned(store, raw, "openai", keep_first=2)
    ask, changed = split_shared(raw, built(job, raw).body, "openai")
    assert changed == {}
    assert ask["role"] == "user" and ask["content"].startswith("[context-guru]")
    assert b'},\n  {\n   "role": "user",\n   "content": "Now write' in raw  # vacuity: pretty


@pytest.mark.parametrize(
    ("members", "level", "changed"),
    [
        ({"max_tokens": 64}, "regular", {"max_tokens": 4096}),  # too short for a summary
        ({"max_tokens": 64000}, "concise", {"max_tokens": 2048}),  # room under the window
        ({"max_tokens": 4096}, "regular", {}),
        # thinking on: the agent's own limit (> budget_tokens, as the API requires) if larger
        (
            {"max_tokens": 32000, "thinking": {"type": "enabled", "budget_tokens": 31999}},
            "regular",
            {},
        ),
        (
            {"max_tokens": 2048, "thinking": {"type": "enabled", "budget_tokens": 1024}},
            "regular",
            {"max_tokens": 4096},
        ),
        ({"max_tokens": 64000, "thinking": {"type": "adaptive"}}, "highly_detailed", {}),
        ({"max_tokens": 64000, "thinking": {"type": "disabled"}}, "regular", {"max_tokens": 4096}),
        ({"max_tokens": 64, "stream": True}, "regular", {"max_tokens": 4096}),  # a stream stays
    ],
)
def test_anthropic_output_limits(members, level, changed):
    raw = json.dumps({"model": "m", **members, "messages": [{"role": "user", "content": "x"}]})
    index = index_body(raw.encode(), DIALECTS["anthropic"])
    assert output_limits("anthropic", index.members, level) == changed


@pytest.mark.parametrize(
    ("members", "changed"),
    [
        ({}, {}),
        ({"stream": True}, {"stream": False}),  # no stream_options: usage only without a stream
        ({"stream": True, "stream_options": {"include_usage": True}}, {}),
        ({"stream": False}, {}),
        ({"max_tokens": 64}, {"max_tokens": 4096}),
        ({"max_completion_tokens": 100000}, {}),  # never lowered: it includes reasoning
        (
            {"max_completion_tokens": 512, "stream": True},
            {"max_completion_tokens": 4096, "stream": False},
        ),
    ],
)
def test_openai_output_limits(members, changed):
    raw = json.dumps({"model": "m", **members, "messages": [{"role": "user", "content": "x"}]})
    index = index_body(raw.encode(), DIALECTS["openai"])
    assert output_limits("openai", index.members, "regular") == changed
    assert MAX_TOKENS["regular"] == 4096


def test_changed_members_are_replaced_in_place_wherever_they_sit(store):
    msgs = openai_transcript(12)
    # stream and max_tokens after messages, odd spacing around them: only their values change.
    raw = (
        '{"model":"gpt-x",  "messages":' + json.dumps(msgs) + ' , "stream" :  true,'
        '"max_tokens":\t64 }'
    ).encode()
    job = commissioned(store, raw, "openai", keep_first=2)
    out = built(job, raw)
    _, changed = split_shared(raw, out.body, "openai")
    assert changed == {"stream": False, "max_tokens": 4096}
    assert out.body.endswith(b' , "stream" :  false,"max_tokens":\t4096 }')


def test_thinking_tool_choice_and_cache_control_survive(store):
    body = grow(fixture_body(CC16), 2)[-1]
    body["tool_choice"] = {"type": "auto", "disable_parallel_tool_use": True}
    body["thinking"] = {"type": "enabled", "budget_tokens": 10000}
    body["max_tokens"] = 20000
    raw = cc_dumps(body)
    out = built(commissioned(store, raw), raw)
    _, changed = split_shared(raw, out.body, "anthropic")
    assert changed == {}  # 20000 > budget + a summary's 4096: the agent's limit is enough
    sent = json.loads(out.body)
    assert sent["tool_choice"] == body["tool_choice"] and sent["thinking"] == body["thinking"]


# -- when it refuses ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dialect", "choice", "forced"),
    [
        ("anthropic", {"type": "any"}, True),
        ("anthropic", {"type": "tool", "name": "Bash"}, True),
        ("anthropic", {"type": "auto"}, False),
        ("anthropic", {"type": "none"}, False),  # no tool at all: a text answer, as asked
        ("openai", "required", True),
        ("openai", {"type": "function", "function": {"name": "f"}}, True),
        ("openai", "auto", False),
        ("openai", "none", False),
        ("openai", None, False),
    ],
)
def test_forces_a_tool(dialect, choice, forced):
    assert forces_a_tool(dialect, choice) is forced


def test_a_forced_tool_choice_refuses_unless_told_to_share_anyway(store):
    body = grow(fixture_body(CC16), 2)[-1]
    body["tool_choice"] = {"type": "any"}
    raw = cc_dumps(body)
    job = commissioned(store, raw)
    assert "tool_choice forces a tool call" in str(build(raw, "anthropic", job.layouts))
    out = build(raw, "anthropic", job.layouts, refuse_forced_tool=False)
    assert isinstance(out, SharedRequest)


def test_a_body_that_does_not_match_the_commission_is_refused(store):
    body = grow(fixture_body(CC16), 2)[-1]
    raw = cc_dumps(body)
    job = commissioned(store, raw)
    fewer = cc_dumps({**body, "messages": body["messages"][:-2]})
    assert "do not match" in str(build(fewer, "anthropic", job.layouts))
    assert "cannot be read" in str(build(b"{nope", "anthropic", job.layouts))
    assert "do not match" in str(build(raw, "anthropic", ()))


# -- where the span is, in the forwarded body's terms ---------------------------------------------


def test_a_roll_forward_points_at_the_spliced_body_with_the_old_summary_in_the_span(store):
    turns = grow(fixture_body(CC16), 14, output_words=120)
    d = make(config(resummarize_tokens=1500), store)
    two_turns(d, turns[0], turns[1])
    for body in turns[2:]:
        r = d.send(body)
        if d.pending:
            break
    assert d.pending, "the checkpoint never rolled forward"
    assert r.body is not None and r.outcome == "rewritten"
    job = d.pending[0]
    at = record(r)["checkpoint"]["covered"][0]
    sent = messages(r.body)
    spliced, plain = job.layouts
    assert spliced == Layout(len(sent), job.head, len(job.transcript) - job.end, summary_at=at)
    assert plain == Layout(len(job.transcript), job.head, len(job.transcript) - job.end)
    out = built(job, r.body)  # the spliced body is what went upstream
    assert out.layout == spliced
    ask, _ = split_shared(r.body, out.body, "anthropic")
    text = ask["content"]
    assert f"after the first {'message' if at == 1 else f'{at} messages'}" in text
    assert f"begins with: [user] {SUMMARY_HEADER}" in text
    assert "includes an earlier summary" in text
    # Had the splice not gone out (fail open), the same job points at the client's body.
    raw = cc_dumps(body)
    assert built(job, raw).layout == plain
    assert (
        "earlier summary" not in split_shared(raw, built(job, raw).body, "anthropic")[0]["content"]
    )


# -- the instruction ---------------------------------------------------------------------------


def _view(role: str, text: str) -> Any:
    return DIALECTS["anthropic"].view({"role": role, "content": text})


def test_the_instruction_says_where_the_span_is_and_what_holds():
    text = build_instruction(
        head=2,
        tail=3,
        total=40,
        first=_view("assistant", "Let me read   the\nparser. " + "x" * 400),
        last=_view("user", "ok"),
        previous=False,
        level="concise",
        custom_prompt="Keep every file path.",
    )
    assert "after the first 2 messages and before the last 3 messages" in text
    assert "(messages 3 to 37 of the 40 above this one)" in text
    assert "begins with: [assistant] Let me read the parser. xxx" in text
    assert text.count("x") < 400  # the anchor is clipped
    assert "ends with: [user] ok" in text
    assert "Be concise" in text
    assert "<operator_instruction>\nKeep every file path.\n</operator_instruction>" in text
    assert text.index("<operator_instruction>") < text.index("## Rules that always hold")
    for rule in ("Never invent", "inside <summary>…</summary>", "call no tool"):
        assert rule in text.split("## Rules that always hold")[1]
    assert "earlier summary" not in text


def test_the_instruction_at_the_edges():
    one = _view("user", "only")
    text = build_instruction(head=0, tail=0, total=1, first=one, last=one, previous=True)
    assert "from the first message (messages 1 to 1 of the 1" in text
    assert "includes an earlier summary" in text
    assert "Operator instruction" not in text
    text = build_instruction(head=1, tail=1, total=3, first=one, last=one, previous=False)
    assert "after the first message and before the last message" in text
