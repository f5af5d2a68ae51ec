"""The `gemini` dialect (cg.wire.dialects.gemini): views of `contents`, the pairing of
`functionCall` and `functionResponse` by id or by name and order, the shape rules in the API's
wording, usage from `usageMetadata`, and answers as JSON and as the SSE stream
(`streamGenerateContent?alt=sse`) rebuilt and rendered."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cg.wire.dialects import MessageShapeError
from cg.wire.dialects.gemini import Gemini, call_key, from_gemini, key_function
from cg.wire.jsonspan import Member
from cg.wire.reply import ProviderError, ResponseParseError, sse_events
from cg.wire.shape import validate_shape
from cg.wire.usage import Usage, UsageError
from tests.support.strategies import SETTINGS

G = Gemini()
SIG = "CiQBVKhc7r0Q" + "x" * 40  # a thoughtSignature: opaque bytes, base64


def user(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "parts": list(parts)}


def model(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "model", "parts": list(parts)}


def call(name: str, args: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"functionCall": {"name": name, "args": args or {}, **extra}}


def response(name: str, output: str, **extra: Any) -> dict[str, Any]:
    return {"functionResponse": {"name": name, "response": {"output": output}, **extra}}


# A Gemini CLI turn as it re-sends it: its task, a thought, two calls of one tool (the first
# signed), their responses in order, then the model's text.
SESSION = [
    user({"text": "List the files and read the README."}),
    model(
        {"text": "I should list first.", "thought": True},
        {**call("run_shell_command", {"command": "ls"}), "thoughtSignature": SIG},
        call("read_file", {"absolute_path": "/w/README.md"}),
    ),
    user(response("run_shell_command", "a.py\nREADME.md"), response("read_file", "# W")),
    model({"text": "Two files; the README is a title."}),
]


def test_a_model_content_is_an_assistant_message_whose_calls_are_answered_by_name_and_order() -> (
    None
):
    views = [G.view(m) for m in SESSION]
    assert [v.role for v in views] == ["user", "assistant", "user", "assistant"]
    assert views[1].block_types == ("thinking", "functionCall", "functionCall")
    assert views[1].tool_call_ids == ("run_shell_command#0", "read_file#0")
    assert views[2].tool_result_ids == ("run_shell_command#0", "read_file#0")
    assert views[1].calls_tools
    assert "[functionCall run_shell_command]" in views[1].text
    assert views[2].text == "a.py\nREADME.md\n# W"
    assert validate_shape(SESSION, G) == []


def test_calls_with_ids_pair_by_id_and_the_kth_call_of_a_name_by_order() -> None:
    by_id = [
        user({"text": "go"}),
        model(call("ls", id="c1"), call("ls", id="c2")),
        user(response("ls", "x", id="c2"), response("ls", "y", id="c1")),
    ]
    assert G.view(by_id[1]).tool_call_ids == ("ls@c1", "ls@c2")
    assert validate_shape(by_id, G) == []
    by_order = [user({"text": "go"}), model(call("ls"), call("ls")), user(response("ls", "x"))]
    (v,) = validate_shape(by_order, G)
    assert v.rule == "answered-tool-use"
    assert "ls#1" in v.message and "number of function response parts" in v.message


def test_a_response_without_its_call_and_an_empty_parts_are_refused_in_the_apis_words() -> None:
    orphan = [user({"text": "go"}), model({"text": "ok"}), user(response("ls", "x"))]
    (v,) = validate_shape(orphan, G)
    assert v.rule == "paired-tool-result"
    assert "function response turn comes immediately after a function call turn" in v.message
    empty = [user({"text": "go"}), {"role": "model", "parts": []}, user({"text": "and?"})]
    (v,) = validate_shape(empty, G)
    assert v.rule == "no-blank-content"
    assert v.message.endswith("contents.parts must not be empty.")


def test_an_unknown_part_or_two_data_in_one_part_pass_the_request_through() -> None:
    with pytest.raises(MessageShapeError, match="unknown part member 'toolCall'"):
        G.view(model({"toolCall": {"id": "x"}}))
    with pytest.raises(MessageShapeError, match="both"):
        G.view(model({"text": "a", "functionCall": {"name": "f"}}))
    with pytest.raises(MessageShapeError):
        G.view(model({"text": 3}))
    # Modifiers are not data: a signature alone, inline data and code are known.
    v = G.view(
        model(
            {"text": "", "thoughtSignature": SIG},
            {"thoughtSignature": SIG},
            {"inlineData": {"mimeType": "image/png", "data": "iVBO"}},
            {"executableCode": {"language": "PYTHON", "code": "1"}},
        )
    )
    assert v.block_types == ("text", "thoughtSignature", "inlineData", "executableCode")
    assert not v.blank


def test_roles_other_than_user_and_model_are_named_as_the_api_names_them() -> None:
    assert G.role_error(user({"text": "a"})) is None
    assert G.role_error(model({"text": "a"})) is None
    assert (
        G.role_error({"role": "assistant", "parts": []}) == "Please use a valid role: user, model."
    )


def test_the_summary_is_a_user_content_with_one_text_part_and_the_transcript_is_contents() -> None:
    assert G.user_message("S.") == {"role": "user", "parts": [{"text": "S."}]}
    assert (G.array_key, G.content_blocks_key()) == ("contents", "parts")
    system = {"parts": [{"text": "You are Gemini CLI."}]}
    assert G.conversation_system({"systemInstruction": system}, SESSION) == system
    assert G.refuse({"cachedContent": "cachedContents/abc"}) is not None
    assert G.refuse({"contents": []}) is None


def test_the_paths_of_both_methods_are_the_dialects() -> None:
    assert G.matches("/v1beta/models/gemini-2.5-pro:generateContent")
    assert G.matches("/v1beta/models/gemini-2.5-pro:streamGenerateContent")
    assert not G.matches("/v1beta/models/gemini-2.5-pro:countTokens")
    assert not G.matches("/v1beta/models/gemini-2.5-pro")


def test_tool_outputs_are_the_string_outputs_of_function_responses() -> None:
    msg = user(
        response("run_shell_command", "a.py"),
        {"functionResponse": {"name": "read_many", "response": {"files": ["a"]}}},
    )
    a, b = G.tool_outputs(msg)
    assert (a.call, a.path, a.text) == (
        "run_shell_command#0",
        ("parts", 0, "functionResponse", "response", "output"),
        "string",
    )
    assert (b.call, b.text) == ("read_many#0", "none")
    (c,) = G.tool_calls(model(call("ls", {"d": "."}, id="q")))
    assert (c.id, c.name, c.input) == ("ls@q", "ls", {"d": "."})


@given(
    name=st.from_regex(r"[A-Za-z_][A-Za-z0-9_.-]{0,20}", fullmatch=True),
    call_id=st.one_of(st.none(), st.text(min_size=1, max_size=12)),
    k=st.integers(0, 50),
)
@SETTINGS
def test_a_call_key_gives_back_the_function_and_the_calls_id(
    name: str, call_id: str | None, k: int
) -> None:
    assert key_function(call_key(name, call_id, k)) == (name, call_id)


def test_a_result_turn_names_the_function_each_result_answers() -> None:
    (turn,) = G.result_turns([("context_guru_expand@c9", "the span"), ("ls#0", "x")])
    assert turn == {
        "role": "user",
        "parts": [
            {
                "functionResponse": {
                    "name": "context_guru_expand",
                    "response": {"output": "the span"},
                    "id": "c9",
                }
            },
            {"functionResponse": {"name": "ls", "response": {"output": "x"}}},
        ],
    }
    assert validate_shape([user({"text": "go"}), model(call("ls")), turn], G)[0].rule == (
        "paired-tool-result"
    )


# -- usage ----------------------------------------------------------------------------------------


def test_usage_metadata_is_read_as_the_spec_says() -> None:
    u = from_gemini(
        {
            "promptTokenCount": 12000,
            "cachedContentTokenCount": 8000,
            "candidatesTokenCount": 300,
            "thoughtsTokenCount": 200,
            "totalTokenCount": 12500,
        }
    )
    assert u == Usage(input_tokens=4000, cache_read_tokens=8000, output_tokens=500, requests=1)
    assert G.usage({"promptTokenCount": 5}).input_tokens == 5
    bad: Any
    for bad in (
        {},
        [],
        {"promptTokenCount": -1},
        {"promptTokenCount": 1, "cachedContentTokenCount": 2},
    ):
        with pytest.raises(UsageError):
            from_gemini(bad)


def test_the_total_follows_the_counts_it_sums() -> None:
    usage = {"promptTokenCount": 10, "candidatesTokenCount": 3, "thoughtsTokenCount": 2}
    usage["totalTokenCount"] = 1
    G.settle_usage(usage)
    assert usage["totalTokenCount"] == 15


# -- answers --------------------------------------------------------------------------------------

ANSWER: dict[str, Any] = {
    "candidates": [
        {
            "content": {
                "role": "model",
                "parts": [
                    {"text": "Thinking about it.", "thought": True},
                    {"text": "Let me look."},
                    {**call("context_guru_expand", {"id": "k1#2"}), "thoughtSignature": SIG},
                ],
            },
            "finishReason": "STOP",
            "index": 0,
        }
    ],
    "usageMetadata": {
        "promptTokenCount": 900,
        "candidatesTokenCount": 40,
        "thoughtsTokenCount": 12,
        "totalTokenCount": 952,
    },
    "modelVersion": "gemini-2.5-pro",
    "responseId": "r-1",
}


def sse(*events: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\r\n\r\n" for e in events)


def test_a_stream_is_the_answer_its_pieces_make() -> None:
    """As the API streams: text in pieces (joined), the thought apart, the call whole with its
    signature, `finishReason` and the final usage on the last event."""
    head = {"modelVersion": "gemini-2.5-pro", "responseId": "r-1"}

    def piece(*parts: dict[str, Any], **rest: Any) -> dict[str, Any]:
        cand = {"content": {"role": "model", "parts": list(parts)}, "index": 0, **rest}
        return {"candidates": [cand], **head}

    body = sse(
        piece({"text": "Thinking ", "thought": True}),
        piece({"text": "about it.", "thought": True}),
        {**piece({"text": "Let "}), "usageMetadata": {"promptTokenCount": 900}},
        piece({"text": "me look."}),
        {
            **piece(
                {**call("context_guru_expand", {"id": "k1#2"}), "thoughtSignature": SIG},
                finishReason="STOP",
            ),
            "usageMetadata": ANSWER["usageMetadata"],
        },
    )
    got = G.parse_stream(body)
    assert got == ANSWER
    G.check_answer(got)
    assert G.answer_text(got) == "Let me look."
    reader = G.usage_reader()
    for _, data in sse_events(body):
        reader.event(None, json.loads(data))
    assert (reader.raw, reader.model) == (ANSWER["usageMetadata"], "gemini-2.5-pro")


def test_a_cut_stream_and_an_error_event_are_not_answers() -> None:
    open_ended = {"candidates": [{"content": {"role": "model", "parts": [{"text": "a"}]}}]}
    with pytest.raises(ResponseParseError, match="finishReason"):
        G.parse_stream(sse(open_ended))
    with pytest.raises(ResponseParseError, match="no events"):
        G.parse_stream(b"")
    err = {"error": {"code": 429, "message": "Resource exhausted", "status": "RESOURCE_EXHAUSTED"}}
    with pytest.raises(ProviderError) as e:
        G.parse_stream(sse(err))
    assert e.value.payload == err
    assert G.answer_error(err) and not G.answer_error(ANSWER)
    with pytest.raises(ResponseParseError):
        G.check_answer({"candidates": []})


def test_a_rendered_answer_streams_back_to_itself() -> None:
    assert G.parse_stream("".join(G.frames(ANSWER)).encode()) == ANSWER


_text = st.text(min_size=1, max_size=30)
_part = st.one_of(
    st.builds(lambda t: {"text": t}, _text),
    st.builds(lambda t: {"text": t, "thought": True}, _text),
    st.builds(
        lambda n, a: {"functionCall": {"name": n, "args": {"a": a}}, "thoughtSignature": SIG},
        st.sampled_from(["ls", "read_file"]),
        _text,
    ),
)


def _merged(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a reader of the stream makes of consecutive text parts of one kind: one part."""
    out: list[dict[str, Any]] = []
    for p in parts:
        if out and "text" in p and "text" in out[-1] and p.get("thought") is out[-1].get("thought"):
            out[-1] = {**out[-1], "text": out[-1]["text"] + p["text"]}
        else:
            out.append(dict(p))
    return out


@given(parts=st.lists(_part, min_size=1, max_size=8), tokens=st.integers(0, 10**6))
@SETTINGS
def test_any_answer_survives_rendering_and_rebuilding(
    parts: list[dict[str, Any]], tokens: int
) -> None:
    answer = {
        "candidates": [
            {
                "content": {"role": "model", "parts": _merged(parts)},
                "finishReason": "STOP",
                "index": 0,
            }
        ],
        "usageMetadata": {"promptTokenCount": tokens, "candidatesTokenCount": 1},
        "modelVersion": "gemini-2.5-flash",
    }
    assert G.parse_stream("".join(G.frames(answer)).encode()) == answer


def test_the_proxys_own_calls_are_found_stripped_and_sent_back_with_their_signatures() -> None:
    (c,) = G.calls(ANSWER)
    assert (c.id, c.name, c.input) == (
        "context_guru_expand#0",
        "context_guru_expand",
        {"id": "k1#2"},
    )
    turn = G.assistant_turn(ANSWER)
    assert turn["role"] == "model"
    assert turn["parts"][2]["thoughtSignature"] == SIG
    assert turn["parts"] == ANSWER["candidates"][0]["content"]["parts"]
    stripped = json.loads(json.dumps(ANSWER))
    G.strip_calls(stripped, "context_guru_expand")
    assert [list(p) for p in stripped["candidates"][0]["content"]["parts"]] == [
        ["text", "thought"],
        ["text"],
    ]
    only_call = {"candidates": [{"content": {"role": "model", "parts": [call("x")]}}]}
    G.strip_calls(only_call, "x")
    assert only_call["candidates"][0]["content"]["parts"] == [{"text": ""}]


# -- the summarizer and the expand tool -----------------------------------------------------------


def test_the_summarizer_request_and_its_output_limit() -> None:
    req = G.summary_request("gemini-2.5-pro", "Summarize.", 4000)
    assert req == {
        "contents": [{"role": "user", "parts": [{"text": "Summarize."}]}],
        "generationConfig": {"maxOutputTokens": 4000},
    }
    low = {"generationConfig": Member("generationConfig", 0, 0, {"maxOutputTokens": 100, "t": 0})}
    assert G.summary_limits(low, 4000) == {"generationConfig": {"maxOutputTokens": 4000, "t": 0}}
    high = {"generationConfig": Member("generationConfig", 0, 0, {"maxOutputTokens": 9000})}
    assert G.summary_limits(high, 4000) == {}
    assert G.summary_limits({}, 4000) == {}
    assert G.auth_headers("k", bearer=False) == {"x-goog-api-key": "k"}
    assert G.auth_headers("k", bearer=True) == {"authorization": "Bearer k"}


def test_the_expand_tool_is_a_function_declaration_and_tool_config_is_read_as_the_api_means() -> (
    None
):
    tool = G.function_tool("context_guru_expand", "Get it back.", {"type": "object"})
    assert tool == {
        "functionDeclarations": [
            {
                "name": "context_guru_expand",
                "description": "Get it back.",
                "parameters": {"type": "object"},
            }
        ]
    }
    assert G.tool_name(tool) == "context_guru_expand"
    assert G.tool_name({"functionDeclarations": [{"name": "a"}, {"name": "b"}]}) is None
    assert G.forces_a_tool({"functionCallingConfig": {"mode": "ANY"}})
    assert not G.forces_a_tool({"functionCallingConfig": {"mode": "AUTO"}})
    assert G.fixed_tool_choice({"functionCallingConfig": {"mode": "NONE"}})
    assert G.fixed_tool_choice(
        {"functionCallingConfig": {"mode": "AUTO", "allowedFunctionNames": ["ls"]}}
    )
    assert not G.fixed_tool_choice({"functionCallingConfig": {"mode": "AUTO"}})
    assert G.tool_choice("none") == {"functionCallingConfig": {"mode": "NONE"}}
    assert G.call_begins(ANSWER, "context_guru_expand") is None


def test_the_model_and_the_stream_are_read_off_the_path() -> None:
    api = "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
    vertex = "/v1/projects/p/locations/us-central1/publishers/google/models/gemini-2.5-flash:generateContent"
    assert (G.url_model(api), G.url_streams(api)) == ("gemini-2.5-pro", True)
    assert (G.url_model(vertex), G.url_streams(vertex)) == ("gemini-2.5-flash", False)
    assert G.url_model("/v1internal:generateContent") is None
    url = "https://generativelanguage.googleapis.com" + api + "&key=K"
    assert G.standalone_url(url, "gemini-2.5-flash") == (
        "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent?key=K"
    )
    assert (
        G.standalone_path("gemini-2.5-flash") == "/v1beta/models/gemini-2.5-flash:generateContent"
    )
    assert (G.usage_key, G.model_key, G.tool_choice_member) == (
        "usageMetadata",
        "modelVersion",
        "toolConfig",
    )
    assert G.answer_model(ANSWER) == "gemini-2.5-pro"


def test_a_held_stream_resumes_with_the_new_rounds_parts_only() -> None:
    first = json.loads(json.dumps(ANSWER))
    final: dict[str, Any] = {
        "candidates": [
            {"content": {"role": "model", "parts": [{"text": "Found it."}]}, "finishReason": "STOP"}
        ]
    }
    G.continued(first, final, 0, 1)
    assert final["candidates"][0]["content"]["parts"] == [{"text": "Found it."}]
    stripped = json.loads(json.dumps(ANSWER))
    G.strip_calls(stripped, "context_guru_expand")
    G.continued(first, stripped, 0, 0)
    assert [p["text"] for p in stripped["candidates"][0]["content"]["parts"]] == [
        "Thinking about it.",
        "Let me look.",
    ]
    assert G.resumed_event({"candidates": []}, 0)
