"""The facts of a transcript, per dialect, on real bodies and on anything at all."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cg.retention.facts import (
    exit_status,
    first_error,
    is_human,
    message_facts,
    transcript_facts,
)
from cg.retention.measure import request_facts
from cg.wire.body import index_body
from cg.wire.dialects import DIALECTS

SHARED = Path(__file__).resolve().parents[2] / "tests" / "fixtures"
CODEX = SHARED / "codex-0.169.0"


def _codex(name: str) -> bytes:
    return str(json.loads((CODEX / name).read_text())["body"]).encode()


def test_a_real_claude_code_body_yields_its_task_and_every_command() -> None:
    raw = (SHARED / "claude_code_2.1.197_turn16.json").read_bytes()
    facts = request_facts(index_body(raw, DIALECTS["anthropic"]))
    kinds = [f.kind for f in facts]
    assert kinds.count("user") == 1 and kinds.count("command") == 15
    # Claude Code's <system-reminder> blocks in the same user turn are the agent's, not facts.
    assert not any("system-reminder" in f.text for f in facts)
    assert all(f.tool == "Bash" for f in facts.values() if f.kind == "command")


def test_a_real_codex_body_yields_commands_with_their_exit_status() -> None:
    facts = request_facts(index_body(_codex("middle.json"), DIALECTS["responses"]))
    commands = [f for f in facts.values() if f.kind == "command"]
    assert len(commands) == 7 and {c.status for c in commands} == {0}
    users = [f.text for f in facts.values() if f.kind == "user"]
    # The <environment_context> item is Codex's wrapper; the human's request is the fact.
    assert users == [
        "Run a few shell commands step by step to look around this folder, then summarise "
        "what you found."
    ]


def test_a_codex_apply_patch_header_is_a_file() -> None:
    facts = request_facts(
        index_body(_codex("default_model_additional_tools.json"), DIALECTS["responses"])
    )
    assert [f.text for f in facts if f.kind == "file"] == ["fake_step_6.txt"]


def test_anthropic_tool_calls_outputs_and_statuses_link_up() -> None:
    msgs: list[Any] = [
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "t1",
                    "name": "Bash",
                    "input": {"command": "pytest -q\n# second line", "description": "run"},
                },
                {"type": "tool_use", "id": "t2", "name": "Write", "input": {"file_path": "/a.py"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [
                        {"type": "text", "text": "collected 3\nE   TypeError: bad\nExit code 2"}
                    ],
                },
                {"type": "tool_result", "tool_use_id": "t2", "content": "written"},
            ],
        },
    ]
    found = transcript_facts("anthropic", msgs)
    by = {(f.kind, f.text): f for f in found}
    assert by[("command", "pytest -q")].status == 2
    assert by[("file", "/a.py")].tool == "Write" and by[("file", "/a.py")].at == 0
    assert by[("error", "E   TypeError: bad")].tool == "Bash"
    assert by[("error", "E   TypeError: bad")].at == 1
    assert len(found) == 3  # the bare exit status is not a fact


def test_openai_list_commands_are_joined_and_tool_messages_read() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "shell", "arguments": '{"command": ["bash", "-lc", "make"]}'}}  # fmt: skip
    msgs = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Build it, and do not push anything."}],
        },
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "make: *** [all] Error 1"},
    ]
    found = transcript_facts("openai", msgs)
    assert [(f.kind, f.text) for f in found] == [
        ("user", "Build it, and do not push anything."),
        ("command", "bash -lc make"),
        ("error", "make: *** [all] Error 1"),
    ]


def test_short_wrapped_and_summary_texts_are_not_human() -> None:
    assert not is_human("ok, go on")  # under 20 characters
    assert not is_human("<system-reminder>\nYou must be brief and exact.\n</system-reminder>")
    assert not is_human("=== History Summary ===\n<summary>\nwhat happened so far\n</summary>")
    assert is_human("<b>bold</b> please keep the html as it is")
    assert is_human("<foo>an unknown tag is still the human's text</foo>")


def test_error_lines_and_statuses() -> None:
    assert first_error("ok\nall fine\n") is None
    assert (
        first_error("a\nTraceback (most recent call last):\n  x")
        == "Traceback (most recent call last):"
    )
    assert first_error("x" * 500 + " failed") == ("x" * 500 + " failed")[:200]
    assert exit_status("Process exited with code 0\n") == 0
    assert exit_status('{"exit_code": 3}') == 3
    assert exit_status("Exit code: 127") == 127
    assert exit_status("no status here") is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=30),
    lambda kids: (
        st.lists(kids, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "role",
                    "content",
                    "type",
                    "text",
                    "input",
                    "command",
                    "path",
                    "tool_calls",
                    "function",
                    "arguments",
                    "output",
                    "call_id",
                    "tool_use_id",
                    "name",
                ]
            ),
            kids,
            max_size=5,
        )
    ),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["anthropic", "openai", "responses", "unknown"]), json_values)
def test_any_message_at_all_yields_facts_or_none_and_never_raises(dialect: str, v: Any) -> None:
    for f in message_facts(dialect, v, 7):
        assert f.kind in ("user", "file", "command", "error") and f.at == 7
        assert isinstance(f.text, str)
        if f.kind in ("command", "error") and f.text:
            assert len(f.text) <= 200 and "\n" not in f.text
