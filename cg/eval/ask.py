"""Asking the user's model one probe, in one condition (docs/eval.md#how-a-probe-is-asked).

The probe's request is the recorded request (the client's, or the one the pipeline sent) with
the question appended as a final user turn, `stream: false`, the tools kept and `tool_choice`
`none` — or, with expand allowed, `auto` with `context_guru_expand` declared, its calls answered
from the eval's store by the proxy's own continuation loop (`cg.expand.continuation`, at most 3
rounds). The request is ours, never forwarded to anyone as the client's, so it is parsed and
re-serialised: the model reads the same content (prompt caches key on it, not on JSON bytes).

The key is read from the environment, sent only in the request's auth header, and cut out of
anything that is reported (an error text); it is never printed, logged or written.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from cg.expand import continuation
from cg.expand.tool import TOOL_JSON, declares
from cg.wire.answers import ProviderError, Reply, ResponseParseError, parse_json, sum_usage
from cg.wire.dialects import DIALECTS, Dialect
from cg.wire.usage import Usage, UsageError

Condition = Literal["original", "rewritten", "rewritten+expand"]
CONDITIONS: tuple[Condition, ...] = ("original", "rewritten", "rewritten+expand")
BYPASS = ("x-context-guru-bypass", "1")  # never rewritten by a context-guru proxy on the way
# Agent headers that change how the provider reads the request (a beta may widen the window).
KEPT_HEADERS = ("anthropic-version", "anthropic-beta", "openai-organization", "openai-project")
TIMEOUT_S = 120.0
FIRST = "cg_eval_first"  # a request extension: the probe's own call, not an expand round

_NO_TOOL = (
    "Answer from this conversation alone, in text, without calling any tool. If you cannot "
    "tell, answer 'I do not know'."
)
_EXPAND = (
    "Answer in text. If the detail was replaced by a History Summary, you may call "
    "context_guru_expand with the id of its <<cg:ID>> marker to restore it; call no other tool. "
    "If you cannot tell, answer 'I do not know'."
)


def probe_text(question: str, condition: Condition) -> str:
    return (
        f"[context-guru eval] {question}\n\n{_EXPAND if condition == CONDITIONS[2] else _NO_TOOL}"
    )


def _blank(content: Any) -> bool:
    if isinstance(content, str):
        return not content.strip()
    if isinstance(content, list):
        return all(
            isinstance(b, dict) and b.get("type") == "text" and not str(b.get("text", "")).strip()
            for b in content
        )
    return content is None


def _blank_prefill(m: Any) -> bool:
    return (
        isinstance(m, dict)
        and m.get("role") == "assistant"
        and not m.get("tool_calls")
        and _blank(m.get("content"))
    )


def _is_system(d: Dialect, m: Any) -> bool:
    try:
        return d.view(m).is_system
    except ValueError:
        return False


def _append_question(dialect: str, items: list[Any], text: str) -> None:
    """The question as the transcript's last user turn, in the dialect's form for a new user
    message. An empty prefill (legal only at the end) is left out, and the question goes before
    any system messages that end the array (legal only there). (Anthropic combines it with a
    user turn right before it, as its API does with consecutive turns of one role.)"""
    d = DIALECTS[dialect]
    at = len(items)
    while at and _is_system(d, items[at - 1]):
        at -= 1
    if at and _blank_prefill(items[at - 1]):
        del items[at - 1]
        at -= 1
    items.insert(at, d.user_message(text))


def probe_body(
    dialect: str, body: bytes, question: str, condition: Condition, model: str | None = None
) -> bytes:
    """The request that asks `question` of the conversation in `body`, in `condition`, of
    `model` (None: the request's own)."""
    d = DIALECTS[dialect]
    doc = json.loads(body)
    if model:
        doc["model"] = model
    items = list(doc.get(d.array_key) or [])
    _append_question(dialect, items, probe_text(question, condition))
    doc[d.array_key] = items
    doc["stream"] = False
    doc.pop("stream_options", None)
    tools = doc.get("tools")
    expand = condition == CONDITIONS[2]
    if expand and not declares(dialect, tools):
        tools = [*(tools if isinstance(tools, list) else []), json.loads(TOOL_JSON[dialect])]
        doc["tools"] = tools
    if isinstance(tools, list) and tools:
        doc["tool_choice"] = d.tool_choice("auto" if expand else "none")
    else:
        doc.pop("tool_choice", None)
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where one dialect's probes go, with the key that pays for them."""

    dialect: str
    url: str
    key: str = field(repr=False)

    def headers(self, recorded: Mapping[str, str]) -> dict[str, str]:
        d = DIALECTS[self.dialect]
        out = {k.lower(): v for k, v in recorded.items() if k.lower() in KEPT_HEADERS}
        if "anthropic-beta" in out:
            # An OAuth beta goes with the subscription token the agent had, not with a key.
            betas = [b.strip() for b in out["anthropic-beta"].split(",")]
            kept = [b for b in betas if b and not b.startswith("oauth-")]
            out["anthropic-beta"] = ",".join(kept)
            if not kept:
                del out["anthropic-beta"]
        out.update({"content-type": "application/json", BYPASS[0]: BYPASS[1]})
        for k, v in d.auth_headers(self.key, bearer=False).items():
            if k not in KEPT_HEADERS or k not in out:  # the agent's API version stays
                out[k] = v
        return out

    def redact(self, text: str) -> str:
        """`text` without the key (cut to length only after: a cut could halve the key)."""
        return text.replace(self.key, "[key]") if self.key else text


def join(base: str, path: str) -> str:
    base = base.rstrip("/")
    return base + (path[3:] if base.endswith("/v1") else path)


def endpoint(dialect: str, base_url: str | None, env: Mapping[str, str]) -> Endpoint:
    """The dialect's endpoint: `base_url` or the provider's own, the key from its variable
    (`ANTHROPIC_API_KEY`, `OPENAI_API_KEY`). ValueError when the key is not set."""
    d = DIALECTS[dialect]
    key = env.get(d.key_env, "")
    if not key:
        raise ValueError(f"no API key for {dialect} requests: set {d.key_env}")
    return Endpoint(dialect, join(base_url or d.default_base, d.path_suffix), key)


class Budget:
    """The calls still allowed (`--max-calls`): every request the client sends takes one, the
    continuation's rounds too; one over the bound is refused before it leaves. The probes'
    first calls (`reserved` of them, marked `FIRST`) are held back from the rounds, so an expand
    round never takes the place of another condition's question."""

    def __init__(self, limit: int | None, reserved: int = 0) -> None:
        self.limit = limit
        self.reserved = reserved
        self.made = 0

    async def take(self, request: httpx.Request) -> None:
        first = request.extensions.get(FIRST, False)
        if first:
            self.reserved = max(0, self.reserved - 1)
        elif self.limit is not None and self.made + self.reserved >= self.limit:
            raise BudgetSpent(f"--max-calls {self.limit} reached")
        if self.limit is not None and self.made >= self.limit:
            raise BudgetSpent(f"--max-calls {self.limit} reached")
        self.made += 1


class BudgetSpent(Exception):
    pass


def client(budget: Budget) -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=TIMEOUT_S, event_hooks={"request": [budget.take]})


@dataclass(slots=True)
class Answer:
    """What one probe got in one condition: the answer's text, or why there is none."""

    text: str = ""
    error: str | None = None
    calls: int = 0  # requests this probe sent (expand rounds included)
    expanded: list[str] = field(default_factory=list)  # the ids the model asked for
    usage: Usage = field(default_factory=Usage)


def _usage(dialect: str, replies: list[Reply]) -> Usage:
    u = sum_usage(replies)
    try:
        got = DIALECTS[dialect].usage(u) if u else Usage()
    except UsageError:
        got = Usage()
    return dataclasses.replace(got, requests=len(replies))


async def ask(
    http: httpx.AsyncClient,
    ep: Endpoint,
    recorded: Mapping[str, str],
    body: bytes,
    condition: Condition,
    resolve: Callable[[str], str],
    limit: asyncio.Semaphore,
) -> Answer:
    """Send one probe request (and its expand rounds); never raises."""
    d = DIALECTS[ep.dialect]
    headers = ep.headers(recorded)
    async with limit:
        try:
            resp = await http.post(ep.url, content=body, headers=headers, extensions={FIRST: True})
        except BudgetSpent as e:
            return Answer(error=str(e))
        except Exception as e:  # noqa: BLE001 - unreachable, a bad URL, anything: an error
            return Answer(error=ep.redact(f"{type(e).__name__}: {e}")[:300], calls=1)
        if resp.status_code != 200:
            return Answer(error=ep.redact(f"HTTP {resp.status_code}: {resp.text}")[:300], calls=1)
        try:
            first = parse_json(ep.dialect, resp.content)
        except (ProviderError, ResponseParseError) as e:
            return Answer(error=ep.redact(str(e))[:300], calls=1)
        replies, final, expanded, error = [first], first, [], None
        if condition == CONDITIONS[2]:
            done = await continuation.run(
                http, ep.url, headers, ep.dialect, body.decode("utf-8"), first, False, resolve
            )
            replies = done.replies
            final = done.final or first
            for entry in done.log:
                expanded += entry.get("ids", [])
                error = entry.get("error") or error
        answer = Answer(calls=len(replies), expanded=expanded, usage=_usage(ep.dialect, replies))
        if error is not None:
            answer.error = ep.redact(f"expand round: {error}")[:300]
            return answer
        try:
            answer.text = d.answer_text(final.message)
        except ResponseParseError as e:
            answer.error = ep.redact(str(e))[:300]
        return answer
