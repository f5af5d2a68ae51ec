"""The summarizer on the Responses API: the shared-cache request (the forwarded Codex request, byte
for byte, plus one user message item), the standalone and `config` calls (`model.provider:
responses`), the answer's text, and the usage of each answer; with the other Responses facts
the summarizer depends on: sessions, Codex recognised by its headers, the prompt-cache shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cg.billing.cache import PromptCache, prompt_of
from cg.billing.tap import UsageTap
from cg.proxy.agents import codex
from cg.state.facts import FactsCache
from cg.state.session import resolve_session, session_of
from cg.state.sqlite import SqliteStore
from cg.summarize.client import Origin, answer_text, resolve_endpoint
from cg.summarize.component import Commission
from cg.summarize.config import ModelConfig, parse_summarize
from cg.summarize.prompt import MAX_TOKENS
from cg.summarize.shared import SharedRequest, build, output_limits
from cg.wire.answers import Reply, render_sse
from cg.wire.body import index_body
from cg.wire.dialects import RESPONSES
from cg.wire.usage import Usage, from_provider
from tests.summarize.test_client import Wire, job
from tests.summarize.test_component_responses import grow
from tests.support.transcripts import TOKENS, config, make
from tests.wire.test_responses import FIXTURES
from tests.wire.test_responses_answers import MESSAGE, REASONING, USAGE, response

Json = Any
URL = "https://api.example.test/v1/responses"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(tmp_path / "cg.sqlite3")
    yield s
    s.close()


def codex_job(store: SqliteStore, raw: bytes) -> Commission:
    d = make(config(keep_first=2, keep_last=3), store, dialect="responses")
    d.send(raw)
    assert len(d.pending) == 1  # guard: the trigger fired and a span existed
    return d.pending[0]


# -- the shared-cache request ------------------------------------------------------------------


def test_the_shared_request_is_the_forwarded_codex_request_plus_one_user_item(
    store: SqliteStore,
) -> None:
    raw = grow("middle", 3)[2]
    job = codex_job(store, raw)
    out = build(raw, job.dialect, job.layouts)
    assert isinstance(out, SharedRequest)
    assert out.changed == {}  # Codex sends no max_output_tokens, and a stream reports usage
    body = out.body
    last = raw.index(b"]", raw.rindex(b'"type":"function_call_output"'))
    end_of_items = raw.rindex(b"}", 0, last) + 1
    assert body[:end_of_items] == raw[:end_of_items]  # every item byte-identical
    assert body.endswith(raw[last:])  # tools, include, prompt_cache_key, … untouched
    added = json.loads(body)["input"][-1]
    assert set(added) == {"type", "role", "content"}
    assert (added["type"], added["role"]) == ("message", "user")
    (part,) = added["content"]
    assert part["type"] == "input_text"
    assert part["text"].startswith("[context-guru] This message is not from the user.")
    assert "after the first 4 messages" in part["text"]
    assert len(json.loads(body)["input"]) == len(json.loads(raw)["input"]) + 1


@pytest.mark.parametrize(
    "members,changed",
    [
        ({}, {}),
        ({"max_output_tokens": 64}, {"max_output_tokens": MAX_TOKENS["regular"]}),
        ({"max_output_tokens": 100_000}, {}),
        ({"stream": True}, {}),
    ],
)
def test_responses_output_limits(members: dict[str, Any], changed: dict[str, Any]) -> None:
    raw = json.dumps({"model": "m", "input": [], **members}).encode()
    doc = index_body(raw, RESPONSES)
    assert output_limits("responses", doc.members, "regular") == changed


# -- the summarizer client ----------------------------------------------------------------------


def test_model_provider_responses_names_the_responses_endpoint() -> None:
    cfg = parse_summarize(
        {"model": {"source": "config", "provider": "responses", "model": "small"}},
        env={"OPENAI_API_KEY": "sk-env"},
    ).model
    ep = resolve_endpoint(cfg, job("responses"), env={"OPENAI_API_KEY": "sk-env"})
    assert (ep.dialect, ep.url, ep.model) == (
        "responses",
        "https://api.openai.com/v1/responses",
        "small",
    )
    assert ep.headers == {"authorization": "Bearer sk-env"}
    cfg2 = ModelConfig(source="config", provider="responses", model="m", base_url="http://h:1/v1")
    assert resolve_endpoint(cfg2, job("responses"), env={}).url == "http://h:1/v1/responses"


def test_cheap_model_provider_env_accepts_responses() -> None:
    cfg = parse_summarize(
        {"model": {"source": "config"}},
        env={"CHEAP_MODEL": "small", "CHEAP_MODEL_PROVIDER": "responses"},
    ).model
    assert cfg.provider == "responses"


def test_a_bad_provider_is_refused_naming_the_key() -> None:
    with pytest.raises(ValueError, match=r"components\.summarize: model\.provider"):
        parse_summarize({"model": {"source": "config", "provider": "codex"}}, env={})


def test_answer_text_of_a_response() -> None:
    assert answer_text("responses", response([REASONING, MESSAGE])) == "Done — 2 files ✓."
    assert answer_text("responses", response([REASONING])) is None


async def test_the_standalone_call_is_one_user_turn_stored_nowhere() -> None:
    wire = Wire(lambda r: httpx.Response(200, json=response([MESSAGE])))
    cfg = ModelConfig(source="config", provider="responses", model="small", base_url="http://h")
    booked: list[tuple[str, str, Usage]] = []
    client = wire.client(cfg, on_usage=lambda s, m, u: booked.append((s, m, u)))
    text = await client("PROMPT ✓", job("responses"))
    assert text == "Done — 2 files ✓."
    (req,) = wire.sent
    assert str(req.url) == "http://h/v1/responses"
    assert json.loads(req.content) == {"model": "small", "input": "PROMPT ✓", "store": False}
    assert req.headers["x-context-guru"] == "summarize"
    assert booked == [("s1", "small", from_provider("responses", USAGE))]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_the_shared_call_reads_a_responses_answer(stream: bool) -> None:
    doc = response([REASONING, MESSAGE])

    def answer(r: httpx.Request) -> httpx.Response:
        if stream:
            return httpx.Response(
                200,
                content=render_sse(Reply("responses", doc)),
                headers={"content-type": "text/event-stream"},
            )
        return httpx.Response(200, json=doc)

    wire = Wire(answer)
    origin = Origin.of(URL, {"authorization": "Bearer sk-agent", "session-id": "s"})
    booked: list[Usage] = []
    client = wire.client(ModelConfig(), on_usage=lambda s, m, u: booked.append(u))
    got = await client.shared(b'{"x":1}', job("responses", model="gpt-5.1-codex", origin=origin))
    assert got == "Done — 2 files ✓."
    (req,) = wire.sent
    assert str(req.url) == URL and req.content == b'{"x":1}'
    assert req.headers["authorization"] == "Bearer sk-agent"
    assert "session-id" not in req.headers  # only the credential and billing headers go
    assert booked == [from_provider("responses", USAGE)]


# -- the facts around it ----------------------------------------------------------------------


def test_session_sources_in_order_with_codexs_header_third() -> None:
    both = {"x-claude-code-session-id": "cc", "session-id": "codex"}
    assert resolve_session(both).id == "cc"
    assert resolve_session({"session-id": "codex"}, cache_key="k").source == "session-id"
    got = resolve_session({}, cache_key="pck-1")
    assert (got.id, got.source) == ("pck-1", "prompt_cache_key")
    bad = resolve_session({"session-id": "no spaces allowed"}, cache_key="bad key!")
    assert bad.source == "head" and bad.skipped == ("session-id", "prompt_cache_key")


def test_a_codex_fixture_resolves_to_its_session_id_header() -> None:
    doc = json.loads((FIXTURES / "middle.json").read_text())
    headers = {k: v for k, v in doc["headers"]}
    idx = index_body(doc["body"].encode(), RESPONSES)
    sid = session_of(headers, idx)
    assert sid.id == headers["session-id"] == json.loads(doc["body"])["prompt_cache_key"]
    assert sid.source == "session-id"


@pytest.mark.parametrize(
    "headers,dialect,why",
    [
        ({"originator": "codex_exec"}, "responses", "originator: codex_"),
        ({"user-agent": "codex_exec/0.169.0 (Debian 12.0.0; x86_64)"}, None, "user-agent: codex_"),
        ({"x-codex-turn-metadata": "{}"}, None, "x-codex-turn-metadata"),
        ({"session-id": "abc"}, "responses", "session-id"),
        ({"session-id": "abc"}, "anthropic", None),
        ({"user-agent": "OpenAI/Python 2.54.0"}, "responses", None),
    ],
)
def test_codex_is_told_by_its_own_headers(
    headers: dict[str, str], dialect: str | None, why: str | None
) -> None:
    assert codex(headers, dialect) == why


def test_every_codex_fixture_is_recognised_as_codex() -> None:
    for path in FIXTURES.glob("*.json"):
        doc = json.loads(path.read_text())
        assert codex({k: v for k, v in doc["headers"]}, "responses") == "originator: codex_"


def test_the_prompt_cache_model_shapes_a_codex_request_with_automatic_caching() -> None:
    """OpenAI-style: every prefix of 1,024+ tokens is cached; the next Codex turn, whose input
    repeats this one's, reads all of it back."""
    turns = grow("middle", 2)
    facts = FactsCache(TOKENS)
    first = prompt_of(index_body(turns[0], RESPONSES), facts)
    second = prompt_of(index_body(turns[1], RESPONSES), facts)
    assert first.auto and len(first.keys) == len(json.loads(turns[0])["input"]) + 1
    assert second.keys[: len(first.keys)] == first.keys  # the prefix repeats
    cache = PromptCache()
    one = cache.bill(first, 0.0)
    assert one.cache_read_tokens == 0 and one.cache_write_tokens == first.tokens
    two = cache.bill(second, 10.0)
    assert two.cache_read_tokens == first.tokens
    assert two.cache_write_tokens == second.tokens - first.tokens


def test_instructions_are_part_of_the_prompts_prelude() -> None:
    facts = FactsCache(TOKENS)
    base = {"model": "m", "input": [{"role": "user", "content": "hi"}]}
    plain = prompt_of(index_body(json.dumps(base).encode(), RESPONSES), facts)
    told = {**base, "instructions": "Be terse. " * 50}
    with_ = prompt_of(index_body(json.dumps(told).encode(), RESPONSES), facts)
    assert with_.keys[0] != plain.keys[0] and with_.tokens > plain.tokens + 50


def test_the_usage_tap_reads_a_rendered_responses_stream_in_small_chunks() -> None:
    raw = render_sse(Reply("responses", response([REASONING, MESSAGE])))
    tap = UsageTap("responses")
    for i in range(0, len(raw), 7):
        assert tap(raw[i : i + 7]) == raw[i : i + 7]
    tap.finish()
    assert from_provider("responses", tap.result()) == Usage(
        input_tokens=176, cache_read_tokens=1024, output_tokens=40, requests=1
    )
    assert tap.model == "gpt-5.1-codex" and not tap.truncated


def test_the_standalone_prompt_is_grounded_in_codexs_user_turns(store: SqliteStore) -> None:
    """The task and the latest user turn of a Codex transcript (`input_text` parts) are what
    the summary is written toward; tool outputs are masked, calls shown."""
    job = codex_job(store, grow("middle", 3)[2])
    prompt = job.prompt(config(keep_first=2, keep_last=3))
    first = prompt.split("<first_user_turn>\n")[1].split("\n</first_user_turn>")[0]
    assert first.startswith("<environment_context>")
    assert "Run a few shell commands step by step" in prompt.split("<conversation>")[0]
    conversation = prompt.split("<conversation>")[1]
    assert "[tool_call exec_command]" in conversation
    assert "<masked_tool_output>" in conversation
    assert "Process exited with code 0" not in conversation
