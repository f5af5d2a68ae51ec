"""cg.billing.tap: the usage read off an answer as it passes — answers built with the official
SDKs' own models, split anywhere, in any line ending, content-encoded, cut short, malformed."""

from __future__ import annotations

import gzip
import itertools
import json
import zlib
from typing import Any

import brotli
import pytest
import zstandard
from anthropic.types import (
    Message,
    MessageDeltaUsage,
    RawContentBlockDeltaEvent,
    RawContentBlockStartEvent,
    RawContentBlockStopEvent,
    RawMessageDeltaEvent,
    RawMessageStartEvent,
    RawMessageStopEvent,
    TextBlock,
    TextDelta,
)
from anthropic.types import Usage as AnthropicUsage
from anthropic.types.raw_message_delta_event import Delta
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import ChoiceDelta
from openai.types.chat.chat_completion_message import ChatCompletionMessage
from openai.types.completion_usage import PromptTokensDetails

from cg.billing.tap import (
    DISABLED,
    READING,
    UNDECODABLE,
    UsageTap,
    decoder,
    mentions_usage,
    usage_of_json,
)
from cg.wire.usage import Usage, UsageError, from_provider

TEXT = ["Hello", ", world", ' — with "usage" in the text', "\nand a CR\r in it", " ☃"]


def anthropic_events(
    pieces: list[str] = TEXT,
    start: dict[str, Any] | None = None,
    delta: dict[str, Any] | None = None,
) -> list[Any]:
    """An Anthropic message stream as the SDK models it (`model_dump_json` writes every field,
    nulls included, as the API may)."""
    start = start or {
        "input_tokens": 12,
        "cache_creation_input_tokens": 3000,
        "cache_read_input_tokens": 50000,
        "output_tokens": 1,
    }
    delta = delta or {"output_tokens": 42, "input_tokens": None}
    msg = Message(
        id="msg_01",
        type="message",
        role="assistant",
        model="claude-sonnet-5-5",
        content=[],
        stop_reason=None,
        stop_sequence=None,
        usage=AnthropicUsage(**start),
    )
    out: list[Any] = [RawMessageStartEvent(type="message_start", message=msg)]
    out.append(
        RawContentBlockStartEvent(
            type="content_block_start", index=0, content_block=TextBlock(type="text", text="")
        )
    )
    out += [
        RawContentBlockDeltaEvent(
            type="content_block_delta", index=0, delta=TextDelta(type="text_delta", text=p)
        )
        for p in pieces
    ]
    out.append(RawContentBlockStopEvent(type="content_block_stop", index=0))
    out.append(
        RawMessageDeltaEvent(
            type="message_delta",
            delta=Delta(stop_reason="end_turn", stop_sequence=None),
            usage=MessageDeltaUsage(**delta),
        )
    )
    out.append(RawMessageStopEvent(type="message_stop"))
    return out


def sse(events: list[Any], eol: str = "\n", named: bool = True) -> bytes:
    frames = []
    for e in events:
        head = f"event: {e.type}{eol}" if named else ""
        frames.append(f"{head}data: {e.model_dump_json()}{eol}{eol}")
    return "".join(frames).encode()


def openai_chunks(include_usage: bool = True, cached: int = 900) -> bytes:
    base = {
        "id": "chatcmpl-1",
        "created": 1,
        "model": "gpt-6.2-sol",
        "object": "chat.completion.chunk",
    }
    chunks = [
        ChatCompletionChunk(
            **base,
            choices=[ChunkChoice(index=0, delta=ChoiceDelta(role="assistant", content=p))],
        )
        for p in TEXT
    ]
    chunks.append(
        ChatCompletionChunk(
            **base, choices=[ChunkChoice(index=0, delta=ChoiceDelta(), finish_reason="stop")]
        )
    )
    frames = []
    for c in chunks:
        d = c.model_dump(mode="json", exclude_none=True)
        if include_usage:
            d["usage"] = None  # as the API writes it on every chunk once usage is asked for
        frames.append(f"data: {json.dumps(d)}\n\n")
    if include_usage:
        last = ChatCompletionChunk(
            **base,
            choices=[],
            usage=CompletionUsage(
                prompt_tokens=1000,
                completion_tokens=20,
                total_tokens=1020,
                prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
            ),
        )
        frames.append(f"data: {last.model_dump_json(exclude_none=True)}\n\n")
    frames.append("data: [DONE]\n\n")
    return "".join(frames).encode()


def run(body: bytes, dialect: str, cuts: list[int] = (), encoding: str = "") -> UsageTap:  # type: ignore[assignment]
    """Feed `body` through a tap in pieces cut at `cuts`, then finish it; every chunk must come
    back as the same object."""
    tap = UsageTap(dialect, encoding)
    edges = [0, *sorted(set(cuts)), len(body)]
    for a, b in itertools.pairwise(edges):
        chunk = body[a:b]
        assert tap(chunk) is chunk
    tap.finish()
    return tap


ANTHROPIC_USAGE = Usage(
    input_tokens=12, cache_write_tokens=3000, cache_read_tokens=50000, output_tokens=42, requests=1
)


# -- the dialects ---------------------------------------------------------------------------


def test_anthropic_stream_merges_message_start_and_the_cumulative_message_delta() -> None:
    tap = run(sse(anthropic_events()), "anthropic")
    assert tap.state == READING and not tap.truncated and tap.malformed == 0
    # message_delta's null input_tokens leaves message_start's 12 standing; 42 replaces 1.
    assert from_provider("anthropic", tap.result()) == ANTHROPIC_USAGE
    assert tap.model == "claude-sonnet-5-5"


def test_anthropic_message_delta_values_replace_not_add() -> None:
    delta = {"output_tokens": 40, "input_tokens": 12, "cache_read_input_tokens": 50000}
    tap = run(sse(anthropic_events(delta=delta)), "anthropic")
    u = from_provider("anthropic", tap.result())
    assert (u.input_tokens, u.cache_read_tokens, u.output_tokens) == (12, 50000, 40)


def test_openai_stream_reads_the_one_chunk_with_non_null_usage() -> None:
    tap = run(openai_chunks(), "openai")
    assert from_provider("openai", tap.result()) == Usage(
        input_tokens=100, cache_read_tokens=900, output_tokens=20, requests=1
    )
    assert tap.model == "gpt-6.2-sol"


def test_openai_stream_without_include_usage_reports_none() -> None:
    tap = run(openai_chunks(include_usage=False), "openai")
    assert tap.result() is None and tap.state == READING and not tap.truncated


def test_responses_stream_reads_response_completed() -> None:
    usage = {
        "input_tokens": 500,
        "input_tokens_details": {"cached_tokens": 400},
        "output_tokens": 7,
        "total_tokens": 507,
    }
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {"id": "r1", "usage": None}},
        {"type": "response.output_text.delta", "delta": "hi"},
        {
            "type": "response.completed",
            "response": {"id": "r1", "model": "gpt-6-sol", "usage": usage},
        },
    ]
    body = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()
    tap = run(body, "responses")
    assert from_provider("responses", tap.result()) == Usage(
        input_tokens=100, cache_read_tokens=400, output_tokens=7, requests=1
    )
    assert tap.model == "gpt-6-sol"


def test_only_events_naming_a_non_null_usage_are_parsed() -> None:
    assert mentions_usage(b'data: {"usage":{"input_tokens":1}}')
    assert not mentions_usage(b'data: {"choices":[],"usage":null}')
    assert not mentions_usage(b'data: {"usage": null}')
    assert not mentions_usage(b'data: {"delta":{"text":"the \\"usage\\" word"}}')
    # A text delta that says "usage" is escaped inside its JSON string: never parsed.
    frames = sse(anthropic_events())
    parsed = [f for f in frames.split(b"\n\n") if mentions_usage(f)]
    assert len(parsed) == 2  # message_start and message_delta, nothing else


# -- framing: any split, any line ending ------------------------------------------------------


BODIES = {
    "anthropic": sse(anthropic_events()),
    "anthropic-crlf": sse(anthropic_events(), eol="\r\n"),
    "anthropic-cr": sse(anthropic_events(), eol="\r"),
    "anthropic-unnamed": sse(anthropic_events(), named=False),
    "openai": openai_chunks(),
}


@settings(max_examples=150, deadline=None)
@given(
    name=st.sampled_from(sorted(BODIES)),
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=40),
)
def test_any_byte_split_in_any_line_ending_gives_the_same_usage(name: str, cuts: list[int]) -> None:
    body = BODIES[name]
    dialect = "openai" if name == "openai" else "anthropic"
    whole = run(body, dialect)
    split = run(body, dialect, [c % (len(body) + 1) for c in cuts])
    assert split.result() == whole.result() is not None
    assert split.model == whole.model
    assert not split.truncated and split.malformed == 0 and split.state == READING


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=20))
def test_one_byte_chunks_and_a_bom(cuts: list[int]) -> None:
    body = b"\xef\xbb\xbf" + BODIES["anthropic-crlf"]
    tap = UsageTap("anthropic")
    for i in range(len(body)):
        tap(body[i : i + 1])
    tap.finish()
    assert from_provider("anthropic", tap.result()) == ANTHROPIC_USAGE


def test_a_missing_final_blank_line_still_reads_the_last_event() -> None:
    body = sse(anthropic_events()).rstrip(b"\n")
    events = body.split(b"\n\n")
    last_with_usage = b"\n\n".join(events[:-1])  # ends with message_delta, no blank line
    tap = run(last_with_usage, "anthropic")
    assert from_provider("anthropic", tap.result()) == ANTHROPIC_USAGE and not tap.truncated


# -- bad input: cut, malformed, wrong shape, over-long ----------------------------------------


def test_a_stream_cut_mid_event_keeps_what_was_reported_and_says_truncated() -> None:
    body = sse(anthropic_events())
    cut = body.index(b"message_delta") + 40  # inside the message_delta event's JSON
    tap = run(body[:cut], "anthropic")
    assert tap.truncated
    # message_start's report stands: the input side, and the first output token.
    u = from_provider("anthropic", tap.result())
    assert (u.input_tokens, u.cache_read_tokens, u.output_tokens) == (12, 50000, 1)


def test_a_cut_flagged_by_the_caller_is_truncated_even_at_an_event_boundary() -> None:
    body = sse(anthropic_events())
    tap = UsageTap("anthropic")
    tap(body[: body.index(b"event: message_delta")])
    tap.finish(cut=True)
    assert tap.truncated


def test_an_unparsable_usage_event_is_counted_and_the_stream_goes_on() -> None:
    body = b'event: message_delta\ndata: {"usage": {oops\n\n' + sse(anthropic_events())
    tap = run(body, "anthropic")
    assert tap.malformed == 1 and tap.state == READING
    assert from_provider("anthropic", tap.result()) == ANTHROPIC_USAGE


@pytest.mark.parametrize(
    ("dialect", "usage"),
    [
        ("anthropic", {"input_tokens": "12"}),
        ("anthropic", {"input_tokens": -1}),
        ("anthropic", {"input_tokens": True}),
        ("anthropic", {}),
        ("anthropic", ["not", "an", "object"]),
        ("openai", {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 9}}),
        ("openai", {"total_tokens": 5}),
        ("openai", {"prompt_tokens": 5, "prompt_tokens_details": "none"}),
    ],
)
def test_usage_of_the_wrong_shape_is_refused_with_a_reason(dialect: str, usage: Any) -> None:
    with pytest.raises(UsageError) as e:
        from_provider(dialect, usage)
    assert "usage" in str(e.value)


def test_openai_cache_writes_are_read_apart() -> None:
    """GPT-5.6 and later bill cache writes at 1.25x input and report them apart."""
    u = from_provider(
        "openai",
        {
            "prompt_tokens": 1000,
            "completion_tokens": 3,
            "prompt_tokens_details": {"cached_tokens": 600, "cache_write_tokens": 300},
        },
    )
    assert u == Usage(
        input_tokens=100, cache_write_tokens=300, cache_read_tokens=600, output_tokens=3, requests=1
    )


def test_an_over_long_event_is_dropped_not_buffered() -> None:
    big = b"data: {" + b"x" * 5000 + b"}\n\n"
    tap = UsageTap("anthropic", max_event=1000)
    for i in range(0, len(big), 100):
        tap(big[i : i + 100])
        assert len(tap._buf) <= 1100
    for chunk in sse(anthropic_events()).split(b"\n\n"):
        tap(chunk + b"\n\n")
    tap.finish()
    assert tap.dropped == 1
    assert from_provider("anthropic", tap.result()) == ANTHROPIC_USAGE


def test_an_internal_error_disables_the_tap_and_every_chunk_still_passes() -> None:
    class Broken:
        raw: Any = None
        model: str | None = None

        def event(self, name: str | None, obj: Any) -> None:
            raise RuntimeError("a bug")

    tap = UsageTap("anthropic")
    tap.reader = Broken()
    body = sse(anthropic_events())
    chunks = [body[i : i + 37] for i in range(0, len(body), 37)]
    assert [tap(c) for c in chunks] == chunks
    tap.finish()
    assert tap.state == DISABLED and "RuntimeError: a bug" in tap.error
    assert tap.result() is None


def test_the_tap_keeps_only_the_unfinished_event() -> None:
    body = sse(anthropic_events(pieces=["x" * 100] * 200))
    tap = UsageTap("anthropic")
    high = 0
    for i in range(0, len(body), 512):
        tap(body[i : i + 512])
        high = max(high, len(tap._buf))
    assert high < 1024  # one delta event plus one chunk at most, never the answer
    tap.finish()
    assert tap.result() is not None


# -- content-encoding --------------------------------------------------------------------------


def _deflate_raw(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


ENCODERS = {
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "deflate-raw": _deflate_raw,
    "br": brotli.compress,
    "zstd": zstandard.ZstdCompressor().compress,
}


@settings(max_examples=60, deadline=None)
@given(
    encoding=st.sampled_from(sorted(ENCODERS)),
    cuts=st.lists(st.integers(min_value=0, max_value=3000), max_size=25),
)
def test_an_encoded_stream_is_decoded_on_the_side_and_passes_as_it_came(
    encoding: str, cuts: list[int]
) -> None:
    raw = BODIES["anthropic"]
    body = ENCODERS[encoding](raw)
    header = "deflate" if encoding == "deflate-raw" else encoding
    tap = run(body, "anthropic", [c % (len(body) + 1) for c in cuts], encoding=header)
    assert tap.state == READING
    assert from_provider("anthropic", tap.result()) == ANTHROPIC_USAGE


def test_two_encodings_are_undone_in_reverse_order() -> None:
    body = brotli.compress(gzip.compress(BODIES["openai"]))
    tap = run(body, "openai", [10, 200], encoding="gzip, br")
    assert from_provider("openai", tap.result()).cache_read_tokens == 900


def test_an_unknown_encoding_is_skipped_and_said_so() -> None:
    tap = run(b"\x00\x01garbage", "anthropic", encoding="compress")
    assert tap.state == UNDECODABLE and "compress" in tap.error and tap.result() is None
    assert decoder("identity") is None and decoder("") is None


def test_a_corrupt_encoded_stream_disables_the_tap_only() -> None:
    tap = run(b"definitely not gzip", "anthropic", encoding="gzip")
    assert tap.state == DISABLED and tap.result() is None


# -- JSON answers ------------------------------------------------------------------------------


def test_json_answers_of_both_sdks() -> None:
    msg = Message(
        id="msg_1",
        type="message",
        role="assistant",
        model="claude-opus-5-5",
        content=[TextBlock(type="text", text="hi")],
        stop_reason="end_turn",
        stop_sequence=None,
        usage=AnthropicUsage(
            input_tokens=5,
            output_tokens=2,
            cache_read_input_tokens=100,
            cache_creation_input_tokens=7,
        ),
    )
    raw, model = usage_of_json(msg.model_dump_json().encode())
    assert model == "claude-opus-5-5"
    assert from_provider("anthropic", raw) == Usage(5, 7, 0, 100, 2, 1)
    done = ChatCompletion(
        id="c",
        created=1,
        model="gpt-6-luna",
        object="chat.completion",
        choices=[
            Choice(
                index=0,
                finish_reason="stop",
                message=ChatCompletionMessage(role="assistant", content="hi"),
            )
        ],
        usage=CompletionUsage(prompt_tokens=50, completion_tokens=5, total_tokens=55),
    )
    raw, model = usage_of_json(done.model_dump_json().encode())
    assert (from_provider("openai", raw), model) == (Usage(50, 0, 0, 0, 5, 1), "gpt-6-luna")
    assert usage_of_json(b"[1, 2]") == (None, None)
    with pytest.raises(ValueError):
        usage_of_json(b"{not json")
