"""A provider flow's credential headers are replaced once its answer is done (or it failed, or
the proxy stops with it in flight), so nothing that reads the flow later holds the key; other
flows are not the addon's to touch. `cg_redact_credentials=false` keeps them."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from mitmproxy import http

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from mitmproxy.test import taddons, tflow, tutils

from cg.proxy.addon import REDACTED, ContextGuru

KEY = "sk-redact-me-123"
BODY = b'{"model":"m","max_tokens":9,"messages":[{"role":"user","content":"hi"}]}'


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))


def flow(path: str = "/v1/messages") -> http.HTTPFlow:
    req = tutils.treq(method=b"POST", path=path.encode(), host="api.anthropic.com", content=BODY)
    req.headers["x-api-key"] = KEY
    req.headers["authorization"] = f"Bearer {KEY}"
    req.headers["anthropic-version"] = "2023-06-01"
    f = tflow.tflow(req=req, resp=tutils.tresp(content=b"{}"))
    return f


def creds(f: http.HTTPFlow) -> list[str]:
    return [*f.request.headers.get_all("x-api-key"), *f.request.headers.get_all("authorization")]


async def test_a_provider_flows_key_is_replaced_once_answered_errored_or_left_at_exit():
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        tctx.configure(cg, cg_preset="off")
        answered, errored, inflight, other = flow(), flow(), flow(), flow("/v1/models")
        for f in (answered, errored, inflight, other):
            cg.request(f)
            assert creds(f) == [KEY, f"Bearer {KEY}"]  # the request goes upstream with its key
        await cg.response(answered)
        cg.error(errored)
        await cg.response(other)
        assert creds(answered) == creds(errored) == [REDACTED, REDACTED]
        assert answered.request.headers["anthropic-version"] == "2023-06-01"  # the rest stays
        assert creds(inflight) == [KEY, f"Bearer {KEY}"]
        assert creds(other) == [KEY, f"Bearer {KEY}"]  # not a provider request: not ours
        cg.done()
        assert creds(inflight) == [REDACTED, REDACTED]


async def test_the_option_keeps_the_key():
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        tctx.configure(cg, cg_preset="off", cg_redact_credentials=False)
        f = flow()
        cg.request(f)
        await cg.response(f)
        assert creds(f) == [KEY, f"Bearer {KEY}"]
