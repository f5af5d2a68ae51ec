"""Codex sessions through a proxy with the tap, audited request by request (the Responses-API
counterpart of tests/e2e/agents.py).

    proxy = start_proxy(fake.url, workdir, "summarize", LOW)        # tap.py loaded first
    s = drive_codex(codex, fake, proxy, workdir, 10)                # Codex, audited
    assert_codex_summarized(s.turns, proxy); assert_codex_expanded_once(s, proxy)

For each request Codex put on the wire (the tap's record, tagged `x-e2e-id`) `audit` finds what
the provider received under that id and the proxy's decision, and checks:

    passed through   the provider got Codex's bytes (body, method, path, headers but host)
    rewritten        `input` is [Codex's head, one summary item, Codex's tail], every kept item's
                     bytes as sent, every byte outside `input` and `tools` as sent, `tools` as
                     sent plus (only) the appended `context_guru_expand` function tool; the
                     summary a user message `=== History Summary ===`…`<<cg:KEY>>`; nothing
                     the API refuses (tests/support/responses_api.py)
    continued        a second request under the same id is the addon's expand round: the first
                     body's input, then the model's items with its `context_guru_expand` call,
                     then that call's output

The byte-level readers here are written apart from `cg/` (with `json.JSONDecoder.raw_decode`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cg.settings import preset_names
from cg.wire.dialects import route
from tests.e2e.agents import Sent, tapped, wait_settled
from tests.e2e.codex import Run, run_codex
from tests.e2e.harness import Proxy, by_id, header_pairs
from tests.support import responses_api as api
from tests.support.codex_script import EXPAND_TOOL, CodexScript, Step, is_compaction, session
from tests.support.fakeprovider import FakeProvider, Recorded
from tests.support.signin import CHATGPT_PATH, ChatGPTAccount

# The tests that need the proxy to speak Responses (the `responses` dialect: decision records,
# summarizing, expanding, the ledger) or the `codex` preset. Until those are built the proxy
# passes `/v1/responses` through undecided, and these are skipped, saying so.
NEEDS_RESPONSES = pytest.mark.skipif(
    route("POST", "/v1/responses") is None,
    reason="needs the `responses` dialect: the proxy does not decide on /v1/responses yet",
)
NEEDS_CODEX_PRESET = pytest.mark.skipif(
    "codex" not in preset_names(), reason="needs the `codex` preset (cg/presets/codex.yaml)"
)
HEADER = "=== History Summary ==="
MARKER = re.compile(r"<<cg:([0-9a-f]+)>>")
HOP = {"host", "content-length", "x-e2e-id"}
RESPONSES = "/v1/responses"
CHATGPT_RESPONSES = CHATGPT_PATH  # Codex signed in with ChatGPT


# -- an independent reader of a body's top-level values --------------------------------------------


def _ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in " \t\r\n":
        i += 1
    return i


def top_level(body: bytes) -> dict[str, tuple[int, int]]:
    """Each top-level key's value as (start, end) character offsets into the decoded body."""
    s = body.decode("utf-8")
    dec = json.JSONDecoder()
    i = _ws(s, 0)
    assert s[i] == "{", "the body is not a JSON object"
    i += 1
    out: dict[str, tuple[int, int]] = {}
    while True:
        i = _ws(s, i)
        if s[i] == "}":
            return out
        key, i = dec.raw_decode(s, i)
        i = _ws(s, i)
        assert s[i] == ":"
        i = _ws(s, i + 1)
        _, j = dec.raw_decode(s, i)
        out[key] = (i, j)
        i = _ws(s, j)
        if s[i] == ",":
            i += 1


def elements(body: bytes, key: str) -> list[bytes]:
    """The bytes of each element of the top-level array `key`."""
    s = body.decode("utf-8")
    start, end = top_level(body)[key]
    assert s[start] == "[", f"{key} is not an array"
    dec = json.JSONDecoder()
    out: list[bytes] = []
    i = start + 1
    while True:
        i = _ws(s, i)
        if s[i] == "]":
            assert i == end - 1
            return out
        _, j = dec.raw_decode(s, i)
        out.append(s[i:j].encode("utf-8"))
        i = _ws(s, j)
        if s[i] == ",":
            i += 1


def outside(body: bytes, *keys: str) -> bytes:
    """The body with the values of `keys` cut out (their keys kept): what must not change."""
    s = body.decode("utf-8")
    spans = sorted(v for k, v in top_level(body).items() if k in keys)
    parts, at = [], 0
    for start, end in spans:
        parts.append(s[at:start])
        at = end
    parts.append(s[at:])
    return "\x00".join(parts).encode("utf-8")


def text_of(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "".join(
        str(c.get("text", "")) for c in content or [] if isinstance(c, dict) and "text" in c
    )


# -- the audit -------------------------------------------------------------------------------


@dataclass
class CodexTurn:
    sent: Sent
    got: Recorded  # what the provider received for it
    outcome: str  # the decision record's
    cg: dict[str, Any]
    compaction: bool = False  # Codex's own compaction request
    summary: bytes | None = None  # the spliced summary item's bytes
    key: str | None = None  # its marker
    continuation: Recorded | None = None  # the addon's expand round, if any


def check_rewrite(sent: bytes, got: bytes) -> tuple[bytes, str]:
    """The rewritten body is Codex's with the middle of its `input` spliced out for one summary
    item; the summary's bytes and marker key."""
    assert outside(got, "input", "tools") == outside(sent, "input", "tools"), (
        "bytes outside `input` and `tools` changed"
    )
    stools, gtools = elements(sent, "tools"), elements(got, "tools")
    assert gtools[: len(stools)] == stools, "Codex's tools changed"
    extra = [json.loads(t) for t in gtools[len(stools) :]]
    assert len(extra) <= 1, "more than one tool appended"
    if extra:
        assert extra[0]["type"] == "function" and extra[0]["name"] == EXPAND_TOOL, extra
    sitems, gitems = elements(sent, "input"), elements(got, "input")
    at = [i for i, x in enumerate(gitems) if HEADER.encode() in x and x not in sitems]
    assert len(at) == 1, f"{len(at)} summary items in a rewritten body"
    head = at[0]
    tail = len(gitems) - head - 1
    assert gitems[:head] == sitems[:head], "a head item is not byte-identical"
    assert gitems[head + 1 :] == sitems[len(sitems) - tail :], "a tail item is not byte-identical"
    assert len(sitems) - head - tail >= 1, "nothing was summarized"
    summary = json.loads(gitems[head])
    assert summary.get("type", "message") == "message" and summary["role"] == "user", summary
    text = text_of(summary)
    assert text.startswith(HEADER), text
    m = MARKER.search(text)
    assert m is not None, text
    assert api.input_problems(json.loads(got)["input"]) == []
    return gitems[head], m.group(1)


def check_continuation(first: Recorded, second: Recorded) -> None:
    """The addon's expand round: the input it sent, the model's items, the call's output."""
    a, b = elements(first.body, "input"), elements(second.body, "input")
    assert b[: len(a)] == a, "the continuation did not keep the sent items' bytes"
    added = [json.loads(x) for x in b[len(a) :]]
    (call,) = [x for x in added if x.get("type") == "function_call"]
    assert call["name"] == EXPAND_TOOL
    assert added[-1]["type"] == "function_call_output" and added[-1]["call_id"] == call["call_id"]
    assert api.input_problems(json.loads(second.body)["input"]) == []


def audit(sent: list[Sent], provider: FakeProvider, proxy: Proxy) -> list[CodexTurn]:
    turns = []
    for s in sent:
        got = provider.wait_for(1, where=by_id(s.eid))
        assert 1 <= len(got) <= 2, f"{len(got)} provider requests for one Codex request"
        line = proxy.records.wait(s.eid)
        assert line["status"] == 200, line
        cg = line["cg"]
        assert cg is not None, f"no decision record for a Codex request: {line}"
        first = got[0]
        assert (first.method, first.path) == (s.method, s.path)
        assert header_pairs(first.headers, HOP) == header_pairs(s.headers, HOP), (
            "Codex's headers changed"
        )
        turn = CodexTurn(s, first, cg["outcome"], cg, is_compaction(first, json.loads(s.body)))
        if turn.outcome == "rewritten":
            turn.summary, turn.key = check_rewrite(s.body, first.body)
        else:
            assert turn.outcome == "passed_through", cg
            assert first.body == s.body, "a passed-through body is not byte-identical"
        if len(got) == 2:
            assert turn.outcome == "rewritten", "an expand round for a turn without a summary"
            turn.continuation = got[1]
            check_continuation(first, got[1])
        turns.append(turn)
    return turns


# -- driving Codex -------------------------------------------------------------------------------


@dataclass
class CodexSession:
    run: Run
    script: CodexScript
    sent: list[Sent]  # Codex's requests to the provider, as it sent them
    turns: list[CodexTurn]


def codex_steps(n: int) -> list[Step]:
    """n steps of `echo step K`: two parallel calls at step 3, preambles at steps 2 and 7."""
    return session(n, parallel_at=(3,), preamble_at=(2, 7))


def drive_codex(
    codex: Path,
    fake: FakeProvider,
    proxy: Proxy,
    workdir: Path,
    script: CodexScript,
    *,
    prompt: str | None = None,
    resume: bool = False,
    config: dict[str, Any] | None = None,
    settle: bool = False,
    timeout: float = 60.0,
    base_url: str | None = None,
    env: dict[str, str] | None = None,
    chatgpt: ChatGPTAccount | None = None,
) -> CodexSession:
    """One `codex exec` run (or `exec resume --last`) of `script` through `proxy` (its tap; by
    default in reverse mode: the provider's `base_url` is the proxy's; a regular proxy passes
    the real `base_url` and `env` with HTTPS_PROXY and the CA), audited request by request.
    Codex must finish without an error and the script must have refused nothing. `settle`:
    before each step, wait until no summary is in flight (`wait_settled`); the script's
    `before` is replaced either way. `chatgpt`: Codex signed in with that account, its turns on
    `…/backend-api/codex/responses` (its account checks and model list, GETs beside them)."""
    # Bound to this proxy (a script may drive several runs, through several proxies).
    script.before = (lambda step: wait_settled(proxy)) if settle else None
    tap = proxy.records.path.with_name("tap.jsonl")
    seen = len(tapped(tap)) if tap.exists() else 0
    fake.responder = script
    try:
        run = run_codex(
            codex,
            prompt or f"{script.tag}: run the scripted steps, one command each.",
            workdir,
            base_url or proxy.url + ("/backend-api/codex" if chatgpt else "/v1"),
            config=config,
            env=env,
            resume=resume,
            timeout=timeout,
            chatgpt=chatgpt,
        )
    finally:
        fake.responder = None
    run.assert_succeeded()
    assert script.refusals == [], script.refusals
    sent = [x for x in tapped(tap)[seen:] if x.method == "POST"]
    route = CHATGPT_RESPONSES if chatgpt else RESPONSES
    others = {x.path for x in tapped(tap)[seen:] if chatgpt is None or x.method == "POST"}
    assert others == {route}, "Codex made other requests"
    return CodexSession(run, script, sent, audit(sent, fake, proxy))


# -- what a summarized Codex session looks like ----------------------------------------------------


def summary_index(turn: CodexTurn) -> int:
    assert turn.summary is not None
    return elements(turn.got.body, "input").index(turn.summary)


def assert_codex_summarized(turns: list[CodexTurn], proxy: Proxy) -> list[int]:
    """A summary was commissioned on a turn that went through untouched, spliced on a later turn
    and every turn after it at the same place, re-emitted byte-identically (no roll-forward);
    nothing failed open or was retried. The rewritten turns' indices."""
    comps = [(t.cg.get("components") or [{}])[0] for t in turns]
    commissioned = [i for i, c in enumerate(comps) if c.get("commission") == "trigger fired"]
    rewritten = [i for i, t in enumerate(turns) if t.outcome == "rewritten"]
    assert commissioned, "no turn commissioned a summary"
    assert rewritten, "no turn was rewritten"
    assert turns[commissioned[0]].outcome == "passed_through", "the qualifying turn was held"
    assert rewritten[0] > commissioned[0], "the summary was not spliced on a later turn"
    assert rewritten == list(range(rewritten[0], len(turns))), "a later turn was not rewritten"
    assert len(rewritten) >= 3, rewritten
    assert len({turns[i].summary for i in rewritten}) == 1, "the summary bytes changed"
    assert len({turns[i].key for i in rewritten}) == 1
    assert len({summary_index(turns[i]) for i in rewritten}) == 1, "the summary moved"
    stats = proxy.stats()
    assert stats["summaries"]["completed"] >= 1
    assert (stats["failed_open"], stats["retried_original"]) == (0, 0)
    return rewritten


def assert_codex_expanded_once(s: CodexSession, proxy: Proxy) -> None:
    """The model called context_guru_expand on the first rewritten turn; the proxy answered it
    with the stashed span and re-sent, once; Codex got the step's answer after it and never
    saw the tool."""
    turns = s.turns
    first = next(i for i, t in enumerate(turns) if t.outcome == "rewritten")
    key = turns[first].key
    assert [i for i, t in enumerate(turns) if t.continuation is not None] == [first]
    assert [a.expand for a in s.script.answers].count(key) == 1
    (expansion,) = s.script.expansions
    assert f"<<cg:{key}>>" in expansion
    assert "echo step 1" in expansion  # the span's first exchange, restored from the stash
    assert proxy.stats()["expansions"] == 1
    never_saw_expand(s)


def never_saw_expand(s: CodexSession) -> None:
    """Codex was never offered, shown or asked about context_guru_expand."""
    assert EXPAND_TOOL not in s.run.stdout
    for x in s.sent:
        assert EXPAND_TOOL.encode() not in x.body
    commands = [i.get("command", "") for i in s.run.items("command_execution")]
    assert all("echo step" in c for c in commands), commands
