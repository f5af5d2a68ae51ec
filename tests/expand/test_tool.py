"""cg.expand.tool: markers, the injection decision, appending the tool byte-preservingly, resolving ids.

Stores are real SQLite files under tmp_path (a `:memory:` store does not persist, and `auto`
injection must refuse it).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from cg.expand.tool import (
    MAX_EXPANSION_CHARS,
    TOOL_JSON,
    TOOL_NAME,
    declares,
    forces_tool_choice,
    inject_reason,
    markers,
    named_key,
    names_tool,
    not_an_id,
    parse_id,
    render_message,
    render_stash,
    resolve,
    tool_insertion,
)
from cg.pipeline.contract import RequestContext, Step
from cg.pipeline.rewrite import ExpandPolicy, rewrite_body
from cg.state import Store, memory
from cg.state.records import stash_key
from cg.state.sqlite import SqliteStore
from cg.wire.body import index_body
from cg.wire.dialects import DIALECTS
from cg.wire.splice import Insert, Keep, Plan
from tests.e2e.harness import message_sources

KEY = "0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba98"
SESSION = "sess-a"
SOURCES = [
    '{"role":"user","content":"Run the tests. caf\\u00e9 \\"q\\""}',
    '{"role":"assistant","content":[{"type":"text","text":"ok 😀"},'
    '{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"cmd":"pytest -x"}}]}',
    '{\n  "role": "user",\n  "content": [{"type":"tool_result","tool_use_id":"toolu_1",'
    '"content":"1 failed: test_parse"}]\n}',
]
ANTHROPIC_TOOLS = [{"name": "Bash", "input_schema": {"type": "object"}}]
OPENAI_TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with SqliteStore(tmp_path / "cg.sqlite3") as st:
        yield st


@pytest.fixture
def stashed(store: Store) -> str:
    """The key of SOURCES stashed for SESSION."""
    key = stash_key(SOURCES)
    store.put_stash(key, SESSION, SOURCES, "anthropic")
    return key


# -- markers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        f"see <<cg:{KEY}>> here",
        f'"text":"x \\u003c\\u003ccg:{KEY}\\u003e\\u003e y"',
        f"\\u003C\\u003Ccg:{KEY}\\u003E\\u003E",  # upper-case hex digits
        f"\\u003c\\u003Ccg:{KEY}\\u003E\\u003e",  # mixed case
        f"<\\u003ccg:{KEY}\\u003e>",  # mixed spellings
        f"\\u003c<cg:{KEY}>\\u003E",
    ],
)
def test_a_marker_is_found_in_every_spelling(raw: str) -> None:
    assert list(markers(raw)) == [KEY]
    assert list(markers(raw.encode())) == [KEY]


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "no marker at all",
        f"<cg:{KEY}>>",  # one bracket short
        f"<<cg:{KEY}>",
        f"<<CG:{KEY}>>",  # the tag is lower case
        f"<<cg {KEY}>>",
        f"<<cg:{KEY.upper()}>>",  # keys are lower-case hex
        f"<<cg:{KEY[:-1]}>>",  # 23 digits
        f"<<cg:{KEY}0>>",  # 25 digits
        f"<<cg:{KEY[:-1]}g>>",
        f"\\u003c\\u003ccg:{KEY}\\u003e",  # escaped, one closing bracket short
        f"\\u003d\\u003dcg:{KEY}\\u003f\\u003f",  # escapes of other characters
        "⟪cg⟫",  # the `summary` mode sentinel is not resolvable
        f"<< cg:{KEY} >>",
    ],
)
def test_near_misses_are_not_markers(raw: str) -> None:
    assert list(markers(raw)) == []
    assert list(markers(raw.encode())) == []


def test_markers_come_in_order_of_appearance_with_repeats() -> None:
    raw = f"<<cg:{OTHER}>> and \\u003c\\u003ccg:{KEY}\\u003e\\u003e and <<cg:{OTHER}>>"
    assert list(markers(raw)) == [OTHER, KEY, OTHER]


def test_markers_in_invalid_utf8_bytes_still_found() -> None:
    assert list(markers(b"\xff\xfe <<cg:" + KEY.encode() + b">> \xc3")) == [KEY]


def test_a_granular_id_is_never_a_marker() -> None:
    """`KEY#N` is an id, never a marker: a summary's marker is the bare `<<cg:KEY>>`, and the
    span's answer labels each message with the id that fetches it alone."""
    assert list(markers(f"<<cg:{KEY}>>")) == [KEY]  # the vacuity guard
    for raw in (f"<<cg:{KEY}#1>>", f"\\u003c\\u003ccg:{KEY}#12\\u003e\\u003e", f"[{KEY}#1]"):
        assert list(markers(raw)) == [], raw
        assert list(markers(raw.encode())) == [], raw
    assert list(markers(f"<<cg:{KEY}>>#1")) == [KEY]  # a marker, then text
    assert all(list(markers(text)) == [] for text in TOOL_JSON.values())


# -- ids: KEY and KEY#N ------------------------------------------------------------------------

HEX = "0123456789abcdef"
DIGITS = "0123456789"


def oracle(s: str) -> tuple[str, int | None] | None:
    """The id grammar spelt out by hand: 24 lower-case hex digits, then nothing, or `#` and 1 to
    6 ASCII digits."""
    key, rest = s[:24], s[24:]
    if len(key) != 24 or any(c not in HEX for c in key):
        return None
    if rest == "":
        return key, None
    n = rest[1:]
    if rest[0] != "#" or not 1 <= len(n) <= 6 or any(c not in DIGITS for c in n):
        return None
    return key, int(n)


KEYS = hs.text(HEX, min_size=24, max_size=24)
# Near misses: the characters an id is made of and the ones next to them (upper-case hex, other
# digits of Unicode, signs, space, line ends, a second `#`).
NEAR = hs.text(HEX + "ABCDEFG#-+. \n\r\t\x00١٣０", max_size=12)


# Any text; a key and a near miss; a key and a well-formed `#N` (so the accepting side is
# reached, not only the refusing one), then perhaps one character more.
IDS = hs.one_of(
    hs.text(),
    hs.builds(str.__add__, KEYS, NEAR),
    hs.builds(lambda k, d, t: f"{k}#{d}{t}", KEYS, hs.text(DIGITS, min_size=1, max_size=7), NEAR),
)


@given(IDS)
@settings(max_examples=400)
def test_parse_id_is_exactly_the_grammar(s: str) -> None:
    assert parse_id(s) == oracle(s)
    assert named_key(s) == (s[:24] if oracle(s[:24]) and s[24:25] in ("", "#") else None)
    if parse_id(s) is not None:
        assert named_key(s) == parse_id(s)[0]  # type: ignore[index]


@given(KEYS, hs.integers(1, 999_999), hs.integers(0, 5))
def test_parse_id_reads_every_n_it_accepts(key: str, n: int, pad: int) -> None:
    assert parse_id(key) == (key, None)
    digits = str(n).zfill(min(6, len(str(n)) + pad))
    assert parse_id(f"{key}#{digits}") == (key, n)
    seven = (str(n) + "0" * 7)[:7]
    assert parse_id(f"{key}#{seven}") is None  # seven digits: no N


@pytest.mark.parametrize(
    "bad",
    [
        None,
        7,
        KEY.encode(),
        [KEY],
        f"{KEY}#",
        f"{KEY}#-1",
        f"{KEY}#+1",
        f"{KEY}#1234567",
        f"{KEY}#1\n",
        f"{KEY}\n",
        f"{KEY}#١",  # an Arabic-Indic digit: `int()` would read it, the grammar does not
        f"{KEY}#1#2",
        f"{KEY}#0x1",
        f"{KEY}#{'9' * 5000}",
        f"{KEY.upper()}#1",
        f"#{KEY}",
    ],
)
def test_parse_id_refuses(bad: Any) -> None:
    assert parse_id(bad) is None


# -- tool_choice -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dialect", "choice", "forced"),
    [
        ("anthropic", None, False),
        ("anthropic", {"type": "auto"}, False),
        ("anthropic", {"type": "auto", "disable_parallel_tool_use": True}, False),
        ("anthropic", {"type": "any"}, True),
        ("anthropic", {"type": "tool", "name": "Bash"}, True),
        ("anthropic", {"type": "none"}, True),
        ("openai", None, False),
        ("openai", "auto", False),
        ("openai", "required", True),
        ("openai", "none", True),
        ("openai", {"type": "function", "function": {"name": "bash"}}, True),
    ],
)
def test_forces_tool_choice(dialect: str, choice: Any, forced: bool) -> None:
    assert forces_tool_choice(dialect, choice) is forced


# -- the injection decision --------------------------------------------------------------------


def decide(
    mode: Any = "auto",
    dialect: str = "anthropic",
    tools: Any = "default",
    choice: Any = None,
    sent: str | bytes = "",
    store: Store | None = None,
    session: str = SESSION,
) -> tuple[bool, str]:
    if tools == "default":
        tools = ANTHROPIC_TOOLS if dialect == "anthropic" else OPENAI_TOOLS
    return inject_reason(mode, dialect, tools, choice, sent, store, session)


def test_inject_when_a_marker_resolves_in_this_session(store: Store, stashed: str) -> None:
    sent = f'{{"messages":[{{"role":"user","content":"<<cg:{stashed}>>"}}]}}'
    assert decide(sent=sent, store=store) == (True, f"marker {stashed} resolves")
    assert decide(dialect="openai", sent=sent.encode(), store=store)[0] is True


def test_inject_reason_every_refusal(tmp_path: Path, store: Store, stashed: str) -> None:
    sent = f"<<cg:{stashed}>>"
    assert decide(store=store, sent=sent)[0] is True  # the baseline every case departs from
    assert decide("never", store=store, sent=sent) == (False, "cg_expand_inject: never")
    declared = [*ANTHROPIC_TOOLS, json.loads(TOOL_JSON["anthropic"])]
    assert decide(tools=declared, store=store, sent=sent) == (
        False,
        "the request already declares the tool",
    )
    assert decide(choice={"type": "any"}, store=store, sent=sent) == (
        False,
        "tool_choice forces a choice",
    )
    no_tools: list[Any] = [None, []]
    for tools in no_tools:
        assert decide(tools=tools, store=store, sent=sent) == (
            False,
            "the request declares no tools",
        )
    with memory() as mem:
        mem.put_stash(stashed, SESSION, SOURCES, "anthropic")
        assert mem.has_stash(stashed, SESSION)
        assert decide(store=mem, sent=sent) == (False, "the store does not persist")
    assert decide(store=None, sent=sent) == (False, "the store does not persist")
    assert decide(store=store, sent="no marker here") == (False, "no resolvable marker")
    # A marker of another session's stash, and a marker of nothing, do not resolve here.
    assert decide(store=store, sent=sent, session="sess-b") == (False, "no resolvable marker")
    assert decide(store=store, sent=f"<<cg:{OTHER}>>") == (False, "no resolvable marker")


def test_always_injects_without_tools_marker_or_store() -> None:
    assert decide("always", tools=None) == (True, "cg_expand_inject: always")
    assert decide("always", dialect="openai", tools=[]) == (True, "cg_expand_inject: always")
    # ... but never over a forcing tool_choice, nor twice.
    assert decide("always", dialect="openai", choice="required")[0] is False
    assert decide("always", tools=[json.loads(TOOL_JSON["anthropic"])])[0] is False


@pytest.mark.parametrize("dialect", ["anthropic", "openai"])
def test_injection_is_idempotent(dialect: str, store: Store, stashed: str) -> None:
    tools = ANTHROPIC_TOOLS if dialect == "anthropic" else OPENAI_TOOLS
    body = json.dumps(
        {"model": "m", "tools": tools, "messages": [{"role": "user", "content": "hi"}]}
    )
    once = _with_tool(body, dialect)
    again = json.loads(once)["tools"]
    assert declares(dialect, again)
    assert decide(dialect=dialect, tools=again, store=store, sent=f"<<cg:{stashed}>>") == (
        False,
        "the request already declares the tool",
    )


# -- appending the tool --------------------------------------------------------------------------

A = TOOL_JSON["anthropic"]
MSGS = '"messages":[{"role":"user","content":"hi"}]'

# (body, expected with @ standing for the tool's bytes)
APPEND_CASES = {
    "compact": (
        '{"model":"m","tools":[{"name":"Bash","input_schema":{}}],' + MSGS + "}",
        '{"model":"m","tools":[{"name":"Bash","input_schema":{}},@],' + MSGS + "}",
    ),
    "pretty": (
        '{\n  "model": "m",\n  "tools": [\n    {\n      "name": "Bash"\n    },\n'
        '    {"name": "Read"}\n  ],\n  ' + MSGS + "\n}\n",
        '{\n  "model": "m",\n  "tools": [\n    {\n      "name": "Bash"\n    },\n'
        '    {"name": "Read"},@\n  ],\n  ' + MSGS + "\n}\n",
    ),
    "empty": ('{"tools":[],' + MSGS + "}", '{"tools":[@],' + MSGS + "}"),
    "blank": ('{"tools":[ ],' + MSGS + "}", '{"tools":[@ ],' + MSGS + "}"),
    "blank-lines": ('{"tools":[\n\n],' + MSGS + "}", '{"tools":[@\n\n],' + MSGS + "}"),
    "after-messages": (
        "{" + MSGS + ',"tools":[{"name":"Bash"}] ,"x":[]}',
        "{" + MSGS + ',"tools":[{"name":"Bash"},@] ,"x":[]}',
    ),
    "missing": ('{"model":"m",' + MSGS + "}", '{"model":"m",' + MSGS + ',"tools":[@]}'),
    "missing-pretty": (
        '{\n  "model": "m",\n  ' + MSGS + "\n}\n\n",
        '{\n  "model": "m",\n  ' + MSGS + '\n,"tools":[@]}\n\n',
    ),
    # Characters that are not bytes before, in and after the array: offsets are bytes.
    "non-ascii": (
        '{"model":"mé🎉","tools":[{"name":"Bash"}],"messages":[{"role":"user","content":"日本"}],'
        '"system":"ça","tools2":[{"name":"🎉"} ]}',
        '{"model":"mé🎉","tools":[{"name":"Bash"},@],"messages":[{"role":"user","content":"日本"}],'
        '"system":"ça","tools2":[{"name":"🎉"} ]}',
    ),
    "non-ascii-after": (
        '{"messages":[{"role":"user","content":"日本"}],"system":"ça 🎉","tools":[{"name":"é"} ]}',
        '{"messages":[{"role":"user","content":"日本"}],"system":"ça 🎉","tools":[{"name":"é"},@ ]}',
    ),
}


def _with_tool(body: str, dialect: str = "anthropic") -> str:
    """`body` with the tool put where `tool_insertion` says, in its bytes."""
    raw = body.encode()
    at, part = tool_insertion(index_body(raw, DIALECTS[dialect]))
    return (raw[:at] + part + raw[at:]).decode()


def test_the_tool_goes_in_at_the_same_bytes_on_a_warm_index() -> None:
    """A next turn's index (segments shared with the last turn's text, its byte offsets
    inherited) puts the tool where a body read whole does, past non-ASCII text."""
    from cg.wire.body import MessageCache

    head = '{"model":"mé🎉","messages":['
    tail = '],"system":"ça 🎉","tools":[{"name":"é"} ]}'
    msgs = ['{"role":"user","content":"日本"}', '{"role":"assistant","content":"ok 🎉"}']
    cache = MessageCache()
    # The second turn inherits the first's offsets; the third repeats the second.
    for turn, k in enumerate((1, 2, 2)):
        raw = (head + ",".join([*msgs[:k], '{"role":"user","content":"é"}']) + tail).encode()
        warm = index_body(raw, DIALECTS["anthropic"], cache)
        assert (warm.shared >= 1) == (turn > 0) and not warm.chars.ascii
        assert tool_insertion(warm) == tool_insertion(index_body(raw, DIALECTS["anthropic"]))
        at, part = tool_insertion(warm)
        assert json.loads(raw[:at] + part + raw[at:])["tools"][-1]["name"] == TOOL_NAME


@pytest.mark.parametrize("case", list(APPEND_CASES))
def test_the_tool_goes_in_and_no_other_byte_changes(case: str) -> None:
    body, expected = APPEND_CASES[case]
    out = _with_tool(body)
    assert out == expected.replace("@", A)
    doc = json.loads(out)
    assert doc["tools"][-1] == json.loads(A)
    assert doc["tools"][:-1] == json.loads(body).get("tools", [])


# -- through rewrite_body (the `_inject` half) ----------------------------------------------------


class Summarize:
    """Cuts messages 1..n-2 and inserts a summary carrying `marker`, like `summarize` does."""

    name = "fake"

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def apply(self, req: RequestContext, plan: Plan) -> Step:
        n = len(req.index.messages)
        summary = Insert.message(
            {"role": "user", "content": f"=== History Summary === {self.marker}"},
            req.index.dialect,
        )
        return Step([Keep(0), summary, Keep(n - 1)], "summarized")


def anthropic_body(tools_first: bool, **extra: Any) -> bytes:
    msgs = [
        {"role": "user", "content": "task ✓"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "u2"},
        {"role": "assistant", "content": "a3"},
        {"role": "user", "content": "now"},
    ]
    doc: dict[str, Any] = {"model": "claude", "max_tokens": 9}
    if tools_first:
        doc["tools"] = ANTHROPIC_TOOLS
    doc["messages"] = msgs
    if not tools_first:
        doc["tools"] = ANTHROPIC_TOOLS
    doc.update(extra)
    return json.dumps(doc, ensure_ascii=False, indent=1).encode()


@pytest.mark.parametrize("tools_first", [True, False], ids=["tools-before", "tools-after"])
def test_rewrite_injects_after_the_splice(tools_first: bool, store: Store, stashed: str) -> None:
    raw = anthropic_body(tools_first)
    r = rewrite_body(
        raw,
        DIALECTS["anthropic"],
        [Summarize(f"<<cg:{stashed}>>")],
        headers={"x-context-guru-session": SESSION},
        expand=ExpandPolicy("auto", store),
    )
    assert r.outcome == "rewritten", r.record
    assert r.record["expand"] == {"injected": True, "reason": f"marker {stashed} resolves"}
    assert r.body is not None
    doc = json.loads(r.body)
    assert [t.get("name") for t in doc["tools"]] == ["Bash", TOOL_NAME]
    assert len(doc["messages"]) == 3
    # Outside `messages`, the tool's bytes and a comma are the only change; the kept messages
    # are the client's bytes.
    rpre, rmsgs, rpost = message_sources(raw)
    opre, omsgs, opost = message_sources(r.body)
    ins = b"," + A.encode()
    changed, same = (opre, rpre) if tools_first else (opost, rpost)
    assert (opost == rpost) if tools_first else (opre == rpre)
    assert changed.count(ins) == 1 and changed.replace(ins, b"", 1) == same
    assert (omsgs[0], omsgs[2]) == (rmsgs[0], rmsgs[4])


def test_rewrite_injects_with_no_component_acting_in_always_mode(store: Store) -> None:
    class Noop:
        name = "noop"

        def apply(self, req: RequestContext, plan: Plan) -> Step:
            return Step(plan, "nothing")

    raw = anthropic_body(True)
    r = rewrite_body(raw, DIALECTS["anthropic"], [Noop()], expand=ExpandPolicy("always", None))
    assert (r.outcome, r.record["reason"]) == ("rewritten", "expand tool injected")
    assert r.body is not None
    assert r.body.replace(b"," + A.encode(), b"", 1) == raw
    # `auto`: no marker, so the same request passes through untouched.
    r = rewrite_body(raw, DIALECTS["anthropic"], [Noop()], expand=ExpandPolicy("auto", store))
    assert (r.outcome, r.body) == ("passed_through", None)
    assert r.record["expand"] == {"injected": False, "reason": "no resolvable marker"}


@pytest.mark.parametrize("tools", ["null", "{}", '"x"', "3"])
def test_a_tools_member_that_is_not_an_array_is_never_appended_to(tools: str) -> None:
    """Found by this suite: `"tools": null` (OpenAI clients send it) got the tool written inside
    `null` (broken JSON) in `always` mode, caught only by the final check: a failed-open request
    and a warning every turn."""

    class Noop:
        name = "noop"

        def apply(self, req: RequestContext, plan: Plan) -> Step:
            return Step(plan, "nothing")

    raw = b'{"model":"g","messages":[{"role":"user","content":"hi"}],"tools":' + tools.encode()
    raw += b"}"
    r = rewrite_body(raw, DIALECTS["openai"], [Noop()], expand=ExpandPolicy("always", None))
    assert r.outcome == "passed_through", r.record
    assert r.body is None
    assert r.record["expand"] == {
        "injected": False,
        "reason": "the request's tools is not an array",
    }


# -- the tool's bytes ----------------------------------------------------------------------------

# Changing these bytes invalidates every user's provider prompt cache once: do it on purpose.
TOOL_SHA256 = {
    "anthropic": "51d7cdf8036558affe5fbc593eaca7e5e2a64e36a5e3830ea0611e8348512aeb",
    "openai": "e88f896e3e9e5ce5cd121b3fbdfd010f665c8ad53b19627b25ccb6e73e2d0d84",
    "responses": "5cf3f32e8e7b4182d1c134eaf344a8a3ae92f027c7d8f25306e2d9c762ebadf9",
    "gemini": "06cd230a94a9bd6540e004f3ab153f81f60aa8c0358ebf3666f5f38a9b428347",
}


def test_tool_json_bytes_are_constant() -> None:
    for dialect, text in TOOL_JSON.items():
        assert hashlib.sha256(text.encode()).hexdigest() == TOOL_SHA256[dialect], dialect
        assert json.dumps(json.loads(text), separators=(",", ":")) == text  # compact, canonical
        assert text.isascii()
    assert json.loads(TOOL_JSON["anthropic"])["name"] == TOOL_NAME
    assert json.loads(TOOL_JSON["openai"])["function"]["name"] == TOOL_NAME
    assert (
        json.loads(TOOL_JSON["openai"])["function"]["parameters"]
        == (json.loads(TOOL_JSON["anthropic"])["input_schema"])
    )
    # The same bytes in another process with another hash seed.
    code = "import json, cg.expand.tool as e; print(json.dumps(e.TOOL_JSON))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
        cwd=Path(__file__).resolve().parents[2],
    ).stdout
    assert json.loads(out) == TOOL_JSON


# -- resolving ids -------------------------------------------------------------------------------


def test_resolve_a_real_stash(store: Store, stashed: str) -> None:
    text = resolve(store, stashed, SESSION)
    assert text.startswith(
        f"The 3 messages that the summary <<cg:{stashed}>> replaced, verbatim (each as its "
        f"original JSON; {stashed}#N fetches the N-th alone):"
    )
    # Each message's exact bytes, under the 1-based id that fetches it alone.
    assert text.split("\n\n")[1:] == [f"[{stashed}#{n}] {src}" for n, src in enumerate(SOURCES, 1)]
    assert "no longer available" not in text
    assert resolve(store, stashed, None) == text  # unscoped: any session's stash


def test_resolve_an_unknown_id_or_another_sessions(store: Store, stashed: str) -> None:
    for key, session in ((OTHER, SESSION), (stashed, "sess-b")):
        text = resolve(store, key, session)
        assert "is no longer available" in text, (key, session)
        assert repr(key) in text
        assert SOURCES[0] not in text


@pytest.mark.parametrize("bad", ["not-a-key", "", f"#{KEY}", f" {KEY}#1", KEY.upper() + "#1"])
def test_resolve_an_id_that_names_no_stash(bad: str) -> None:
    class Untouchable:
        persistent = True

        def get_stash(self, *a: Any) -> None:
            raise AssertionError("an id that names no stash reached the store")

    text = resolve(Untouchable(), bad, SESSION)  # type: ignore[arg-type]
    assert text == not_an_id(bad)
    assert "is not a context-guru id" in text and "ID#N" in text


# -- KEY#N: one message -----------------------------------------------------------------------


def test_resolve_one_message_answers_it_alone(store: Store, stashed: str) -> None:
    whole = resolve(store, stashed, SESSION)
    assert all(src in whole for src in SOURCES)  # the vacuity guard: the span has all three
    for n, src in enumerate(SOURCES, 1):
        text = resolve(store, f"{stashed}#{n}", SESSION)
        assert text == (
            f"Message {n} of 3 that the summary <<cg:{stashed}>> replaced, verbatim (its original "
            f"JSON):\n\n{src}"
        )
        assert [other for other in SOURCES if other in text] == [src]
    # Zero-padded digits are the same message (the grammar is 1 to 6 digits).
    assert resolve(store, f"{stashed}#002", SESSION) == resolve(store, f"{stashed}#2", SESSION)
    assert resolve(store, f"{stashed}#2", None) == resolve(store, f"{stashed}#2", SESSION)


@pytest.mark.parametrize(
    "suffix", ["0", "4", "999999", "000000", "-1", "x", "1234567", "", "1.5", " 1", "1 ", "١", "#1"]
)
def test_a_message_the_stash_does_not_hold_is_answered_with_its_size(
    store: Store, stashed: str, suffix: str
) -> None:
    text = resolve(store, f"{stashed}#{suffix}", SESSION)
    assert text.startswith(f"context_guru_expand: {f'{stashed}#{suffix}'!r} is not a message")
    assert f"it holds 3 messages, {stashed}#1 to {stashed}#3" in text
    assert not any(src in text for src in SOURCES)


def test_an_absurd_suffix_is_answered_briefly(store: Store, stashed: str) -> None:
    text = resolve(store, f"{stashed}#" + "9" * 100_000, SESSION)
    assert "it holds 3 messages" in text and len(text) < 400


@pytest.mark.parametrize("suffix", ["1", "0", "4", "x", ""])
def test_another_sessions_message_is_no_longer_available_as_its_span(
    store: Store, stashed: str, suffix: str
) -> None:
    ident = f"{stashed}#{suffix}"
    assert "verbatim" in resolve(store, f"{stashed}#1", SESSION)  # the vacuity guard
    text = resolve(store, ident, "sess-b")
    never = resolve(store, f"{OTHER}#{suffix}", "sess-b")
    assert "is no longer available" in text
    assert text == never.replace(OTHER, stashed)  # whether it exists, and its size, untold
    assert "3 messages" not in text


def test_one_message_on_a_store_that_does_not_persist() -> None:
    with memory() as mem:
        key = stash_key(SOURCES)
        mem.put_stash(key, SESSION, SOURCES, "anthropic")
        assert "is no longer available" in resolve(mem, f"{key}#1", SESSION)


def test_one_message_over_the_cap_is_shown_up_to_it(store: Store) -> None:
    big = [json.dumps({"role": "user", "content": "x" * 5000}), '{"role":"user","content":"y"}']
    key = stash_key(big)
    store.put_stash(key, SESSION, big, "openai")
    stash = store.get_stash(key, SESSION)
    assert stash is not None
    assert render_message(stash, 1) == (
        f"Message 1 of 2 that the summary <<cg:{key}>> replaced, verbatim (its original JSON):"
        f"\n\n{big[0]}"
    )
    capped = render_message(stash, 1, cap=1000)
    assert capped.endswith(
        f"\n\n[… the message is {len(big[0])} characters: only its first 1000 are shown]"
    )
    assert big[0][:1000] in capped and big[0][:1001] not in capped
    assert render_message(stash, 2, cap=1000).endswith("\n\n" + big[1])  # under it: whole


def test_resolve_an_expired_stash(tmp_path: Path) -> None:
    t = [1_000_000.0]
    with SqliteStore(tmp_path / "cg.sqlite3", ttl_hours=1, now=lambda: t[0]) as st:
        key = stash_key(SOURCES)
        st.put_stash(key, SESSION, SOURCES, "anthropic")
        assert "verbatim" in resolve(st, key, SESSION)
        t[0] += 2 * 3600
        st.evict()
        assert "is no longer available" in resolve(st, key, SESSION)


def test_resolve_on_a_store_that_does_not_persist() -> None:
    with memory() as mem:
        key = stash_key(SOURCES)
        mem.put_stash(key, SESSION, SOURCES, "anthropic")
        assert "is no longer available" in resolve(mem, key, SESSION)


def test_render_stash_caps_the_expansion(store: Store) -> None:
    big = [json.dumps({"role": "user", "content": f"{i} " + "x" * 1000}) for i in range(10)]
    key = stash_key(big)
    store.put_stash(key, SESSION, big, "openai")
    stash = store.get_stash(key, SESSION)
    assert stash is not None
    full = render_stash(stash)
    assert all(src in full for src in big) and "not shown" not in full
    capped = render_stash(stash, cap=3500)
    shown = [src for src in big if src in capped]
    assert shown == big[:3]
    assert f"\n\n[{key}#3] {big[2]}" in capped  # the last shown, then what fetches the rest
    assert capped.endswith(
        "\n\n[… 7 more messages not shown: the expansion is capped at 3500 characters; "
        f"fetch one as {key}#N]"
    )
    assert len(capped.rsplit("\n\n[…", 1)[0]) <= 3500
    assert MAX_EXPANSION_CHARS == 200_000


@pytest.mark.parametrize(
    ("data", "named"),
    [
        (b'{"name":"context_guru_expand"}', True),
        (rb'{"name":"context\u005fguru_expand"}', True),
        (rb'{"name":"\u0063ontext\u005Fguru\u005fexpand"}', True),
        (b'{"name":"context_guru_expan"}', False),
        (rb'{"text":"caf\u00e9","name":"Bash"}', False),  # an escape, but not of our name
        (b"", False),
    ],
)
def test_names_tool_finds_the_name_however_json_spells_it(data: bytes, named: bool) -> None:
    assert names_tool(data) is named
    assert names_tool(bytearray(data)) is named  # the gate reads a bytearray
