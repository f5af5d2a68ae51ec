"""A provider flow's credential headers are replaced once its answer is done (or it failed, or
the proxy stops with it in flight), so nothing that reads the flow later holds the key: the turns
the addon routes, and every other flow to a provider (count_tokens, /v1/models: any flow in
reverse mode; a known provider host, a `cg_hosts` one, or one that served a turn). Other flows
are not the addon's to touch. `cg_redact_credentials=false` keeps them."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from mitmproxy import http
from mitmproxy.proxy.mode_specs import ProxyMode

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from mitmproxy.test import taddons, tflow, tutils

from cg.proxy.addon import REDACTED, ContextGuru
from cg.proxy.providers import LEARN_MAX

KEY = "sk-redact-me-123"
BODY = b'{"model":"m","max_tokens":9,"messages":[{"role":"user","content":"hi"}]}'


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))


def flow(
    path: str = "/v1/messages",
    host: str = "api.anthropic.com",
    method: str = "POST",
    mode: str = "regular",
    host_header: str | None = None,
) -> http.HTTPFlow:
    req = tutils.treq(method=method.encode(), path=path.encode(), host=host, content=BODY)
    if host_header is not None:
        req.headers["host"] = host_header
    req.headers["x-api-key"] = KEY
    req.headers["authorization"] = f"Bearer {KEY}"
    req.headers["anthropic-version"] = "2023-06-01"
    f = tflow.tflow(req=req, resp=tutils.tresp(content=b"{}"))
    f.client_conn.proxy_mode = ProxyMode.parse(mode)
    return f


def creds(f: http.HTTPFlow) -> list[str]:
    return [*f.request.headers.get_all("x-api-key"), *f.request.headers.get_all("authorization")]


async def test_a_provider_flows_key_is_replaced_once_answered_errored_or_left_at_exit():
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        tctx.configure(cg, cg_preset="off")
        answered, errored, inflight = flow(), flow(), flow()
        other = flow("/v1/models", host="files.example.test", method="GET")
        for f in (answered, errored, inflight, other):
            cg.request(f)
            assert creds(f) == [KEY, f"Bearer {KEY}"]  # the request goes upstream with its key
        await cg.response(answered)
        cg.error(errored)
        await cg.response(other)
        assert creds(answered) == creds(errored) == [REDACTED, REDACTED]
        assert answered.request.headers["anthropic-version"] == "2023-06-01"  # the rest stays
        assert creds(inflight) == [KEY, f"Bearer {KEY}"]
        assert creds(other) == [KEY, f"Bearer {KEY}"]  # not a provider's flow: not ours
        cg.done()
        assert creds(inflight) == [REDACTED, REDACTED]


SIBLINGS = [
    ("POST", "/v1/messages/count_tokens"),
    ("GET", "/v1/models"),
    ("HEAD", "/"),
    ("POST", "/v1/responses/compact"),
]


@pytest.mark.parametrize(("method", "path"), SIBLINGS)
async def test_a_provider_hosts_other_flows_are_redacted_once_done(method, path):
    """Not routed (no decision record), yet the provider's: the same redaction as a turn's."""
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        tctx.configure(cg, cg_preset="off")
        cases = [
            flow(path, method=method, mode="reverse:https://gateway.example.test"),
            flow(path, "api.anthropic.com", method),
            flow(path, "api.openai.com", method),
            # transparent mode: the address connected to, the provider named by the Host
            flow(path, "160.79.104.10", method, "transparent", "api.anthropic.com:443"),
        ]
        answered, errored, inflight = cases[:-2], cases[-2], cases[-1]
        for f in cases:
            cg.request(f)
            assert "context_guru" not in f.metadata  # the guard: not a routed turn
            assert creds(f) == [KEY, f"Bearer {KEY}"]  # it goes upstream with its key
        for f in answered:
            await cg.response(f)
            assert creds(f) == [REDACTED, REDACTED], f.request.url
            assert f.request.headers["anthropic-version"] == "2023-06-01"
        cg.error(errored)
        assert creds(errored) == [REDACTED, REDACTED]
        assert creds(inflight) == [KEY, f"Bearer {KEY}"]
        cg.done()
        assert creds(inflight) == [REDACTED, REDACTED]


async def test_cg_hosts_and_a_host_that_served_a_turn_are_a_providers():
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        tctx.configure(cg, cg_preset="off")
        gateway = "llm.gateway.example.test"
        before = flow("/v1/models", gateway, "GET")
        cg.request(before)
        await cg.response(before)
        assert creds(before) == [KEY, f"Bearer {KEY}"]  # nothing says it is a provider yet
        turn = flow("/v1/messages", gateway)
        cg.request(turn)
        await cg.response(turn)
        assert "context_guru" in turn.metadata and creds(turn) == [REDACTED, REDACTED]
        after = flow("/v1/models", gateway, "GET")
        cg.request(after)
        await cg.response(after)
        assert creds(after) == [REDACTED, REDACTED]  # it served a turn: a provider's host
        tctx.configure(cg, cg_hosts=["*.corp.example.test"])
        listed = flow("/v1/models", "llm.corp.example.test", "GET")
        outside = flow("/v1/messages", "files.example.test")  # a turn's path, outside cg_hosts
        for f in (listed, outside):
            cg.request(f)
            await cg.response(f)
        assert creds(listed) == [REDACTED, REDACTED]
        assert creds(outside) == [KEY, f"Bearer {KEY}"]  # not the addon's: untouched
        again = flow("/v1/models", gateway, "GET")  # learnt before cg_hosts changed: kept
        cg.request(again)
        await cg.response(again)
        assert creds(again) == [REDACTED, REDACTED]


async def test_the_hosts_learnt_are_bounded():
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        tctx.configure(cg, cg_preset="off")
        for n in range(LEARN_MAX + 50):
            f = flow("/v1/messages", f"h{n}.example.test")
            cg.request(f)
            await cg.response(f)
        assert len(cg.providers.seen) == LEARN_MAX


async def test_the_option_keeps_the_key():
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        tctx.configure(cg, cg_preset="off", cg_redact_credentials=False)
        for f in (flow(), flow("/v1/models", method="GET"), flow("/", mode="reverse:http://x")):
            cg.request(f)
            await cg.response(f)
            assert creds(f) == [KEY, f"Bearer {KEY}"]
        assert cg.live == {}
