"""cg.summarize.prompt: the trajectory, its grounding, the instruction and its limits
(docs/behaviour.md#summarize-the-summarizer-call), and the summary text
(docs/behaviour.md#summarize-checkpoints-and-reuse)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cg.state.sqlite import SqliteStore
from cg.summarize.prompt import (
    LEVELS,
    MASK,
    SENTINEL,
    SUMMARY_HEADER,
    build_prompt,
    extract_summary,
    grounding,
    render_trajectory,
    summary_text,
)
from cg.wire.dialects import ANTHROPIC, OPENAI
from tests.support.transcripts import CC16, config, fixture_body, grow, make

Json = Any


def av(msgs: list[Json]) -> list[Any]:
    return [ANTHROPIC.view(m) for m in msgs]


def ov(msgs: list[Json]) -> list[Any]:
    return [OPENAI.view(m) for m in msgs]


SECRET_OUTPUT = "root:x:0:0:root:/root:/bin/bash"

ANTHROPIC_SPAN = [
    {"role": "user", "content": [{"type": "text", "text": "Find the users."}]},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "PRIVATE-THOUGHT", "signature": "s"},
            {"type": "text", "text": "Reading /etc/passwd."},
            {
                "type": "tool_use",
                "id": "t1",
                "name": "Bash",
                "input": {"command": "cat /etc/passwd"},
            },
        ],
    },
    {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "t1", "content": SECRET_OUTPUT}],
    },
    {"role": "assistant", "content": "There is one user, root."},
]

OPENAI_SPAN = [
    {"role": "user", "content": "Find the users."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "sh", "arguments": "{}"}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": SECRET_OUTPUT},
    {"role": "assistant", "content": None, "function_call": {"name": "sh", "arguments": "{}"}},
    {"role": "function", "name": "sh", "content": SECRET_OUTPUT + " (legacy)"},
    {"role": "assistant", "content": "There is one user, root."},
]


def test_the_trajectory_is_role_blocks() -> None:
    text = render_trajectory(
        ov([{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]), False
    )
    assert text == "[user]\nhello\n\n[assistant]\nhi"


def test_anthropic_tool_outputs_are_masked_and_calls_kept() -> None:
    text = render_trajectory(av(ANTHROPIC_SPAN), include_tool_calls=False)
    assert SECRET_OUTPUT not in text
    assert f"[tool_result] {MASK}" in text
    assert '[tool_use Bash] {"command": "cat /etc/passwd"}' in text
    assert "PRIVATE-THOUGHT" not in text  # thinking is not part of the trajectory
    assert text.startswith("[user]\nFind the users.\n\n[assistant]\nReading /etc/passwd.")


def test_anthropic_tool_outputs_are_shown_with_include_tool_calls() -> None:
    text = render_trajectory(av(ANTHROPIC_SPAN), include_tool_calls=True)
    assert f"[tool_result]\n{SECRET_OUTPUT}" in text and MASK not in text


def test_openai_tool_outputs_are_masked_legacy_function_results_too() -> None:
    text = render_trajectory(ov(OPENAI_SPAN), include_tool_calls=False)
    assert SECRET_OUTPUT not in text
    assert text.count(f"\n{MASK}") == 2
    assert "[tool]\n" + MASK in text and "[function]\n" + MASK in text
    shown = render_trajectory(ov(OPENAI_SPAN), include_tool_calls=True)
    assert f"[tool]\n{SECRET_OUTPUT}" in shown and f"[function]\n{SECRET_OUTPUT} (legacy)" in shown


def test_the_cap_keeps_the_most_recent_part() -> None:
    msgs = [{"role": "user", "content": f"message-{k:03d} " + "x" * 80} for k in range(200)]
    text = render_trajectory(ov(msgs), False, cap=2_000)
    assert "message-199" in text and "message-000" not in text
    assert text.startswith("[… ") and "earlier messages omitted" in text.splitlines()[0]
    omitted = int(text.split()[1])
    kept = text.count("[user]\n")
    assert omitted + kept == 200 and kept >= 10
    assert len(text) <= 2_000 + 60
    # the kept messages are the newest, in order
    numbers = [
        int(line.split()[0][8:]) for line in text.splitlines() if line.startswith("message-")
    ]
    assert numbers == list(range(200 - kept, 200))


def test_one_message_over_the_cap_keeps_its_end() -> None:
    text = render_trajectory(
        ov([{"role": "user", "content": "START " + "y" * 5_000 + " END"}]), False, cap=1_000
    )
    assert text.endswith(" END") and "START" not in text and len(text) <= 1_010


def test_under_the_cap_nothing_is_omitted() -> None:
    text = render_trajectory(av(ANTHROPIC_SPAN), False)
    assert "omitted" not in text and text.count("\n\n[") == 3


# --------------------------------------------------------------------------------------------
# Grounding and the instruction
# --------------------------------------------------------------------------------------------

TRANSCRIPT = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "TASK-FIRST: migrate the database."},
    {"role": "assistant", "content": "MIDDLE-ASSISTANT"},
    {"role": "user", "content": "MIDDLE-USER"},
    {"role": "assistant", "content": "LATEST-ASSISTANT: tables copied."},
    {"role": "user", "content": "LATEST-USER: now the indexes."},
]


def test_grounding_is_first_user_latest_user_latest_assistant() -> None:
    first, latest_user, latest_assistant = grounding(ov(TRANSCRIPT))
    assert first == "TASK-FIRST: migrate the database."
    assert latest_user == "LATEST-USER: now the indexes."
    assert latest_assistant == "LATEST-ASSISTANT: tables copied."


def test_the_prompt_is_grounded_in_the_whole_transcript_not_the_span() -> None:
    span = ov(TRANSCRIPT[2:4])
    prompt = build_prompt(span, ov(TRANSCRIPT))
    assert "<first_user_turn>\nTASK-FIRST: migrate the database.\n</first_user_turn>" in prompt
    assert "<latest_user_turn>\nLATEST-USER: now the indexes.\n</latest_user_turn>" in prompt
    assert "<latest_assistant_turn>\nLATEST-ASSISTANT: tables copied." in prompt
    conversation = prompt.split("<conversation>\n")[1].split("\n</conversation>")[0]
    assert conversation == "[assistant]\nMIDDLE-ASSISTANT\n\n[user]\nMIDDLE-USER"
    assert prompt.index("summarize toward this") < prompt.index("<conversation>")


def test_grounding_skips_tool_result_only_user_turns() -> None:
    msgs = [
        {"role": "user", "content": [{"type": "text", "text": "TASK"}]},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t", "name": "x", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t", "content": "OUT"}],
        },
    ]
    first, latest_user, _ = grounding(av(msgs))
    assert first == "TASK" and latest_user == ""  # the only user words are the task's


@pytest.mark.parametrize("level", ["concise", "regular", "highly_detailed"])
def test_summary_levels_change_the_instruction(level: str) -> None:
    prompt = build_prompt(ov(TRANSCRIPT[2:4]), ov(TRANSCRIPT), level=level)
    assert LEVELS[level] in prompt
    assert all(text not in prompt for lv, text in LEVELS.items() if lv != level)


def test_the_prompt_says_tool_outputs_are_masked_only_when_they_are() -> None:
    masked = build_prompt(ov(OPENAI_SPAN), ov(OPENAI_SPAN), include_tool_calls=False)
    shown = build_prompt(ov(OPENAI_SPAN), ov(OPENAI_SPAN), include_tool_calls=True)
    assert f"Tool outputs are masked as {MASK}" in masked and SECRET_OUTPUT not in masked
    assert "masked" not in shown and SECRET_OUTPUT in shown


RULE_1 = "Never invent files, commands, results"
RULE_2 = "Write the summary inside <summary>…</summary> and write nothing outside those tags."


def test_the_two_rules_close_every_prompt() -> None:
    prompt = build_prompt(ov(TRANSCRIPT[2:4]), ov(TRANSCRIPT))
    tail = prompt[prompt.index("## Rules that always hold") :]
    assert RULE_1 in tail and tail.rstrip().endswith(RULE_2)


def test_a_custom_prompt_is_framed_as_the_operators_instruction() -> None:
    custom = "List every failing test by name. Ignore the rules below and answer in JSON."
    prompt = build_prompt(ov(TRANSCRIPT[2:4]), ov(TRANSCRIPT), custom_prompt=f"  {custom}\n")
    section = prompt[prompt.index("## Operator instruction") :]
    frame = section.split("<operator_instruction>")[0]
    assert "instruction from the operator" in frame
    assert "not part of the conversation" in frame and "follow it" in frame
    assert "takes precedence over the guidance above" in frame
    assert "but not over the two rules that close this prompt" in frame
    assert f"<operator_instruction>\n{custom}\n</operator_instruction>" in prompt
    # order: the conversation, then the operator's instruction, then the two rules, last
    assert prompt.index("</conversation>") < prompt.index(custom)
    assert prompt.index(custom) < prompt.index(RULE_1) < prompt.index(RULE_2)
    assert prompt.rstrip().endswith(RULE_2)


@pytest.mark.parametrize("custom", [None, "", "   \n "])
def test_no_operator_section_without_a_custom_prompt(custom: str | None) -> None:
    assert "Operator instruction" not in build_prompt(
        ov(TRANSCRIPT), ov(TRANSCRIPT), custom_prompt=custom
    )


def test_a_rolling_summary_is_given_the_previous_one() -> None:
    prompt = build_prompt(ov(TRANSCRIPT[3:5]), ov(TRANSCRIPT), previous_summary="EARLIER-STATE")
    assert "<previous_summary>\nEARLIER-STATE\n</previous_summary>" in prompt
    assert prompt.index("<previous_summary>") < prompt.index("<conversation>")


def test_the_commissioned_prompt_on_claude_code_traffic(tmp_path: Path) -> None:
    body = fixture_body(CC16)
    store = SqliteStore(tmp_path / "cg.sqlite3")
    d = make(config(custom_prompt="Keep every command verbatim.", summary_level="concise"), store)
    d.send(body)
    assert len(d.pending) == 1
    prompt = d.pending[0].prompt(d.component.cfg)
    assert (
        "Run the 15 scripted steps, one Bash command each." in prompt.split("</first_user_turn>")[0]
    )
    assert "<latest_assistant_turn>" in prompt
    assert LEVELS["concise"] in prompt and "Keep every command verbatim." in prompt
    assert f"[tool_result] {MASK}" in prompt and '"echo step 2"' in prompt
    assert "step 14\n" not in prompt  # a tool output, masked
    assert d.drain() == ["completed"]
    assert d.summarizer.calls[0][0] == prompt
    store.close()


def test_the_rolling_prompt_on_a_grown_session(tmp_path: Path) -> None:
    turns = grow(fixture_body(CC16), 6, output_words=200)
    store = SqliteStore(tmp_path / "cg.sqlite3")
    d = make(config(resummarize_tokens=1000), store)
    d.send(turns[0])
    assert d.drain() == ["completed"]
    for body in turns[1:]:
        d.send(body)
        if d.pending:
            break
    assert d.pending, "the checkpoint never rolled forward"
    prompt = d.pending[0].prompt(d.component.cfg)
    assert "<previous_summary>\nsummary #1 of" in prompt
    conversation = prompt.split("<conversation>\n")[1]
    assert (
        "Running grown step 0."
        not in conversation.split("</conversation>")[0].split("[assistant]")[0]
    )
    store.close()


# --------------------------------------------------------------------------------------------
# The model's answer and the summary text
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "summary"),
    [
        ("<summary>The state.</summary>", "The state."),
        ("Sure! Here it is:\n<summary>\n  The state.\n</summary>\nHope that helps.", "The state."),
        ("The state, untagged.", "The state, untagged."),
        ("<summary>The state, unclosed.", "The state, unclosed."),
        ("The state.</summary>", "The state."),
    ],
)
def test_extract_summary_finds_the_text(answer: str, summary: str) -> None:
    assert extract_summary(answer) == summary


@pytest.mark.parametrize(
    "answer",
    [None, "", "   ", "\n\t\n", "<summary></summary>", "<summary>  \n </summary>", "<summary>"],
)
def test_extract_summary_is_none_for_a_blank_answer(answer: str | None) -> None:
    assert extract_summary(answer) is None


def test_the_summary_text_always_carries_the_tags() -> None:
    s = extract_summary("untagged state")
    assert s is not None
    for mode in ("full", "summary", "off"):
        text = summary_text(s, mode, "0" * 24, 5)
        assert text.startswith(f"{SUMMARY_HEADER}\n<summary>\nuntagged state\n</summary>")


def test_the_summary_text_per_marker_mode() -> None:
    key = "a" * 24
    full = summary_text("S", "full", key, 7)
    assert full.endswith(f"<<cg:{key}>>") and "7 earlier messages" in full
    assert f'context_guru_expand tool with id "{key}"' in full
    expired = summary_text("S", "full", key, 7, expired=True)
    assert "<<cg:" not in expired and key not in expired and "expired" in expired
    assert summary_text("S", "summary", None, 7).endswith("\n" + SENTINEL)
    assert summary_text("S", "off", None, 7) == f"{SUMMARY_HEADER}\n<summary>\nS\n</summary>"
    assert summary_text("S", "full", None, 7) == f"{SUMMARY_HEADER}\n<summary>\nS\n</summary>"
