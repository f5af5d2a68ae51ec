"""Raw HTTP through a real `mitmdump -s cg_addon.py` (`off` preset): nothing changes on the way.

Real captured bodies, bad input (docs/behaviour.md#errors-and-bad-input), huge bodies, control
endpoints, non-provider paths and the bypass header. Every test first proves the provider (or the
addon) actually answered.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.harness import (
    Capture,
    Proxy,
    assert_forwarded_unchanged,
    by_id,
    new_id,
    received,
)
from tests.support.fakeprovider import DEFAULT_TEXT, FakeProvider, Recorded

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).parent.parent / "fixtures"
ANTHROPIC = "/v1/messages"
OPENAI = "/v1/chat/completions"
GOOD = b'{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}'
MB = 1024 * 1024


def send(
    proxy: Proxy,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    method: str = "POST",
) -> tuple[str, httpx.Request, httpx.Response]:
    """Send one request through the proxy, tagged with a fresh `x-e2e-id`."""
    eid, capture = new_id(), Capture()
    with proxy.client(event_hooks=capture.hooks()) as c:
        r = c.request(method, path, content=body, headers={**(headers or {}), "x-e2e-id": eid})
    return eid, capture.only(), r


def passed(
    proxy: Proxy, provider: FakeProvider, eid: str, sent: httpx.Request
) -> tuple[Recorded, dict[str, Any]]:
    """The provider got exactly what was sent; return it and the flow's decision record."""
    got = received(provider, eid)
    assert_forwarded_unchanged(sent, got)
    return got, proxy.records.cg(eid)


def assert_still_serving(proxy: Proxy, provider: FakeProvider) -> None:
    eid, sent, r = send(proxy, ANTHROPIC, GOOD)
    assert r.status_code == 200
    assert r.json()["content"][0]["text"] == DEFAULT_TEXT
    _, cg = passed(proxy, provider, eid, sent)
    assert cg["outcome"] == "passed_through"


# -- real captured requests ------------------------------------------------------------------


def test_claude_code_turn16_replay_is_byte_identical(proxy, provider):
    meta = json.loads((FIXTURES / "claude_code_2.1.197_turn16.headers.json").read_text())
    body = (FIXTURES / "claude_code_2.1.197_turn16.json").read_bytes()
    drop = {"host", "content-length", "accept-encoding"}
    headers = {k: v for k, v in meta["headers"] if k.lower() not in drop}
    assert meta["path"] == "/v1/messages?beta=true"
    eid, sent, r = send(proxy, meta["path"], body, headers)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")  # the body asks to stream
    assert "message_stop" in r.text
    got, cg = passed(proxy, provider, eid, sent)
    assert got.body == body
    assert got.header("x-claude-code-session-id") == "f8e1c462-b91a-42bd-a7aa-b16df1f9a2c3"
    assert cg["dialect"] == "anthropic"
    assert cg["outcome"] == "passed_through"
    assert cg["messages_in"] == 34


def test_claude_code_tool_use_fixture_with_odd_whitespace_is_byte_identical(proxy, provider):
    fixture = json.loads((FIXTURES / "claude_code_anthropic_tool_use.json").read_text())
    text = json.dumps(fixture["body"], indent="\t", separators=(" ,", " :  "), ensure_ascii=True)
    body = ("\r\n \n" + text + "\n\t ").encode()
    eid, sent, r = send(proxy, ANTHROPIC, body, {"content-type": "application/json"})
    assert r.status_code == 200
    assert r.json()["content"][0]["text"] == DEFAULT_TEXT
    got, cg = passed(proxy, provider, eid, sent)
    assert got.body == body
    assert cg["dialect"] == "anthropic"
    assert cg["outcome"] == "passed_through"
    assert cg["messages_in"] == len(fixture["body"]["messages"])


# -- bad input (docs/behaviour.md#errors-and-bad-input): forwarded unchanged, and the record says
# why ---

BAD_BODIES = [
    ("invalid-json", b'{"model":"m","messages":[{"role":"user","content":"hi"}', "malformed JSON"),
    ("json-array", b'[{"role":"user","content":"hi"}]', "not a JSON object"),
    ("json-string", b'"messages"', "not a JSON object"),
    ("messages-object", b'{"model":"m","messages":{"role":"user"}}', "not an array"),
    ("messages-null", b'{"model":"m","messages":null}', "not an array"),
    ("element-number", b'{"model":"m","messages":[1]}', "messages[0] is not an object (got int)"),
    (
        "element-list",
        b'{"messages":[{"role":"user","content":"a"},["x"]]}',
        "messages[1] is not an object",
    ),
    ("role-missing", b'{"messages":[{"content":"hi"}]}', "no string 'role'"),
    ("non-utf8", b'{"model":"m","messages":[{"role":"user","content":"caf\xe9"}]}', "not UTF-8"),
    ("empty", b"", "empty body"),
    ("bom", b'\xef\xbb\xbf{"messages":[]}', "byte-order mark"),
    ("duplicate-key", b'{"messages":[],"messages":[]}', "duplicate top-level key"),
    ("no-messages", b'{"model":"m","prompt":"hi"}', "no 'messages' field"),
]


@pytest.mark.parametrize("path", [ANTHROPIC, OPENAI], ids=["anthropic", "openai"])
@pytest.mark.parametrize(
    ("body", "reason"), [c[1:] for c in BAD_BODIES], ids=[c[0] for c in BAD_BODIES]
)
def test_bad_body_reaches_provider_unchanged_with_reason(proxy, provider, path, body, reason):
    eid, sent, r = send(proxy, path, body, {"content-type": "application/json"})
    got, cg = passed(proxy, provider, eid, sent)
    assert got.body == body
    assert cg["outcome"] == "passed_through"
    assert reason in cg["reason"]
    assert r.status_code in (200, 400)  # whatever the provider said, passed back
    assert_still_serving(proxy, provider)


def test_anthropic_unknown_role_passes_through_with_reason(proxy, provider):
    body = b'{"model":"m","messages":[{"role":"user","content":"a"},{"role":"tool","content":"b"}]}'
    eid, sent, _ = send(proxy, ANTHROPIC, body)
    got, cg = passed(proxy, provider, eid, sent)
    assert got.body == body
    assert cg["outcome"] == "passed_through"
    assert "unknown role 'tool'" in cg["reason"]


def test_gzip_body_reaches_provider_as_the_same_gzip_bytes(proxy, provider):
    plain = b'{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"zipped"}]}'
    body = gzip.compress(plain, mtime=0)
    headers = {"content-type": "application/json", "content-encoding": "gzip"}
    eid, sent, r = send(proxy, ANTHROPIC, body, headers)
    assert r.status_code == 200
    got, cg = passed(proxy, provider, eid, sent)
    assert got.body == body
    assert got.decoded == plain
    assert got.header("content-encoding") == "gzip"
    assert cg["outcome"] == "passed_through"
    assert cg["messages_in"] == 1  # the addon read the decoded body


def test_undecodable_gzip_body_passes_through_with_reason(proxy, provider):
    body = b"this is not gzip at all"
    eid, sent, _ = send(proxy, ANTHROPIC, body, {"content-encoding": "gzip"})
    got, cg = passed(proxy, provider, eid, sent)
    assert got.body == body
    assert cg["outcome"] == "passed_through"
    assert "cannot decode body" in cg["reason"]
    assert_still_serving(proxy, provider)


def _big_body(size: int) -> bytes:
    head = b'{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"'
    tail = b'"},{"role":"assistant","content":"ok"},{"role":"user","content":"go on"}]}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


def test_5mb_body_is_indexed_and_forwarded_byte_identical(proxy, provider):
    body = _big_body(5 * MB)
    eid, sent, r = send(proxy, ANTHROPIC, body, {"content-type": "application/json"})
    assert r.status_code == 200
    got, cg = passed(proxy, provider, eid, sent)
    assert got.body == body
    assert cg["outcome"] == "passed_through"
    assert cg["reason"] == "no components in the pipeline"
    assert cg["messages_in"] == 3


def test_50mb_body_over_the_cap_is_forwarded_unparsed(proxy, provider):
    body = _big_body(50 * MB)
    eid, sent, r = send(proxy, ANTHROPIC, body, {"content-type": "application/json"})
    assert r.status_code == 200
    got, cg = passed(proxy, provider, eid, sent)
    assert got.body == body
    assert cg["outcome"] == "passed_through"
    assert "over cg_max_body_mb" in cg["reason"]
    assert "messages_in" not in cg  # never parsed
    assert_still_serving(proxy, provider)


# -- control endpoints -----------------------------------------------------------------------


def _answered_by_addon(proxy: Proxy, provider: FakeProvider, eid: str) -> dict[str, Any]:
    line = proxy.records.wait(eid)  # the flow finished...
    assert not [r for r in provider.requests if by_id(eid)(r)]  # ...without reaching the provider
    assert line["cg"] is None
    return line


def test_health_is_answered_by_the_addon_and_never_forwarded(proxy, provider):
    eid, _, r = send(proxy, "/_cg/health", method="GET")
    assert r.status_code == 200
    assert r.json()["ok"] is True
    assert r.json()["preset"] == "off"
    _answered_by_addon(proxy, provider, eid)


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("POST", "/_cg/health", 405), ("GET", "/_cg/nope", 404), ("GET", "/_cg/stats?x=1", 200)],
)
def test_control_paths_never_reach_the_provider(proxy, provider, method, path, status):
    eid, _, r = send(proxy, path, b"{}" if method == "POST" else None, method=method)
    assert r.status_code == status
    assert r.headers["content-type"] == "application/json"
    r.json()
    _answered_by_addon(proxy, provider, eid)


def test_stats_count_provider_requests_by_outcome(proxy, provider):
    with proxy.client() as c:
        before = c.get("/_cg/stats").json()
    for key in ("requests", "rewritten", "passed_through", "failed_open", "retried_original"):
        assert isinstance(before[key], int), key
    for key in ("tokens_before", "tokens_after"):
        assert isinstance(before[key], int), key
    assert set(before["summaries"]) >= {
        "commissioned",
        "completed",
        "failed",
        "timed_out",
        "reused",
    }

    for path, body, headers in [
        (ANTHROPIC, GOOD, {}),
        (OPENAI, b"[]", {}),
        (ANTHROPIC, GOOD, {"x-context-guru-bypass": "1"}),
        ("/v1/messages/count_tokens", GOOD, {}),  # not a provider route: not counted
    ]:
        eid, sent, _ = send(proxy, path, body, headers)
        assert_forwarded_unchanged(sent, received(provider, eid))
    with proxy.client() as c:
        after = c.get("/_cg/stats").json()
    delta = {k: after[k] - before[k] for k in ("requests", "passed_through", "bypassed")}
    assert delta == {"requests": 3, "passed_through": 2, "bypassed": 1}
    assert after["rewritten"] == before["rewritten"]
    assert after["failed_open"] == before["failed_open"]


# -- non-provider traffic and the bypass header ----------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/models", None),
        ("GET", "/v1/messages", None),
        ("POST", "/v1/messages/count_tokens", GOOD),
        ("POST", "/v1/messages/batches", b'{"requests":[]}'),
        ("POST", "/v1/completions", b'{"model":"m","prompt":"hi"}'),
        ("PUT", "/v1/chat/completions", GOOD),
        ("POST", "/some/other/api?q=1", b"\x00\xff binary \xfe"),
    ],
)
def test_non_provider_traffic_is_untouched_and_undecided(proxy, provider, method, path, body):
    eid, sent, r = send(proxy, path, body, method=method)
    assert_forwarded_unchanged(sent, received(provider, eid))
    line = proxy.records.wait(eid)
    assert line["cg"] is None
    assert line["status"] == r.status_code
    if method == "GET":
        assert r.json() == {"echo": True, "path": path}


def test_bypass_header_forwards_unchanged_with_outcome_bypassed(proxy, provider):
    body = b'{"model":"m","messages":[{"role":"user","content":"skip me"}],"stream":false}'
    eid, sent, r = send(proxy, OPENAI, body, {"x-context-guru-bypass": "1"})
    assert r.json()["choices"][0]["message"]["content"] == DEFAULT_TEXT
    got, cg = passed(proxy, provider, eid, sent)
    assert got.header("x-context-guru-bypass") == "1"
    assert cg["dialect"] == "openai"
    assert cg["outcome"] == "bypassed"
    assert "x-context-guru-bypass" in cg["reason"]
