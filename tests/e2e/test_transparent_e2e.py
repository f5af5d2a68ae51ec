"""The addon's own calls upstream when mitmproxy knows the server only by its address.

In transparent and local modes (and here: a regular proxy whose CONNECT target an addon routes to
an address, tests/e2e/tap.py's `tap_route`) `flow.request.url` names the address connected to,
`https://127.0.0.1:PORT/…`, while the agent asked for a provider by name (`Host`). The addon's own
calls — an `incoming` summary, an expand round, the re-send after a 400 — must connect to that
address but verify the provider's certificate against the name, as mitmproxy itself did.

The fake provider's certificate names only `api.provider.invalid` (RFC 6761: it resolves
nowhere) and not the address: a call that checked the certificate against the address, or that
looked the name up, fails. Real transparent mode needs root and OS redirection rules, which the
suite does not set up; the flows' `request.host` being an address is what this reproduces.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import pytest

from tests.e2e.agents import LOW, assert_expanded_once, assert_summarized, start_proxy
from tests.e2e.harness import Proxy, by_id, new_id
from tests.e2e.pki import Pki, make_pki
from tests.e2e.sdk_agent import SdkAgent, run_scripted
from tests.e2e.sdk_sessions import anthropic_messages
from tests.support.fakeprovider import DEFAULT_TEXT, FakeProvider, anthropic_error

pytestmark = pytest.mark.e2e

NAME = "api.provider.invalid"
KEY = "sk-transparent-e2e"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki-named"), [NAME], address=False)


@pytest.fixture(scope="module")
def fake(pki: Pki) -> Iterator[FakeProvider]:
    with FakeProvider(tls=pki.server_context()) as p:
        yield p


def start(fake: FakeProvider, pki: Pki, workdir: Path, summarize: dict[str, object]) -> Proxy:
    options = [
        f"tap_route={NAME}=127.0.0.1:{fake.port}",
        f"ssl_verify_upstream_trusted_ca={pki.ca}",
        f"cg_hosts={NAME}",
    ]
    return start_proxy("", workdir, "summarize", summarize, options=options, mode="regular")


def client_tls(proxy: Proxy) -> ssl.SSLContext:
    """The agent trusts mitmproxy's CA (its interception certificates)."""
    ca = proxy.records.path.parent / "confdir" / "mitmproxy-ca-cert.pem"
    return ssl.create_default_context(cafile=str(ca))


def test_the_fake_cannot_be_verified_by_its_address(fake, pki):
    """The guard: what the fixed calls would otherwise do — verify against 127.0.0.1 — fails,
    and the name resolves nowhere."""
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    with pytest.raises(ssl.SSLCertVerificationError, match="IP address mismatch"):  # noqa: SIM117
        with socket.create_connection(("127.0.0.1", fake.port), timeout=10) as raw:
            ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    with socket.create_connection(("127.0.0.1", fake.port), timeout=10) as raw:  # by name: fine
        ctx.wrap_socket(raw, server_hostname=NAME).close()
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo(NAME, 443)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_summary_and_expand_round_reach_the_provider_by_name(
    fake, pki, tmp_path, proxies, stream
):
    proxy = proxies(start(fake, pki, tmp_path, LOW))
    agent = SdkAgent(
        "anthropic",
        is_async=True,
        stream=stream,
        base_url=f"https://{NAME}",
        http={"proxy": proxy.url, "verify": client_tls(proxy)},
    )
    script, turns = await run_scripted(fake, proxy, tmp_path, agent)
    # The summary was written by the provider (an `incoming` call to the address, by name) and
    # spliced; the model's expand call was answered by an addon round sent the same way.
    assert_summarized(turns, proxy, head=1)
    assert_expanded_once(turns, script, proxy)
    summaries = fake.summarizer_requests
    assert summaries, "no summarizer call reached the provider"
    assert {r.header("host") for r in summaries} == {NAME}
    continued = [t.continuation for t in turns if t.continuation is not None]
    assert len(continued) == 1 and continued[0].header("host") == NAME
    stats = proxy.stats()
    assert stats["summaries"]["failed"] == 0 and stats["summaries"]["completed"] >= 1


def test_the_resend_after_a_400_reaches_the_provider_by_name(fake, pki, tmp_path, proxies):
    proxy = proxies(start(fake, pki, tmp_path, {**LOW, "model": {"share_cache": "never"}}))
    http = httpx.Client(proxy=proxy.url, verify=client_tls(proxy), trust_env=False, timeout=30)
    client = anthropic.Anthropic(
        base_url=f"https://{NAME}", api_key=KEY, http_client=http, max_retries=0
    )
    tag = new_id()
    headers = {"x-context-guru-session": f"s-{tag}"}

    def turn(n: int) -> tuple[str, str]:
        eid = new_id()
        msg = client.messages.create(
            model="claude-test",
            max_tokens=64,
            messages=anthropic_messages(tag, n),
            extra_headers={**headers, "x-e2e-id": eid},
        )
        return eid, msg.content[0].text  # type: ignore[union-attr]

    with client:
        c0 = proxy.counts()
        turn(7)  # commissions a summary (to the address, by name)
        proxy.wait_count(c0, "completed")
        fake.script(anthropic_error(400, "invalid_request_error", "refused the rewrite"))
        eid, text = turn(9)  # spliced, refused, re-sent as the client sent it
    assert text == DEFAULT_TEXT
    assert proxy.records.cg(eid)["outcome"] == "retried_original"
    refused, resent = fake.wait_for(2, where=by_id(eid))
    assert b"=== History Summary ===" in refused.body
    assert b"=== History Summary ===" not in resent.body
    assert (refused.header("host"), resent.header("host")) == (NAME, NAME)
    assert proxy.counts()["retried_original"] == c0["retried_original"] + 1
