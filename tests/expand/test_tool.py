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

from cg.expand.tool import (
    MAX_EXPANSION_CHARS,
    TOOL_JSON,
    TOOL_NAME,
    declares,
    forces_tool_choice,
    inject_reason,
    markers,
    names_tool,
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
    "anthropic": "21fc13d40b5136d61fa4f5bd76f0127ed87866e196939d630c54a2c1055f82ec",
    "openai": "e916de3321523a5ce736c4e2359498fae924c3fcb929cbc7dcd7ecbe75cb2c8b",
    "responses": "63d7e7fbad9d4ad9af618ac7d93fcf5d9c09bc83c5cda037aa8c6ba379b24736",
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
    assert text.startswith(f"The 3 messages that the summary <<cg:{stashed}>> replaced, verbatim")
    for n, src in enumerate(SOURCES):
        assert f"\n\n[{n}] {src}" in text  # each message's exact bytes
    assert "no longer available" not in text
    assert resolve(store, stashed, None) == text  # unscoped: any session's stash


def test_resolve_an_unknown_id_or_another_sessions(store: Store, stashed: str) -> None:
    for key, session in ((OTHER, SESSION), (stashed, "sess-b"), ("not-a-key", SESSION)):
        text = resolve(store, key, session)
        assert "is no longer available" in text, (key, session)
        assert repr(key) in text
        assert SOURCES[0] not in text


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
    assert capped.endswith(
        "\n\n[… 7 more messages not shown: the expansion is capped at 3500 characters]"
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
