"""Granular expand ids (`KEY#N`, docs/behaviour.md#expand) on both store engines (`target`: a
real SQLite file, and a fresh database on the suite's PostgreSQL server; tests/conftest.py):
the N-th message read back byte for byte from a store opened anew, an N the stash lacks answered
with its size, another tenant's or session's `KEY#N` no longer available exactly as its `KEY`, and
the CLI reading one message from either engine, and the ids the summary's floor writes
(`cg.summarize.floor`) naming the messages their facts are in.

A stash is stored as its messages' sources (`Stash.sources()`), so neither engine's schema knows
about `#N`: what is shown here is that the N-th source each engine gives back is the N-th put.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cg.cli import main
from cg.expand.tool import resolve
from cg.state.records import stash_key
from cg.state.tenant import ANONYMOUS, fingerprint
from cg.summarize.floor import build_floor, span_facts
from tests.state.test_store import Target, make

# Escapes, non-ASCII, a line separator, irregular whitespace, a nested array: bytes that a parse
# and re-encode would change.
SOURCES = [
    '{"role": "user", "content": "caf\\u00e9 \\ud83d\\ude00 \\"quoted\\" \\n"}',
    '{"role":"assistant","content":[{"type":"text","text":"café 😀 \u2028 tab\\t"},'
    '{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"cmd":"ls -la"}}]}',
    '{\n  "role": "user",\n  "content": [{"type":"tool_result","tool_use_id":"toolu_1",'
    '"content":"total 0\\n-rw-r--r-- a.py"}]\n}',
]
# A Responses span: its input items (a call and its output are two items).
ITEMS = [
    '{"type":"message","role":"user","content":[{"type":"input_text","text":"list"}]}',
    '{"type":"function_call","call_id":"c1","name":"exec_command","arguments":"{\\"cmd\\":\\"ls\\"}"}',
    '{"type":"function_call_output","call_id":"c1","output":"a.py\\nb.py"}',
    '{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"gAAA=="}',
]
SECRET = b"k" * 32
K1 = fingerprint(SECRET, {"x-api-key": "sk-user-one"})
K2 = fingerprint(SECRET, {"x-api-key": "sk-user-two"})
SESSION = "sess-a"


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    if request.param == "sqlite":
        return tmp_path / "sub" / "cg.sqlite3"
    url: str = request.getfixturevalue("pg_url")
    return url


def one(key: str, n: int, count: int, source: str) -> str:
    """The tool's answer to `key#n`."""
    return (
        f"Message {n} of {count} that the summary <<cg:{key}>> replaced, verbatim (its original "
        f"JSON):\n\n{source}"
    )


@pytest.mark.parametrize(
    ("span", "dialect"),
    [(SOURCES, "anthropic"), (ITEMS, "responses")],
    ids=["anthropic", "responses"],
)
def test_each_message_reads_back_alone_from_a_store_opened_anew(
    target: Target, span: list[str], dialect: str
) -> None:
    key = stash_key(span)
    with make(target) as st:
        st.put_stash(key, SESSION, span, dialect, K1)
    with make(target) as st:  # what the engine wrote, not what a process kept
        assert resolve(st, key, SESSION, K1) == (  # the vacuity guard: the span, whole
            f"The {len(span)} messages that the summary <<cg:{key}>> replaced, verbatim (each as "
            f"its original JSON; {key}#N fetches the N-th alone):"
            + "".join(f"\n\n[{key}#{n}] {src}" for n, src in enumerate(span, 1))
        )
        for n, src in enumerate(span, 1):
            text = resolve(st, f"{key}#{n}", SESSION, K1)
            assert text == one(key, n, len(span), src), n
            assert [s for s in span if s in text] == [src]
        held = f"it holds {len(span)} messages, {key}#1 to {key}#{len(span)}"
        for bad in ("0", str(len(span) + 1), "999999", "-1", "x", "1234567", ""):
            text = resolve(st, f"{key}#{bad}", SESSION, K1)
            assert held in text, bad
            assert not any(s in text for s in span)


def test_another_tenants_or_sessions_message_is_no_longer_available(target: Target) -> None:
    key, never = stash_key(SOURCES), "f" * 24
    with make(target) as st:
        st.put_stash(key, SESSION, SOURCES, "anthropic", K1)
        # The guard: the owner (and the operator, tenant None) read every message.
        assert resolve(st, f"{key}#2", SESSION, K1) == one(key, 2, 3, SOURCES[1])
        assert resolve(st, f"{key}#2", None) == one(key, 2, 3, SOURCES[1])
        for suffix in ("", "#1", "#3", "#0", "#4", "#x"):
            for session, tenant in ((SESSION, K2), (SESSION, ANONYMOUS), ("sess-b", K1)):
                text = resolve(st, key + suffix, session, tenant)
                gone = resolve(st, never + suffix, session, tenant)
                assert "is no longer available" in text, (suffix, session, tenant)
                assert text == gone.replace(never, key)  # as an id that never existed
                assert "3 messages" not in text and not any(s in text for s in SOURCES)


def test_the_cli_prints_one_message_from_either_engine(
    target: Target,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # nothing may touch ~/.context-guru
    key = stash_key(ITEMS)
    with make(target) as st:
        st.put_stash(key, SESSION, ITEMS, "responses", K1)
    assert main(["expand", f"{key}#2", "--db", str(target), "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert json.loads(out) == {
        "id": f"{key}#2",
        "session": SESSION,
        "n": 2,
        "message": json.loads(ITEMS[1]),
    }
    assert main(["expand", f"{key}#5", "--db", str(target)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err == f"{key}#5: the stash holds 4 messages, {key}#1 to {key}#4\n"


def test_the_ids_the_floor_writes_fetch_the_messages_their_facts_are_in(target: Target) -> None:
    """The floor (`cg.summarize.floor`) ends each fact with the `KEY#N` of its message: each id
    it writes resolves, on either engine, to the one message that holds that fact."""
    span = [
        json.dumps(m, ensure_ascii=False)
        for m in [
            {"role": "user", "content": "Fix the tokenizer but never touch migrations/ — ever."},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "t1",
                        "name": "Edit",
                        "input": {"file_path": "tok.py"},
                    }
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "ValueError: bad token"}
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "t2", "name": "Bash", "input": {"command": "pytest"}}
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t2", "content": "1 failed\nexit code 1"}
                ],
            },
        ]
    ]
    key = stash_key(span)
    found = span_facts("anthropic", span)
    assert {f.kind for f in found} == {"user", "file", "command", "error"}  # the guard
    floor = build_floor(found, key, keep_user_tokens=8000, keep_artifact_tokens=4000, count=len)
    written = set(re.findall(rf"{key}#[0-9]+", floor))
    assert written == {f"{key}#{f.at + 1}" for f in found}  # every fact's id, and only those
    with make(target) as st:
        st.put_stash(key, SESSION, span, "anthropic", K1)
        for f in found:
            text = resolve(st, f"{key}#{f.at + 1}", SESSION, K1)
            assert text == one(key, f.at + 1, len(span), span[f.at])
            assert f.text in json.dumps(json.loads(span[f.at]), ensure_ascii=False), f
