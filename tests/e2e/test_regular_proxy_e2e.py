"""Regular proxy mode with TLS interception: clients reach "https://api.anthropic.com" and
"https://api.openai.com" through `mitmdump -s cg_addon.py` as their HTTPS_PROXY, trusting
mitmproxy's CA — Claude Code with NODE_EXTRA_CA_CERTS, the Python SDKs with SSL_CERT_FILE.

Nothing leaves the machine: the fake provider serves those names over TLS on 127.0.0.1 with a
certificate from a throwaway CA (tests/e2e/pki.py) that mitmproxy is told to trust
(`ssl_verify_upstream_trusted_ca`), and the tap's route (tests/e2e/tap.py) connects mitmproxy to
it, SNI and Host unchanged. A second TLS server plays an unrelated HTTPS site on the same proxy.
The proxy runs as the README says: `cg_hosts=api.anthropic.com,api.openai.com`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.agents import (
    LOW,
    assert_expanded_once,
    assert_summarized,
    drive_claude,
    never_saw_expand,
    start_proxy,
)
from tests.e2e.harness import Capture, Proxy, by_id, header_pairs, new_id
from tests.e2e.pki import Pki, make_pki
from tests.e2e.sdk_agent import SdkAgent, run_scripted
from tests.support.fakeprovider import DEFAULT_TEXT, FakeProvider

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PROVIDERS = ("api.anthropic.com", "api.openai.com")
OTHER = "files.example.test"
# What Claude Code asks api.anthropic.com besides its turns (a custom base URL skips these).
FIRST_PARTY = {("GET", "/api/claude_code/policy_limits"), ("GET", "/api/claude_code/settings")}
PROXY_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), [*PROVIDERS, OTHER])


@pytest.fixture(scope="module")
def fake(pki: Pki) -> Iterator[FakeProvider]:
    """The provider, serving both hostnames over TLS."""
    with FakeProvider(tls=pki.server_context()) as p:
        yield p


@pytest.fixture(scope="module")
def site(pki: Pki) -> Iterator[FakeProvider]:
    """An unrelated HTTPS site: its traffic must pass the proxy untouched."""
    with FakeProvider(tls=pki.server_context()) as p:
        yield p


def start_regular(
    fake: FakeProvider, site: FakeProvider, pki: Pki, workdir: Path, **kw: Any
) -> Proxy:
    routes = [f"tap_route={h}=127.0.0.1:{fake.port}" for h in PROVIDERS]
    options = [
        *routes,
        f"tap_route={OTHER}=127.0.0.1:{site.port}",
        f"ssl_verify_upstream_trusted_ca={pki.ca}",
        "cg_hosts=api.anthropic.com,api.openai.com",
    ]
    return start_proxy("", workdir, options=options, mode="regular", **kw)


def mitm_ca(proxy: Proxy) -> Path:
    """The CA mitmproxy signs its interception certificates with (in the test's confdir)."""
    ca = proxy.records.path.parent / "confdir" / "mitmproxy-ca-cert.pem"
    assert ca.is_file()
    return ca


@pytest.fixture
def https_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Set the client's environment for one proxy: HTTPS_PROXY and SSL_CERT_FILE, and nothing
    (NO_PROXY, another proxy, a base URL) that would route around it."""
    for name in (*PROXY_ENV, "SSL_CERT_DIR", "ANTHROPIC_BASE_URL", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)

    def use(proxy: Proxy) -> None:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        monkeypatch.setenv("SSL_CERT_FILE", str(mitm_ca(proxy)))

    yield use


def claude_env(proxy: Proxy) -> dict[str, str]:
    return {"HTTPS_PROXY": proxy.url, "NODE_EXTRA_CA_CERTS": str(mitm_ca(proxy))}


def hosts(proxy: Proxy) -> set[str]:
    lines = proxy.records.path.with_name("tap.jsonl").read_text().splitlines()
    return {json.loads(x)["host"] for x in lines}


# -- Claude Code ---------------------------------------------------------------------------------


def test_claude_code_through_https_proxy_default_preset_byte_identical(
    claude_code, fake, site, pki, tmp_path, proxies
):
    proxy = proxies(start_regular(fake, site, pki, tmp_path, preset="summarize"))
    s = drive_claude(claude_code, fake, proxy, tmp_path, 6, claude_env(proxy), FIRST_PARTY)
    assert [t.outcome for t in s.turns] == ["passed_through"] * 7
    assert all(t.cg["dialect"] == "anthropic" for t in s.turns)  # decided: cg_hosts matched
    assert hosts(proxy) == {"api.anthropic.com"}  # everything it sent went through the proxy
    assert proxy.stats()["summaries"]["commissioned"] == 0


def test_claude_code_through_https_proxy_is_summarized_reused_and_expanded(
    claude_code, fake, site, pki, tmp_path, proxies
):
    proxy = proxies(start_regular(fake, site, pki, tmp_path, preset="summarize", summarize=LOW))
    s = drive_claude(
        claude_code,
        fake,
        proxy,
        tmp_path,
        10,
        claude_env(proxy),
        FIRST_PARTY,
        expand=True,
        settle=True,
    )
    assert_summarized(s.turns, proxy, head=1)
    assert_expanded_once(s.turns, s.script, proxy)
    never_saw_expand(s)


# -- the SDKs ------------------------------------------------------------------------------------

SDK_CASES = [
    ("anthropic", False, True),
    ("anthropic", True, False),
    ("openai", False, False),
    ("openai", True, True),
]


@pytest.mark.parametrize(
    ("dialect", "is_async", "stream"),
    SDK_CASES,
    ids=[f"{d}-{'async' if a else 'sync'}-{'stream' if s else 'json'}" for d, a, s in SDK_CASES],
)
async def test_sdk_agent_through_https_proxy_is_summarized_reused_and_expanded(
    fake, site, pki, tmp_path, proxies, https_env, dialect, is_async, stream
):
    proxy = proxies(start_regular(fake, site, pki, tmp_path, preset="summarize", summarize=LOW))
    https_env(proxy)
    agent = SdkAgent(dialect, is_async=is_async, stream=stream)  # default host, from the env
    script, turns = await run_scripted(fake, proxy, tmp_path, agent)
    assert hosts(proxy) == {PROVIDERS[0] if dialect == "anthropic" else PROVIDERS[1]}
    assert all(t.got.header("host") == hosts(proxy).pop() for t in turns)
    assert_summarized(turns, proxy, head=1 if dialect == "anthropic" else 2)
    assert_expanded_once(turns, script, proxy)


# -- everything else through the same proxy ---------------------------------------------------------


def test_non_provider_https_traffic_passes_the_proxy_untouched(
    fake, site, pki, tmp_path, proxies, https_env
):
    proxy = proxies(start_regular(fake, site, pki, tmp_path, preset="summarize", summarize=LOW))
    https_env(proxy)
    capture = Capture()
    messages = [{"role": "user", "content": f"Task {n}: Ünïcödé ✓"} for n in range(9)]
    provider_body = json.dumps({"model": "m", "max_tokens": 9, "messages": messages}).encode()
    sends = [
        ("GET", f"https://{OTHER}/data?q=1&x=%C3%BC", None),
        ("POST", f"https://{OTHER}/upload", b'{"messages": [1, 2, 3],  "k": "\\u00fc"}'),
        # A provider-shaped request to a host outside cg_hosts is not the addon's business.
        ("POST", f"https://{OTHER}/v1/messages", provider_body),
        ("POST", f"https://{PROVIDERS[0]}/v1/messages", provider_body),  # the guard: decided
    ]
    replies = []
    with httpx.Client(event_hooks=capture.hooks(), timeout=30) as client:  # env: proxy, CA
        for method, url, body in sends:
            eid = new_id()
            r = client.request(method, url, content=body, headers={"x-e2e-id": eid})
            replies.append((eid, r))
    for (eid, r), sent in zip(replies, capture.sent, strict=True):
        server = fake if sent.url.host in PROVIDERS else site
        (got,) = server.wait_for(1, where=by_id(eid))
        assert (got.method, got.path) == (sent.method, sent.url.raw_path.decode())
        assert got.body == sent.content
        mine = header_pairs(sent.headers.multi_items(), skip=())
        assert header_pairs(got.headers, skip=()) == mine  # Host too
        record = proxy.records.wait(eid)
        if sent.url.host in PROVIDERS:
            assert record["cg"]["outcome"] == "passed_through", record  # decided, not rewritten
            assert r.json()["content"][0]["text"] == DEFAULT_TEXT
        else:
            assert record["cg"] is None, record  # never read by the addon
    get, upload, foreign, _ = (r for _, r in replies)
    assert get.status_code == 200 and get.content == b'{"echo":true,"path":"/data?q=1&x=%C3%BC"}'
    assert upload.status_code == 404 and upload.json()["error"]["type"] == "not_found"
    assert foreign.json()["content"][0]["text"] == DEFAULT_TEXT
    assert hosts(proxy) == {OTHER, PROVIDERS[0]}
    stats = proxy.stats()
    assert (stats["requests"], stats["rewritten"]) == (1, 0)
