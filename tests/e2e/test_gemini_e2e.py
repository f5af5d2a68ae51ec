"""The `gemini` dialect through a real `mitmdump -s cg_addon.py`, driven by Google's own SDK
(google-genai) against the fake provider's Gemini API (tests/support/gemini_api.py).

A session is a task and rounds of `run_shell_command` calls, each answered by its
`functionResponse`, re-sent whole every turn as Gemini CLI re-sends it. With the triggers lowered
the middle of it becomes one summary: the provider gets contents it accepts (the oracle's
`contents_problem`), the same summary bytes turn after turn, the task and the newest rounds byte
for byte; a model that calls `context_guru_expand` is answered by the proxy, over JSON and over
the stream; the API key in `?key=` is a credential: it names the tenant and is written nowhere.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from google import genai
from google.genai import types

from tests.e2e.harness import Proxy, by_id, low, new_id, start_summarize
from tests.support import gemini_api
from tests.support.fakeprovider import FakeProvider, Recorded, Reply

pytestmark = pytest.mark.e2e

KEY = "AIza-e2e-gemini-key-00000001"
MODEL = "gemini-2.5-pro"
HEADER = "=== History Summary ==="
MARKER = re.compile(r"<<cg:([0-9a-f]+)>>")
LOW = low(resummarize_tokens=100_000)  # one summary, reused for the rest of the test
SHELL = types.FunctionDeclaration(
    name="run_shell_command",
    description="Run a shell command.",
    parameters_json_schema={"type": "object", "properties": {"command": {"type": "string"}}},
)
# As Gemini CLI declares its tools (the expand tool goes in only beside the agent's own).
CONFIG = types.GenerateContentConfig(tools=[types.Tool(function_declarations=[SHELL])])


def history(rounds: int, tag: str) -> list[types.Content]:
    """A task, then `rounds` model turns calling run_shell_command with their responses."""
    out = [
        types.Content(role="user", parts=[types.Part(text=f"Task {tag}: fix the failing test.")])
    ]
    for n in range(rounds):
        call = types.FunctionCall(name="run_shell_command", args={"command": f"cat part{n}.py"})
        out.append(types.Content(role="model", parts=[types.Part(function_call=call)]))
        result = types.FunctionResponse(
            name="run_shell_command", response={"output": f"line {n}: value_{n} = {n * 7}\n" * 8}
        )
        out.append(types.Content(role="user", parts=[types.Part(function_response=result)]))
    return out


def wire(contents: list[types.Content]) -> list[Any]:
    """The contents as the API's JSON (camelCase), as the SDK would send them."""
    return [c.model_dump(mode="json", exclude_none=True, by_alias=True) for c in contents]


def client(proxy: Proxy, e2e_id: str, sent: list[httpx.Request] | None = None) -> genai.Client:
    """Google's SDK pointed at the proxy; every request it sends kept in `sent`."""
    hooks = {"event_hooks": {"request": [sent.append]}} if sent is not None else {}
    options = types.HttpOptions(base_url=proxy.url, headers={"x-e2e-id": e2e_id}, client_args=hooks)
    return genai.Client(api_key=KEY, http_options=options)


def contents_of(rec: Recorded) -> list[Any]:
    doc = rec.json()
    assert gemini_api.contents_problem(doc) is None, gemini_api.contents_problem(doc)
    return list(doc["contents"])


def summary_of(contents: list[Any]) -> tuple[int, Any] | None:
    for i, c in enumerate(contents):
        texts = [p.get("text", "") for p in c.get("parts", [])]
        if c.get("role") == "user" and any(t.startswith(HEADER) for t in texts):
            return i, c
    return None


def agent_requests(fake: FakeProvider, e2e_id: str) -> list[Recorded]:
    return [r for r in fake.requests if by_id(e2e_id)(r) and not r.is_summarizer]


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeProvider]:
    with FakeProvider() as p:
        yield p


@pytest.fixture(scope="module")
def proxy(fake: FakeProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    with start_summarize(fake.url, tmp_path_factory.mktemp("gemini"), LOW) as p:
        yield p


def test_a_turn_under_the_triggers_reaches_the_provider_byte_for_byte(
    fake: FakeProvider, tmp_path: Path
) -> None:
    with Proxy.start(fake.url, tmp_path) as p:
        e2e = new_id()
        sent: list[httpx.Request] = []
        options = types.HttpOptions(
            base_url=p.url,
            headers={"x-e2e-id": e2e},
            client_args={"event_hooks": {"request": [sent.append]}},
        )
        with genai.Client(api_key=KEY, http_options=options) as c:
            c.models.generate_content(model=MODEL, contents=history(3, "plain"), config=CONFIG)
        (got,) = agent_requests(fake, e2e)
        (req,) = sent
        assert got.body == req.content
        assert got.path == req.url.raw_path.decode()
        record = p.records.wait(e2e)
        assert record["cg"]["dialect"] == "gemini"


def test_a_long_session_is_summarized_and_the_summary_is_sent_again_byte_for_byte(
    fake: FakeProvider, proxy: Proxy
) -> None:
    e2e = new_id()
    sent: list[httpx.Request] = []
    with client(proxy, e2e, sent) as c:
        turns = session(fake, proxy, c, e2e)
    found = [summary_of(t) for t in turns]
    assert all(f is not None for f in found), "no summary was spliced"
    (i1, s1), (i2, s2) = found  # type: ignore[misc]
    assert (i1, json.dumps(s1)) == (i2, json.dumps(s2)), "the summary changed between turns"
    last = json.loads(sent[-1].content)["contents"]
    assert turns[1][0] == last[0], "the task is not kept as sent"
    kept = len(turns[1]) - i2 - 1
    assert kept > 0 and turns[1][i2 + 1 :] == last[len(last) - kept :]
    assert len(turns[1]) < len(last)
    assert MARKER.search(s2["parts"][0]["text"])
    tools = agent_requests(fake, e2e)[-1].json()["tools"]
    assert tools[0] == json.loads(sent[-1].content)["tools"][0]
    assert tools[-1]["functionDeclarations"][0]["name"] == "context_guru_expand"
    usage = proxy.stats()["usage"]["agent"]
    assert usage["requests"] >= 3 and usage["input_tokens"] > 0


def session(fake: FakeProvider, proxy: Proxy, c: genai.Client, e2e: str) -> list[list[Any]]:
    """A turn that commissions a summary, then two streamed turns: what the provider got."""
    before = proxy.counts()
    c.models.generate_content(model=MODEL, contents=history(8, "long"), config=CONFIG)
    proxy.wait_count(before, "completed")
    turns = []
    for rounds in (9, 10):
        chunks = c.models.generate_content_stream(
            model=MODEL, contents=history(rounds, "long"), config=CONFIG
        )
        assert "".join(ch.text or "" for ch in chunks)
        turns.append(contents_of(agent_requests(fake, e2e)[-1]))
    return turns


def expand_call(marker: str) -> dict[str, Any]:
    return {"functionCall": {"name": "context_guru_expand", "args": {"id": marker}}}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_the_models_expand_call_is_answered_by_the_proxy(
    fake: FakeProvider, proxy: Proxy, stream: bool
) -> None:
    e2e = new_id()
    with client(proxy, e2e) as c:
        expand_turns(fake, proxy, c, e2e, stream)


def expand_turns(fake: FakeProvider, proxy: Proxy, c: genai.Client, e2e: str, stream: bool) -> None:
    tag = f"expand-{stream}"
    before = proxy.counts()
    c.models.generate_content(model=MODEL, contents=history(8, tag), config=CONFIG)
    proxy.wait_count(before, "completed")
    # The next turn: prime the summary's marker, then the model asks for it back.
    c.models.generate_content(model=MODEL, contents=history(9, tag), config=CONFIG)
    spliced = summary_of(contents_of(agent_requests(fake, e2e)[-1]))
    assert spliced is not None
    marker = MARKER.search(spliced[1]["parts"][0]["text"])
    assert marker is not None
    usage = {"promptTokenCount": 50, "candidatesTokenCount": 5, "totalTokenCount": 55}
    call = gemini_api.response(MODEL, [expand_call(marker.group(1))], usage)
    if stream:
        fake.script(
            Reply(frames=list(gemini_api.stream_frames(call))), Reply(text="Found: value_3.")
        )
        got = "".join(
            ch.text or ""
            for ch in c.models.generate_content_stream(
                model=MODEL, contents=history(10, tag), config=CONFIG
            )
        )
    else:
        fake.script(Reply(body=json.dumps(call).encode()), Reply(text="Found: value_3."))
        got = (
            c.models.generate_content(model=MODEL, contents=history(10, tag), config=CONFIG).text
            or ""
        )
    assert got == "Found: value_3."
    second = agent_requests(fake, e2e)[-1]
    contents = contents_of(second)
    called, answered = contents[-2], contents[-1]
    assert called["parts"][0]["functionCall"]["name"] == "context_guru_expand"
    response = answered["parts"][0]["functionResponse"]
    assert response["name"] == "context_guru_expand"
    assert "value_3 = 21" in response["response"]["output"]
    assert proxy.counts()["expansions"] >= before["expansions"] + 1


def test_a_key_in_the_query_is_a_credential_written_nowhere(
    fake: FakeProvider, tmp_path: Path
) -> None:
    db = tmp_path / "cg.sqlite3"
    with start_summarize(fake.url, tmp_path, LOW, db=db) as p:
        e2e = new_id()
        tools = [
            {
                "functionDeclarations": [
                    SHELL.model_dump(mode="json", exclude_none=True, by_alias=True)
                ]
            }
        ]
        bodies = [{"contents": wire(history(n, "q")), "tools": tools} for n in (8, 9)]
        path = f"/v1beta/models/{MODEL}:generateContent?key={KEY}"
        before = p.counts()
        with httpx.Client(base_url=p.url, trust_env=False, timeout=30) as h:
            assert h.post(path, json=bodies[0], headers={"x-e2e-id": e2e}).status_code == 200
            p.wait_count(before, "completed")
            second = new_id()
            assert h.post(path, json=bodies[1], headers={"x-e2e-id": second}).status_code == 200
        record = p.records.wait(second)
        assert KEY not in json.dumps(record) and "key=[redacted" in record["path"]
        assert summary_of(contents_of(agent_requests(fake, second)[-1])) is not None
        summarizer = [r for r in fake.requests if r.is_summarizer and KEY in r.path]
        assert summarizer, "the summarizer did not call back with the agent's key"
        assert record["cg"].get("tenant") == "bound"
        log = p.log_text()
    assert KEY not in log
    with sqlite3.connect(db) as conn:
        dump = "\n".join(conn.iterdump())
    assert KEY not in dump


def test_gemini_cli_signed_in_with_google_goes_by_code_assist_and_is_summarized_there(
    fake: FakeProvider, tmp_path: Path
) -> None:
    """Code Assist (`…/v1internal:streamGenerateContent`), the route Gemini CLI takes signed in
    with Google: the request wrapped as `{"model", "project", "request": {…}}`, the answer as
    `{"response": …}`. The wrapped transcript is summarized where it lies, the envelope kept
    byte for byte, the shared summarizer calling back on the same route with the same bearer;
    the expand tool is not offered there (its answers would need re-wrapping)."""
    bearer = "ya29.fake-google-oauth-token"
    config = low(resummarize_tokens=100_000, model={"share_cache": "always"})
    tools = [
        {"functionDeclarations": [SHELL.model_dump(mode="json", exclude_none=True, by_alias=True)]}
    ]

    def wrapped(rounds: int) -> bytes:
        inner = {"contents": wire(history(rounds, "ca")), "tools": tools, "session_id": "s-1"}
        envelope = {
            "model": MODEL,
            "project": "cg-managed-1",
            "user_prompt_id": "u-1",
            "request": inner,
        }
        return json.dumps(envelope).encode()

    path = "/v1internal:streamGenerateContent?alt=sse"
    headers = {"authorization": f"Bearer {bearer}", "content-type": "application/json"}
    with start_summarize(fake.url, tmp_path, config) as p:
        first, second = new_id(), new_id()
        before = p.counts()
        with httpx.Client(base_url=p.url, trust_env=False, timeout=30) as h:
            r = h.post(path, content=wrapped(8), headers={**headers, "x-e2e-id": first})
            assert r.status_code == 200 and b'"response"' in r.content
            p.wait_count(before, "completed")
            sent = wrapped(9)
            r = h.post(path, content=sent, headers={**headers, "x-e2e-id": second})
            assert r.status_code == 200
        record = p.records.wait(second)["cg"]
        usage = p.stats()["usage"]["agent"]
    assert (record["dialect"], record["outcome"]) == ("gemini", "rewritten"), record
    assert "Code Assist" in record["expand"]["reason"]
    (got,) = agent_requests(fake, second)
    envelope = got.json()
    assert {k: v for k, v in envelope.items() if k != "request"} == {
        "model": MODEL,
        "project": "cg-managed-1",
        "user_prompt_id": "u-1",
    }
    contents = envelope["request"]["contents"]
    assert gemini_api.contents_problem(envelope["request"]) is None
    assert summary_of(contents) is not None and len(contents) < len(
        json.loads(sent)["request"]["contents"]
    )
    assert got.body.startswith(sent[: sent.index(b'"contents"')]), "the envelope's head changed"
    calls = [r for r in fake.requests if r.is_summarizer and b"Task ca:" in r.body]
    assert calls and all(
        c.path == path and c.header("authorization") == f"Bearer {bearer}" for c in calls
    )
    assert usage["requests"] >= 2 and usage["input_tokens"] > 0  # read from the wrapped answers
