"""The fake provider's Gemini API, read by Google's own SDK (google-genai): a JSON answer, the
stream, usage with a cache read, and the 400 for contents the API refuses."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from google import genai
from google.genai import errors, types

from tests.support.fakeprovider import FakeProvider, Reply

KEY = "AIza-fake-key-gemini-0001"
LONG = "You are a careful coding agent. " * 300  # over the cache's minimum prefix


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with FakeProvider() as p:
        yield p


def client(fake: FakeProvider) -> genai.Client:
    return genai.Client(api_key=KEY, http_options=types.HttpOptions(base_url=fake.url))


def test_the_sdk_reads_a_json_answer_and_its_usage(fake: FakeProvider) -> None:
    fake.script(Reply(text="Two files."))
    c = client(fake)  # (held: a Client closes its connections when it is collected)
    r = c.models.generate_content(model="gemini-2.5-flash", contents="How many?")
    assert r.text == "Two files."
    assert r.usage_metadata is not None and r.usage_metadata.prompt_token_count
    (rec,) = fake.requests
    assert rec.path == "/v1beta/models/gemini-2.5-flash:generateContent"
    assert rec.header("x-goog-api-key") == KEY


def test_the_sdk_reads_the_stream_and_a_second_turn_reads_the_cache(fake: FakeProvider) -> None:
    c = client(fake)
    config = types.GenerateContentConfig(system_instruction=LONG)
    for _ in range(2):
        chunks = list(
            c.models.generate_content_stream(
                model="gemini-2.5-pro", contents="Hello there", config=config
            )
        )
        assert (
            "".join(ch.text or "" for ch in chunks)
            == "Hello from the fake provider, streamed in pieces."
        )
    usage = chunks[-1].usage_metadata
    assert usage is not None and usage.cached_content_token_count
    assert fake.requests[-1].path == "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"


def test_an_unanswered_function_call_is_refused_in_the_apis_words(fake: FakeProvider) -> None:
    contents = [
        types.Content(role="user", parts=[types.Part(text="go")]),
        types.Content(
            role="model",
            parts=[types.Part(function_call=types.FunctionCall(name="ls", args={}))],
        ),
        types.Content(role="user", parts=[types.Part(text="and?")]),
    ]
    c = client(fake)
    with pytest.raises(errors.ClientError) as e:
        c.models.generate_content(model="gemini-2.5-flash", contents=contents)
    assert e.value.code == 400
    assert "number of function response parts" in str(e.value)
