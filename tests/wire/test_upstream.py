"""Our own calls upstream when mitmproxy's URL names an address: the provider's name for SNI, the
certificate check and `Host` (`cg.wire.upstream.sni_name`, `agent_request(sni=…)`), and one pooled
client per name (`HttpPool.client(sni)`)."""

from __future__ import annotations

import httpx
import pytest

from cg.summarize.client import HttpPool, Origin
from cg.wire.upstream import agent_request, sni_name


@pytest.mark.parametrize(
    ("url_host", "host_header", "expected"),
    [
        ("127.0.0.1", "api.anthropic.com", "api.anthropic.com"),  # transparent: address + name
        ("2606:4700::6810:85e5", "api.openai.com", "api.openai.com"),
        ("[::1]", "API.Example.COM.", "api.example.com"),  # normalised as TLS wants it
        ("api.anthropic.com", "api.anthropic.com", None),  # the URL names the host already
        ("api.anthropic.com", "127.0.0.1", None),  # reverse mode keeping a client's Host
        ("127.0.0.1", "127.0.0.1", None),  # the agent itself named an address
        ("127.0.0.1", "", None),
        ("127.0.0.1", None, None),
        ("127.0.0.1", "bad name\r\nx: y", None),  # not a DNS name: never handed to TLS
        ("127.0.0.1", "a" * 300, None),
    ],
)
def test_sni_name(url_host, host_header, expected):
    assert sni_name(url_host, host_header) == expected


async def test_agent_request_names_the_provider_for_tls_and_host():
    async with httpx.AsyncClient() as client:
        headers = [(b"host", b"api.provider.invalid"), (b"x-api-key", b"k")]
        out = agent_request(
            client, "POST", "https://127.0.0.1:8443/v1/messages", headers, b"{}",
            sni="api.provider.invalid",
        )  # fmt: skip
        assert out.extensions["sni_hostname"] == "api.provider.invalid"
        assert out.headers["host"] == "api.provider.invalid"  # the agent's own Host, as sent
        assert out.url.host == "127.0.0.1"  # still connects to the address
        h2 = agent_request(  # HTTP/2 agents carry :authority, no Host header: the name then
            client, "POST", "https://127.0.0.1/v1/messages", [(b"x-api-key", b"k")], b"{}",
            sni="api.provider.invalid",
        )  # fmt: skip
        assert h2.headers["host"] == "api.provider.invalid"
        plain = agent_request(client, "POST", "https://api.x.test/v1/messages", headers, b"{}")
        assert "sni_hostname" not in plain.extensions
        assert plain.headers["host"] == "api.x.test"


def test_origin_keeps_the_name_and_host_only_with_sni():
    headers = {"host": "api.provider.invalid", "x-api-key": "k", "cookie": "c"}
    named = Origin.of("https://127.0.0.1/v1/messages", headers, "api.provider.invalid")
    assert named.sni == "api.provider.invalid"
    assert named.headers == {"x-api-key": "k", "host": "api.provider.invalid"}
    plain = Origin.of("https://api.x.test/v1/messages", headers)
    assert plain.sni is None and plain.headers == {"x-api-key": "k"}


async def test_pool_keeps_one_client_per_name_and_closes_the_oldest_beyond_the_cap():
    pool = HttpPool()
    pool.MAX_NAMED = 2
    default = pool.client()
    a = pool.client("a.test")
    assert pool.client("a.test") is a and a is not default
    b = pool.client("b.test")
    c = pool.client("c.test")  # a is the least recently used: dropped and closed
    assert len({id(x) for x in (default, a, b, c)}) == 4
    assert pool.client("b.test") is b and pool.client("a.test") is not a
    await pool.aclose()
    assert a.is_closed and b.is_closed and c.is_closed and default.is_closed
