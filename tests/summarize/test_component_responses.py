"""The `summarize` component on Responses traffic: real Codex 0.169.0 requests grown turn by turn
(reasoning, calls, outputs, as Codex re-sends them), through `rewrite_body` with the component
alone and an in-process fake summarizer — the summary item's shape, its byte-identical reuse,
what is kept, the stash, Codex's own compaction, the input passed through untouched, sessions and
the expand tool."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cg.expand.tool import TOOL_JSON, TOOL_NAME
from cg.pipeline.rewrite import ExpandPolicy, Rewrite, rewrite_body
from cg.proxy.agents import codex_compaction
from cg.state.sqlite import SqliteStore
from cg.summarize.component import conversation_key
from cg.summarize.prompt import SUMMARY_HEADER
from cg.wire.body import index_body
from cg.wire.dialects import RESPONSES
from cg.wire.shape import validate_shape
from tests.support.transcripts import MARKER_RE, config, make, record, two_turns
from tests.wire.test_responses import FIXTURES, fixture

Json = Any
COMPACTION = {"x-codex-turn-metadata": json.dumps({"request_kind": "compaction"})}


def codex_round(n: int, words: int = 80) -> list[Json]:
    """One Codex tool round as Codex re-sends it: reasoning, a function call, its output."""
    cid = f"call_grown{n:04d}"
    return [
        {
            "type": "reasoning",
            "id": f"rs_grown{n:04d}",
            "summary": [{"type": "summary_text", "text": f"**Step {n}**"}],
            "content": None,
            "encrypted_content": f"gAAAA{n:06d}",
        },
        {
            "type": "function_call",
            "status": "completed",
            "id": f"fc_grown{n:04d}",
            "name": "exec_command",
            "arguments": json.dumps({"cmd": f"echo grown {n}"}),
            "call_id": cid,
        },
        {
            "type": "function_call_output",
            "id": f"fco_grown{n:04d}",
            "call_id": cid,
            "output": " ".join(f"line{n}-{k}" for k in range(words)),
        },
    ]


def grow(name: str, turns: int, words: int = 80) -> list[bytes]:
    """The bodies of `turns` further requests after a fixture, one round each (an output of
    `words` words); every body's input is a byte prefix of the next one's, as Codex sends
    them."""
    base = json.loads(json.loads((FIXTURES / f"{name}.json").read_text())["body"])
    items = list(base["input"])
    out: list[bytes] = []
    for n in range(turns):
        items = items + codex_round(n, words)
        out.append(json.dumps({**base, "input": items}, separators=(",", ":")).encode())
    return out


def items(raw: bytes) -> list[Json]:
    out: list[Json] = json.loads(raw)["input"]
    return out


def summary_item(r: Rewrite) -> tuple[int, Json]:
    assert r.body is not None, r.record
    found = [
        (i, it)
        for i, it in enumerate(items(r.body))
        if it.get("type") == "message" and SUMMARY_HEADER in json.dumps(it)
    ]
    assert len(found) == 1, found
    return found[0]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(tmp_path / "cg.sqlite3")
    yield s
    s.close()


def codex_config(**over: Any) -> Any:
    return config(keep_first=2, keep_last=3, **over)


def test_a_codex_session_is_summarized_and_the_summary_reused_byte_identically(
    store: SqliteStore,
) -> None:
    turns = grow("middle", 8)
    d = make(codex_config(), store, dialect="responses")
    first = two_turns(d, turns[0], turns[1])
    i, summary = summary_item(first)
    # The summary: one typed user message item with one input_text part, ending in the marker.
    assert set(summary) == {"type", "role", "content"}
    assert (summary["type"], summary["role"]) == ("message", "user")
    (part,) = summary["content"]
    assert part["type"] == "input_text" and part["text"].startswith(SUMMARY_HEADER)
    key = MARKER_RE.search(part["text"])
    assert key is not None
    # Kept byte for byte: the two developer items, the environment turn and the task (head 4).
    src = index_body(turns[1], RESPONSES)
    out = index_body(first.body or b"", RESPONSES)
    assert i == 4
    assert [out.source(k) for k in range(4)] == [src.source(k) for k in range(4)]
    tail = len(out.messages) - i - 1
    assert [out.source(k) for k in range(i + 1, len(out.messages))] == [
        src.source(k) for k in range(len(src.messages) - tail, len(src.messages))
    ]
    # The stash restores the span exactly: head + stash + tail == the input.
    stash = store.get_stash(key.group(1))
    assert stash is not None and stash.dialect == "responses"
    assert [out.source(k) for k in range(i)] + stash.sources() + [
        out.source(k) for k in range(i + 1, len(out.messages))
    ] == [src.source(k) for k in range(len(src.messages))]
    assert validate_shape(out.views, RESPONSES) == []
    raw_summary = out.source(i)
    for body in turns[2:]:
        r = d.send(body)
        assert r.outcome == "rewritten", r.record
        again = index_body(r.body or b"", RESPONSES)
        assert again.source(i) == raw_summary  # the same bytes, every turn
        assert record(r)["reused"] is True
        assert not d.pending
    assert len(d.summarizer.calls) == 1


def test_the_additional_tools_session_keeps_its_tools_item_and_system_prompt(
    store: SqliteStore,
) -> None:
    turns = grow("default_model_additional_tools", 3)
    d = make(codex_config(), store, dialect="responses")
    r = two_turns(d, turns[0], turns[1])
    i, _ = summary_item(r)
    assert i == 7  # additional_tools + 4 developer items, then the environment turn and the task
    assert items(r.body or b"")[0]["type"] == "additional_tools"
    assert items(r.body or b"")[:7] == items(turns[1])[:7]


def test_codexs_own_compaction_passes_through_and_invalidates_the_checkpoint(
    store: SqliteStore,
) -> None:
    turns = grow("middle", 4)
    d = make(codex_config(), store, dialect="responses")
    two_turns(d, turns[0], turns[1])
    conv = conversation_key(
        "sess-1", d.component.facts.of(index_body(turns[1], RESPONSES), 0).digest
    )
    assert store.get_checkpoint(conv) is not None  # guard: there was one to invalidate
    compaction = dict(COMPACTION)
    reason = codex_compaction(compaction)
    assert reason is not None
    r = rewrite_body(
        turns[2],
        RESPONSES,
        [d.component],
        headers={"x-context-guru-session": "sess-1", **compaction},
        agent_compaction=reason,
    )
    assert r.outcome == "passed_through" and r.body is None
    assert r.record["reason"] == reason
    assert r.record["invalidated"] == [f"checkpoint of {conv}"]
    assert store.get_checkpoint(conv) is None
    assert not r.commissions
    after = d.send(turns[3])
    assert after.outcome == "passed_through"  # nothing to splice until a new summary
    assert "checkpoint" not in record(after) or record(after)["checkpoint"] != "reused"


def test_the_real_compaction_request_is_recognised_and_a_normal_turn_is_not() -> None:
    for name, kind in (("own_compaction_call", "compaction"), ("after_own_compaction", "turn")):
        doc = json.loads((FIXTURES / f"{name}.json").read_text())
        headers = {k: v for k, v in doc["headers"]}
        assert json.loads(headers["x-codex-turn-metadata"])["request_kind"] == kind
        assert (codex_compaction(headers) is not None) == (kind == "compaction")
    assert codex_compaction({"x-codex-turn-metadata": "{not json"}) is None


@pytest.mark.parametrize(
    "breakage,why",
    [
        (
            lambda its: (
                [*its, {"type": "function_call_output", "call_id": "call_x", "output": "o"}]
            ),
            "the input already breaks paired-tool-result: No tool call found for function call "
            "output with call_id call_x.",
        ),
        (
            lambda its: its[:-1],  # the last output gone: its call unanswered
            "the input already breaks answered-tool-use: No tool output found for function call",
        ),
        (
            lambda its: its + its[-3:],  # the last round again: duplicate ids
            "the input already breaks unique-ids: Duplicate item found with id rs_grown0003.",
        ),
        (
            lambda its: [*its, its[-3]],  # a reasoning item left last
            "the input already breaks unique-ids",
        ),
    ],
)
def test_input_that_already_breaks_a_rule_passes_through_untouched(
    store: SqliteStore, breakage: Any, why: str
) -> None:
    turns = grow("middle", 4)
    d = make(codex_config(), store, dialect="responses")
    two_turns(d, turns[0], turns[1])  # guard: this session does get rewritten
    doc = json.loads(turns[3])
    doc["input"] = breakage(doc["input"])
    raw = json.dumps(doc).encode()
    r = d.send(raw)
    assert r.outcome == "passed_through" and r.body is None
    assert r.record["reason"].startswith(why), r.record["reason"]
    assert r.record["input_violations"]
    assert not d.pending


def test_sessions_come_from_codexs_session_id_header_then_prompt_cache_key(
    store: SqliteStore,
) -> None:
    raw = fixture("middle")
    d = make(codex_config(), store, dialect="responses", session=None)
    r = d.send(raw, **{"session-id": "01a22c54-411d-7d33-a708-9561f201632e"})
    assert r.record["session"] == "01a22c54-411d-7d33-a708-9561f201632e"
    r = d.send(raw)
    assert r.record["session"] == json.loads(raw)["prompt_cache_key"]
    doc = json.loads(raw)
    del doc["prompt_cache_key"]
    r = d.send(json.dumps(doc).encode())
    assert r.record["session"].startswith("h:")


def test_the_expand_tool_is_appended_in_the_responses_shape_with_constant_bytes(
    store: SqliteStore,
) -> None:
    turns = grow("middle", 5)
    d = make(codex_config(), store, dialect="responses")
    two_turns(d, turns[0], turns[1])
    policy = ExpandPolicy("auto", store)
    sent: list[bytes] = []
    for body in turns[2:]:
        r = rewrite_body(
            body,
            RESPONSES,
            [d.component],
            headers={"x-context-guru-session": "sess-1"},
            expand=policy,
        )
        assert r.outcome == "rewritten" and r.body is not None
        assert r.record["expand"]["injected"] is True
        tools = json.loads(r.body)["tools"]
        assert tools[:-1] == json.loads(body)["tools"]
        assert tools[-1]["name"] == TOOL_NAME and tools[-1]["type"] == "function"
        sent.append(r.body)
    for body in sent:
        assert body.count(TOOL_JSON["responses"].encode()) == 1


def test_the_expand_tool_is_not_injected_when_tools_live_in_an_additional_tools_item(
    store: SqliteStore,
) -> None:
    turns = grow("default_model_additional_tools", 3)
    d = make(codex_config(), store, dialect="responses")
    two_turns(d, turns[0], turns[1])
    for mode in ("auto", "always"):
        r = rewrite_body(
            turns[2],
            RESPONSES,
            [d.component],
            headers={"x-context-guru-session": "sess-1"},
            expand=ExpandPolicy(mode, store),
        )
        assert r.outcome == "rewritten" and r.body is not None  # the summary still splices
        assert r.record["expand"] == {
            "injected": False,
            "reason": "the tools live in an additional_tools item, not in tools",
        }
        assert b'"context_guru_expand"' not in r.body.replace(b"context_guru_expand tool", b"")
        assert "tools" not in json.loads(r.body)


@pytest.mark.parametrize(
    "doc,why",
    [
        ({"model": "m", "input": "hi", "tools": []}, "'input' is a string"),
        ({"model": "m", "input": [], "previous_response_id": "resp_1"}, "previous_response_id"),
    ],
)
def test_requests_without_visible_history_pass_through_with_the_reason(
    store: SqliteStore, doc: Json, why: str
) -> None:
    d = make(codex_config(), store, dialect="responses")
    r = d.send(json.dumps(doc).encode())
    assert r.outcome == "passed_through" and r.body is None
    assert why in r.record["reason"]
