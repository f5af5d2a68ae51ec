"""cg.wire.dialects: read-only message views for each wire format, and routing requests to them."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given

from cg.wire.dialects import ANTHROPIC, DIALECTS, OPENAI, BlockView, MessageShapeError, route
from tests.support.strategies import SETTINGS, Sample, bodies

# -- anthropic -------------------------------------------------------------------------------


def test_anthropic_string_content() -> None:
    v = ANTHROPIC.view({"role": "user", "content": "hello 😀"})
    assert (v.role, v.text, v.form, v.blocks, v.blank) == ("user", "hello 😀", "string", (), False)
    assert v.tool_call_ids == v.tool_result_ids == ()
    assert not v.is_system and not v.calls_tools


def test_anthropic_every_block_type() -> None:
    content = [
        {"type": "thinking", "thinking": "let me think", "signature": "c2ln"},
        {"type": "redacted_thinking", "data": "ZW5j"},
        {"type": "text", "text": "I'll run it", "cache_control": {"type": "ephemeral"}},
        {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"cmd": "ls ü"}},
        {"type": "tool_use", "id": "toolu_2", "name": "read", "input": {}},
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
    ]
    v = ANTHROPIC.view({"role": "assistant", "content": content})
    assert v.form == "blocks"
    assert v.block_types == (
        "thinking",
        "redacted_thinking",
        "text",
        "tool_use",
        "tool_use",
        "server_tool_use",
        "web_search_tool_result",
    )
    assert v.tool_call_ids == ("toolu_1", "toolu_2")  # server tools are not client tool calls
    assert v.tool_result_ids == ()
    assert v.calls_tools and not v.blank
    assert v.blocks[0] == BlockView("thinking", "let me think", False)
    assert v.blocks[1] == BlockView("redacted_thinking", "[redacted_thinking]")
    assert v.blocks[3].text == '[tool_use bash] {"cmd": "ls ü"}'
    assert v.blocks[6] == BlockView("web_search_tool_result", "[web_search_tool_result]")
    assert v.blocks[3].shown == "" and v.blocks[3].call is content[3]  # rendered when read
    assert v.text == "\n".join(
        [
            "let me think",
            "[redacted_thinking]",
            "I'll run it",
            '[tool_use bash] {"cmd": "ls ü"}',
            "[tool_use read] {}",
            "[server_tool_use]",
            "[web_search_tool_result]",
        ]
    )


@pytest.mark.parametrize(
    ("block", "why"),
    [
        ({"type": ["text"]}, "a content block is not an object with a string 'type'"),
        ({"text": "x"}, "a content block is not an object with a string 'type'"),
        ("text", "a content block is not an object with a string 'type'"),
        ({"type": "video"}, "unknown content block type 'video'"),
    ],
)
def test_anthropic_a_block_that_is_not_one_is_refused_by_name(block: object, why: str) -> None:
    with pytest.raises(MessageShapeError, match=re.escape(why)):
        ANTHROPIC.view({"role": "user", "content": [{"type": "text", "text": "a"}, block]})


def test_anthropic_a_blank_text_or_thinking_block_makes_the_message_blank() -> None:
    for kind in ("text", "thinking"):
        for t in ("", " \n", None, 3):
            v = ANTHROPIC.view({"role": "user", "content": [{"type": kind, kind: t}]})
            assert v.blank and v.blocks[0].blank, (kind, t)
            assert v.blocks[0].text == (t if isinstance(t, str) else "")
        v = ANTHROPIC.view({"role": "user", "content": [{"type": kind, kind: " x"}]})
        assert not v.blank and v.text == " x"


def test_anthropic_tool_results_string_and_block_content() -> None:
    content = [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "file.txt"},
        {
            "type": "tool_result",
            "tool_use_id": "toolu_2",
            "is_error": True,
            "content": [
                {"type": "text", "text": "line 1"},
                {"type": "image", "source": {"type": "base64", "data": "AA=="}},
            ],
        },
        {"type": "tool_result", "tool_use_id": "toolu_3"},
        {"type": "text", "text": "continue"},
    ]
    v = ANTHROPIC.view({"role": "user", "content": content})
    assert v.tool_result_ids == ("toolu_1", "toolu_2", "toolu_3")
    assert v.tool_call_ids == ()
    assert [b.text for b in v.blocks] == ["file.txt", "line 1\n[image]", "", "continue"]
    assert not v.blank  # an empty tool_result is not blank content
    assert not v.calls_tools  # only assistants call tools


def test_anthropic_image_and_document_blocks() -> None:
    img = {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}
    doc = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "d"}}
    v = ANTHROPIC.view({"role": "user", "content": [img, doc]})
    assert v.block_types == ("image", "document")
    assert v.text == "[image]\n[document]"
    assert not v.blank


@pytest.mark.parametrize(
    ("content", "blank"),
    [
        ("", True),
        (" \n", True),
        ([], True),
        ([{"type": "text", "text": ""}], True),
        ([{"type": "text", "text": 5}], True),
        ([{"type": "thinking", "thinking": " ", "signature": "s"}], True),
        ([{"type": "thinking", "signature": "s"}, {"type": "text", "text": "x"}], True),
        ([{"type": "redacted_thinking", "data": ""}], False),
        ("x", False),
    ],
)
def test_anthropic_blank(content: Any, blank: bool) -> None:
    assert ANTHROPIC.view({"role": "assistant", "content": content}).blank is blank


def test_anthropic_null_and_missing_content() -> None:
    assert ANTHROPIC.view({"role": "user", "content": None}).form == "null"
    missing = ANTHROPIC.view({"role": "user"})
    assert (missing.form, missing.blank) == ("missing", True)


def test_anthropic_system_message_mid_array() -> None:
    v = ANTHROPIC.view({"role": "system", "content": [{"type": "text", "text": "reminder"}]})
    assert v.is_system and v.text == "reminder"


def test_anthropic_tool_use_without_an_id_still_counts_as_a_call() -> None:
    v = ANTHROPIC.view({"role": "assistant", "content": [{"type": "tool_use", "name": "x"}]})
    assert v.tool_call_ids == ("",) and v.calls_tools


@pytest.mark.parametrize(
    "message",
    [
        "not an object",
        {"content": "no role"},
        {"role": None, "content": "x"},
        {"role": "user", "content": 1},
        {"role": "user", "content": {"type": "text"}},
        {"role": "user", "content": ["bare string block"]},
        {"role": "user", "content": [{"type": 3}]},
        {"role": "user", "content": [{"text": "no type"}]},
    ],
)
def test_anthropic_unreadable_messages(message: Any) -> None:
    with pytest.raises(MessageShapeError):
        ANTHROPIC.view(message)


# -- openai ----------------------------------------------------------------------------------


def test_openai_system_developer_and_name() -> None:
    s = OPENAI.view({"role": "system", "content": "be terse"})
    d = OPENAI.view(
        {"role": "developer", "content": [{"type": "text", "text": "rules"}], "name": "x"}
    )
    assert s.is_system and d.is_system
    assert (d.form, d.text, d.block_types) == ("blocks", "rules", ("text",))
    u = OPENAI.view({"role": "user", "name": "alice", "content": "hi"})
    assert (u.role, u.text, u.blank) == ("user", "hi", False)


def test_openai_parallel_tool_calls_with_null_content() -> None:
    msg = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "a", "arguments": '{"x":1}'}},
            {"id": "call_2", "type": "function", "function": {"name": "b", "arguments": "{}"}},
        ],
    }
    v = OPENAI.view(msg)
    assert v.tool_call_ids == ("call_1", "call_2")
    assert v.calls_tools and not v.blank
    assert v.form == "null"
    assert v.text == '[tool_call a] {"x":1}\n[tool_call b] {}'


@pytest.mark.parametrize("content", [None, "", "MISSING"])
def test_openai_tool_calls_excuse_empty_content(content: Any) -> None:
    msg: dict[str, Any] = {"role": "assistant", "tool_calls": [{"id": "c", "function": {}}]}
    if content != "MISSING":
        msg["content"] = content
    assert not OPENAI.view(msg).blank
    no_calls = {k: v for k, v in msg.items() if k != "tool_calls"}
    assert OPENAI.view(no_calls).blank


def test_openai_tool_role_message() -> None:
    v = OPENAI.view({"role": "tool", "tool_call_id": "call_1", "content": "42", "name": "a"})
    assert (v.role, v.tool_result_ids, v.text, v.blank) == ("tool", ("call_1",), "42", False)
    parts = OPENAI.view(
        {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "r"}]}
    )
    assert parts.text == "r"


def test_openai_legacy_function_call() -> None:
    call = OPENAI.view(
        {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}}
    )
    assert not call.blank
    assert call.text == "[tool_call f] {}"
    assert call.tool_call_ids == ()  # legacy calls are not paired by id
    result = OPENAI.view({"role": "function", "name": "f", "content": "1"})
    assert result.tool_result_ids == ()


def test_openai_content_parts() -> None:
    v = OPENAI.view(
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
                {"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}},
            ],
        }
    )
    assert v.block_types == ("text", "image_url", "input_audio")
    assert v.text == "look\n[image_url]\n[input_audio]"
    refusal = OPENAI.view({"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]})
    assert refusal.text == "no" and not refusal.blank


@pytest.mark.parametrize(
    "message",
    [
        ["not", "an", "object"],
        {"content": "x"},
        {"role": "user", "content": 3.5},
        {"role": "user", "content": ["bare"]},
        {"role": "assistant", "content": None, "tool_calls": "call"},
        {"role": "assistant", "content": None, "tool_calls": ["call"]},
    ],
)
def test_openai_unreadable_messages(message: Any) -> None:
    with pytest.raises(MessageShapeError):
        OPENAI.view(message)


@SETTINGS
@given(bodies())
def test_views_of_generated_messages_are_consistent(s: Sample) -> None:
    d = DIALECTS[s.dialect]
    for m in s.messages:
        v = d.view(m)
        assert v.role == m["role"]
        assert not v.blank or m["role"] == "assistant"  # only the empty prefill is blank
        if v.calls_tools:
            assert v.role == "assistant"
        if s.dialect == "openai" and m["role"] == "tool":
            assert v.tool_result_ids == (m["tool_call_id"],)


def test_content_blocks_key() -> None:
    assert ANTHROPIC.content_blocks_key() == OPENAI.content_blocks_key() == "content"


# -- routing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "dialect"),
    [
        ("POST", "/v1/messages", "anthropic"),
        ("POST", "/v1/messages?beta=true", "anthropic"),
        ("POST", "/v1/messages/", "anthropic"),
        ("POST", "/anthropic/v1/messages", "anthropic"),
        ("post", "/v1/messages", "anthropic"),
        ("POST", "/v1/chat/completions", "openai"),
        ("POST", "/openai/v1/chat/completions?api-version=1", "openai"),
        ("POST", "/api/proxy/v1/chat/completions#x", "openai"),
        ("POST", "/v1/messages/count_tokens", None),
        ("POST", "/v1/messages/count_tokens?beta=true", None),
        ("POST", "/v1/messages/batches", None),
        ("POST", "/v1/messages/batches/msgbatch_1/cancel", None),
        ("POST", "/v1/completions", None),
        ("POST", "/v1/responses", "responses"),
        ("POST", "/openai/v1/responses?x=1", "responses"),
        ("POST", "/v1/responses/compact", None),
        # Codex signed in with ChatGPT (chatgpt.com's Codex backend)
        ("POST", "/backend-api/codex/responses", "responses"),
        ("POST", "/backend-api/codex/responses/", "responses"),
        ("POST", "/backend-api/codex/responses/compact", None),
        ("GET", "/backend-api/codex/models?client_version=0.171.0", None),
        ("POST", "/backend-api/responses", None),
        ("POST", "/v1/responses/resp_123/cancel", None),
        ("GET", "/v1/responses/resp_123", None),
        ("GET", "/v1/responses", None),
        ("POST", "/v1/chat/completions/abc", None),
        ("POST", "/xv1/messages", None),
        ("POST", "/", None),
        ("POST", "", None),
        ("GET", "/v1/messages", None),
        ("GET", "/v1/chat/completions", None),
        ("PUT", "/v1/messages", None),
        ("OPTIONS", "/v1/chat/completions", None),
    ],
)
def test_route(method: str, path: str, dialect: str | None) -> None:
    d = route(method, path)
    assert (d.name if d else None) == dialect
    if dialect:
        assert d is DIALECTS[dialect]


# -- Claude on Vertex AI, Bedrock ----------------------------------------------------------------

VERTEX = "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5@20250929"


def test_claude_on_vertex_is_the_anthropic_dialect_with_its_model_in_the_path() -> None:
    from cg.wire.dialects import ANTHROPIC, GEMINI, route

    assert route("POST", VERTEX + ":rawPredict") is ANTHROPIC
    assert route("POST", VERTEX + ":streamRawPredict") is ANTHROPIC
    assert route("POST", VERTEX.rsplit("/", 1)[0] + "/count-tokens:rawPredict") is None
    google = "/v1/projects/p/locations/us/publishers/google/models/gemini-2.5-pro:generateContent"
    assert route("POST", google) is GEMINI
    assert ANTHROPIC.url_model(VERTEX + ":rawPredict") == "claude-sonnet-4-5@20250929"
    assert ANTHROPIC.url_model("/v1/messages") is None
    assert ANTHROPIC.url_streams(VERTEX + ":streamRawPredict")
    assert not ANTHROPIC.url_streams(VERTEX + ":rawPredict")
    url = "https://us-east5-aiplatform.googleapis.com" + VERTEX + ":streamRawPredict"
    assert ANTHROPIC.standalone_url(url, "claude-haiku-4-5@20251001") == (
        url.replace(
            "claude-sonnet-4-5@20250929:streamRawPredict", "claude-haiku-4-5@20251001:rawPredict"
        )
    )
    assert ANTHROPIC.standalone_url("https://api.anthropic.com/v1/messages", "m") == (
        "https://api.anthropic.com/v1/messages"
    )
    body = {"model": "m", "max_tokens": 9, "messages": []}
    assert ANTHROPIC.standalone_body(url, body) == {
        "max_tokens": 9,
        "messages": [],
        "anthropic_version": "vertex-2023-10-16",
    }
    assert ANTHROPIC.standalone_body("https://api.anthropic.com/v1/messages", body) is body


def test_a_bedrock_model_request_is_signed_and_passes_through_saying_so() -> None:
    from cg.wire.dialects import BEDROCK_REASON, route, signed

    for tail in ("invoke", "invoke-with-response-stream", "converse", "converse-stream"):
        path = f"/model/anthropic.claude-sonnet-4-5-20250929-v1:0/{tail}"
        assert route("POST", path) is None
        assert signed("POST", path) == BEDROCK_REASON
    assert signed("GET", "/model/x/invoke") is None
    assert signed("POST", "/v1/messages") is None
