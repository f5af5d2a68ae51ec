"""The probes (cg/eval/probes.py): what is asked, how it names its fact without giving it away,
and the exact-match score."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from cg.eval.probes import correct, normalise, question, span_probes, tool_calls, user_prefix
from cg.retention.facts import USER_MIN_CHARS, Found

WORDS = st.text(alphabet="abcdefghij'", min_size=1, max_size=8)


@given(st.lists(WORDS, min_size=1, max_size=12), st.sampled_from([" ", "  ", "\n", "\t "]))
def test_a_user_question_never_holds_the_whole_message(words: list[str], sep: str) -> None:
    text = sep.join(words)
    if len(text) < USER_MIN_CHARS:
        text = text + "x" * USER_MIN_CHARS
    prefix = user_prefix(text)
    assert prefix and normalise(text).startswith(normalise(prefix))
    assert len(normalise(prefix)) < len(normalise(text))
    q = question(Found("user", text, 3), None, 0)
    assert q is not None and normalise(text) not in normalise(q)


def test_the_score_is_exact_match_with_whitespace_and_colour_normalised() -> None:
    assert correct("a  b\nc", "It was: a b c.")
    assert correct("\x1b[31mE   TypeError: x\x1b[0m", "E TypeError: x")
    assert not correct("src/app/a.py", "src/app/b.py")
    assert not correct("", "anything")  # nothing to match is never right


def _anthropic(n: int) -> list[Any]:
    """A transcript: the task, then n rounds alternating Read and Bash calls, each output of a
    Bash call failing."""
    out: list[Any] = [{"role": "user", "content": "The task: fix the parser, keep tests green."}]
    for r in range(n):
        tool = ("Read", "Bash")[r % 2]
        args = {"file_path": f"/a/f{r}.py"} if tool == "Read" else {"command": f"make t{r}\nx"}
        out.append(
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": f"t{r}", "name": tool, "input": args}],
            }
        )
        text = f"error: build {r} failed" if tool == "Bash" else "ok"
        out.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": f"t{r}", "content": text},
                    {"type": "text", "text": f"Round {r} done, please go on with the next step"},
                ],
            }
        )
    return out


def test_probes_ask_for_the_span_s_facts_by_tool_and_ordinal() -> None:
    msgs = _anthropic(8)
    span = range(5, 13)  # rounds 2..5 (messages 5..12)
    probes = span_probes("anthropic", msgs, span, 100, "s")
    assert probes and all(p.at in span for p in probes)
    by = {p.expected: p for p in probes}
    # Round 2 is the 2nd Read (f2), round 3 the 2nd Bash (t3).
    assert "2nd call of the `Read` tool" in by["/a/f2.py"].question
    assert "2nd call of the `Bash` tool" in by["make t3"].question
    assert "2nd call of the `Bash` tool" in by["error: build 3 failed"].question
    assert by["make t3"].kind == "command" and by["/a/f2.py"].kind == "file"
    assert "Round 2 done" in by["Round 2 done, please go on with the next step"].question
    # Nothing of the head or the tail; the answer never in its own question (but the user's
    # first words).
    assert "/a/f0.py" not in by and "make t7" not in by
    assert all(p.expected not in p.question for p in probes)


def test_probes_are_spread_over_the_kinds_and_chosen_by_the_seed() -> None:
    msgs = _anthropic(20)
    span = range(1, 40)
    a = span_probes("anthropic", msgs, span, 8, "one")
    assert [p.kind for p in a] == ["user", "file", "command", "error"] * 2
    assert a == span_probes("anthropic", msgs, span, 8, "one")  # deterministic
    assert a != span_probes("anthropic", msgs, span, 8, "two")


def test_a_fact_first_seen_before_the_span_is_not_probed() -> None:
    msgs = _anthropic(4)
    again = json.loads(json.dumps(msgs[1]))
    again["content"][0]["id"] = "t9"
    msgs[5] = again  # the span's call reads the head's file once more
    msgs[6]["content"][0]["tool_use_id"] = "t9"
    probes = span_probes("anthropic", msgs, range(5, 9), 100, "s")
    assert "/a/f0.py" not in {p.expected for p in probes}
    assert probes  # (the span has facts of its own)


def test_tool_calls_per_dialect() -> None:
    openai = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "sh", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    assert list(tool_calls("openai", openai)) == [("sh", "c1", 1)]
    responses = [
        {"type": "message", "role": "user", "content": "go"},
        {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
        {"type": "local_shell_call", "call_id": "c2", "action": {"command": ["ls"]}},
    ]
    assert list(tool_calls("responses", responses)) == [
        ("shell", "c1", 1),
        ("local_shell", "c2", 2),  # (a call with no name: its type, as the dialect names it)
    ]
