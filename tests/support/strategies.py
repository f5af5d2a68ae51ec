"""Shared hypothesis strategies: valid transcripts in both dialects, serialised many ways.

`bodies()` draws a `Sample`: a request body as a Python object and as JSON text written by a
tiny serialiser of our own (`dumps`), which can produce compact, indented and oddly spaced
output, `\\u` escapes (ensure_ascii, HTML-style `\\u003c`, random needless escapes, even in keys),
escaped slashes and non-ASCII text. The transcripts obey docs/behaviour.md#shape-rules, so a test
can break them on purpose (`mutated_messages`) and know what it broke.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any, Literal

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

SETTINGS = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

Dialect = Literal["anthropic", "openai"]
DIALECT_NAMES: list[Dialect] = ["anthropic", "openai"]
AnyDialect = Literal["anthropic", "openai", "responses"]
Json = Any

# --------------------------------------------------------------------------------------------
# Serialiser
# --------------------------------------------------------------------------------------------

Layout = Literal["compact", "spaced", "indent", "odd"]
_ODD_WS = ["", " ", "  ", "\t", "\n", "\r\n", "\n\t ", " \n  "]
_SHORT_ESC = {
    '"': '\\"',
    "\\": "\\\\",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\b": "\\b",
    "\f": "\\f",
}


@dataclass(frozen=True)
class Style:
    layout: Layout = "compact"
    ensure_ascii: bool = False
    escape_slash: bool = False
    html_escape: bool = False  # < > & written as \u003c \u003e \u0026 (Go's encoder does this)
    escape_random: bool = False  # needless \uXXXX escapes of plain ASCII, keys included
    seed: int = 0


styles = st.builds(
    Style,
    layout=st.sampled_from(["compact", "spaced", "indent", "odd"]),
    ensure_ascii=st.booleans(),
    escape_slash=st.booleans(),
    html_escape=st.booleans(),
    escape_random=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)


class _Writer:
    def __init__(self, style: Style) -> None:
        self.style = style
        self.rnd = random.Random(style.seed)
        self.out: list[str] = []

    def ws(self, where: str, depth: int) -> str:
        layout = self.style.layout
        if layout == "compact":
            return ""
        if layout == "spaced":
            return " " if where in ("after_comma", "after_colon") else ""
        if layout == "indent":
            if where in ("open", "after_comma", "close"):
                return "\n" + "  " * depth
            return " " if where == "after_colon" else ""
        return self.rnd.choice(_ODD_WS)

    def string(self, s: str) -> str:
        st_ = self.style
        parts = ['"']
        for ch in s:
            o = ord(ch)
            if ch in _SHORT_ESC:
                parts.append(_SHORT_ESC[ch])
            elif ch == "/" and st_.escape_slash:
                parts.append("\\/")
            elif o < 0x20 or 0xD800 <= o <= 0xDFFF:
                parts.append(f"\\u{o:04x}")
            elif o > 0x7F and st_.ensure_ascii:
                if o > 0xFFFF:
                    v = o - 0x10000
                    parts.append(f"\\u{0xD800 + (v >> 10):04x}\\u{0xDC00 + (v & 0x3FF):04x}")
                else:
                    parts.append(f"\\u{o:04x}")
            elif st_.html_escape and ch in "<>&":
                parts.append(f"\\u{o:04x}")
            elif st_.escape_random and o < 0x80 and self.rnd.random() < 0.15:
                parts.append(f"\\u{o:04X}" if self.rnd.random() < 0.5 else f"\\u{o:04x}")
            else:
                parts.append(ch)
        parts.append('"')
        return "".join(parts)

    def value(self, v: Json, depth: int) -> None:
        out = self.out
        if isinstance(v, dict):
            if not v:
                out.append(
                    "{" + (self.ws("open", depth) if self.style.layout == "odd" else "") + "}"
                )
                return
            out.append("{")
            for n, (k, x) in enumerate(v.items()):
                if n:
                    out.append(self.ws("before_comma", depth + 1))
                    out.append(",")
                    out.append(self.ws("after_comma", depth + 1))
                else:
                    out.append(self.ws("open", depth + 1))
                out.append(self.string(k))
                out.append(self.ws("before_colon", depth + 1))
                out.append(":")
                out.append(self.ws("after_colon", depth + 1))
                self.value(x, depth + 1)
            out.append(self.ws("close", depth))
            out.append("}")
        elif isinstance(v, list):
            if not v:
                out.append(
                    "[" + (self.ws("open", depth) if self.style.layout == "odd" else "") + "]"
                )
                return
            out.append("[")
            for n, x in enumerate(v):
                if n:
                    out.append(self.ws("before_comma", depth + 1))
                    out.append(",")
                    out.append(self.ws("after_comma", depth + 1))
                else:
                    out.append(self.ws("open", depth + 1))
                self.value(x, depth + 1)
            out.append(self.ws("close", depth))
            out.append("]")
        elif isinstance(v, str):
            out.append(self.string(v))
        elif v is True:
            out.append("true")
        elif v is False:
            out.append("false")
        elif v is None:
            out.append("null")
        elif isinstance(v, int):
            out.append(str(v))
        elif isinstance(v, float):
            out.append(repr(v))
        else:  # pragma: no cover - the strategies only build JSON values
            raise TypeError(type(v))


def dumps(obj: Json, style: Style = Style()) -> str:
    """Serialise `obj` in `style`; `json.loads(dumps(obj, s)) == obj` for every style."""
    w = _Writer(style)
    if style.layout == "odd":
        w.out.append(w.rnd.choice(_ODD_WS))
    w.value(obj, 0)
    if style.layout == "odd":
        w.out.append(w.rnd.choice(_ODD_WS))
    elif style.layout == "indent":
        w.out.append("\n")
    return "".join(w.out)


# --------------------------------------------------------------------------------------------
# Text and small values
# --------------------------------------------------------------------------------------------

_SNIPPETS = [
    "😀",
    "🧠🔧",
    "中文字符",
    "日本語",
    "한국어",
    "e\u0301",  # e + combining acute
    "a\u0308\u0323",
    "<b>&amp;</b>",
    "</script>",
    "http://x.example/a/b",
    '"quoted"',
    "back\\slash",
    "tab\there",
    "line\nbreak",
    "\u2028\u2029",
    "\x00\x1f",
    "\u00a0nbsp",
    "ß",
    "𝕏",
]

_chars = st.characters(codec="utf-8", exclude_categories=["Cs"])
text_any = st.one_of(
    st.text(_chars, max_size=6),
    st.builds(
        lambda a, b, c: a + b + c,
        st.text(_chars, max_size=3),
        st.sampled_from(_SNIPPETS),
        st.text(_chars, max_size=3),
    ),
    st.sampled_from(["", "ok", "Hello, world.", "ls -la /tmp", *_SNIPPETS]),
)
# Never blank (docs/behaviour.md#shape-rules rule 4): something other than whitespace is always
# present.
text = text_any.map(lambda s: s if s.strip() else s + "x")
ident = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=8)
small_json: st.SearchStrategy[Json] = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**40), 2**40),
        st.floats(allow_nan=False, allow_infinity=False, width=32),
        text_any,
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(ident, inner, max_size=3)),
    max_leaves=6,
)
cache_control = st.sampled_from([{"type": "ephemeral"}, {"type": "ephemeral", "ttl": "1h"}])


@dataclass
class _Ids:
    """Unique tool-call ids within one transcript: a counter, then random decoration."""

    prefix: str
    n: int = 0
    used: list[str] = field(default_factory=list)

    def new(self, draw: st.DrawFn) -> str:
        self.n += 1
        tid = f"{self.prefix}{self.n}_{draw(ident)}"
        self.used.append(tid)
        return tid


def _maybe_cache(draw: st.DrawFn, block: dict[str, Json]) -> dict[str, Json]:
    if draw(st.integers(0, 4)) == 0:
        block["cache_control"] = draw(cache_control)
    return block


# --------------------------------------------------------------------------------------------
# Anthropic
# --------------------------------------------------------------------------------------------


@st.composite
def a_text_block(draw: st.DrawFn) -> dict[str, Json]:
    return _maybe_cache(draw, {"type": "text", "text": draw(text)})


@st.composite
def a_image_block(draw: st.DrawFn) -> dict[str, Json]:
    return _maybe_cache(
        draw,
        {
            "type": "image",
            "source": {
                "type": "base64",
                "media_type": draw(st.sampled_from(["image/png", "image/jpeg"])),
                "data": draw(st.text(alphabet="ABCDEFabcdef0123456789+/", max_size=16)) + "==",
            },
        },
    )


@st.composite
def a_document_block(draw: st.DrawFn) -> dict[str, Json]:
    return {
        "type": "document",
        "source": {"type": "text", "media_type": "text/plain", "data": draw(text)},
        "title": draw(text),
    }


@st.composite
def a_user(draw: st.DrawFn) -> dict[str, Json]:
    if draw(st.booleans()):
        return {"role": "user", "content": draw(text)}
    blocks = draw(
        st.lists(
            st.one_of(a_text_block(), a_image_block(), a_document_block()),
            min_size=1,
            max_size=4,
        )
    )
    return {"role": "user", "content": blocks}


@st.composite
def a_system(draw: st.DrawFn) -> dict[str, Json]:
    """A mid-array system message, as Claude Code and the Agent SDK inject them."""
    if draw(st.booleans()):
        return {"role": "system", "content": draw(text)}
    return {"role": "system", "content": draw(st.lists(a_text_block(), min_size=1, max_size=2))}


@st.composite
def a_assistant(draw: st.DrawFn, ids: _Ids, allow_tools: bool = True) -> dict[str, Json]:
    if draw(st.integers(0, 4)) == 0:
        return {"role": "assistant", "content": draw(text)}
    blocks: list[dict[str, Json]] = []
    for _ in range(draw(st.integers(0, 2))):
        if draw(st.booleans()):
            blocks.append(
                {
                    "type": "thinking",
                    "thinking": draw(text),
                    "signature": draw(
                        st.text(alphabet="ABCDEFGHabcdefgh0123456789+/=", max_size=24)
                    ),
                }
            )
        else:
            blocks.append({"type": "redacted_thinking", "data": draw(ident) + "=="})
    blocks.extend(draw(st.lists(a_text_block(), max_size=2)))
    if draw(st.integers(0, 5)) == 0:
        sid = "srvtoolu_" + draw(ident)
        blocks.append({"type": "server_tool_use", "id": sid, "name": "web_search", "input": {}})
        blocks.append({"type": "web_search_tool_result", "tool_use_id": sid, "content": []})
    n_calls = draw(st.integers(0, 3)) if allow_tools else 0
    for _ in range(n_calls):
        blocks.append(
            {
                "type": "tool_use",
                "id": ids.new(draw),
                "name": draw(ident),
                "input": draw(st.dictionaries(ident, small_json, max_size=3)),
            }
        )
    if not blocks:
        blocks.append(draw(a_text_block()))
    return {"role": "assistant", "content": blocks}


@st.composite
def a_tool_results(draw: st.DrawFn, call_ids: list[str]) -> dict[str, Json]:
    """The user message answering every call of the assistant turn before it."""
    order = draw(st.permutations(call_ids))
    blocks: list[dict[str, Json]] = []
    for tid in order:
        block: dict[str, Json] = {"type": "tool_result", "tool_use_id": tid}
        kind = draw(st.integers(0, 3))
        if kind == 0:
            block["content"] = draw(text_any)
        elif kind == 1:
            block["content"] = draw(
                st.lists(st.one_of(a_text_block(), a_image_block()), min_size=0, max_size=2)
            )
        elif kind == 2:
            block["content"] = draw(text)
        if draw(st.integers(0, 3)) == 0:
            block["is_error"] = draw(st.booleans())
        blocks.append(_maybe_cache(draw, block))
    if draw(st.integers(0, 3)) == 0:
        blocks.append(draw(a_text_block()))
    return {"role": "user", "content": blocks}


@st.composite
def anthropic_messages(draw: st.DrawFn, min_turns: int = 0, max_turns: int = 5) -> list[Json]:
    """A valid anthropic transcript: user first, then assistant/user turns, tools answered."""
    ids = _Ids("toolu_")
    msgs: list[Json] = []
    if draw(st.integers(0, 6)) == 0:
        msgs.append(draw(a_system()))  # index 0: always legal
    msgs.append(draw(a_user()))
    for _ in range(draw(st.integers(min_turns, max_turns))):
        if draw(st.integers(0, 4)) == 0:
            msgs.append(draw(a_system()))  # followed by the assistant turn below
        before = len(ids.used)
        msgs.append(draw(a_assistant(ids)))
        calls = ids.used[before:]
        msgs.append(draw(a_tool_results(calls)) if calls else draw(a_user()))
    ending = draw(st.sampled_from(["user", "user", "user", "prefill", "empty_prefill", "system"]))
    if ending == "prefill":
        msgs.append({"role": "assistant", "content": draw(text)})
    elif ending == "empty_prefill":
        msgs.append({"role": "assistant", "content": draw(st.sampled_from(["", []]))})
    elif ending == "system":
        msgs.append(draw(a_system()))  # ends the array: legal
    return msgs


# --------------------------------------------------------------------------------------------
# OpenAI
# --------------------------------------------------------------------------------------------


@st.composite
def o_text_parts(draw: st.DrawFn, images: bool = False) -> list[dict[str, Json]]:
    part = st.builds(lambda t: {"type": "text", "text": t}, text)
    if images:
        image = st.builds(
            lambda u: {"type": "image_url", "image_url": {"url": "https://x.example/" + u}}, ident
        )
        return draw(st.lists(st.one_of(part, image), min_size=1, max_size=3))
    return draw(st.lists(part, min_size=1, max_size=2))


@st.composite
def o_content(draw: st.DrawFn, images: bool = False) -> Json:
    return draw(text) if draw(st.booleans()) else draw(o_text_parts(images))


def _named(draw: st.DrawFn, msg: dict[str, Json]) -> dict[str, Json]:
    if draw(st.integers(0, 3)) == 0:
        msg["name"] = draw(ident)
    return msg


@st.composite
def o_system(draw: st.DrawFn) -> dict[str, Json]:
    role = draw(st.sampled_from(["system", "developer"]))
    return _named(draw, {"role": role, "content": draw(o_content())})


@st.composite
def o_user(draw: st.DrawFn) -> dict[str, Json]:
    return _named(draw, {"role": "user", "content": draw(o_content(images=True))})


@st.composite
def o_assistant_turn(draw: st.DrawFn, ids: _Ids) -> list[dict[str, Json]]:
    """One assistant message, plus the run of tool (or function) messages answering it."""
    kind = draw(st.sampled_from(["text", "text", "tools", "tools", "legacy"]))
    if kind == "text":
        if draw(st.integers(0, 3)) == 0:
            refusal = {"type": "refusal", "refusal": draw(text)}
            return [{"role": "assistant", "content": [refusal]}]
        return [_named(draw, {"role": "assistant", "content": draw(o_content())})]
    if kind == "legacy":
        name = draw(ident)
        call = {"name": name, "arguments": json.dumps(draw(st.dictionaries(ident, small_json)))}
        return [
            {"role": "assistant", "content": None, "function_call": call},
            {"role": "function", "name": name, "content": draw(text)},
        ]
    calls = [
        {
            "id": ids.new(draw),
            "type": "function",
            "function": {
                "name": draw(ident),
                "arguments": json.dumps(draw(st.dictionaries(ident, small_json, max_size=3))),
            },
        }
        for _ in range(draw(st.integers(1, 3)))
    ]
    msg: dict[str, Json] = {"role": "assistant"}
    content = draw(st.sampled_from(["null", "empty", "text", "missing"]))
    if content == "null":
        msg["content"] = None
    elif content == "empty":
        msg["content"] = ""
    elif content == "text":
        msg["content"] = draw(text)
    msg["tool_calls"] = calls
    out: list[dict[str, Json]] = [msg]
    for c in draw(st.permutations(calls)):
        tool: dict[str, Json] = {"role": "tool", "tool_call_id": c["id"]}
        tool["content"] = draw(o_content())
        out.append(_named(draw, tool))
    return out


@st.composite
def openai_messages(draw: st.DrawFn, min_turns: int = 0, max_turns: int = 5) -> list[Json]:
    """A valid openai transcript: optional system/developer first, tool runs answered."""
    ids = _Ids("call_")
    msgs: list[Json] = []
    if draw(st.integers(0, 3)) != 0:
        msgs.append(draw(o_system()))
    msgs.append(draw(o_user()))
    for _ in range(draw(st.integers(min_turns, max_turns))):
        if draw(st.integers(0, 4)) == 0:
            msgs.append(draw(o_system()))  # mid-array, followed by the assistant turn
        turn = draw(o_assistant_turn(ids))
        msgs.extend(turn)
        if len(turn) == 1 or draw(st.booleans()):
            msgs.append(draw(o_user()))
    return msgs


def messages(dialect: Dialect, min_turns: int = 0, max_turns: int = 5) -> st.SearchStrategy[Json]:
    if dialect == "anthropic":
        return anthropic_messages(min_turns, max_turns)
    return openai_messages(min_turns, max_turns)


# --------------------------------------------------------------------------------------------
# Broken transcripts
# --------------------------------------------------------------------------------------------

_BLANKS_ANTHROPIC: list[Json] = [
    "",
    "  ",
    "\n\t",
    [],
    [{"type": "text", "text": ""}],
    [{"type": "text", "text": " \n"}],
    [{"type": "thinking", "thinking": "", "signature": "sig"}],
    [{"type": "thinking", "signature": "sig"}, {"type": "text", "text": "ok"}],
    None,
]
_BLANKS_OPENAI: list[Json] = ["", "  ", [], [{"type": "text", "text": "\t"}], None]


@st.composite
def mutated_messages(draw: st.DrawFn, dialect: Dialect) -> list[Json]:
    """A transcript, then a few random breakages: drop, swap, duplicate, move, blank out."""
    msgs: list[Json] = [json.loads(json.dumps(m)) for m in draw(messages(dialect, 1, 6))]
    blanks = _BLANKS_ANTHROPIC if dialect == "anthropic" else _BLANKS_OPENAI
    for op in draw(st.lists(st.sampled_from(["drop", "swap", "dup", "move", "blank"]), max_size=3)):
        if not msgs:
            break
        i = draw(st.integers(0, len(msgs) - 1))
        j = draw(st.integers(0, len(msgs) - 1))
        if op == "drop":
            del msgs[i]
        elif op == "swap":
            msgs[i], msgs[j] = msgs[j], msgs[i]
        elif op == "dup":
            msgs.insert(j, json.loads(json.dumps(msgs[i])))
        elif op == "move":
            msgs.insert(j, msgs.pop(i))
        else:
            msgs[i]["content"] = json.loads(json.dumps(draw(st.sampled_from(blanks))))
    return msgs


# --------------------------------------------------------------------------------------------
# Whole bodies
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    dialect: AnyDialect
    body: dict[str, Json]
    text: str
    style: Style

    @property
    def raw(self) -> bytes:
        return self.text.encode("utf-8")

    @property
    def messages(self) -> list[Json]:
        """The transcript: `messages`, or a Responses body's `input` items."""
        msgs: list[Json] = self.body["input" if self.dialect == "responses" else "messages"]
        return msgs


@st.composite
def _anthropic_fields(draw: st.DrawFn) -> dict[str, Json]:
    system = st.one_of(text, st.lists(a_text_block(), min_size=1, max_size=2))
    tools = st.lists(
        st.fixed_dictionaries(
            {
                "name": ident,
                "description": text,
                "input_schema": st.just({"type": "object", "properties": {}}),
            }
        ),
        max_size=3,
    )
    options: dict[str, st.SearchStrategy[Json]] = {
        "max_tokens": st.integers(1, 64000),
        "system": system,
        "tools": tools,
        "metadata": st.fixed_dictionaries({"user_id": ident}),
        "stream": st.booleans(),
        "temperature": st.sampled_from([0, 0.5, 1.0]),
        "thinking": st.just({"type": "enabled", "budget_tokens": 1024}),
        "tool_choice": st.just({"type": "auto"}),
        "x_unknown": small_json,
    }
    return {k: draw(v) for k, v in options.items() if draw(st.booleans())}


@st.composite
def _openai_fields(draw: st.DrawFn) -> dict[str, Json]:
    tools = st.lists(
        st.fixed_dictionaries(
            {
                "type": st.just("function"),
                "function": st.fixed_dictionaries(
                    {"name": ident, "parameters": st.just({"type": "object"})}
                ),
            }
        ),
        max_size=3,
    )
    options: dict[str, st.SearchStrategy[Json]] = {
        "tools": tools,
        "stream": st.booleans(),
        "stream_options": st.just({"include_usage": True}),
        "temperature": st.sampled_from([0, 0.2, 1.5]),
        "n": st.just(1),
        "user": ident,
        "metadata": st.dictionaries(ident, ident, max_size=2),
        "max_completion_tokens": st.integers(1, 4096),
        "x_unknown": small_json,
    }
    return {k: draw(v) for k, v in options.items() if draw(st.booleans())}


@st.composite
def bodies(
    draw: st.DrawFn,
    dialect: Dialect | None = None,
    style: Style | None = None,
    min_turns: int = 0,
    max_turns: int = 5,
    allow_empty: bool = False,
) -> Sample:
    """A request body in random key order, serialised in a random (or the given) style."""
    d: Dialect = dialect if dialect is not None else draw(st.sampled_from(DIALECT_NAMES))
    if allow_empty and draw(st.integers(0, 9)) == 0:
        msgs: list[Json] = []
    else:
        msgs = draw(messages(d, min_turns, max_turns))
    fields = draw(_anthropic_fields() if d == "anthropic" else _openai_fields())
    fields["model"] = draw(st.sampled_from(["claude-sonnet-4-5", "gpt-4o", "m/" + "x"]))
    fields["messages"] = msgs
    order = draw(st.permutations(sorted(fields)))
    body = {k: fields[k] for k in order}
    s = style if style is not None else draw(styles)
    return Sample(d, body, dumps(body, s), s)


@dataclass(frozen=True)
class NextTurn:
    """A body, and the body its next turn sends: its messages again (`same`), more after them
    (`append`), or those up to a cut and others after (`replace`); both in the first's style."""

    sample: Sample
    how: str
    first: bytes
    second: bytes


@st.composite
def next_turns(draw: st.DrawFn) -> NextTurn:
    sample = draw(bodies(min_turns=1, max_turns=4))
    assert sample.dialect != "responses"
    msgs = sample.body["messages"]
    cut = draw(st.integers(0, len(msgs)))
    nxt = draw(messages(sample.dialect, 0, 2))
    how = draw(st.sampled_from(["append", "replace", "same"]))
    later = {"append": msgs + nxt, "replace": msgs[:cut] + nxt, "same": msgs}[how]
    first = dumps(sample.body, sample.style).encode()
    return NextTurn(
        sample, how, first, dumps({**sample.body, "messages": later}, sample.style).encode()
    )


# --------------------------------------------------------------------------------------------
# The Responses API: `input` items
# --------------------------------------------------------------------------------------------


def r_message(role: str, body: str, typed: bool = True, parts: bool = True) -> dict[str, Json]:
    """A message item: typed (`"type": "message"`) or an EasyInputMessage, with string or part
    content (`input_text`, or `output_text` for the assistant)."""
    part = "output_text" if role == "assistant" else "input_text"
    content: Json = [{"type": part, "text": body}] if parts else body
    item: dict[str, Json] = {"type": "message"} if typed else {}
    item.update({"role": role, "content": content})
    return item


@st.composite
def r_reasoning(draw: st.DrawFn, ids: _Ids) -> dict[str, Json]:
    summary = draw(st.lists(text, max_size=2))
    return {
        "type": "reasoning",
        "id": "rs_" + ids.new(draw),
        "summary": [{"type": "summary_text", "text": t} for t in summary],
        "content": None,
        "encrypted_content": "gAAAA" + draw(ident),
    }


@st.composite
def r_turn(draw: st.DrawFn, ids: _Ids) -> list[dict[str, Json]]:
    """One model turn: maybe a reasoning item, then a message, or k parallel calls (function or
    custom) followed by their k outputs, in any order."""
    out: list[dict[str, Json]] = []
    if draw(st.booleans()):
        out.append(draw(r_reasoning(ids)))
    kind = draw(st.sampled_from(["message", "function", "custom", "web_search"]))
    if kind == "message":
        out.append(r_message("assistant", draw(text), typed=draw(st.booleans())))
        return out
    if kind == "web_search":
        out.append(
            {
                "type": "web_search_call",
                "id": "ws_" + ids.new(draw),
                "status": "completed",
                "action": {"type": "search", "query": draw(text)},
            }
        )
        return out
    calls = [ids.new(draw) for _ in range(draw(st.integers(1, 3)))]
    for cid in calls:
        if kind == "function":
            out.append(
                {
                    "type": "function_call",
                    "name": draw(ident),
                    "arguments": json.dumps({"cmd": draw(text)}),
                    "call_id": cid,
                }
            )
        else:
            out.append(
                {"type": "custom_tool_call", "name": "exec", "input": draw(text), "call_id": cid}
            )
    for cid in draw(st.permutations(calls)):
        otype = "function_call_output" if kind == "function" else "custom_tool_call_output"
        output: Json = draw(
            st.one_of(text_any, st.builds(lambda t: [{"type": "input_text", "text": t}], text))
        )
        out.append({"type": otype, "call_id": cid, "output": output})
    return out


@st.composite
def responses_items(
    draw: st.DrawFn, min_turns: int = 0, max_turns: int = 6, lead: int | None = None
) -> list[Json]:
    """A valid `input`: 0-3 leading developer/system items (an `additional_tools` item among
    them, sometimes), the task, then model turns and user notes."""
    ids = _Ids("call_")
    items: list[Json] = []
    n_lead = draw(st.integers(0, 3)) if lead is None else lead
    for k in range(n_lead):
        if k == 0 and draw(st.integers(0, 3)) == 0:
            items.append(
                {
                    "type": "additional_tools",
                    "role": "developer",
                    "tools": [{"type": "function", "name": "exec", "parameters": {}}],
                }
            )
        else:
            role = draw(st.sampled_from(["developer", "system"]))
            items.append(r_message(role, draw(text), typed=draw(st.booleans())))
    items.append(r_message("user", draw(text), parts=draw(st.booleans())))
    for _ in range(draw(st.integers(min_turns, max_turns))):
        items.extend(draw(r_turn(ids)))
        if draw(st.integers(0, 2)) == 0:
            items.append(r_message("user", draw(text), typed=draw(st.booleans())))
    return items


@st.composite
def responses_bodies(
    draw: st.DrawFn, min_turns: int = 0, max_turns: int = 6, style: Style | None = None
) -> Sample:
    """A Responses request body in random key order, serialised in a random style."""
    fields: dict[str, Json] = {
        "model": draw(st.sampled_from(["gpt-5.1-codex", "my-local-model"])),
        "input": draw(responses_items(min_turns, max_turns)),
    }
    options: dict[str, st.SearchStrategy[Json]] = {
        "instructions": text,
        "tools": st.just([{"type": "function", "name": "exec", "parameters": {}}]),
        "stream": st.booleans(),
        "store": st.booleans(),
        "prompt_cache_key": ident,
        "include": st.just(["reasoning.encrypted_content"]),
        "x_unknown": small_json,
    }
    fields.update({k: draw(v) for k, v in options.items() if draw(st.booleans())})
    order = draw(st.permutations(sorted(fields)))
    body = {k: fields[k] for k in order}
    s = style if style is not None else draw(styles)
    return Sample("responses", body, dumps(body, s), s)


# --------------------------------------------------------------------------------------------
# Gemini API bodies
# --------------------------------------------------------------------------------------------


def _g_call(name: str, call_id: str | None, signed: bool) -> dict[str, Json]:
    fc: dict[str, Json] = {"name": name, "args": {"command": "ls"}}
    if call_id is not None:
        fc["id"] = call_id
    part: dict[str, Json] = {"functionCall": fc}
    if signed:
        part["thoughtSignature"] = "c2lnbmF0dXJl"
    return part


@st.composite
def gemini_contents(draw: st.DrawFn, min_turns: int = 0, max_turns: int = 6) -> list[Json]:
    """A task, then model turns (text, a thought, calls by id or by name) each answered in
    the next user content (every call by a `functionResponse`, else text), as Gemini CLI
    re-sends them."""
    out: list[Json] = [{"role": "user", "parts": [{"text": draw(text)}]}]
    for n in range(draw(st.integers(min_turns, max_turns))):
        parts: list[Json] = []
        if draw(st.booleans()):
            parts.append({"text": draw(text), "thought": True})
        calls = draw(st.lists(st.sampled_from(["run_shell_command", "read_file"]), max_size=2))
        by_id = draw(st.booleans())
        for k, name in enumerate(calls):
            parts.append(_g_call(name, f"c{n}_{k}" if by_id else None, draw(st.booleans())))
        if not parts or draw(st.booleans()):
            parts.insert(0, {"text": draw(text)})
        out.append({"role": "model", "parts": parts})
        if calls:
            answers = [
                {
                    "functionResponse": {
                        "name": name,
                        "response": {"output": draw(text)},
                        **({"id": f"c{n}_{k}"} if by_id else {}),
                    }
                }
                for k, name in enumerate(calls)
            ]
            out.append({"role": "user", "parts": answers})
        else:
            out.append({"role": "user", "parts": [{"text": draw(text)}]})
    return out


@st.composite
def gemini_bodies(
    draw: st.DrawFn, min_turns: int = 0, max_turns: int = 6, style: Style | None = None
) -> Json:
    """A Gemini API request body (the model is in its path) in random key order and style."""
    fields: dict[str, Json] = {"contents": draw(gemini_contents(min_turns, max_turns))}
    decl = {"name": "run_shell_command", "parameters": {"type": "object"}}
    options: dict[str, st.SearchStrategy[Json]] = {
        "systemInstruction": text.map(lambda t: {"parts": [{"text": t}]}),
        "tools": st.just([{"functionDeclarations": [decl]}]),
        "generationConfig": st.just(
            {"temperature": 0, "thinkingConfig": {"includeThoughts": True}}
        ),
        "x_unknown": small_json,
    }
    fields.update({k: draw(v) for k, v in options.items() if draw(st.booleans())})
    order = draw(st.permutations(sorted(fields)))
    body = {k: fields[k] for k in order}
    s = style if style is not None else draw(styles)
    return dumps(body, s).encode("utf-8")
