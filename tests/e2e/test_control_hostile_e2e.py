"""The control surface and the agent's key against hostile callers, on a real mitmdump.

- **DNS rebinding** (reverse mode): a page on `rebind.attacker.example` whose name now resolves to
  127.0.0.1 asks `/_cg/expand` and `/_cg/sessions` with its own `Host` (and, cross-origin, its
  `Origin`): refused, nothing read, nothing forwarded; the same requests with a loopback Host read
  the stash and the session (the guard). mitmproxy's reverse mode rewrites the Host before any
  hook, so this also shows the Host the client sent is the one judged.
- **A page through the regular proxy** fetching `http://anything.example/_cg/sessions`: refused,
  while `http://context-guru.test/_cg/health` (the name the harness itself polls) answers.
- **The token** (`cg_control_token`, or `CONTEXT_GURU_CONTROL_TOKEN` in the proxy's environment):
  loopback callers need it too (Bearer, or Basic for a browser), `context-guru stats --proxy`
  sends it with `--token` (or the variable), and it is in no saved flow and no log line.
- **Sibling endpoints**: `count_tokens`, `/v1/models`, `HEAD /` carry the agent's key but are no
  turn of the addon's; with `-w` (`save_stream_file`) and `--flow-detail 3` the flow file read
  back and mitmdump's printout hold no key, while the provider received it. Through a regular
  proxy, a provider host's flows are redacted and another host's are left as they were.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from mitmproxy import http, io

from cg.cli import main as cli
from cg.proxy.addon import REDACTED
from cg.proxy.environ import CONTROL_TOKEN_ENV
from tests.e2e.agents import TAP
from tests.e2e.harness import Proxy, low, new_id, received, start_summarize
from tests.e2e.sdk_sessions import SdkClient, anthropic_messages
from tests.support.fakeprovider import FakeProvider

pytestmark = pytest.mark.e2e

REBIND = "rebind.attacker.example"
TOKEN = "cg-hostile-e2e-token-5c1d"
KEY = "sk-sibling-kept-nowhere-4471"
OTHER_KEY = "sk-not-a-providers-key-0932"
FLOW_DETAIL = ("--flow-detail", "3")


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeProvider]:
    with FakeProvider() as p:
        yield p


def no_cors(r: httpx.Response) -> None:
    assert not [k for k in r.headers if k.lower().startswith("access-control-")], r.headers


# -- the Host and the Origin ------------------------------------------------------------------


def test_reverse_mode_refuses_a_rebinding_host_and_a_foreign_origin(fake, tmp_path, proxies):
    proxy = proxies(start_summarize(fake.url, tmp_path, low()))
    with SdkClient(proxy, "anthropic") as agent:
        c0 = proxy.counts()
        agent.turn(anthropic_messages(agent.session, 7))
        proxy.wait_count(c0, "completed")
        session = agent.session
    with sqlite3.connect(tmp_path / "cg.sqlite3") as conn:
        (key,) = {k for (k,) in conn.execute("SELECT key FROM stashes")}
    conn.close()
    port = proxy.port
    with httpx.Client(base_url=proxy.url, trust_env=False, timeout=10) as c:
        # the guard: sent to the address it listens on, both read what there is
        r = c.get("/_cg/expand", params={"id": key})
        assert r.status_code == 200 and "parser.py" in r.text
        r = c.get("/_cg/sessions")
        assert r.status_code == 200 and session in r.text
        before = len(fake.requests)
        attempts = [
            ({"host": f"{REBIND}:{port}", "origin": f"http://{REBIND}:{port}"}, 421),
            ({"host": f"{REBIND}:{port}"}, 421),  # same origin after the rebinding: no Origin
            ({"host": REBIND, "origin": f"http://{REBIND}"}, 421),
            ({"host": f"127.0.0.1:{port}", "origin": f"http://{REBIND}:{port}"}, 403),
            ({"host": f"localhost:{port}", "origin": "null"}, 403),
        ]
        for headers, status in attempts:
            for path, params in (
                ("/_cg/expand", {"id": key}),
                ("/_cg/sessions", None),
                ("/_cg/", None),
                ("/_cg/stats", None),
            ):
                r = c.get(path, params=params, headers=headers)
                assert r.status_code == status, (path, headers, r.text)
                assert "parser.py" not in r.text and session not in r.text, r.text
                assert "sessions" not in r.json() and "requests" not in r.json()
                no_cors(r)
    assert len(fake.requests) == before  # answered by the addon, never forwarded


def test_regular_mode_answers_its_own_names_only(fake, tmp_path, proxies):
    # Started: the harness polled http://context-guru.test/_cg/health through it.
    proxy = proxies(Proxy.start(fake.url, tmp_path, mode="regular"))
    before = len(fake.requests)
    with httpx.Client(proxy=proxy.url, trust_env=False, timeout=10) as c:
        r = c.get("http://context-guru.test/_cg/health")
        assert r.status_code == 200 and r.json()["ok"] is True
        r = c.get("http://context-guru.test/_cg/sessions")
        assert r.status_code == 200 and "sessions" in r.json()
        for url in (
            "http://anything.example/_cg/sessions",
            "http://anything.example/_cg/health",
            "http://anything.example/_cg/",
            f"http://{REBIND}:8080/_cg/stats",
        ):
            r = c.get(url)
            assert r.status_code == 421 and "cg_control_hosts" in r.json()["error"], url
            assert "sessions" not in r.json() and "ok" not in r.json()
            no_cors(r)
        # a page of another site, through the proxy, asking the dashboard's own name
        r = c.get(
            "http://context-guru.test/_cg/sessions", headers={"origin": "http://anything.example"}
        )
        assert r.status_code == 403 and "sessions" not in r.json()
    assert len(fake.requests) == before  # nothing went anywhere


# -- the token --------------------------------------------------------------------------------


@pytest.mark.parametrize("given", ["option", "environment"])
def test_a_token_is_needed_from_loopback_too_and_the_cli_sends_it(
    fake, tmp_path, proxies, capsys, monkeypatch, given
):
    flows = tmp_path / "flows.mitm"
    options = [f"save_stream_file={flows}"]
    env = {}
    if given == "option":
        options.append(f"cg_control_token={TOKEN}")
    else:
        env[CONTROL_TOKEN_ENV] = TOKEN
    # Started: the harness's health poll sent the token (Proxy.token).
    proxy = proxies(Proxy.start(fake.url, tmp_path, options=options, env=env))
    assert proxy.token == TOKEN
    with httpx.Client(base_url=proxy.url, trust_env=False, timeout=10) as c:
        for path in ("/_cg/health", "/_cg/stats", "/_cg/sessions"):
            r = c.get(path)
            assert r.status_code == 401, path
            assert r.headers.get_list("www-authenticate") == [
                'Bearer realm="context-guru"',
                'Basic realm="context-guru"',
            ]
            assert "requests" not in r.json() and "sessions" not in r.json()
        r = c.get("/_cg/")
        assert r.status_code == 401
        assert r.headers["www-authenticate"] == 'Basic realm="context-guru"'
        assert c.get("/_cg/health", headers={"authorization": f"Bearer {TOKEN}"}).status_code == 200
        r = c.get("/_cg/", auth=("me", TOKEN))  # a person's browser, answering the prompt
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert c.get("/_cg/health", auth=("me", TOKEN[:-1])).status_code == 401
    monkeypatch.delenv(CONTROL_TOKEN_ENV, raising=False)
    capsys.readouterr()
    assert cli(["stats", "--proxy", proxy.url]) == 1
    assert "401" in capsys.readouterr().err
    assert cli(["stats", "--proxy", proxy.url, "--token", TOKEN, "--json"]) == 0
    assert '"requests"' in capsys.readouterr().out
    monkeypatch.setenv(CONTROL_TOKEN_ENV, TOKEN)
    assert cli(["stats", "--proxy", proxy.url]) == 0
    assert "requests" in capsys.readouterr().out
    proxy.stop()
    saved = flows.read_bytes()
    assert b"/_cg/health" in saved  # the guard: the control flows were saved
    assert TOKEN.encode() not in saved
    assert TOKEN not in proxy.log_text()


# -- the key on a provider's other endpoints ----------------------------------------------------

SIBLINGS = [
    ("POST", "/v1/messages/count_tokens", b'{"model":"claude-test","messages":[]}'),
    ("GET", "/v1/models", None),
    ("GET", "/v1/models/claude-test", None),
    ("HEAD", "/", None),
]


def saved_flows(path: Path) -> dict[str, http.HTTPFlow]:
    """The flows of a `-w` file, by their `x-e2e-id`."""
    out: dict[str, http.HTTPFlow] = {}
    with path.open("rb") as f:
        for flow in io.FlowReader(f).stream():
            assert isinstance(flow, http.HTTPFlow)
            eid = flow.request.headers.get("x-e2e-id")
            if eid is not None:
                out[eid] = flow
    return out


def send(c: httpx.Client, key: str, method: str, url: str, body: bytes | None) -> str:
    eid = new_id()
    headers = {
        "x-api-key": key,
        "authorization": f"Bearer {key}",
        "anthropic-version": "2023-06-01",
        "x-e2e-id": eid,
    }
    c.request(method, url, content=body, headers=headers)
    return eid


@pytest.mark.parametrize("redact", [True, False], ids=["redacted", "cg_redact_credentials=false"])
def test_count_tokens_and_models_keep_no_key_in_the_flow_file_or_the_printout(
    fake, tmp_path, proxies, redact
):
    flows = tmp_path / "flows.mitm"
    options = [f"save_stream_file={flows}"]
    if not redact:
        options.append("cg_redact_credentials=false")
    proxy = proxies(Proxy.start(fake.url, tmp_path, options=options, args=FLOW_DETAIL))
    with httpx.Client(base_url=proxy.url, trust_env=False, timeout=10) as c:
        eids = [send(c, KEY, method, path, body) for method, path, body in SIBLINGS]
    for eid in eids:
        got = received(fake, eid)  # the key went upstream, where it is meant for
        assert got.header("x-api-key") == KEY and got.header("authorization") == f"Bearer {KEY}"
        assert proxy.records.wait(eid)["cg"] is None  # finished, and no turn of the addon's
    proxy.stop()
    saved = saved_flows(flows)
    assert set(eids) <= set(saved)
    printed = proxy.log_text()
    assert "/v1/messages/count_tokens" in printed and "anthropic-version" in printed  # shown
    if not redact:  # the guard: the search finds the key where it is
        assert KEY in printed and KEY.encode() in flows.read_bytes()
        return
    for eid in eids:
        headers = saved[eid].request.headers
        assert headers.get_all("x-api-key") == [REDACTED], headers
        assert headers.get_all("authorization") == [REDACTED]
        assert headers["anthropic-version"] == "2023-06-01"
    assert KEY.encode() not in flows.read_bytes()
    assert KEY not in printed and REDACTED in printed


def test_through_a_regular_proxy_a_provider_hosts_flows_are_redacted_and_no_others(
    fake, tmp_path, proxies
):
    flows = tmp_path / "flows.mitm"
    routes = [f"tap_route={h}=127.0.0.1:{fake.port}" for h in ("api.anthropic.com", "files.test")]
    proxy = proxies(
        Proxy.start(
            "",
            tmp_path,
            mode="regular",
            scripts=[TAP],
            options=[*routes, f"save_stream_file={flows}"],
            args=FLOW_DETAIL,
        )
    )
    with httpx.Client(proxy=proxy.url, trust_env=False, timeout=10) as c:
        provider = [send(c, KEY, m, f"http://api.anthropic.com{p}", b) for m, p, b in SIBLINGS]
        other = send(c, OTHER_KEY, "GET", "http://files.test/v1/models", None)
    for eid in [*provider, other]:
        assert received(fake, eid).header("x-api-key") in (KEY, OTHER_KEY)
        proxy.records.wait(eid)
    proxy.stop()
    saved = saved_flows(flows)
    for eid in provider:
        assert saved[eid].request.headers.get_all("x-api-key") == [REDACTED]
    # another host's flow is mitmproxy's, as it was: its header kept (and the search works)
    assert saved[other].request.headers.get_all("x-api-key") == [OTHER_KEY]
    assert KEY.encode() not in flows.read_bytes()
    assert KEY not in proxy.log_text() and OTHER_KEY in proxy.log_text()
