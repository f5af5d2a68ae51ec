"""The model client that writes summaries: one pooled async httpx client, both sources, all three
dialects. Errors form one small tree (in `cg.summarize.component`):

    SummarizerError          unreachable, 4xx/5xx after retries, an unreadable answer
     ├─ SummarizerTimeout    no answer within the deadline
     └─ NoModel              no model or endpoint is available: a no-op, with that reason

`incoming` reuses the proxied request's own endpoint, credential and model: the `Origin` is taken
from the intercepted request and lives in memory only, for the life of one job. `config` uses a
dedicated (cheap) model from the `model:` block or `CHEAP_MODEL*`. Every request carries
`x-context-guru: summarize` and is retried (transport errors, 408, 409, 429, 5xx) under one
deadline. The client never reads the process's proxy settings: it is the proxy.

Two requests: `__call__` sends the standalone prompt (non-streaming); `shared` sends the body
`cg.summarize.shared` built from the commissioning request, to that request's own URL with its
headers, and reads the answer as it comes (JSON, or SSE when the agent streamed). Every answer's
`usage` goes to `on_usage(session, model, Usage)` — the summarizer's own cost, for the ledger; a
missing or malformed usage is skipped, never an error.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from cg.summarize.component import (
    Commission,
    NoModel,
    SummarizerError,
    SummarizerRefused,
    SummarizerTimeout,
)
from cg.summarize.config import ModelConfig
from cg.summarize.prompt import MAX_TOKENS as MAX_TOKENS
from cg.wire.answers import Reply, ResponseParseError, parse_json, parse_sse, usage_of
from cg.wire.dialects import ANTHROPIC, DIALECTS
from cg.wire.dialects.anthropic import ANTHROPIC_VERSION as ANTHROPIC_VERSION
from cg.wire.upstream import Exchange, exchange_of, sni_extensions, ssl_context
from cg.wire.usage import Usage, UsageError, from_provider

HEADER = "x-context-guru"
TIMEOUT_ENV = "CONTEXT_GURU_SUMMARIZE_TIMEOUT"
DEFAULT_TIMEOUT = 90.0
RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
REFUSED_STATUS = frozenset({400, 413, 422})  # the request as sent: no retry helps
MAX_ATTEMPTS = 3
# `model.provider` names a wire format: `openai` is Chat Completions, `responses` the OpenAI
# Responses API (same host and key, its own path): `Dialect.default_base`, `.key_env` and
# `.path_suffix`.
PATHS = {name: d.path_suffix for name, d in DIALECTS.items()}
# Headers of the intercepted request that an `incoming` summary may reuse: the credential, the
# API version and betas (a beta can change how the prompt is rendered, so the shared call needs
# the agent's), and OpenAI's organisation and project (the prompt cache is per organisation, and
# the summary is billed where the agent's turn is).
INCOMING_HEADERS = (
    "x-api-key",
    "authorization",
    "anthropic-version",
    "anthropic-beta",
    "openai-organization",
    "openai-project",
    "x-goog-api-key",
)
UsageSink = Callable[[str, str, Usage], None]
# Every request the summarizer sends, with its answer: (the job, which request — `shared` or
# `standalone` — and the exchange). The mitmproxy face shows each as a flow of its own.
CallSink = Callable[[Commission, str, Exchange], None]


@dataclass(frozen=True, slots=True)
class Origin:
    """Where the proxied request went and the credential it carried. Memory only; no repr.

    `sni`: `url` names the address connected to (transparent/local mode), and TLS and `Host`
    name this provider instead (`cg.wire.upstream.sni_name`)."""

    url: str
    headers: dict[str, str] = field(repr=False)
    sni: str | None = None

    @classmethod
    def of(cls, url: str, headers: Mapping[str, str], sni: str | None = None) -> Origin:
        """The reused headers: `INCOMING_HEADERS`, and those a sign-in's own route needs
        (`Dialect.route_headers`: ChatGPT's account, originator, session and thread)."""
        names = INCOMING_HEADERS + tuple(h for d in DIALECTS.values() for h in d.route_headers(url))
        kept = {k: headers[k] for k in names if k in headers}
        if sni:
            kept["host"] = headers.get("host") or sni
        return cls(url, kept, sni)

    def headers_for(self, dialect: str) -> dict[str, str]:
        """The reused headers, with what a request in `dialect` needs if it had none (the API
        version of an Anthropic one: `Dialect.summarizer_headers`)."""
        return DIALECTS[dialect].summarizer_headers(self.headers)


def _origin(job: Commission) -> Origin:
    if not isinstance(job.origin, Origin):
        raise NoModel("model.source incoming: no proxied request to reuse")
    return job.origin


@dataclass(frozen=True, slots=True)
class Endpoint:
    dialect: str
    url: str
    model: str
    headers: dict[str, str] = field(repr=False)
    sni: str | None = None


def timeout_from_env(env: Mapping[str, str] | None = None) -> float:
    """`CONTEXT_GURU_SUMMARIZE_TIMEOUT` in seconds; a bad value is refused, naming the variable."""
    raw = (os.environ if env is None else env).get(TIMEOUT_ENV, "")
    if not raw.strip():
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{TIMEOUT_ENV}: not a number of seconds (got {raw!r})") from None
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{TIMEOUT_ENV}: must be a finite number > 0 (got {raw!r})")
    return value


def _join(base: str, path: str) -> str:
    base = base.rstrip("/")
    return base + (path[3:] if base.endswith("/v1") else path)


def resolve_endpoint(
    cfg: ModelConfig, job: Commission, env: Mapping[str, str] | None = None, shared: bool = False
) -> Endpoint:
    """The endpoint, model and headers for one job. Raises `NoModel` when there are none.

    `shared` (option `cg_shared`, a proxy several users share): a `config` model with no key of
    its own (`model.api_key` or `CHEAP_MODEL_API_KEY`) never falls back to the process's
    provider key, which would bill every user's summaries to whoever started the proxy."""
    env = os.environ if env is None else env
    if cfg.source == "incoming":
        origin = _origin(job)
        model = cfg.model or job.model
        if not model:
            raise NoModel("model.source incoming: the request names no model")
        url = DIALECTS[job.dialect].standalone_url(origin.url, model)
        return Endpoint(job.dialect, url, model, origin.headers_for(job.dialect), origin.sni)

    d = DIALECTS[cfg.provider or ANTHROPIC.name]
    if not cfg.model:
        raise NoModel("model.source config: no model.model (or CHEAP_MODEL) set")
    if cfg.api_key is None and shared:
        raise NoModel(
            "cg_shared: model.source config has no key of its own (model.api_key or "
            f"CHEAP_MODEL_API_KEY); {d.key_env} is not used on a shared proxy"
        )
    key = cfg.api_key.get_secret_value() if cfg.api_key else env.get(d.key_env, "")
    base = cfg.base_url or d.default_base
    headers = d.auth_headers(key, bearer=cfg.auth == "bearer")
    return Endpoint(d.name, _join(base, d.standalone_path(cfg.model)), cfg.model, headers)


def request_body(ep: Endpoint, prompt: str, level: str) -> dict[str, Any]:
    return DIALECTS[ep.dialect].summary_request(ep.model, prompt, MAX_TOKENS.get(level, 4096))


def answer_text(dialect: str, doc: Any) -> str | None:
    """The text of a non-streaming answer in any dialect; None when it has none."""
    if not isinstance(doc, dict):
        raise SummarizerError("the answer is not a JSON object")
    try:
        d = DIALECTS[dialect]
        text = d.answer_text(d.answer_body(doc))
    except ResponseParseError as e:
        raise SummarizerError(str(e)) from None
    return text if text.strip() else None


class SummarizerClient:
    """One model config's summarizer; all instances share the addon's pooled httpx client.

    `on_usage(session, model, usage)` is told the provider's usage of every answer (both
    requests); an exception it raises is swallowed: accounting never fails a summary.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        client: HttpPool,
        *,
        level: str = "regular",
        timeout: float = DEFAULT_TIMEOUT,
        env: Mapping[str, str] | None = None,
        on_usage: UsageSink | None = None,
        shared_proxy: bool = False,
        on_call: CallSink | None = None,
    ) -> None:
        self.cfg = cfg
        self.on_call = on_call
        self.shared_proxy = shared_proxy
        self.pool = client
        self.level = level
        self.timeout = timeout
        self.env = env
        self.on_usage = on_usage

    async def __call__(self, prompt: str, job: Commission) -> str | None:
        """The standalone prompt, as one non-streaming user message."""
        ep = resolve_endpoint(self.cfg, job, self.env, self.shared_proxy)
        d = DIALECTS[ep.dialect]
        payload = d.standalone_body(ep.url, request_body(ep, prompt, self.level))
        if d.streams_only(ep.url):  # ChatGPT's Codex backend: streamed or refused
            payload = d.streamed(payload)
        body = json.dumps(payload).encode()
        resp = await self._post(ep.url, body, ep.headers, ep.sni, job, "standalone")
        if resp.headers.get("content-type", "").startswith("text/event-stream"):
            try:
                reply = parse_sse(ep.dialect, resp.content)
            except ResponseParseError as e:
                raise SummarizerError(f"unreadable answer: {type(e).__name__}") from None
            self._usage(job, ep.model, ep.dialect, usage_of(reply))
            return reply_text(reply)
        try:
            doc = resp.json()
        except ValueError:
            raise SummarizerError("the answer is not JSON") from None
        inner = d.answer_body(doc)
        usage = inner.get(d.usage_key) if isinstance(inner, dict) else None
        self._usage(job, ep.model, ep.dialect, usage)
        return answer_text(ep.dialect, doc)

    async def shared(self, body: bytes, job: Commission) -> str | None:
        """The shared-cache request: `body` to the commissioning request's own URL, with its
        credential and version headers. The answer's text (not its thinking, not its tool
        calls); None when it has none."""
        origin = _origin(job)
        if job.dialect not in DIALECTS:
            raise NoModel(f"no shared-cache summarizer for the {job.dialect} dialect")
        headers = origin.headers_for(job.dialect)
        resp = await self._post(origin.url, body, headers, origin.sni, job, "shared")
        ctype = resp.headers.get("content-type", "")
        try:
            if ctype.startswith("text/event-stream"):
                reply = parse_sse(job.dialect, resp.content)
            else:
                reply = parse_json(job.dialect, resp.content)
        except ResponseParseError as e:
            raise SummarizerError(f"unreadable answer: {type(e).__name__}") from None
        self._usage(job, job.model or "", job.dialect, usage_of(reply))
        return reply_text(reply)

    def _usage(self, job: Commission, model: str, dialect: str, usage: Any) -> None:
        if self.on_usage is None or usage is None:
            return
        try:
            parsed = from_provider(dialect, usage)
        except UsageError:
            return
        try:
            self.on_usage(job.session, model, parsed)
        except Exception:  # noqa: BLE001 - accounting must never fail a summary
            return

    def _shown(
        self,
        job: Commission | None,
        kind: str,
        req: httpx.Request,
        started: float,
        resp: httpx.Response | None = None,
        error: str | None = None,
    ) -> None:
        """Hand one attempt to `on_call` (a flow in mitmweb); never fails the summary."""
        if self.on_call is None or job is None:
            return
        try:
            self.on_call(job, kind, exchange_of(req, started, resp, error))
        except Exception:  # noqa: BLE001 - showing a call must never fail it
            return

    async def _post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        sni: str | None = None,
        job: Commission | None = None,
        kind: str = "standalone",
    ) -> httpx.Response:
        """POST under one deadline with bounded retries; the 200 response, read whole. `sni`:
        the provider's name when `url` names an address (`Origin.sni`). Each attempt, with
        its answer or error, goes to `on_call` (`job`, `kind`)."""
        headers = {**headers, "content-type": "application/json", HEADER: "summarize"}
        deadline = time.monotonic() + self.timeout
        last = "no attempt made"
        attempts = 0
        asked = 0.0  # what the provider's retry-after asked us to wait
        for attempt in range(MAX_ATTEMPTS):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            attempts += 1
            client = self.pool.client(sni)
            req = client.build_request(
                "POST",
                url,
                content=body,
                headers=headers,
                timeout=left,
                extensions=sni_extensions(sni),
            )
            started = time.time()
            try:
                # httpx's timeout bounds each read, not the whole answer: the deadline does.
                async with asyncio.timeout(left):
                    resp = await client.send(req)
            except (httpx.TimeoutException, TimeoutError):
                self._shown(job, kind, req, started, error=f"no answer within {self.timeout:g}s")
                raise SummarizerTimeout(f"no answer within {self.timeout:g}s") from None
            except httpx.TransportError as e:
                last = f"{type(e).__name__}"
                self._shown(job, kind, req, started, error=last)
            else:
                self._shown(job, kind, req, started, resp)
                if resp.status_code == 200:
                    return resp
                last = f"HTTP {resp.status_code}"
                if resp.status_code in REFUSED_STATUS:
                    raise SummarizerRefused(last)
                if resp.status_code not in RETRY_STATUS:
                    raise SummarizerError(last)
                asked = retry_after(resp.headers.get("retry-after"))
            # A provider that says when to come back is not asked again sooner.
            backoff = max(min(0.25 * 2**attempt, 2.0) * (0.5 + random.random()), asked)
            if time.monotonic() + backoff >= deadline:
                break
            await asyncio.sleep(backoff)
        if time.monotonic() >= deadline:
            raise SummarizerTimeout(f"no answer within {self.timeout:g}s ({last})")
        raise SummarizerError(f"gave up after {attempts} attempts ({last})")


def retry_after(value: str | None) -> float:
    """Seconds a `retry-after` header asks for (a number of seconds; an HTTP date is read as
    0, no wait of our own beyond the backoff); 0 when absent or unreadable."""
    try:
        seconds = float(value) if value else 0.0
    except ValueError:
        return 0.0
    return seconds if math.isfinite(seconds) and seconds > 0 else 0.0


def reply_text(reply: Reply) -> str | None:
    """The text of a parsed answer (either dialect, streamed or not); None when it has none."""
    return answer_text(reply.dialect, reply.message)


class HttpPool:
    """One async httpx client for the process, made lazily inside the running loop.

    `trust_env=False`: the proxy must not send its own calls through itself. TLS verification
    follows mitmproxy's own upstream settings (`verify`).

    `client(sni)`: calls to an address under a provider's name (transparent/local mode) get a
    client of their own per name, since a pooled connection is keyed by the address alone and
    must never carry one provider's request over a TLS session opened for another. At most
    `MAX_NAMED` names are kept; the least recently used one beyond is closed.
    """

    MAX_NAMED = 16

    def __init__(self, verify: bool | str = True, max_connections: int | None = 16) -> None:
        self._verify = verify
        # None: no cap (the expand relay holds a connection for a whole streamed answer, one
        # per agent turn in flight: a cap would queue turns behind others' generations).
        self.max_connections = max_connections
        self._client: httpx.AsyncClient | None = None
        self._named: dict[str, httpx.AsyncClient] = {}
        self._closing: set[asyncio.Task[None]] = set()

    @property
    def verify(self) -> bool | str:
        return self._verify

    @verify.setter
    def verify(self, value: bool | str) -> None:
        """A change (mitmproxy's `ssl_insecure` or `ssl_verify_upstream_trusted_ca`) retires
        every client made under the old setting: their pooled connections were verified by it."""
        if value == self._verify:
            return
        self._verify = value
        old = [c for c in (self._client, *self._named.values()) if c is not None]
        self._client, self._named = None, {}
        for client in old:
            self._retire(client)

    def _retire(self, client: httpx.AsyncClient) -> None:
        try:
            task = asyncio.get_running_loop().create_task(client.aclose())
        except RuntimeError:  # no loop (a client is only ever made inside one): nothing open
            return
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _new(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            trust_env=False,
            verify=ssl_context(self._verify),  # a path as `verify` is deprecated in httpx
            # Uncapped (the relay): as many kept alive as there are turns in flight, up to 64,
            # so concurrent agents do not reconnect upstream on every turn.
            limits=httpx.Limits(
                max_connections=self.max_connections,
                max_keepalive_connections=8 if self.max_connections else 64,
            ),
        )

    def client(self, sni: str | None = None) -> httpx.AsyncClient:
        if sni:
            named = self._named.pop(sni, None) or self._new()
            self._named[sni] = named  # most recently used last
            while len(self._named) > self.MAX_NAMED:
                self._retire(self._named.pop(next(iter(self._named))))
            return named
        if self._client is None:
            self._client = self._new()
        return self._client

    async def aclose(self) -> None:
        clients = [c for c in (self._client, *self._named.values()) if c is not None]
        self._client = None
        self._named = {}
        for client in clients:
            await client.aclose()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
