"""Shared by the real-agent tests (Claude Code, the SDK agent loops): start a proxy with the tap,
drive a scripted session, and check what an agent sent against what the provider got.

    proxy = start_proxy(fake.url, workdir, "summarize", LOW)       # tap.py loaded first
    s = drive_claude(binary, fake, proxy, workdir, 10, env, side)  # Claude Code, audited
    turns = audit(sent, fake, proxy, "anthropic")                  # any agent's requests
    assert_summarized(turns, proxy, head=1); assert_expanded_once(turns, script, proxy)

`sent` is every request the agent put on the wire (from the tap for Claude Code, from an httpx
hook for the SDKs), each tagged with its `x-e2e-id`. For each one `audit` finds what the provider
received under that id and the proxy's decision, and checks:

    passed through   the provider got the agent's bytes (body, method, path, headers but host)
    rewritten        [agent head, one summary message, agent tail], every kept message's bytes
                     as sent, the bytes around `messages` as sent (but the appended expand tool),
                     the summary a user message `=== History Summary ===`…`<<cg:KEY>>`, no
                     system message right before it, and no shape or wire-role problem (by the
                     script's provider-side rules and by cg.wire.shape)
    continued        a second request under the same id is the addon's expand round: the first
                     body's messages, then the model's `context_guru_expand` call and its result

and returns one `Turn` per request, in order, for the test's own assertions.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cg.wire.shape import check_wire_roles, validate_shape
from tests.e2e.claude_code import Run, run_claude
from tests.e2e.harness import (
    Proxy,
    by_id,
    header_pairs,
    low,
    message_sources,
    poll,
    start_summarize,
)
from tests.support.agent_script import EXPAND_TOOL, AgentScript, session, shape_problems
from tests.support.fakeprovider import FakeProvider, Recorded

TAP = Path(__file__).with_name("tap.py")
SECRET = "the secret number is 4711"  # in the file the scripted Read reads
# Triggers low enough for a session's third request to qualify; one summary, reused to the end
# (no roll-forward). keep_first 2 keeps [system, task] on openai; on anthropic the head retreats
# to [task], since the second message calls a tool (or, for Claude Code, is a system message).
LOW = low(min_messages=6, keep_first=2, resummarize_tokens=1_000_000)
HEADER = "=== History Summary ==="
MARKER = re.compile(r"<<cg:([0-9a-f]+)>>")
HOP = {"host", "content-length", "x-e2e-id"}


@dataclass(frozen=True)
class Sent:
    """One request as the agent sent it."""

    eid: str
    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes


@dataclass
class Turn:
    sent: Sent
    got: Recorded  # what the provider received for it
    outcome: str  # the decision record's
    cg: dict[str, Any]
    summary: bytes | None = None  # the spliced summary message's bytes
    key: str | None = None  # its marker
    continuation: Recorded | None = None  # the addon's expand round, if any


def start_proxy(
    upstream: str,
    workdir: Path,
    preset: str,
    summarize: dict[str, Any] | None = None,
    options: Sequence[str] = (),
    **kw: Any,
) -> Proxy:
    """`start_summarize` with the tap loaded first (`workdir/tap.jsonl`): its own SQLite file,
    and `summarize` (if given) as the summarize component's config over the preset."""
    opts = [f"tap_file={workdir / 'tap.jsonl'}", *options]
    return start_summarize(
        upstream, workdir, summarize, preset=preset, options=opts, scripts=[TAP], **kw
    )


def tapped(path: Path) -> list[Sent]:
    """The tap's lines (tests/e2e/tap.py), in the order the requests arrived."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        d = json.loads(line)
        headers = [(k, v) for k, v in d["headers"]]
        out.append(Sent(d["id"], d["method"], d["path"], headers, base64.b64decode(d["body"])))
    return out


def _strip_tool(post: bytes) -> bytes:
    """`post` without the one `context_guru_expand` tool appended to its `tools` array."""
    s = post.decode("utf-8")
    start = s.find('{"type":"function","function":{"name":"' + EXPAND_TOOL + '"')
    if start < 0:
        start = s.find('{"name":"' + EXPAND_TOOL + '"')
    assert start > 0, "no expand tool in the rewritten body"
    _, end = json.JSONDecoder().raw_decode(s, start)
    assert s[start - 1] == ",", "the expand tool is not appended after the agent's tools"
    return (s[: start - 1] + s[end:]).encode("utf-8")


def check_rewrite(sent: bytes, got: bytes, dialect: str) -> tuple[bytes, str]:
    """The rewritten body is the agent's with its middle spliced out for one summary; the
    summary message's bytes and marker key."""
    spre, smsgs, spost = message_sources(sent)
    gpre, gmsgs, gpost = message_sources(got)
    assert gpre == spre, "bytes before `messages` changed"
    if gpost != spost:
        assert _strip_tool(gpost) == spost, "bytes after `messages` changed beyond the expand tool"
    at = [i for i, m in enumerate(gmsgs) if HEADER.encode() in m and m not in smsgs]
    assert len(at) == 1, f"{len(at)} summary messages in a rewritten body"
    head = at[0]
    tail = len(gmsgs) - head - 1
    assert gmsgs[:head] == smsgs[:head], "a head message is not byte-identical"
    assert gmsgs[head + 1 :] == smsgs[len(smsgs) - tail :], "a tail message is not byte-identical"
    assert len(smsgs) - head - tail >= 1, "nothing was summarized"
    summary = json.loads(gmsgs[head])
    assert set(summary) == {"role", "content"} and summary["role"] == "user", summary
    text = summary["content"]
    assert isinstance(text, str) and text.startswith(HEADER + "\n<summary>"), text
    assert EXPAND_TOOL in text
    m = MARKER.search(text)
    assert m is not None, text
    if head > 0:
        before = json.loads(gmsgs[head - 1])
        assert before["role"] not in ("system", "developer"), "the summary follows a system message"
    messages = json.loads(got)["messages"]
    assert shape_problems(dialect, messages) == []
    assert validate_shape(messages, dialect) == []
    assert check_wire_roles(got, dialect) == []
    return gmsgs[head], m.group(1)


def check_continuation(first: Recorded, second: Recorded, dialect: str) -> None:
    """The addon's expand round: the body it sent, plus the model's call and our answer."""
    _, a, _ = message_sources(first.body)
    _, b, _ = message_sources(second.body)
    assert b[: len(a)] == a, "the continuation did not keep the sent messages' bytes"
    added = [json.loads(x) for x in b[len(a) :]]
    assert added[0]["role"] == "assistant"
    if dialect == "anthropic":
        (call,) = [c for c in added[0]["content"] if c["type"] == "tool_use"]
        assert call["name"] == EXPAND_TOOL
        (result,) = added[1]["content"]
        assert result["type"] == "tool_result" and result["tool_use_id"] == call["id"]
    else:
        (call,) = added[0]["tool_calls"]
        assert call["function"]["name"] == EXPAND_TOOL
        assert added[1]["role"] == "tool" and added[1]["tool_call_id"] == call["id"]
    assert shape_problems(dialect, json.loads(second.body)["messages"]) == []


def audit(sent: list[Sent], provider: FakeProvider, proxy: Proxy, dialect: str) -> list[Turn]:
    turns = []
    for s in sent:
        got = provider.wait_for(1, where=by_id(s.eid))
        assert 1 <= len(got) <= 2, f"{len(got)} provider requests for one agent request"
        line = proxy.records.wait(s.eid)
        assert line["status"] == 200, line
        cg = line["cg"]
        assert cg is not None, line
        first = got[0]
        assert (first.method, first.path) == (s.method, s.path)
        assert header_pairs(first.headers, HOP) == header_pairs(s.headers, HOP), (
            "the agent's headers changed",
            header_pairs(first.headers, HOP),
            header_pairs(s.headers, HOP),
        )
        turn = Turn(s, first, cg["outcome"], cg)
        if turn.outcome == "rewritten":
            turn.summary, turn.key = check_rewrite(s.body, first.body, dialect)
        else:
            assert turn.outcome == "passed_through", cg
            assert first.body == s.body, "a passed-through body is not byte-identical"
        if len(got) == 2:
            assert turn.outcome == "rewritten", "an expand round for a turn without a summary"
            turn.continuation = got[1]
            check_continuation(first, got[1], dialect)
        turns.append(turn)
    return turns


def wait_settled(proxy: Proxy, timeout: float = 10.0) -> None:
    """Block until no summary is in flight (every commissioned one completed, failed or timed
    out): a script's gate, so the next turn deterministically sees the newest summary."""
    for _ in poll(timeout):
        c = proxy.stats()["summaries"]
        if c["commissioned"] == c["completed"] + c["failed"] + c["timed_out"]:
            return
    raise TimeoutError(f"a summary was still in flight after {timeout}s")


# -- what a summarized session looks like ----------------------------------------------------------


def summary_index(turn: Turn) -> int:
    _, msgs, _ = message_sources(turn.got.body)
    assert turn.summary is not None
    return msgs.index(turn.summary)


def assert_summarized(turns: list[Turn], proxy: Proxy, head: int) -> list[int]:
    """A summary was commissioned on a turn that went through untouched, spliced on a later
    turn and every turn after it, at `head`, and re-emitted byte-identically (no roll-forward);
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
    assert all(summary_index(turns[i]) == head for i in rewritten)
    stats = proxy.stats()
    assert stats["summaries"]["commissioned"] == stats["summaries"]["completed"] == 1
    assert stats["summaries"]["reused"] == len(rewritten)
    assert (stats["failed_open"], stats["retried_original"]) == (0, 0)
    return rewritten


def assert_expanded_once(turns: list[Turn], script: AgentScript, proxy: Proxy) -> None:
    """The model called context_guru_expand on the first rewritten turn; the proxy answered it
    with the stashed span and re-sent, once; the agent got the answer after it."""
    first = next(i for i, t in enumerate(turns) if t.outcome == "rewritten")
    key = turns[first].key
    assert [i for i, t in enumerate(turns) if t.continuation is not None] == [first]
    assert [a.expand for a in script.answers].count(key) == 1
    (expansion,) = script.expansions
    assert f"<<cg:{key}>> replaced, verbatim" in expansion
    assert "echo step 1" in expansion  # the span's first exchange, restored from the stash
    assert proxy.stats()["expansions"] == 1


# -- Claude Code sessions ------------------------------------------------------------------------


@dataclass
class ClaudeSession:
    run: Run
    script: AgentScript
    sent: list[Sent]
    turns: list[Turn]


def drive_claude(
    claude: Path,
    fake: FakeProvider,
    proxy: Proxy,
    workdir: Path,
    steps: int,
    env: dict[str, str],
    side: set[tuple[str, str]],
    *,
    settle: bool = False,
    **script_kw: Any,
) -> ClaudeSession:
    """One Claude Code session of `steps` scripted steps (two parallel calls at step 3, a Read
    at step 5) through `proxy` (its tap), audited turn by turn. `side`: the (method, path) of
    the requests it makes besides its turns, each of which must pass untouched. `settle`: before
    each step, wait until no summary is in flight (`wait_settled`)."""
    if settle:
        script_kw["before"] = lambda step: wait_settled(proxy)
    work = workdir / "work"
    work.mkdir(parents=True, exist_ok=True)
    (work / "notes.txt").write_text(SECRET + "\n")
    tag = f"CG-{workdir.name}"
    script = AgentScript(
        tag, session(steps, parallel_at=(3,), read_at={5: str(work / "notes.txt")}), **script_kw
    )
    fake.responder = script
    try:
        run = run_claude(claude, f"{tag}: run the scripted steps, one tool call each.", work, env)
    finally:
        fake.responder = None
    result = run.assert_succeeded()
    assert result["result"] == script.final_text
    assert script.refusals == [], script.refusals

    tap = tapped(proxy.records.path.with_name("tap.jsonl"))
    sent = [x for x in tap if x.method == "POST"]
    assert len(sent) == steps + 1, f"Claude Code made {len(sent)} requests for {steps} steps"
    side_requests(tap, fake, proxy, side)
    assert [a.step for a in script.answers if a.expand is None] == list(range(steps + 1))
    # Claude Code really ran every tool the script called, and sent back what they printed.
    outputs = sorted(str(v) for v in script.results.values())
    assert sum(f"step {k}" in outputs for k in range(1, steps + 1)) == steps - 1
    assert "step 3b" in outputs
    assert any(SECRET in o for o in outputs)
    return ClaudeSession(run, script, sent, audit(sent, fake, proxy, "anthropic"))


def side_requests(
    tap: list[Sent], fake: FakeProvider, proxy: Proxy, expected: set[tuple[str, str]]
) -> None:
    """Claude Code's requests that are not turns: not provider requests, so each reaches the
    provider byte-identical and undecided."""
    others = [x for x in tap if x.method != "POST"]
    seen = {(x.method, x.path) for x in others}
    assert seen == expected, seen
    for x in others:
        (got,) = fake.wait_for(1, where=by_id(x.eid))
        assert (got.method, got.path, got.body) == (x.method, x.path, x.body)
        assert header_pairs(got.headers, HOP) == header_pairs(x.headers, HOP)
        assert proxy.records.wait(x.eid)["cg"] is None


def never_saw_expand(s: ClaudeSession) -> None:
    """Claude Code was never offered, shown or asked about context_guru_expand."""
    assert EXPAND_TOOL not in s.run.stdout
    names = {b["name"] for b in s.run.blocks("assistant") if b.get("type") == "tool_use"}
    assert names == {"Bash", "Read"}, names
    for sent in s.sent:
        assert EXPAND_TOOL.encode() not in sent.body
