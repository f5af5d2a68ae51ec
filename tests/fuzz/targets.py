"""Fuzz targets: one function per surface, each taking one input of bytes, each asserting what
must hold for any input. A target that raises anything but AssertionError has found a bug (an
exception a hook would have let out); an AssertionError is a broken property.

    jsonspan        cg.wire.jsonspan.walk_document: spans that parse back to their values
    body            cg.wire.body.index_body: an index, or BodyRejected
    rewrite         cg.pipeline.rewrite.rewrite_body with a splicing component (the real span
                    logic: select_span + repair_orphans): the original bytes, or a rewrite that
                    indexes, keeps every byte outside `messages`, and adds no shape violation
    span            cg.summarize.span.select_span + repair_orphans over indexed bodies
    answer_json     cg.wire.answers.parse_json, per dialect, then everything the continuation
    answer_sse      loop and the summarizer do with a reply (calls, strip, assistant turn,
                    usage, render JSON and SSE, parse back: the same message)
    tap             cg.billing.tap.UsageTap over any chunking and content-encoding: chunks
                    returned unchanged, never disabled by an internal error, the same usage
                    whatever the chunking; usage_of_json + cg.wire.usage.from_provider
    hooks           cg.proxy.addon.ContextGuru's request and response hooks in-process (a
                    mitmproxy flow): never an exception out of a hook; the body forwarded is
                    the client's bytes or a valid rewrite; the answer reaches the client

Every target is registered in TARGETS with the hypothesis strategy that feeds it (structured
inputs rendered to bytes, then mutated: a byte-level fuzzer such as atheris feeds the same
functions from raw bytes). A new dialect adds its name to `DIALECT_NAMES` (the request, answer
and tap targets pick their dialect from the input's first byte) and, if its answers have their
own shape, a strategy in `answer_values`.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import re
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import brotli
import zstandard
from hypothesis import strategies as st

from cg.billing.tap import DISABLED, UsageTap, usage_of_json
from cg.pipeline.contract import RequestContext, Step
from cg.pipeline.rewrite import rewrite_body
from cg.summarize.span import leading_system, repair_orphans, select_span
from cg.wire import answers, decode
from cg.wire.body import BodyRejected, index_body
from cg.wire.dialects import DIALECTS, route
from cg.wire.jsonspan import JsonSpanError, walk_document
from cg.wire.reply import ResponseParseError
from cg.wire.shape import validate_shape
from cg.wire.splice import Insert, Keep, Plan, plan_views
from cg.wire.usage import UsageError, from_provider
from tests.support.strategies import bodies, gemini_bodies, responses_bodies, small_json

DIALECT_NAMES = sorted(DIALECTS)  # every registered request dialect
ANSWER_DIALECTS = DIALECT_NAMES  # every dialect answers in its own JSON and SSE form
PATHS = {
    "anthropic": "/v1/messages",
    "openai": "/v1/chat/completions",
    "responses": "/v1/responses",
    "gemini": "/v1beta/models/gemini-2.5-flash:generateContent",
}


# What the inputs did, by target: the run's vacuity guard (a fuzzer whose every input is rejected
# at the door has tested the door only).
SEEN: Counter[str] = Counter()


def pick(data: bytes, options: list[str]) -> tuple[str, bytes]:
    """The option named by the input's first byte, and the rest of the input."""
    if not data:
        return options[0], b""
    return options[data[0] % len(options)], data[1:]


def same_json(a: Any, b: Any) -> bool:
    """Equality of parsed JSON, NaN included (json.loads accepts it, and NaN != NaN)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


# -- the wire layer ----------------------------------------------------------------------------


def t_jsonspan(data: bytes) -> None:
    text = data.decode("utf-8", "replace")
    try:
        members = walk_document(text, arrays=("messages",))
    except (JsonSpanError, RecursionError):
        return
    for m in members:
        assert same_json(json.loads(text[m.start : m.end]), m.value), m.key
        if m.array is not None:
            for el in m.array.elements:
                assert same_json(json.loads(text[el.start : el.end]), el.value)


def t_body(data: bytes) -> None:
    dialect, raw = pick(data, DIALECT_NAMES)
    try:
        index = index_body(raw, DIALECTS[dialect])
    except BodyRejected:
        return
    assert index.text.encode("utf-8") == raw
    for i, m in enumerate(index.messages):
        assert same_json(json.loads(index.source(i)), m.value)


class Splicer:
    """Summarizes `[head | span | tail]` as the summarize component does (select_span, then the
    summary message, then orphan repair), with keep_first/keep_last from the input."""

    name = "splicer"

    def __init__(self, keep_first: int, keep_last: int) -> None:
        self.keep_first, self.keep_last = keep_first, keep_last

    def apply(self, req: RequestContext, plan: Plan) -> Step:
        index = req.index
        span = select_span(index.views, self.keep_first, self.keep_last, index.dialect.pairing)
        if isinstance(span, str):
            return Step(None, span)
        summary = Insert.message(
            index.dialect.user_message(
                "=== History Summary ===\nfuzz <<cg:0123456789abcdef01234567>>"
            ),
            index.dialect,
        )
        new: Plan = [Keep(i) for i in range(span.head)]
        new.append(summary)
        new.extend(Keep(i) for i in range(span.end, len(index.messages)))
        return Step(repair_orphans(index, new), "spliced")


def _outside_messages(raw: bytes, dialect: str) -> tuple[str, str]:
    index = index_body(raw, DIALECTS[dialect])
    return index.text[: index.array.start], index.text[index.array.end :]


def t_rewrite(data: bytes) -> None:
    dialect, rest = pick(data, DIALECT_NAMES)
    keep_first, rest = (rest[0] % 4, rest[1:]) if rest else (1, b"")
    keep_last, raw = (rest[0] % 5, rest[1:]) if rest else (2, b"")
    d = DIALECTS[dialect]
    result = rewrite_body(raw, d, [Splicer(keep_first, keep_last)])
    SEEN[f"rewrite:{result.outcome}"] += 1
    assert result.outcome in ("passed_through", "rewritten", "failed_open"), result.record
    if result.outcome == "failed_open" and result.record.get("violations"):
        # The span logic never introduces a violation the input did not have: a failed-open
        # rewrite of a valid body would be a summary lost on a real transcript.
        had = {v.rule for v in validate_shape(index_body(raw, d).views, d)}
        assert {v["rule"] for v in result.record["violations"]} <= had, result.record
    assert "internal error" not in str(result.record.get("reason")), result.record
    for rec in result.record.get("components", ()):
        assert "error" not in rec, rec  # the component (the span logic) raised
    if result.body is None:
        return
    assert result.outcome == "rewritten"
    before, after = _outside_messages(raw, dialect)
    new = index_body(result.body, d)  # a rewrite always indexes
    assert new.text[: new.array.start] == before
    assert new.text[new.array.end :] == after
    old = index_body(raw, d)
    had = {v.rule for v in validate_shape(old.views, d)}
    got = {v.rule for v in validate_shape(new.views, d)}
    assert got <= had, (had, got)


def t_span(data: bytes) -> None:
    dialect, rest = pick(data, DIALECT_NAMES)
    kf, kl, raw = (rest[0] % 4, rest[1] % 5, rest[2:]) if len(rest) >= 2 else (1, 2, b"")
    try:
        index = index_body(raw, DIALECTS[dialect])
    except BodyRejected:
        return
    n = len(index.messages)
    span = select_span(index.views, kf, kl, index.dialect.pairing)
    if isinstance(span, str):
        return
    assert 0 <= span.head < span.end <= n
    lead = leading_system(index.views) if index.dialect.pairing == "id" else 0
    assert span.head <= lead + kf and (kl == 0 or span.end <= n)
    plan: Plan = [Keep(i) for i in range(span.head)]
    plan.append(Insert.message({"role": "user", "content": "s"}, index.dialect))
    plan.extend(Keep(i) for i in range(span.end, n))
    repaired = repair_orphans(index, plan)
    views = plan_views(index, repaired)
    # every tool result left has its call in the message that opens its run
    assert len(views) <= len(plan)


# -- answers -----------------------------------------------------------------------------------


def _no_nulls(message: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in message.items() if v is not None}


def _use(reply: answers.Reply, form: str) -> None:
    """Everything the continuation loop and the summarizer do with a reply parsed from `form`
    (json or sse): none of it may raise. Rendered back in the form it came in, it parses to the
    same message; rendered in the other form (a client that asked for a stream and got JSON), it
    renders, and what cannot be read back is refused, never an error of another kind."""
    answers.tool_calls(reply)
    stripped = answers.strip_calls(reply, "context_guru_expand")
    assert all(c.name != "context_guru_expand" for c in answers.tool_calls(stripped))
    answers.assistant_messages(reply)  # what the continuation loop appends
    answers.tool_results(reply.dialect, [("id", "text")])
    usage = answers.client_usage([reply, reply])
    final = answers.with_usage(stripped, usage) if usage else stripped
    same = answers.render_json if form == "json" else answers.render_sse
    parse = answers.parse_json if form == "json" else answers.parse_sse
    back = parse(reply.dialect, same(final))
    # A stream announces the standard keys (stop_sequence, …) as null where the message had
    # none: the same message.
    assert same_json(_no_nulls(back.message), _no_nulls(final.message)), (back, final)
    other = answers.render_sse if form == "json" else answers.render_json
    other_parse = answers.parse_sse if form == "json" else answers.parse_json
    with contextlib.suppress(ResponseParseError):
        other_parse(reply.dialect, other(final))
    from cg.summarize.client import reply_text
    from cg.summarize.component import SummarizerError

    with contextlib.suppress(SummarizerError):
        reply_text(reply)


def t_answer_json(data: bytes) -> None:
    dialect, raw = pick(data, ANSWER_DIALECTS)
    try:
        reply = answers.parse_json(dialect, raw)
    except ResponseParseError:
        SEEN["answer_json:refused"] += 1
        return
    SEEN["answer_json:parsed"] += 1
    SEEN[f"answer_json:parsed:{dialect}"] += 1
    _use(reply, "json")


def t_answer_sse(data: bytes) -> None:
    dialect, raw = pick(data, ANSWER_DIALECTS)
    try:
        reply = answers.parse_sse(dialect, raw)
    except ResponseParseError:
        SEEN["answer_sse:refused"] += 1
        return
    SEEN["answer_sse:parsed"] += 1
    SEEN[f"answer_sse:parsed:{dialect}"] += 1
    _use(reply, "sse")


# -- the usage tap -----------------------------------------------------------------------------

ENCODINGS = ["", "gzip", "deflate", "br", "zstd", "identity", "gzip, br", "compress"]


def encode(body: bytes, encoding: str) -> bytes:
    for coding in [c.strip() for c in encoding.split(",") if c.strip()]:
        if coding == "gzip":
            body = gzip.compress(body)
        elif coding == "deflate":
            body = zlib.compress(body)
        elif coding == "br":
            body = brotli.compress(body)
        elif coding == "zstd":
            body = zstandard.ZstdCompressor().compress(body)
    return body


def _tap(dialect: str, encoding: str, chunks: list[bytes]) -> UsageTap:
    tap = UsageTap(dialect, encoding)
    for c in chunks:
        assert tap(c) is c  # every chunk goes through as it came
    tap.finish()
    return tap


def t_tap(data: bytes) -> None:
    dialect, rest = pick(data, sorted(DIALECTS))
    encoding, rest = pick(rest, ENCODINGS)
    step, body = (rest[0] % 17 + 1, rest[1:]) if rest else (1, b"")
    wire = encode(body, encoding)
    whole = _tap(dialect, encoding, [wire])
    pieces = [wire[i : i + step] for i in range(0, len(wire), step)]
    split = _tap(dialect, encoding, pieces)
    for tap in (whole, split):
        assert tap.state != DISABLED, tap.error  # an internal error, swallowed
    assert same_json(whole.result(), split.result()), (whole.result(), split.result())
    assert whole.truncated == split.truncated
    SEEN[f"tap:{'usage' if whole.result() is not None else 'none'}"] += 1
    try:
        raw, _model = usage_of_json(body)
    except ValueError:
        raw = whole.result()
    for d in DIALECTS:
        if raw is not None:
            with contextlib.suppress(UsageError):
                from_provider(d, raw)


# -- the hooks, in-process -----------------------------------------------------------------------


class Hooks:
    """One addon on its own event loop, configured once: the summarize preset with lowered
    triggers, a store file, the expand tool always offered; and a fake provider on 127.0.0.1
    (tests/support/fakeprovider.py) that the flows name, so the addon's own calls — the `incoming`
    summaries, the expand rounds — are answered and later turns are spliced."""

    def __init__(self, workdir: str) -> None:
        import asyncio
        import warnings
        from pathlib import Path

        import yaml

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from mitmproxy.test import taddons

        from cg.proxy.addon import ContextGuru
        from tests.support.fakeprovider import FakeProvider

        self.fake = FakeProvider().start()
        self.loop = asyncio.new_event_loop()
        cfg = Path(workdir) / "fuzz.yaml"
        trigger = {"min_request_frac": 0, "min_request_tokens": 0, "min_messages": 2}
        summarize = {
            "cache_state": "any",
            "min_tokens": 0,
            "resummarize_tokens": 0,
            "trigger": trigger,
            "model": {"share_cache": "never"},
            "keep_last": 1,
        }
        cfg.write_text(yaml.safe_dump({"components": {"summarize": summarize}}))
        self.addon = ContextGuru()

        async def start() -> Any:
            ctx = taddons.context(self.addon)
            ctx.__enter__()
            ctx.configure(
                self.addon,
                cg_preset="summarize",
                cg_config=str(cfg),
                cg_db=str(Path(workdir) / "fuzz.sqlite3"),
                cg_expand_inject="always",
            )
            return ctx

        self.ctx = self.loop.run_until_complete(start())

    def close(self) -> None:
        async def stop() -> None:
            self.addon.done()
            self.ctx.__exit__(None, None, None)
            await self.addon.pool.aclose()

        self.loop.run_until_complete(stop())
        self.loop.close()
        self.fake.stop()


_HOOKS: dict[str, Hooks] = {}


def hooks(workdir: str) -> Hooks:
    """The fuzzing addon for `workdir` (made once per process and directory)."""
    if workdir not in _HOOKS:
        _HOOKS[workdir] = Hooks(workdir)
    return _HOOKS[workdir]


def close_hooks() -> None:
    for h in _HOOKS.values():
        h.close()
    _HOOKS.clear()


MARKER = re.compile(r"<<cg:([0-9a-f]{24})>>")
ENCODED = b"\0ce="  # a hooks input whose body is content-encoded (`encoded_input`)


def encoded_input(coding: str, body: bytes) -> bytes:
    """The part of a hooks input after its two leading bytes for a body sent with
    `Content-Encoding: coding` (`body` as sent, already in that coding); the answer follows."""
    return ENCODED + coding.encode() + b"\0" + len(body).to_bytes(4, "big") + body


def t_hooks(data: bytes, workdir: str | None = None) -> None:
    """The request hook on a fuzzed body, then the response hook on a fuzzed answer; when that
    commissioned a summary, the same turn again once it is written (spliced)."""
    import asyncio
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from mitmproxy.test import tflow, tutils

    h = hooks(workdir or _workdir())
    dialect, rest = pick(data, DIALECT_NAMES)
    ctype, rest = pick(rest, ["application/json", "text/event-stream"])
    encoding = ""
    end = rest.find(b"\0", len(ENCODED)) if rest.startswith(ENCODED) else -1
    if end > 0:  # `\0ce=CODING\0`, the body's length (4 bytes), the body in that coding
        encoding = rest[len(ENCODED) : end].decode("latin-1")
        size = int.from_bytes(rest[end + 1 : end + 5], "big")
        raw, answer = rest[end + 5 : end + 5 + size], rest[end + 5 + size :]
    else:
        cut = rest.find(b"\0\0")
        raw, answer = (rest[:cut], rest[cut + 2 :]) if cut >= 0 else (rest, b"")
    path = PATHS.get(dialect, f"/v1/{dialect}")
    if route("POST", path) is None:
        return

    async def turn() -> dict[str, Any]:
        req = tutils.treq(
            method=b"POST", path=path.encode(), host="127.0.0.1", port=h.fake.port, content=raw
        )
        flow = tflow.tflow(req=req, resp=tutils.tresp(content=answer))
        assert flow.response is not None
        flow.response.headers["content-type"] = ctype
        flow.client_conn.peername = ("127.0.0.1", 1)
        if encoding:
            flow.request.headers["content-encoding"] = encoding
            flow.request.raw_content = raw
        out = h.addon.request(flow)  # a hook that raised fails the target here
        if out is not None:  # a large body, read in the addon's worker thread
            await out
        record = flow.metadata.get("context_guru")
        assert isinstance(record, dict)
        if record.get("bound") == "cg_max_body_mb":  # a body decoding past the cap: untouched
            assert flow.request.raw_content is raw and record["outcome"] == "passed_through"
            SEEN["hooks:over_the_cap"] += 1
        SEEN[f"hooks:{record['outcome']}"] += 1
        SEEN[f"hooks:{dialect}:{record['outcome']}"] += 1
        if record.get("expand", {}).get("injected"):
            SEEN["hooks:expand_offered"] += 1
        sent = flow.request.raw_content
        if sent != raw:
            assert record["outcome"] == "rewritten", record
            plain = decode.decode(sent or b"", encoding, 1 << 30) if encoding else sent
            new = index_body(plain or b"", DIALECTS[dialect])
            if any(r.get("reused") for r in record.get("components", ())):
                SEEN["hooks:spliced"] += 1
                store = h.addon.store
                for key in MARKER.findall(new.text):  # no marker points at a missing stash
                    assert store is not None and store.has_stash(key), key
        h.addon.responseheaders(flow)
        await h.addon.response(flow)
        assert flow.response is not None
        if record.get("expand", {}).get("rounds"):
            SEEN["hooks:expand_rounds"] += 1
        return record

    async def both() -> None:
        await turn()
        pending = list(h.addon.tasks.values())
        if pending:  # the summary commissioned: let it finish, then the same turn again
            await asyncio.wait(pending, timeout=10)
            SEEN["hooks:summaries"] += 1
            await turn()

    h.loop.run_until_complete(both())


_WORKDIR: list[str] = []


def _workdir() -> str:
    import tempfile

    if not _WORKDIR:
        _WORKDIR.append(tempfile.mkdtemp(prefix="cg-fuzz-"))
    return _WORKDIR[0]


# -- the registry --------------------------------------------------------------------------------

_TOKENS = [
    b"{", b"}", b"[", b"]", b'"', b",", b":", b"\\", b"\\u", b"\\ud800", b"\\udc00", b"null",
    b"NaN", b"-Infinity", b"1e999", b"0", b"-", b"\n\n", b"\r", b"\r\n", b"data: ", b"event: ",
    b"data: [DONE]\n\n", b'"role"', b'"user"', b'"assistant"', b'"tool"', b'"system"',
    b'"content"', b'"type"', b'"text"', b'"tool_use"', b'"tool_result"', b'"tool_use_id"',
    b'"tool_calls"', b'"messages"', b'"usage"', b'"index"', b'"delta"', b'"id"', b'"name"',
    b'"input"', b'"context_guru_expand"', b'"output"', b'"function_call"', b'"call_id"',
    b'"output_text"', b'"reasoning"', b"event: response.completed\n", b"\xff", b"\xc3", b"\xef\xbb\xbf", b"\0\0",
]  # fmt: skip


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[bytes]) -> bytes:
    """A valid input, then a few byte-level edits: flip, delete, insert a JSON/SSE token,
    duplicate a slice, truncate."""
    data = bytearray(draw(base))
    for op in draw(st.lists(st.sampled_from(["flip", "del", "ins", "dup", "cut"]), max_size=4)):
        n = len(data)
        i = draw(st.integers(0, n))
        if op == "flip" and n:
            data[min(i, n - 1)] ^= 1 << draw(st.integers(0, 7))
        elif op == "del" and n:
            del data[i : i + draw(st.integers(1, 16))]
        elif op == "ins":
            data[i:i] = draw(st.sampled_from(_TOKENS))
        elif op == "dup" and n:
            j = draw(st.integers(i, n))
            data[i:i] = data[i:j]
        elif op == "cut":
            del data[i:]
    return bytes(data)


def _prefixed(
    dialect_names: list[str], inner: Callable[[str], st.SearchStrategy[bytes]]
) -> st.SearchStrategy[bytes]:
    return st.integers(0, len(dialect_names) - 1).flatmap(
        lambda k: inner(dialect_names[k]).map(lambda b: bytes([k]) + b)
    )


def request_bytes(dialect: str) -> st.SearchStrategy[bytes]:
    if dialect in ("anthropic", "openai"):
        valid = bodies(dialect).map(lambda s: s.raw)  # type: ignore[arg-type]
    elif dialect == "responses":
        valid = responses_bodies().map(lambda s: s.raw)
    elif dialect == "gemini":
        valid = gemini_bodies()
    else:
        valid = small_json.map(lambda v: json.dumps({"messages": [v]}).encode())
    return st.one_of(valid, mutated(valid), st.binary(max_size=200))


@st.composite
def anthropic_answer(draw: st.DrawFn) -> dict[str, Any]:
    text = st.text(max_size=40)
    block = st.one_of(
        st.builds(lambda t: {"type": "text", "text": t}, text),
        st.builds(lambda t: {"type": "thinking", "thinking": t, "signature": "sig"}, text),
        st.builds(
            lambda n, i: {"type": "tool_use", "id": f"toolu_{i}", "name": n, "input": {"id": i}},
            st.sampled_from(["context_guru_expand", "Bash", ""]),
            st.text(max_size=8),
        ),
        st.builds(lambda v: {"type": "mystery_block", "x": v}, small_json),
    )
    usage = st.fixed_dictionaries(
        {"input_tokens": st.integers(0, 10**6), "output_tokens": st.integers(0, 10**6)},
        optional={"cache_read_input_tokens": st.integers(0, 10**6)},
    )
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-fuzz",
        "content": draw(st.lists(block, max_size=4)),
        "stop_reason": draw(st.sampled_from(["end_turn", "tool_use", None])),
        "stop_sequence": None,
        "usage": draw(usage),
    }


@st.composite
def openai_answer(draw: st.DrawFn) -> dict[str, Any]:
    call = st.builds(
        lambda n, a, i: {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": n, "arguments": a},
        },
        st.sampled_from(["context_guru_expand", "bash"]),
        st.sampled_from(['{"id": "x"}', "{", "", "[]"]),
        st.integers(0, 9),
    )
    msg: dict[str, Any] = {
        "role": "assistant",
        "content": draw(st.one_of(st.none(), st.text(max_size=40))),
    }
    calls = draw(st.lists(call, max_size=3))
    if calls:
        msg["tool_calls"] = calls
    usage = st.fixed_dictionaries(
        {"prompt_tokens": st.integers(0, 10**6), "completion_tokens": st.integers(0, 10**6)},
        optional={"total_tokens": st.integers(0, 10**6)},
    )
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-fuzz",
        "choices": [{"index": 0, "message": msg, "logprobs": None, "finish_reason": "stop"}],
        "usage": draw(usage),
    }


@st.composite
def responses_answer(draw: st.DrawFn) -> dict[str, Any]:
    """A Responses API `response` object: output items of every kind Codex meets (reasoning,
    message, function and custom tool calls, our expand tool, an unknown item)."""
    text = st.text(max_size=40)
    item = st.one_of(
        st.builds(
            lambda t: {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": t, "annotations": []}],
            },
            text,
        ),
        st.builds(
            lambda t: {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [{"type": "summary_text", "text": t}],
                "encrypted_content": "gAAAA",
            },
            text,
        ),
        st.builds(
            lambda n, a, i: {
                "type": "function_call",
                "id": f"fc_{i}",
                "call_id": f"call_{i}",
                "name": n,
                "arguments": a,
                "status": "completed",
            },
            st.sampled_from(["context_guru_expand", "exec"]),
            st.sampled_from(['{"id": "x"}', "{", "", "[]"]),
            st.integers(0, 9),
        ),
        st.builds(
            lambda t: {"type": "custom_tool_call", "call_id": "call_c", "name": "x", "input": t},
            text,
        ),
        st.builds(lambda v: {"type": "mystery_item", "x": v}, small_json),
    )
    usage = st.fixed_dictionaries(
        {"input_tokens": st.integers(0, 10**6), "output_tokens": st.integers(0, 10**6)},
        optional={
            "input_tokens_details": st.fixed_dictionaries({"cached_tokens": st.integers(0, 10**6)}),
            "total_tokens": st.integers(0, 10**6),
        },
    )
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "status": draw(st.sampled_from(["completed", "incomplete"])),
        "model": "gpt-fuzz",
        "output": draw(st.lists(item, max_size=4)),
        "usage": draw(usage),
    }


@st.composite
def gemini_answer(draw: st.DrawFn) -> dict[str, Any]:
    text = st.text(max_size=40)
    part = st.one_of(
        st.builds(lambda t: {"text": t}, text),
        st.builds(lambda t: {"text": t, "thought": True}, text),
        st.builds(
            lambda n, i: {"functionCall": {"name": n, "args": {"id": i}}, "thoughtSignature": "s"},
            st.sampled_from(["context_guru_expand", "run_shell_command", ""]),
            st.text(max_size=8),
        ),
        st.builds(lambda v: {"mysteryPart": v}, small_json),
    )
    usage = st.fixed_dictionaries(
        {"promptTokenCount": st.integers(0, 10**6), "candidatesTokenCount": st.integers(0, 10**6)},
        optional={"cachedContentTokenCount": st.integers(0, 10**3)},
    )
    candidate = {
        "content": {"role": "model", "parts": draw(st.lists(part, min_size=1, max_size=4))},
        "finishReason": draw(st.sampled_from(["STOP", "MAX_TOKENS"])),
        "index": 0,
    }
    return {"candidates": [candidate], "usageMetadata": draw(usage), "modelVersion": "gemini-fuzz"}


def answer_values(dialect: str) -> st.SearchStrategy[dict[str, Any]]:
    if dialect == "gemini":
        return gemini_answer()
    if dialect == "responses":
        return responses_answer()
    return anthropic_answer() if dialect == "anthropic" else openai_answer()


def _paths(value: Any, here: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [here]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*here, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*here, i))
    return out


@st.composite
def retyped(draw: st.DrawFn, value: Any) -> Any:
    """`value` (parsed JSON) with a few nodes replaced by JSON of another shape: a string
    where a list was, a number for a text, null for an object — what byte flips rarely make."""
    value = json.loads(json.dumps(value))
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(value)[1:]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        new: Any = draw(
            st.one_of(small_json, st.sampled_from([None, 0, -1, 1.5, "", [], {}, True]))
        )
        node = value
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = new
    return value


def _sse_retyped(dialect: str, message: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """The message's event stream with one event's data retyped."""
    frames = list(DIALECTS[dialect].frames(message))

    @st.composite
    def one(draw: st.DrawFn) -> bytes:
        i = draw(st.integers(0, len(frames) - 1))
        head, _, data = frames[i].rstrip("\n").rpartition("data: ")
        if data.strip() == "[DONE]":
            return "".join(frames).encode("utf-8", "backslashreplace")
        new = draw(retyped(json.loads(data)))
        frames2 = [*frames[:i], f"{head}data: {json.dumps(new)}\n\n", *frames[i + 1 :]]
        return "".join(frames2).encode("utf-8", "backslashreplace")

    return one()


def answer_bytes(dialect: str, sse: bool) -> st.SearchStrategy[bytes]:
    render = answers.render_sse if sse else answers.render_json
    values = answer_values(dialect)
    valid = values.map(lambda m: render(answers.Reply(dialect, m)))
    if sse:
        structural = values.flatmap(lambda m: _sse_retyped(dialect, m))
    else:
        structural = values.flatmap(retyped).map(lambda m: json.dumps(m).encode())
    return st.one_of(valid, structural, mutated(valid), st.binary(max_size=200))


def tap_bytes() -> st.SearchStrategy[bytes]:
    names = sorted(DIALECTS)
    return st.tuples(
        st.integers(0, len(names) - 1),
        st.integers(0, len(ENCODINGS) - 1),
        st.integers(0, 255),
        st.one_of(
            *(answer_bytes(d, sse) for d in ANSWER_DIALECTS for sse in (True, False)),
            st.binary(max_size=300),
        ),
    ).map(lambda t: bytes([t[0], t[1], t[2]]) + t[3])


def hook_bytes() -> st.SearchStrategy[bytes]:
    """The dialect byte, the answer's content type, a request of that dialect (or, sometimes, of
    another: a body sent to the wrong path), the answer."""

    def encoded(body: bytes, coding: str) -> bytes:
        return encoded_input(coding, decode.encode(body, coding))

    def for_dialect(k: int) -> st.SearchStrategy[bytes]:
        d = DIALECT_NAMES[k]
        body = st.one_of(request_bytes(d), request_bytes(d), *map(request_bytes, DIALECT_NAMES))
        codings = st.sampled_from(["gzip", "br", "zstd", "deflate", "gzip, br"])
        plain = st.tuples(st.integers(0, 1), body, answer_bytes(d, True) | answer_bytes(d, False))
        sent = st.tuples(st.integers(0, 1), request_bytes(d), codings, answer_bytes(d, False))
        return st.one_of(
            plain.map(lambda t: bytes([k, t[0]]) + t[1] + b"\0\0" + t[2]),
            sent.map(lambda t: bytes([k, t[0]]) + encoded(t[1], t[2]) + t[3]),
        )

    return st.integers(0, len(DIALECT_NAMES) - 1).flatmap(for_dialect)


@dataclass(frozen=True)
class Target:
    name: str
    run: Callable[[bytes], None]
    inputs: Callable[[], st.SearchStrategy[bytes]]


def _body_inputs() -> st.SearchStrategy[bytes]:
    return _prefixed(DIALECT_NAMES, request_bytes)


def _knobs_then_body() -> st.SearchStrategy[bytes]:
    return st.tuples(
        st.integers(0, len(DIALECT_NAMES) - 1), st.integers(0, 255), st.integers(0, 255)
    ).flatmap(lambda t: request_bytes(DIALECT_NAMES[t[0]]).map(lambda b: bytes(t) + b))


TARGETS: dict[str, Target] = {
    t.name: t
    for t in [
        Target("jsonspan", t_jsonspan, lambda: request_bytes("anthropic")),
        Target("body", t_body, _body_inputs),
        Target("rewrite", t_rewrite, _knobs_then_body),
        Target("span", t_span, _knobs_then_body),
        Target("answer_json", t_answer_json, lambda: _prefixed(ANSWER_DIALECTS, lambda d: answer_bytes(d, False))),
        Target("answer_sse", t_answer_sse, lambda: _prefixed(ANSWER_DIALECTS, lambda d: answer_bytes(d, True))),
        Target("tap", t_tap, tap_bytes),
        Target("hooks", t_hooks, hook_bytes),
    ]
}  # fmt: skip
