"""The control surface (`/_cg/*`): which Host and Origin are answered, the token every caller
needs once set (Bearer or Basic), what a remote caller may read, ids validated, the token kept
nowhere, and no request that makes the addon open a path.

In-process: the addon under `mitmproxy.test.taddons` on a real SQLite file, control requests as
mitmproxy flows from a loopback or a remote peer, sent to `Host: 127.0.0.1:8080` unless a test
names another.
"""

from __future__ import annotations

import base64
import json
import sys
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mitmproxy import exceptions, http
from mitmproxy.proxy.mode_specs import ProxyMode

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from mitmproxy.test import taddons, tflow, tutils

from cg.proxy import control
from cg.proxy.addon import ContextGuru
from cg.proxy.environ import CONTROL_TOKEN_ENV
from cg.state.records import stash_key
from cg.wire.usage import Usage
from tests.proxy.pending import finish

LOCAL = ("127.0.0.1", 50000)
HOST = "127.0.0.1:8080"  # what a client of a proxy on 127.0.0.1:8080 sends
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


def control_flow(path: str, peer: tuple[Any, ...] = LOCAL, **headers: str) -> http.HTTPFlow:
    """A GET of `path` from `peer` with `headers` (`host` is HOST unless given)."""
    req = tutils.treq(method=b"GET", path=path.encode(), host="proxy.test", content=b"")
    for k, v in {"host": HOST, **headers}.items():
        req.headers[k.replace("_", "-")] = v
    f = tflow.tflow(req=req)
    f.client_conn.peername = peer
    return f


def http2(f: http.HTTPFlow) -> http.HTTPFlow:
    """`f` in HTTP/2: its Host is the `:authority`, and no `host` header."""
    f.request.http_version = "HTTP/2.0"
    f.request.authority = f.request.headers.pop("host")
    return f


def no_host(f: http.HTTPFlow) -> http.HTTPFlow:
    del f.request.headers["host"]
    return f


def ask(
    cg: ContextGuru, path: str, peer: tuple[Any, ...] = LOCAL, **headers: str
) -> tuple[http.HTTPFlow, int, Any]:
    return answer(cg, control_flow(path, peer, **headers))


def answer(cg: ContextGuru, f: http.HTTPFlow) -> tuple[http.HTTPFlow, int, Any]:
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
    # a token does not open it to a Host that is not ours either
    auth = {"authorization": f"Bearer {TOKEN}"}
    assert ask(cg, "/_cg/health", REMOTE, host="rebind.attacker.example", **auth)[1] == 421


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
    assert ids(ask(cg, "/_cg/sessions", LOCAL, **auth)[2]) == {A, B}
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
    # One message, `KEY#N`: A's own; B's, in range or not, exactly as one that never existed.
    _, status, doc = ask(
        cg, f"/_cg/expand?id={KEY_A}%231", REMOTE, x_context_guru_session=A, **auth
    )
    assert status == 200 and doc["source"] == SPAN_A[0]
    for n in ("1", "0", "2"):
        _, status, doc = ask(
            cg, f"/_cg/expand?id={KEY_B}%23{n}", REMOTE, x_context_guru_session=A, **auth
        )
        _, status2, doc2 = ask(
            cg, f"/_cg/expand?id={nowhere}%23{n}", REMOTE, x_context_guru_session=A, **auth
        )
        assert status == status2 == 404 and "bravo" not in json.dumps(doc)
        assert doc2["error"].replace(nowhere, KEY_B) == doc["error"], n
        assert "holds" not in doc["error"]
    # no session named (or one that is not allow-listed): nothing to read
    for h in ({}, {"x_context_guru_session": "../../etc"}, {"x_context_guru_session": ""}):
        for path in ("/_cg/sessions", f"/_cg/expand?id={KEY_A}", f"/_cg/expand?id={KEY_A}%231"):
            _, status, doc = ask(cg, path, REMOTE, **h, **auth)
            assert status == 400 and "x-context-guru-session" in doc["error"]


# -- which Host and Origin are answered --------------------------------------------------------

OURS = [
    "127.0.0.1",
    "127.0.0.1:8080",
    "127.8.9.10:1",
    "[::1]",
    "[::1]:8080",
    "[::ffff:127.0.0.1]:8080",
    "localhost",
    "LOCALHOST:8080",
    "localhost.:8080",
    "context-guru.test",
    "Context-Guru.Test:80",
]
NOT_OURS = [
    "rebind.attacker.example",
    "rebind.attacker.example:8080",
    "anything",
    "0.0.0.0:8080",
    "[::]:8080",
    "10.0.0.1:8080",
    "127.0.0.1.attacker.example",
    "localhost.attacker.example",
    "context-guru.test.attacker.example",
    "evil.localhost",
    "[::1",
    "[::1]x",
    "localhost:http",
    "127.0.0.1:80:80",
    ":8080",
]


def refused(status: int, doc: Any) -> bool:
    """A refusal that reads nothing: no session, no stash, no store."""
    text = json.dumps(doc)
    return status >= 400 and "alpha" not in text and "sessions" not in doc and "store" not in doc


@pytest.mark.parametrize("host", OURS)
@pytest.mark.parametrize("h2", [False, True], ids=["host", "authority"])
async def test_a_loopback_host_localhost_or_the_default_name_is_answered(addon, host, h2):
    cg, _ = addon
    f = control_flow("/_cg/sessions", host=host)
    _, status, doc = answer(cg, http2(f) if h2 else f)
    assert status == 200 and ids(doc) == {A, B}


@pytest.mark.parametrize("host", NOT_OURS)
@pytest.mark.parametrize("h2", [False, True], ids=["host", "authority"])
async def test_any_other_host_is_refused_and_reads_nothing(addon, host, h2):
    cg, tctx = addon
    tctx.configure(cg, cg_control_remote=True)  # the peer rule would let anyone in
    for peer in (LOCAL, REMOTE):
        for path in ("/_cg/sessions", f"/_cg/expand?id={KEY_A}", "/_cg/", "/_cg/health"):
            f = control_flow(path, peer, host=host, x_context_guru_session=A)
            f, status, doc = answer(cg, http2(f) if h2 else f)
            assert status == 421 and refused(status, doc), (path, doc)
            assert "cg_control_hosts" in doc["error"]
            assert f.request.host == "proxy.test"  # answered here: never forwarded


async def test_a_request_that_names_no_host_is_judged_by_its_peer(addon):
    """HTTP/1.0 without Host (a balancer's health check): no browser sends it."""
    cg, _ = addon
    assert answer(cg, no_host(control_flow("/_cg/health")))[1] == 200
    assert answer(cg, no_host(control_flow("/_cg/health", REMOTE)))[1] == 403


def reverse(f: http.HTTPFlow, sent: str | None = None) -> http.HTTPFlow:
    """`f` as a reverse-mode listener hands it to the hooks: its Host replaced by the
    upstream's, the one the client sent kept (`sent`) as `capture_client_host` keeps it."""
    f.client_conn.proxy_mode = ProxyMode.parse("reverse:https://api.anthropic.com")
    f.request.headers["host"] = "api.anthropic.com"
    if sent is not None:
        setattr(f.request, control.CLIENT_HOST, sent)
    return f


async def test_reverse_mode_judges_the_host_the_client_sent(addon):
    cg, tctx = addon
    _, status, doc = answer(cg, reverse(control_flow("/_cg/sessions"), "127.0.0.1:8080"))
    assert status == 200 and ids(doc) == {A, B}
    _, status, doc = answer(cg, reverse(control_flow("/_cg/sessions"), "rebind.attacker.example"))
    assert status == 421 and refused(status, doc)
    # not kept (the listener's rewrite was not seen): unknown, refused
    _, status, doc = answer(cg, reverse(control_flow("/_cg/sessions")))
    assert status == 421 and "not known" in doc["error"]
    # with keep_host_header mitmproxy leaves the Host as sent: that is the one judged
    tctx.options.add_option("keep_host_header", bool, True, "(proxyserver's, not loaded here)")
    for sent, status in (("localhost:8080", 200), ("rebind.attacker.example:8080", 421)):
        f = reverse(control_flow("/_cg/sessions"))
        f.request.headers["host"] = sent
        assert answer(cg, f)[1] == status, sent


def test_the_client_host_is_kept_by_this_mitmproxy():
    """Vacuity guard for the reverse-mode tests above: the wrapper is in place, once."""
    from mitmproxy.proxy.layers.http import HttpStream

    assert control.capture_client_host() and control.capture_client_host()
    method = HttpStream.state_wait_for_request_headers
    assert getattr(method, "cg_keeps_client_host", False)
    assert not getattr(getattr(method, "__wrapped__", None), "cg_keeps_client_host", False)


async def test_the_option_names_the_hosts_answered(addon):
    cg, tctx = addon
    tctx.configure(cg, cg_control_hosts=["cg.corp.example, *.proxies.example"])
    for host in ("cg.corp.example:8080", "a.proxies.example", "B.Proxies.Example."):
        assert ask(cg, "/_cg/health", host=host)[1] == 200, host
    for host in ("context-guru.test", "proxies.example", "cg.corp.example.evil"):
        assert ask(cg, "/_cg/health", host=host)[1] == 421, host
    assert ask(cg, "/_cg/health", host="[::1]:8080")[1] == 200  # loopback whatever it says
    tctx.configure(cg, cg_control_hosts=[])
    assert ask(cg, "/_cg/health", host="localhost")[1] == 200
    assert ask(cg, "/_cg/health", host="context-guru.test")[1] == 421


@pytest.mark.parametrize(
    "entry",
    [
        "http://cg.example",
        "cg.example/_cg",
        "cg.example:8080",
        "[::1]:8080",
        "*",
        "*.*",
        "?",
        "a:b",
    ],
)
async def test_a_control_host_that_is_no_name_is_refused_naming_the_option(addon, entry):
    cg, tctx = addon
    with pytest.raises(exceptions.OptionsError, match="cg_control_hosts"):
        tctx.configure(cg, cg_control_hosts=[entry])


@pytest.mark.parametrize(
    "origin",
    [
        "http://127.0.0.1:8080",
        "http://localhost:3000",
        "http://[::1]:8080",
        "https://context-guru.test",
    ],
)
async def test_an_origin_of_ours_is_answered(addon, origin):
    cg, _ = addon
    f, status, doc = ask(cg, "/_cg/sessions", origin=origin)
    assert status == 200 and ids(doc) == {A, B}
    assert f.response is not None
    assert not [k for k in f.response.headers if k.lower().startswith("access-control-")]


@pytest.mark.parametrize(
    "origin",
    [
        "null",
        "http://rebind.attacker.example:8080",
        "https://evil.example",
        "http://127.0.0.1.evil.example",
        "http://localhost:http",
        "127.0.0.1",
        "",
        "file://",
    ],
)
async def test_a_foreign_or_null_origin_is_refused(addon, origin):
    cg, _ = addon
    for host in (HOST, "localhost:8080"):
        for path in ("/_cg/sessions", f"/_cg/expand?id={KEY_A}", "/_cg/"):
            f, status, doc = ask(cg, path, host=host, origin=origin)
            assert status == 403 and refused(status, doc), (path, origin)
            assert f.response is not None
            assert not [k for k in f.response.headers if k.lower().startswith("access-control-")]


async def test_every_origin_a_request_carries_is_judged(addon):
    cg, _ = addon
    f = control_flow("/_cg/sessions")
    f.request.headers.set_all("origin", ["http://127.0.0.1:8080", "https://evil.example"])
    assert answer(cg, f)[1] == 403


# -- the token, for everyone once set -------------------------------------------------------------


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


async def test_a_token_is_needed_from_loopback_too(addon):
    cg, tctx = addon
    tctx.configure(cg, cg_control_token=TOKEN)
    for path in ("/_cg/health", "/_cg/stats", "/_cg/sessions", f"/_cg/expand?id={KEY_A}"):
        f, status, doc = ask(cg, path)
        assert status == 401 and refused(status, doc), path
        assert f.response is not None
        assert f.response.headers.get_all("www-authenticate") == [
            'Bearer realm="context-guru"',
            'Basic realm="context-guru"',
        ]
    # the dashboard asks a person's browser for Basic credentials
    f, status, _ = ask(cg, "/_cg/")
    assert status == 401 and f.response is not None
    assert f.response.headers.get_all("www-authenticate") == ['Basic realm="context-guru"']
    # with it, a loopback caller reads every session, as without a token
    _, status, doc = ask(cg, "/_cg/sessions", authorization=f"Bearer {TOKEN}")
    assert status == 200 and ids(doc) == {A, B}


@pytest.mark.parametrize(
    ("authorization", "status"),
    [
        (basic("anyone", TOKEN), 200),
        (basic("", TOKEN), 200),
        (basic("x", TOKEN + ":more"), 401),
        (basic(TOKEN, "wrong"), 401),
        (basic("anyone", TOKEN[:-1]), 401),
        ("Basic !!notbase64!!", 401),
        (f"basic {base64.b64encode(f'u:{TOKEN}'.encode()).decode()}", 200),
        (f"bearer {TOKEN}", 200),
        (f"Bearer  {TOKEN} ", 200),
        (f"Token {TOKEN}", 401),
    ],
)
async def test_basic_auth_carries_the_token_as_its_password(addon, authorization, status):
    cg, tctx = addon
    tctx.configure(cg, cg_control_token=TOKEN)
    for path in ("/_cg/", "/_cg/sessions"):
        f, got, _ = ask(cg, path, authorization=authorization)
        assert got == status, (path, authorization)
        assert "authorization" not in f.request.headers


async def test_the_token_can_come_from_the_environment(addon, monkeypatch):
    cg, tctx = addon
    monkeypatch.setenv(CONTROL_TOKEN_ENV, TOKEN)
    tctx.configure(cg, cg_control_token="")
    assert ask(cg, "/_cg/health")[1] == 401
    assert ask(cg, "/_cg/health", authorization=f"Bearer {TOKEN}")[1] == 200
    tctx.configure(cg, cg_control_token="other-token")  # the option wins
    assert ask(cg, "/_cg/health", authorization=f"Bearer {TOKEN}")[1] == 401


@pytest.mark.parametrize("token", ["two words", "tab\there", "é-token", "new\nline"])
async def test_a_token_no_client_could_send_is_refused_unshown(addon, token):
    cg, tctx = addon
    with pytest.raises(exceptions.OptionsError, match="cg_control_token") as e:
        tctx.configure(cg, cg_control_token=token)
    assert token not in str(e.value)


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
        KEY_A + "%23",
        KEY_A + "%23-1",
        KEY_A + "%23x",
        KEY_A + "%231234567",
        KEY_A + "%231%0A",
        KEY_A + "%231%232",
        KEY_A + "%23" + "9" * 5000,
        "%23" + KEY_A,
    ],
)
async def test_malformed_ids_are_refused_and_not_echoed_at_length(addon, key):
    cg, _ = addon
    _, status, doc = ask(cg, f"/_cg/expand?id={key}")
    assert status == 400 and "not a context-guru id" in doc["error"]
    assert len(doc["error"]) < 200


SPAN_C = [
    '{"role":"user","content":"list the files"}',
    '{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"Bash","input":{}}]}',
    '{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":'
    '"a.py \\u2014 caf\\u00e9"}]}',
]


async def test_one_message_of_a_stash_by_its_number(addon):
    cg, _ = addon
    key = stash_key(SPAN_C)
    cg.store.put_stash(key, A, SPAN_C, "anthropic")
    _, status, whole = ask(cg, f"/_cg/expand?id={key}")
    assert status == 200 and len(whole["messages"]) == 3  # the vacuity guard: the span, whole
    for n, src in enumerate(SPAN_C, 1):
        _, status, doc = ask(cg, f"/_cg/expand?id={key}%23{n}")  # `#` arrives as %23
        assert status == 200, n
        assert doc == {
            "id": f"{key}#{n}",
            "session": A,
            "created": whole["created"],
            "count": 3,
            "dialect": "anthropic",
            "key": key,
            "n": n,
            "message": json.loads(src),
            "source": src,  # its exact bytes, escapes and all
        }
    for none in ("0", "4", "999999"):
        _, status, doc = ask(cg, f"/_cg/expand?id={key}%23{none}")
        assert status == 404, none
        assert doc == {"error": f"id {key}#{none}: the stash holds 3 messages, {key}#1 to {key}#3"}
    _, status, doc = ask(cg, f"/_cg/expand?id={'0' * 24}%231")
    assert status == 404 and "unknown or no longer available" in doc["error"]


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
