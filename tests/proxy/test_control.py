"""The control surface (`/_cg/*`): who is answered, what a remote caller may read, ids validated,
the bearer token kept nowhere, and no request that makes the addon open a path.

In-process: the addon under `mitmproxy.test.taddons` on a real SQLite file, control requests as
mitmproxy flows from a loopback or a remote peer.
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mitmproxy import http

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from mitmproxy.test import taddons, tflow, tutils

from cg.proxy.addon import ContextGuru
from cg.state.store import stash_key
from cg.wire.usage import Usage
from tests.proxy.pending import finish

LOCAL = ("127.0.0.1", 50000)
REMOTE = ("203.0.113.7", 50000)
TOKEN = "cg-control-token-3f9a77c1"
A, B = "session-a", "session-b"
SPAN_A = ['{"role":"user","content":"alpha secret"}']
SPAN_B = ['{"role":"user","content":"bravo secret"}']
KEY_A, KEY_B = stash_key(SPAN_A), stash_key(SPAN_B)


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))


@pytest.fixture
async def addon(tmp_path: Path) -> AsyncIterator[tuple[ContextGuru, taddons.context]]:
    """The addon on its own store, holding one stash, one session clock and one booked answer
    (what puts a session in `/_cg/sessions`) for A and for B."""
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        tctx.configure(cg, cg_preset="summarize", cg_db=str(tmp_path / "cg.sqlite3"))
        assert cg.store is not None and cg.store.persistent
        for session, key, span in ((A, KEY_A, SPAN_A), (B, KEY_B, SPAN_B)):
            cg.store.put_stash(key, session, span, "anthropic")
            cg.store.touch_session(session)
            cg.store.record_usage(session, [("agent", "claude-test", "", Usage(1, requests=1))])
        yield cg, tctx


def ask(
    cg: ContextGuru, path: str, peer: tuple[Any, ...] = LOCAL, **headers: str
) -> tuple[http.HTTPFlow, int, Any]:
    req = tutils.treq(method=b"GET", path=path.encode(), host="proxy.test", content=b"")
    for k, v in headers.items():
        req.headers[k.replace("_", "-")] = v
    f = tflow.tflow(req=req)
    f.client_conn.peername = peer
    finish(cg.request(f))
    assert f.response is not None
    body = f.response.content or b""
    if f.response.headers.get("content-type", "").startswith("text/html"):
        return f, f.response.status_code, body.decode()  # the dashboard, /_cg/
    return f, f.response.status_code, json.loads(body) if body else None


def ids(doc: Any) -> set[str]:
    return {row["id"] for row in doc["sessions"]}


# -- who is answered ------------------------------------------------------------------------------


async def test_a_local_caller_reads_every_session_and_every_stash(addon):
    cg, _ = addon
    assert ids(ask(cg, "/_cg/sessions")[2]) == {A, B}
    for key, span in ((KEY_A, SPAN_A), (KEY_B, SPAN_B)):
        _, status, doc = ask(cg, f"/_cg/expand?id={key}")
        assert status == 200 and doc["messages"] == [json.loads(span[0])]


async def test_remote_callers_are_refused_by_default(addon):
    cg, _ = addon
    for path in ("/_cg/health", "/_cg/stats", "/_cg/sessions", f"/_cg/expand?id={KEY_A}"):
        _, status, doc = ask(cg, path, REMOTE, x_context_guru_session=A)
        assert status == 403 and "loopback" in doc["error"]


async def test_a_token_admits_remote_callers_that_present_it_and_no_one_else(addon):
    cg, tctx = addon
    tctx.configure(cg, cg_control_token=TOKEN)
    for given_ in (None, "Bearer wrong", f"Basic {TOKEN}", TOKEN, f"Bearer {TOKEN}x"):
        h = {"authorization": given_} if given_ is not None else {}
        f, status, doc = ask(cg, "/_cg/health", REMOTE, **h)
        assert status == 401, given_
        assert f.response is not None and f.response.headers["www-authenticate"].startswith(
            "Bearer"
        )
        assert TOKEN not in json.dumps(doc)
    f, status, doc = ask(cg, "/_cg/health", REMOTE, authorization=f"Bearer {TOKEN}")
    assert status == 200 and doc["ok"] is True
    assert doc["store"] == {"ok": True}  # a remote caller is not told the store's path
    # cg_control_remote without the token does not open the door once a token is set
    tctx.configure(cg, cg_control_remote=True)
    assert ask(cg, "/_cg/health", REMOTE)[1] == 401


async def test_the_token_is_removed_from_every_control_flow(addon):
    cg, tctx = addon
    tctx.configure(cg, cg_control_token=TOKEN)
    for peer, auth in ((REMOTE, f"Bearer {TOKEN}"), (REMOTE, "Bearer nope"), (LOCAL, TOKEN)):
        f, _, _ = ask(cg, "/_cg/stats", peer, authorization=auth)
        assert "authorization" not in f.request.headers
        assert TOKEN.encode() not in f.request.headers.fields.__repr__().encode()
        assert f.response is not None and TOKEN.encode() not in (f.response.content or b"")


@pytest.mark.parametrize("via", ["token", "remote"])
async def test_a_remote_caller_reads_only_its_own_session(addon, via):
    cg, tctx = addon
    if via == "token":
        tctx.configure(cg, cg_control_token=TOKEN)
        auth = {"authorization": f"Bearer {TOKEN}"}
    else:
        tctx.configure(cg, cg_control_remote=True)
        auth = {}
    # the guard: both sessions exist, and a local caller sees both
    assert ids(ask(cg, "/_cg/sessions")[2]) == {A, B}
    _, status, doc = ask(cg, "/_cg/sessions", REMOTE, x_context_guru_session=A, **auth)
    assert status == 200 and ids(doc) == {A}
    _, status, doc = ask(cg, "/_cg/sessions", REMOTE, x_claude_code_session_id=B, **auth)
    assert status == 200 and ids(doc) == {B}
    _, status, doc = ask(cg, f"/_cg/expand?id={KEY_A}", REMOTE, x_context_guru_session=A, **auth)
    assert status == 200 and doc["session"] == A
    # B's stash, asked by A: unknown, exactly as an id that never existed
    _, status, doc = ask(cg, f"/_cg/expand?id={KEY_B}", REMOTE, x_context_guru_session=A, **auth)
    assert status == 404 and "bravo" not in json.dumps(doc)
    nowhere = "0" * 24
    _, status2, doc2 = ask(
        cg, f"/_cg/expand?id={nowhere}", REMOTE, x_context_guru_session=A, **auth
    )
    assert status2 == 404 and doc2["error"].replace(nowhere, KEY_B) == doc["error"]
    # no session named (or one that is not allow-listed): nothing to read
    for h in ({}, {"x_context_guru_session": "../../etc"}, {"x_context_guru_session": ""}):
        for path in ("/_cg/sessions", f"/_cg/expand?id={KEY_A}"):
            _, status, doc = ask(cg, path, REMOTE, **h, **auth)
            assert status == 400 and "x-context-guru-session" in doc["error"]


@pytest.mark.parametrize(
    "key",
    [
        "",
        "nothex",
        "A" * 24,
        "0" * 23,
        "0" * 25,
        "../" * 8,
        "%2e%2e%2f",
        "0" * 24 + "%0A",
        "x" * 5000,
    ],
)
async def test_malformed_ids_are_refused_and_not_echoed_at_length(addon, key):
    cg, _ = addon
    _, status, doc = ask(cg, f"/_cg/expand?id={key}")
    assert status == 400 and "not a context-guru id" in doc["error"]
    assert len(doc["error"]) < 200


# -- no path a request chose ----------------------------------------------------------------------

_OPENS: list[tuple[str, Any]] = []
_WATCH = False
_EVENTS = (
    "open",
    "os.listdir",
    "os.scandir",
    "shutil.",
    "sqlite3.connect",
    "os.remove",
    "os.rename",
)


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _WATCH and event.startswith(_EVENTS):
        _OPENS.append((event, args))


sys.addaudithook(_audit)  # audit hooks cannot be removed: this one records only while _WATCH

HOSTILE_PATHS = st.sampled_from(
    [
        "/_cg/../../../../etc/passwd",
        "/_cg/%2e%2e/%2e%2e/etc/passwd",
        "/_cg/expand/../../../tmp/x",
        "/_cg//etc/passwd",
        "/_cg/expand?id=/etc/passwd",
        "/_cg/expand?id=..%2F..%2Fcg.sqlite3",
        "/_cg/sessions?db=/tmp/other.sqlite3",
        "/_cg/stats?cg_db=/tmp/x",
        "/_cg/health?config=/etc/shadow",
        "/_cg/expand?id=file:///etc/passwd",
    ]
)


async def test_no_control_request_makes_the_addon_open_a_path(addon):
    cg, tctx = addon
    tctx.configure(cg, cg_control_remote=True)

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        path=st.one_of(
            HOSTILE_PATHS,
            st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=60).map(
                lambda s: "/_cg/" + s
            ),
        ),
        session=st.one_of(
            st.none(), st.sampled_from(["../x", "/etc/passwd", A]), st.text(max_size=20)
        ),
        remote=st.booleans(),
    )
    def one(path: str, session: str | None, remote: bool) -> None:
        global _WATCH
        headers = {}
        if session is not None and session.isprintable() and session.isascii():
            headers["x_context_guru_session"] = session
        _OPENS.clear()
        _WATCH = True
        try:
            _, status, _ = ask(cg, path, REMOTE if remote else LOCAL, **headers)
        finally:
            _WATCH = False
        assert status in (200, 400, 404, 405)
        assert _OPENS == [], f"{path!r} opened {_OPENS}"

    one()


def test_the_audit_guard_sees_an_open():
    """Vacuity guard: the hook does record an open while watching."""
    global _WATCH
    _OPENS.clear()
    _WATCH = True
    try:
        with open(__file__, "rb"):
            pass
    finally:
        _WATCH = False
    assert any(e == "open" for e, _ in _OPENS)
