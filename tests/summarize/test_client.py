"""cg.summarize.client: endpoint resolution, request bodies, answer parsing, retries under one deadline.

The network is an `httpx.MockTransport` injected into the `HttpPool`; nothing leaves the process.
"""

from __future__ import annotations

import asyncio
import json
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
from mitmproxy import http

from cg.summarize import client as summarizer
from cg.summarize.client import (
    HEADER,
    INCOMING_HEADERS,
    MAX_ATTEMPTS,
    MAX_TOKENS,
    TIMEOUT_ENV,
    Endpoint,
    HttpPool,
    Origin,
    SummarizerClient,
    answer_text,
    resolve_endpoint,
    retry_after,
    timeout_from_env,
)
from cg.summarize.component import (
    Commission,
    NoModel,
    SummarizerError,
    SummarizerRefused,
    SummarizerTimeout,
)
from cg.summarize.config import ModelConfig
from cg.wire.dialects import DIALECTS
from cg.wire.usage import Usage

KEY = "sk-ant-SECRET-0123456789"
ORIGIN_URL = "https://api.example.test/v1/messages?beta=true"
PROMPT = "Summarize this — «trajectory» ✓"


def agent_headers() -> http.Headers:
    """What an agent's intercepted request carries (mitmproxy's case-insensitive Headers)."""
    return http.Headers(
        [
            (b"Host", b"api.example.test"),
            (b"X-Api-Key", KEY.encode()),
            (b"Authorization", b"Bearer " + KEY.encode()),
            (b"anthropic-version", b"2023-06-01"),
            (b"anthropic-beta", b"context-1m-2025-08-07"),
            (b"Cookie", b"session=abc"),
            (b"User-Agent", b"claude-cli/2.1"),
            (b"Content-Type", b"application/json"),
            (b"x-context-guru-session", b"s1"),
            (b"x-claude-code-session-id", b"cc-1"),
            (b"openai-organization", b"org-1"),
            (b"x-e2e-id", b"e"),
        ]
    )


def job(
    dialect: str = "anthropic", model: str | None = "claude-sonnet-4", origin: Any = None
) -> Commission:
    return Commission(
        session="s1",
        dialect=dialect,
        model=model,
        head=1,
        end=4,
        covered_hash="0" * 32,
        sources=[],
        span=[],
        transcript=[],
        previous_summary=None,
        origin=origin,
    )


def incoming(**kw: Any) -> ModelConfig:
    return ModelConfig(source="incoming", **kw)


def config(**kw: Any) -> ModelConfig:
    return ModelConfig(source="config", **kw)


def anthropic_answer(*blocks: Any) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "content": list(blocks)}


def openai_answer(content: Any) -> dict[str, Any]:
    return {"object": "chat.completion", "choices": [{"index": 0, "message": {"content": content}}]}


Handler = Callable[[httpx.Request], httpx.Response | Awaitable[httpx.Response]]


class Wire:
    """A MockTransport pool that records every request and answers with `handler`."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.sent: list[httpx.Request] = []
        self.pool = HttpPool()

        async def handle(request: httpx.Request) -> httpx.Response:
            await request.aread()
            self.sent.append(request)
            out = self.handler(request)
            return await out if not isinstance(out, httpx.Response) else out

        self.pool._client = httpx.AsyncClient(transport=httpx.MockTransport(handle))

    def client(self, cfg: ModelConfig, **kw: Any) -> SummarizerClient:
        return SummarizerClient(cfg, self.pool, **{"env": {}, **kw})

    def body(self, n: int = -1) -> Any:
        return json.loads(self.sent[n].content)


def ok_anthropic(text: str = "<summary>done</summary>") -> Handler:
    return lambda r: httpx.Response(200, json=anthropic_answer({"type": "text", "text": text}))


@pytest.fixture
def wire() -> Wire:
    return Wire(ok_anthropic())


@pytest.fixture(autouse=True)
def _quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Jitter at its minimum: the backoffs are 0.125 s, 0.25 s, … — short and deterministic."""
    monkeypatch.setattr("cg.summarize.client.random.random", lambda: 0.0)


# -- Origin and resolve_endpoint: incoming -----------------------------------------------------


def test_origin_keeps_only_the_credential_version_and_billing_headers():
    """Credential, API version and betas, and OpenAI's organisation (its prompt cache is per
    organisation, and the summary is billed where the agent's turn is); nothing else."""
    origin = Origin.of(ORIGIN_URL, agent_headers())
    assert origin.url == ORIGIN_URL
    assert origin.headers == {
        "x-api-key": KEY,
        "authorization": f"Bearer {KEY}",
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "context-1m-2025-08-07",
        "openai-organization": "org-1",
    }
    assert set(origin.headers) <= set(INCOMING_HEADERS)


def test_incoming_reuses_origin_url_and_headers_and_the_jobs_model():
    origin = Origin.of(ORIGIN_URL, agent_headers())
    ep = resolve_endpoint(incoming(), job(origin=origin), env={})
    assert ep.dialect == "anthropic"
    assert ep.url == ORIGIN_URL
    assert ep.model == "claude-sonnet-4"
    assert ep.headers == origin.headers


def test_incoming_model_model_overrides_the_jobs_model():
    origin = Origin.of(ORIGIN_URL, agent_headers())
    ep = resolve_endpoint(incoming(model="claude-haiku-4"), job(origin=origin), env={})
    assert ep.model == "claude-haiku-4"
    assert ep.url == ORIGIN_URL  # still the proxied request's own endpoint and credential


def test_incoming_anthropic_without_version_gets_the_default_one():
    origin = Origin.of(ORIGIN_URL, http.Headers(x_api_key=KEY))
    ep = resolve_endpoint(incoming(), job(origin=origin), env={})
    assert ep.headers == {"x-api-key": KEY, "anthropic-version": summarizer.ANTHROPIC_VERSION}


def test_incoming_openai_adds_no_anthropic_header():
    url = "https://llm.example.test/v1/chat/completions"
    origin = Origin.of(url, http.Headers(authorization=f"Bearer {KEY}"))
    ep = resolve_endpoint(incoming(), job("openai", "gpt-x", origin), env={})
    assert (ep.dialect, ep.url, ep.model) == ("openai", url, "gpt-x")
    assert ep.headers == {"authorization": f"Bearer {KEY}"}


def test_incoming_ignores_the_cheap_model_env():
    origin = Origin.of(ORIGIN_URL, agent_headers())
    env = {"CHEAP_MODEL": "cheap", "CHEAP_MODEL_BASE_URL": "http://cheap.test"}
    ep = resolve_endpoint(incoming(), job(origin=origin), env=env)
    assert (ep.url, ep.model) == (ORIGIN_URL, "claude-sonnet-4")


def test_incoming_without_a_model_is_no_model():
    origin = Origin.of(ORIGIN_URL, agent_headers())
    with pytest.raises(NoModel, match="names no model"):
        resolve_endpoint(incoming(), job(model=None, origin=origin), env={})


def test_incoming_without_an_origin_is_no_model():
    with pytest.raises(NoModel, match="no proxied request"):
        resolve_endpoint(incoming(), job(origin=None), env={})


# -- resolve_endpoint: config ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "base", "url"),
    [
        ("anthropic", "http://cheap.test:8000", "http://cheap.test:8000/v1/messages"),
        ("anthropic", "http://cheap.test:8000/", "http://cheap.test:8000/v1/messages"),
        ("anthropic", "http://cheap.test:8000/v1", "http://cheap.test:8000/v1/messages"),
        ("anthropic", "http://cheap.test/api/v1/", "http://cheap.test/api/v1/messages"),
        ("openai", "http://cheap.test:8000", "http://cheap.test:8000/v1/chat/completions"),
        ("openai", "http://cheap.test:8000/v1", "http://cheap.test:8000/v1/chat/completions"),
        ("anthropic", None, "https://api.anthropic.com/v1/messages"),
        ("openai", None, "https://api.openai.com/v1/chat/completions"),
    ],
)
def test_config_base_url_with_and_without_v1(provider, base, url):
    cfg = config(model="small", provider=provider, base_url=base, api_key="k")
    ep = resolve_endpoint(cfg, job(origin=Origin.of(ORIGIN_URL, agent_headers())), env={})
    assert (ep.dialect, ep.url, ep.model) == (provider, url, "small")


def test_config_provider_defaults_to_anthropic():
    ep = resolve_endpoint(config(model="small", api_key="k"), job(), env={})
    assert ep.dialect == "anthropic"
    assert ep.url == "https://api.anthropic.com/v1/messages"


def test_config_never_reuses_the_agents_credential_or_endpoint():
    origin = Origin.of(ORIGIN_URL, agent_headers())
    ep = resolve_endpoint(config(model="small", provider="openai"), job(origin=origin), env={})
    assert ep.url == "https://api.openai.com/v1/chat/completions"
    assert ep.headers == {}  # no key configured: none sent, and never the agent's


@pytest.mark.parametrize(
    ("auth", "expected"),
    [
        (None, {"x-api-key": "ck"}),
        ("x-api-key", {"x-api-key": "ck"}),
        ("bearer", {"authorization": "Bearer ck"}),
    ],
)
def test_config_anthropic_auth_modes(auth, expected):
    cfg = config(model="small", provider="anthropic", api_key="ck", auth=auth)
    ep = resolve_endpoint(cfg, job(), env={})
    assert ep.headers == {"anthropic-version": summarizer.ANTHROPIC_VERSION, **expected}


def test_config_openai_sends_a_bearer_token():
    ep = resolve_endpoint(config(model="small", provider="openai", api_key="ck"), job(), env={})
    assert ep.headers == {"authorization": "Bearer ck"}


@pytest.mark.parametrize(
    ("provider", "var", "header", "value"),
    [
        ("anthropic", "ANTHROPIC_API_KEY", "x-api-key", "envkey"),
        ("openai", "OPENAI_API_KEY", "authorization", "Bearer envkey"),
    ],
)
def test_config_api_key_falls_back_to_the_providers_env_key(
    monkeypatch, provider, var, header, value
):
    monkeypatch.setenv(var, "process-env-key")  # the mapping given wins over os.environ
    other = "OPENAI_API_KEY" if var == "ANTHROPIC_API_KEY" else "ANTHROPIC_API_KEY"
    env = {var: "envkey", other: "wrong-provider"}
    ep = resolve_endpoint(config(model="small", provider=provider), job(), env=env)
    assert ep.headers[header] == value
    assert "wrong-provider" not in json.dumps(ep.headers)


def test_config_api_key_set_wins_over_the_env_key():
    cfg = config(model="small", provider="openai", api_key="cfgkey")
    ep = resolve_endpoint(cfg, job(), env={"OPENAI_API_KEY": "envkey"})
    assert ep.headers == {"authorization": "Bearer cfgkey"}


def test_config_without_a_model_is_no_model():
    with pytest.raises(NoModel, match=r"model\.model"):
        resolve_endpoint(config(provider="openai", api_key="k"), job(), env={})


# -- what goes on the wire -----------------------------------------------------------------------


@pytest.mark.parametrize("level", ["concise", "regular", "highly_detailed"])
async def test_anthropic_request_is_non_streaming_with_the_summarize_header(wire, level):
    origin = Origin.of(ORIGIN_URL, agent_headers())
    text = await wire.client(incoming(), level=level)(PROMPT, job(origin=origin))
    assert text == "<summary>done</summary>"
    (req,) = wire.sent
    assert req.method == "POST"
    assert str(req.url) == ORIGIN_URL
    assert req.headers[HEADER] == "summarize"
    assert req.headers["content-type"] == "application/json"
    assert req.headers["x-api-key"] == KEY
    assert req.headers["anthropic-beta"] == "context-1m-2025-08-07"
    # `openai-organization` goes back to the endpoint it came with (Origin keeps it); the
    # agent's other headers do not.
    for private in ("cookie", "x-context-guru-session", "x-e2e-id"):
        assert private not in req.headers
    assert req.headers["user-agent"] != "claude-cli/2.1"
    assert wire.body() == {
        "model": "claude-sonnet-4",
        "max_tokens": MAX_TOKENS[level],
        "messages": [{"role": "user", "content": PROMPT}],
    }


async def test_openai_request_is_non_streaming_with_the_summarize_header():
    wire = Wire(lambda r: httpx.Response(200, json=openai_answer("<summary>ok</summary>")))
    cfg = config(model="small", provider="openai", base_url="http://cheap.test/v1", api_key="ck")
    assert await wire.client(cfg)(PROMPT, job("anthropic")) == "<summary>ok</summary>"
    (req,) = wire.sent
    assert str(req.url) == "http://cheap.test/v1/chat/completions"
    assert req.headers[HEADER] == "summarize"
    assert req.headers["authorization"] == "Bearer ck"
    assert "x-api-key" not in req.headers
    assert wire.body() == {"model": "small", "messages": [{"role": "user", "content": PROMPT}]}


async def test_no_model_is_raised_before_anything_is_sent(wire):
    with pytest.raises(NoModel):
        await wire.client(config(provider="openai"))(PROMPT, job())
    assert wire.sent == []


# -- reading the answer ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "text"),
    [
        (
            anthropic_answer({"type": "text", "text": "<summary>a</summary>"}),
            "<summary>a</summary>",
        ),
        (
            anthropic_answer(
                {"type": "thinking", "thinking": "hmm", "signature": "x"},
                {"type": "text", "text": "<summary>a"},
                {"type": "tool_use", "id": "t", "name": "n", "input": {}},
                {"type": "text", "text": "b</summary>"},
            ),
            "<summary>ab</summary>",
        ),
        (anthropic_answer(), None),
        (anthropic_answer({"type": "text", "text": " \n "}), None),
        (anthropic_answer({"type": "tool_use", "id": "t", "name": "n", "input": {}}), None),
        (anthropic_answer({"type": "text", "text": None}, {"type": "text", "text": "x"}), "x"),
    ],
    ids=["one-block", "text-blocks-joined", "empty", "blank", "no-text-block", "null-text"],
)
def test_answer_text_anthropic(doc, text):
    assert answer_text("anthropic", doc) == text


@pytest.mark.parametrize(
    ("content", "text"),
    [
        ("<summary>s</summary>", "<summary>s</summary>"),
        (
            [
                {"type": "text", "text": "<summary>s"},
                {"type": "refusal", "refusal": "no"},
                {"type": "text", "text": "</summary>"},
            ],
            "<summary>s</summary>",
        ),
        ([{"type": "text", "text": None}, {"type": "text", "text": "p"}], "p"),
        ("", None),
        ("   ", None),
        (None, None),
        ([], None),
        ([{"type": "image_url", "image_url": {"url": "x"}}], None),
    ],
    ids=["string", "parts", "null-part-text", "empty", "blank", "null", "no-parts", "no-text"],
)
def test_answer_text_openai(content, text):
    assert answer_text("openai", openai_answer(content)) == text


@pytest.mark.parametrize(
    ("dialect", "doc"),
    [
        ("anthropic", []),
        ("anthropic", {"type": "message"}),
        ("anthropic", {"content": "a string"}),
        ("openai", {"choices": []}),
        ("openai", {"choices": ["x"]}),
        ("openai", "text"),
    ],
)
def test_answer_text_unreadable_answer_is_a_summarizer_error(dialect, doc):
    with pytest.raises(SummarizerError):
        answer_text(dialect, doc)


async def test_a_blank_answer_is_none_not_an_error():
    wire = Wire(ok_anthropic(""))
    assert await wire.client(config(model="m", api_key="k"))(PROMPT, job()) is None


async def test_an_answer_that_is_not_json_is_a_summarizer_error():
    wire = Wire(lambda r: httpx.Response(200, content=b"<html>gateway</html>"))
    with pytest.raises(SummarizerError, match="not JSON"):
        await wire.client(config(model="m", api_key="k"))(PROMPT, job())


# -- retries under one deadline ----------------------------------------------------------------


def sequence(*steps: int | type[httpx.TransportError]) -> Handler:
    """Answer the n-th request with steps[n]: a status (200 is a good answer) or an exception."""
    it = iter(steps)

    def handle(request: httpx.Request) -> httpx.Response:
        step = next(it)
        if isinstance(step, type):
            raise step("simulated", request=request)
        if step == 200:
            return ok_anthropic()(request)  # type: ignore[return-value]
        return httpx.Response(step, json={"error": {"message": f"status {step}"}})

    return handle


@pytest.mark.parametrize(
    "steps",
    [
        (429, 200),
        (500, 200),
        (529, 503, 200),
        (502, 504, 200),
        (408, 409, 200),
        (httpx.ConnectError, 200),
        (httpx.ReadError, httpx.RemoteProtocolError, 200),
    ],
    ids=lambda s: "-".join(str(x) if isinstance(x, int) else x.__name__ for x in s),
)
async def test_retries_transient_failures_then_succeeds(steps):
    wire = Wire(sequence(*steps))
    text = await wire.client(config(model="m", api_key="k"))(PROMPT, job())
    assert text == "<summary>done</summary>"
    assert len(wire.sent) == len(steps)
    assert len({r.content for r in wire.sent}) == 1  # every attempt sends the same request


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_no_retry_on_a_client_error(status):
    wire = Wire(sequence(status, 200))
    with pytest.raises(SummarizerError, match=f"HTTP {status}") as e:
        await wire.client(config(model="m", api_key="k"))(PROMPT, job())
    assert not isinstance(e.value, SummarizerTimeout)
    assert len(wire.sent) == 1


async def test_gives_up_after_max_attempts_with_the_last_status():
    wire = Wire(sequence(*[503] * (MAX_ATTEMPTS + 1)))
    with pytest.raises(SummarizerError, match=f"{MAX_ATTEMPTS} attempts.*HTTP 503") as e:
        await wire.client(config(model="m", api_key="k"))(PROMPT, job())
    assert not isinstance(e.value, SummarizerTimeout)
    assert len(wire.sent) == MAX_ATTEMPTS


async def test_transport_errors_every_time_is_an_error_not_a_timeout():
    wire = Wire(sequence(*[httpx.ConnectError] * MAX_ATTEMPTS))
    with pytest.raises(SummarizerError, match="ConnectError") as e:
        await wire.client(config(model="m", api_key="k"))(PROMPT, job())
    assert not isinstance(e.value, SummarizerTimeout)
    assert len(wire.sent) == MAX_ATTEMPTS


async def test_the_message_counts_the_attempts_actually_made():
    """A backoff that would overrun the deadline ends the retries early; say how many ran."""
    wire = Wire(sequence(503, 503, 503))
    client = wire.client(config(model="m", api_key="k"), timeout=0.3)
    with pytest.raises(SummarizerError) as e:
        await client(PROMPT, job())
    assert len(wire.sent) == 2  # 0.125 s then 0.25 s of backoff: the third would be too late
    assert "2 attempts" in str(e.value)


async def test_an_httpx_timeout_is_a_summarizer_timeout():
    wire = Wire(sequence(httpx.ReadTimeout))
    with pytest.raises(SummarizerTimeout):
        await wire.client(config(model="m", api_key="k"))(PROMPT, job())
    assert len(wire.sent) == 1


async def test_a_server_that_never_answers_times_out_at_the_deadline():
    async def hang(request: httpx.Request) -> httpx.Response:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    wire = Wire(hang)
    t0 = time.monotonic()
    with pytest.raises(SummarizerTimeout, match=r"0\.3s"):
        await wire.client(config(model="m", api_key="k"), timeout=0.3)(PROMPT, job())
    assert 0.25 <= time.monotonic() - t0 < 2.0


async def test_a_server_that_drips_its_answer_times_out_at_the_deadline():
    """httpx's timeouts are per read: an answer trickling in byte by byte must still stop."""

    async def drip() -> AsyncIterator[bytes]:
        for _ in range(100):
            await asyncio.sleep(0.05)  # cg: allow-sleep: the server under test drips its answer
            yield b" "

    wire = Wire(lambda r: httpx.Response(200, content=drip()))
    t0 = time.monotonic()
    with pytest.raises(SummarizerTimeout):
        await wire.client(config(model="m", api_key="k"), timeout=0.3)(PROMPT, job())
    assert time.monotonic() - t0 < 2.0


async def test_retries_stop_at_the_deadline():
    async def slow_503(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.2)  # cg: allow-sleep: the server under test is slow to answer
        return httpx.Response(503)

    wire = Wire(slow_503)
    t0 = time.monotonic()
    with pytest.raises(SummarizerError):
        await wire.client(config(model="m", api_key="k"), timeout=0.5)(PROMPT, job())
    assert time.monotonic() - t0 < 1.5
    assert len(wire.sent) <= 2


# -- timeout_from_env --------------------------------------------------------------------------


def test_timeout_default():
    assert timeout_from_env({}) == summarizer.DEFAULT_TIMEOUT
    assert timeout_from_env({TIMEOUT_ENV: "  "}) == summarizer.DEFAULT_TIMEOUT


def test_timeout_reads_os_environ_when_no_mapping_is_given(monkeypatch):
    monkeypatch.setenv(TIMEOUT_ENV, "7")
    assert timeout_from_env() == 7.0


@pytest.mark.parametrize(("raw", "value"), [("1", 1.0), ("2.5", 2.5), (" 30 ", 30.0)])
def test_timeout_value(raw, value):
    assert timeout_from_env({TIMEOUT_ENV: raw}) == value


@pytest.mark.parametrize("raw", ["abc", "1s", "0", "-1", "nan", "inf", "-inf"])
def test_timeout_bad_value_is_refused_naming_the_variable(raw):
    with pytest.raises(ValueError, match=TIMEOUT_ENV) as e:
        timeout_from_env({TIMEOUT_ENV: raw})
    assert repr(raw) in str(e.value)


# -- the credential never leaks ----------------------------------------------------------------


def test_api_key_absent_from_repr_and_str():
    origin = Origin.of(ORIGIN_URL, agent_headers())
    cfg = config(model="m", provider="anthropic", api_key=KEY, auth="bearer")
    ep = resolve_endpoint(cfg, job(), env={})
    assert ep.headers["authorization"] == f"Bearer {KEY}"  # the key is really in there
    ep_in = resolve_endpoint(incoming(), job(origin=origin), env={})
    client = SummarizerClient(cfg, HttpPool())
    for obj in (origin, ep, ep_in, client, cfg, job(origin=origin)):
        assert KEY not in repr(obj)
        assert KEY not in str(obj)
    assert isinstance(ep, Endpoint)


async def _hang(request: httpx.Request) -> httpx.Response:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


FAILURES: dict[str, Callable[[], Handler]] = {
    "401": lambda: sequence(401),
    "503s": lambda: sequence(503, 503, 503),
    "connect-error": lambda: sequence(*[httpx.ConnectError] * 3),
    "read-timeout": lambda: sequence(httpx.ReadTimeout),
    "hang": lambda: _hang,
    "not-json": lambda: lambda r: httpx.Response(200, content=b"nope"),
    "not-an-answer": lambda: lambda r: httpx.Response(200, json={"content": None}),
}


@pytest.mark.parametrize("failure", list(FAILURES))
@pytest.mark.parametrize("source", ["incoming", "config"])
async def test_api_key_absent_from_every_exception(failure, source):
    wire = Wire(FAILURES[failure]())
    if source == "incoming":
        cfg, j = incoming(), job(origin=Origin.of(ORIGIN_URL, agent_headers()))
    else:
        cfg, j = config(model="m", api_key=KEY), job()
    with pytest.raises(SummarizerError) as e:
        await wire.client(cfg, timeout=0.5)(PROMPT, j)
    assert KEY in json.dumps(dict(wire.sent[0].headers))  # the key really was sent
    shown = "".join(traceback.format_exception(e.value))
    assert KEY not in shown
    assert KEY not in repr(e.value)


# -- the pool ----------------------------------------------------------------------------------


async def test_pool_never_reads_proxy_settings_and_closes(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    pool = HttpPool(verify=False)
    client = pool.client()
    assert client is pool.client()
    assert client.trust_env is False
    await pool.aclose()
    assert client.is_closed
    assert pool.client() is not client
    await pool.aclose()


async def test_a_changed_verify_setting_retires_every_client_made_under_the_old_one():
    pool = HttpPool(verify=True)
    plain, named = pool.client(), pool.client("api.provider.invalid")
    pool.verify = True  # unchanged: kept
    assert pool.client() is plain
    pool.verify = False  # mitmproxy's ssl_insecure turned on at run time
    assert pool.client() is not plain and pool.client("api.provider.invalid") is not named
    await asyncio.gather(*pool._closing)
    assert plain.is_closed and named.is_closed
    await pool.aclose()


# -- the shared-cache request --------------------------------------------------------------------

SHARED_BODY = (
    b'{"model":"claude-sonnet-4","max_tokens":4096,"messages":[{"role":"user","content":"x"}]}'
)
SSE = {"content-type": "text/event-stream; charset=utf-8"}


def sse(*events: tuple[str, dict[str, Any]]) -> bytes:
    return "".join(f"event: {n}\ndata: {json.dumps(d)}\n\n" for n, d in events).encode()


def anthropic_stream(*blocks: dict[str, Any], usage: dict[str, Any] | None = None) -> bytes:
    """A complete Anthropic message stream carrying `blocks` (text, thinking, tool_use)."""
    start_usage = usage or {"input_tokens": 5, "output_tokens": 1}
    events: list[tuple[str, dict[str, Any]]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-sonnet-4",
                    "content": [],
                    "stop_reason": None,
                    "usage": start_usage,
                },
            },
        )
    ]
    for i, b in enumerate(blocks):
        kind = b["type"]
        empty = {"text": ""} if kind == "text" else {"thinking": ""} if kind == "thinking" else {}
        start = {**b, **empty} if kind != "tool_use" else {**b, "input": {}}
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": i, "content_block": start},
            )
        )
        if kind == "text":
            delta = {"type": "text_delta", "text": b["text"]}
        elif kind == "thinking":
            delta = {"type": "thinking_delta", "thinking": b["thinking"]}
        else:
            delta = {"type": "input_json_delta", "partial_json": json.dumps(b["input"])}
        events.append(
            ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta})
        )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    final = {"output_tokens": 42, **({"cache_read_input_tokens": 900} if usage else {})}
    events.append(
        (
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": final},
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return sse(*events)


THINKING = {
    "type": "thinking",
    "thinking": "Let me think <summary>not this</summary>",
    "signature": "c2ln",
}
TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}


async def test_shared_sends_the_body_as_is_to_the_agents_endpoint_with_its_headers():
    wire = Wire(ok_anthropic())
    origin = Origin.of(ORIGIN_URL, agent_headers())
    text = await wire.client(incoming()).shared(SHARED_BODY, job(origin=origin))
    assert text == "<summary>done</summary>"
    (req,) = wire.sent
    assert str(req.url) == ORIGIN_URL and req.method == "POST"
    assert req.content == SHARED_BODY
    assert req.headers[HEADER] == "summarize"
    assert req.headers["content-type"] == "application/json"
    assert (req.headers["x-api-key"], req.headers["anthropic-beta"]) == (
        KEY,
        "context-1m-2025-08-07",
    )
    for private in ("cookie", "x-context-guru-session", "x-e2e-id"):
        assert private not in req.headers
    bare = Origin.of(ORIGIN_URL, {"x-api-key": KEY})
    await wire.client(incoming()).shared(SHARED_BODY, job(origin=bare))
    assert wire.sent[-1].headers["anthropic-version"] == "2023-06-01"


@pytest.mark.parametrize("stream", [False, True])
async def test_shared_takes_the_text_not_the_thinking_nor_the_tool_calls(stream):
    blocks = (THINKING, {"type": "text", "text": "<summary>S</summary>"}, TOOL_USE)
    if stream:
        wire = Wire(lambda r: httpx.Response(200, content=anthropic_stream(*blocks), headers=SSE))
    else:
        doc = {**anthropic_answer(*blocks), "id": "m", "model": "x", "stop_reason": "end_turn"}
        wire = Wire(lambda r: httpx.Response(200, json=doc))
    origin = Origin.of(ORIGIN_URL, agent_headers())
    assert (
        await wire.client(incoming()).shared(SHARED_BODY, job(origin=origin))
        == "<summary>S</summary>"
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_shared_answer_with_only_tool_calls_has_no_text(stream):
    if stream:
        wire = Wire(lambda r: httpx.Response(200, content=anthropic_stream(TOOL_USE), headers=SSE))
    else:
        wire = Wire(lambda r: httpx.Response(200, json=anthropic_answer(TOOL_USE)))
    origin = Origin.of(ORIGIN_URL, agent_headers())
    assert await wire.client(incoming()).shared(SHARED_BODY, job(origin=origin)) is None


def openai_stream(
    content: str | None, calls: bool = False, usage: dict[str, Any] | None = None
) -> bytes:
    base = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-test"}
    delta: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        delta["tool_calls"] = [
            {
                "index": 0,
                "id": "call_1",
                "type": "function",
                "function": {"name": "f", "arguments": "{}"},
            }
        ]
    chunks = [
        {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {
            **base,
            "choices": [
                {"index": 0, "delta": {}, "finish_reason": "tool_calls" if calls else "stop"}
            ],
        },
    ]
    if usage:
        chunks.append({**base, "choices": [], "usage": usage})
    return ("".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n").encode()


@pytest.mark.parametrize(
    ("answer", "text"),
    [
        (openai_stream("<summary>O</summary>"), "<summary>O</summary>"),
        (openai_stream(None, calls=True), None),
    ],
)
async def test_shared_reads_an_openai_stream(answer, text):
    wire = Wire(lambda r: httpx.Response(200, content=answer, headers=SSE))
    j = job(
        "openai",
        "gpt-test",
        Origin.of("https://api.example.test/v1/chat/completions", {"authorization": "Bearer k"}),
    )
    assert await wire.client(incoming()).shared(b"{}", j) == text
    assert "anthropic-version" not in wire.sent[0].headers


@pytest.mark.parametrize("status", [400, 413, 422])
async def test_shared_refused_is_its_own_error(status):
    wire = Wire(sequence(status))
    origin = Origin.of(ORIGIN_URL, agent_headers())
    with pytest.raises(SummarizerRefused, match=f"HTTP {status}"):
        await wire.client(incoming()).shared(SHARED_BODY, job(origin=origin))
    assert len(wire.sent) == 1  # not retried


async def test_shared_server_errors_are_not_refusals():
    wire = Wire(sequence(503, 503, 503))
    origin = Origin.of(ORIGIN_URL, agent_headers())
    with pytest.raises(SummarizerError) as e:
        await wire.client(incoming(), timeout=5).shared(SHARED_BODY, job(origin=origin))
    assert not isinstance(e.value, SummarizerRefused)
    assert KEY not in "".join(traceback.format_exception(e.value))


async def test_shared_unreadable_answers_and_no_origin():
    wire = Wire(
        lambda r: httpx.Response(200, content=b"event: message_start\ndata: {", headers=SSE)
    )
    origin = Origin.of(ORIGIN_URL, agent_headers())
    with pytest.raises(SummarizerError, match="unreadable answer"):
        await wire.client(incoming()).shared(SHARED_BODY, job(origin=origin))
    with pytest.raises(NoModel):
        await wire.client(incoming()).shared(SHARED_BODY, job(origin=None))


# -- usage ---------------------------------------------------------------------------------------


class Sink:
    def __init__(self, fail: bool = False) -> None:
        self.got: list[tuple[str, str, Usage]] = []
        self.fail = fail

    def __call__(self, session: str, model: str, usage: Usage) -> None:
        self.got.append((session, model, usage))
        if self.fail:
            raise RuntimeError("ledger down")


ANTHROPIC_USAGE = {
    "input_tokens": 30,
    "cache_creation_input_tokens": 0,
    "cache_read_input_tokens": 900,
    "output_tokens": 1,
}


async def test_usage_of_a_streamed_shared_answer_reaches_on_usage():
    body = anthropic_stream({"type": "text", "text": "<summary>S</summary>"}, usage=ANTHROPIC_USAGE)
    wire = Wire(lambda r: httpx.Response(200, content=body, headers=SSE))
    sink = Sink()
    origin = Origin.of(ORIGIN_URL, agent_headers())
    await wire.client(incoming(), on_usage=sink).shared(SHARED_BODY, job(origin=origin))
    # message_start's input side, message_delta's cumulative output
    assert sink.got == [("s1", "claude-sonnet-4", Usage(30, 0, 0, 900, 42, 1))]


async def test_usage_of_openai_answers_and_of_the_standalone_call_reaches_on_usage():
    usage = {
        "prompt_tokens": 1000,
        "completion_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 896},
    }
    wire = Wire(
        lambda r: httpx.Response(
            200, content=openai_stream("<summary>O</summary>", usage=usage), headers=SSE
        )
    )
    sink = Sink()
    j = job("openai", "gpt-test", Origin.of("https://api.example.test/v1/chat/completions", {}))
    await wire.client(incoming(), on_usage=sink).shared(b"{}", j)
    assert sink.got == [("s1", "gpt-test", Usage(104, 0, 0, 896, 7, 1))]
    doc = {
        **openai_answer("<summary>x</summary>"),
        "usage": {"prompt_tokens": 50, "completion_tokens": 5},
    }
    wire = Wire(lambda r: httpx.Response(200, json=doc))
    await wire.client(config(model="cheap", provider="openai", base_url="http://h"), on_usage=sink)(
        PROMPT, j
    )
    assert sink.got[-1] == ("s1", "cheap", Usage(50, 0, 0, 0, 5, 1))


@pytest.mark.parametrize("usage", [None, "many", {"input_tokens": -1}, {}])
async def test_a_missing_or_malformed_usage_is_skipped(usage):
    doc = anthropic_answer({"type": "text", "text": "<summary>d</summary>"})
    if usage is not None:
        doc["usage"] = usage
    wire = Wire(lambda r: httpx.Response(200, json=doc))
    sink = Sink()
    origin = Origin.of(ORIGIN_URL, agent_headers())
    assert (
        await wire.client(incoming(), on_usage=sink)(PROMPT, job(origin=origin))
        == "<summary>d</summary>"
    )
    assert sink.got == []


async def test_a_failing_usage_sink_never_fails_the_summary():
    doc = {
        **anthropic_answer({"type": "text", "text": "<summary>d</summary>"}),
        "usage": ANTHROPIC_USAGE,
    }
    wire = Wire(lambda r: httpx.Response(200, json=doc))
    sink = Sink(fail=True)
    origin = Origin.of(ORIGIN_URL, agent_headers())
    assert (
        await wire.client(incoming(), on_usage=sink)(PROMPT, job(origin=origin))
        == "<summary>d</summary>"
    )
    assert len(sink.got) == 1


# -- cg_shared: a proxy several users share --------------------------------------------------


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_shared_proxy_never_falls_back_to_the_process_key(provider):
    env = {"ANTHROPIC_API_KEY": "process-key", "OPENAI_API_KEY": "process-key"}
    cfg = config(model="small", provider=provider)
    # the guard: unshared, the process's key is what the call would carry
    assert "process-key" in json.dumps(resolve_endpoint(cfg, job(), env=env).headers)
    with pytest.raises(NoModel, match="cg_shared") as e:
        resolve_endpoint(cfg, job(), env=env, shared=True)
    assert "process-key" not in str(e.value)
    keyed = config(model="small", provider=provider, api_key="own-key")
    ep = resolve_endpoint(keyed, job(), env=env, shared=True)
    assert "own-key" in json.dumps(ep.headers) and "process-key" not in json.dumps(ep.headers)


async def test_shared_proxy_summary_without_a_key_sends_nothing(wire):
    client = wire.client(config(model="small"), env={"ANTHROPIC_API_KEY": "process-key"},
                         shared_proxy=True)  # fmt: skip
    with pytest.raises(NoModel):
        await client("summarize this", job())
    assert wire.sent == []
    agents = wire.client(incoming(), shared_proxy=True)  # the agent's own key: unaffected
    origin = Origin.of(ORIGIN_URL, agent_headers())
    assert await agents("summarize this", job(origin=origin)) == "<summary>done</summary>"
    assert wire.sent[-1].headers["x-api-key"] == KEY


# -- retry-after -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("2", 2.0), ("0.5", 0.5), (None, 0.0), ("", 0.0), ("soon", 0.0), ("-3", 0.0), ("nan", 0.0),
     ("Wed, 21 Oct 2026 07:28:00 GMT", 0.0)],
)  # fmt: skip
def test_retry_after_reads_seconds(value, seconds):
    assert retry_after(value) == seconds


async def test_a_429_with_retry_after_is_asked_again_no_sooner():
    seen: list[float] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(time.monotonic())
        if len(seen) == 1:
            return httpx.Response(429, headers={"retry-after": "0.6"}, json={})
        return ok_anthropic()(request)  # type: ignore[return-value]

    wire = Wire(handle)
    out = await wire.client(incoming(), timeout=10)("p", job(origin=Origin.of(ORIGIN_URL, {})))
    assert out == "<summary>done</summary>"
    assert len(seen) == 2 and seen[1] - seen[0] >= 0.6  # the backoff alone is 0.125 s


async def test_a_retry_after_past_the_deadline_gives_up_at_once():
    seen: list[float] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(time.monotonic())
        return httpx.Response(429, headers={"retry-after": "30"}, json={})

    wire = Wire(handle)
    t0 = time.monotonic()
    with pytest.raises(SummarizerError, match="429"):
        await wire.client(incoming(), timeout=5)("p", job(origin=Origin.of(ORIGIN_URL, {})))
    assert len(seen) == 1 and time.monotonic() - t0 < 1.0  # not asked again, nor waited for


# -- Codex signed in with ChatGPT: its backend's route, headers and rules ----------------------

CHATGPT_URL = "https://chatgpt.example.test/backend-api/codex/responses"
CHATGPT_HEADERS = DIALECTS["responses"].route_headers(CHATGPT_URL)
CHATGPT_BEARER = "Bearer eyJhbGciOiJub25lIn0.eyJzdWIiOiJ0ZXN0In0.sig"


def chatgpt_headers() -> http.Headers:
    """What Codex 0.171.0 signed in with ChatGPT sends (tests/e2e/test_codex_chatgpt_e2e.py
    reads them live)."""
    return http.Headers(
        [
            (b"Host", b"chatgpt.example.test"),
            (b"Authorization", CHATGPT_BEARER.encode()),
            (b"ChatGPT-Account-Id", b"acct-test-1"),
            (b"originator", b"codex_exec"),
            (b"version", b"0.171.0"),
            (b"session-id", b"019a-session"),
            (b"thread-id", b"019a-session"),
            (b"x-codex-turn-metadata", b'{"request_kind":"turn"}'),
            (b"User-Agent", b"codex_exec/0.171.0"),
            (b"Cookie", b"__cf_bm=abc"),
        ]
    )


def responses_stream(text: str) -> bytes:
    done = {
        "type": "response.completed",
        "response": {
            "id": "resp_1",
            "object": "response",
            "status": "completed",
            "model": "gpt-5.1-codex",
            "output": [
                {
                    "type": "message",
                    "id": "msg_1",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            ],
            "usage": {"input_tokens": 10, "output_tokens": 3, "total_tokens": 13},
        },
    }
    return f"event: response.completed\ndata: {json.dumps(done)}\n\n".encode()


def test_origin_keeps_the_chatgpt_account_and_session_headers():
    origin = Origin.of(CHATGPT_URL, chatgpt_headers())
    assert origin.headers == {
        "authorization": CHATGPT_BEARER,
        "chatgpt-account-id": "acct-test-1",
        "originator": "codex_exec",
        "version": "0.171.0",
        "session-id": "019a-session",
        "thread-id": "019a-session",
    }
    assert set(origin.headers) <= {*INCOMING_HEADERS, *CHATGPT_HEADERS}
    # The same headers to the API's route: only the credential goes.
    api = Origin.of("https://api.example.test/v1/responses", chatgpt_headers())
    assert api.headers == {"authorization": CHATGPT_BEARER}


async def test_the_standalone_request_on_the_chatgpt_route_streams_unstored():
    """ChatGPT's Codex backend refuses `stream: false`, a stored response and
    `max_output_tokens`: the standalone summarizer request there is streamed (in the shape
    Codex sends), read as a stream, and sent with the agent's bearer and account."""
    sse = responses_stream("<summary>chatgpt</summary>")
    wire = Wire(
        lambda r: httpx.Response(200, content=sse, headers={"content-type": "text/event-stream"})
    )
    seen: list[Usage] = []
    client = wire.client(incoming(), on_usage=lambda s, m, u: seen.append(u))
    origin = Origin.of(CHATGPT_URL, chatgpt_headers())
    text = await client(PROMPT, job("responses", "gpt-5.1-codex", origin=origin))
    assert text == "<summary>chatgpt</summary>"
    (req,) = wire.sent
    assert str(req.url) == CHATGPT_URL
    assert req.headers["authorization"] == CHATGPT_BEARER
    assert req.headers["chatgpt-account-id"] == "acct-test-1"
    assert req.headers["originator"] == "codex_exec"
    assert "cookie" not in req.headers and "x-codex-turn-metadata" not in req.headers
    body = wire.body()
    assert body["stream"] is True and body["store"] is False
    part = {"type": "input_text", "text": PROMPT}
    assert body["input"] == [{"type": "message", "role": "user", "content": [part]}]
    assert "max_output_tokens" not in body
    assert [u.output_tokens for u in seen] == [3]


async def test_the_standalone_request_on_the_api_route_stays_unstreamed():
    """Vacuity guard for the test above: the same dialect on `/v1/responses` is not streamed."""
    doc = {"output": [{"type": "message", "content": [{"type": "output_text", "text": "x"}]}]}
    wire = Wire(lambda r: httpx.Response(200, json=doc))
    origin = Origin.of("https://api.example.test/v1/responses", chatgpt_headers())
    assert await wire.client(incoming())(PROMPT, job("responses", "m", origin=origin)) == "x"
    assert "stream" not in wire.body() and wire.body()["input"] == PROMPT
