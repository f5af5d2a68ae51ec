"""The turn the proxy tests send the addon with the real `summarize` component (the fixtures
in tests/proxy/conftest.py): Claude Code's fixture, grown past the summarize trigger."""

from __future__ import annotations

import warnings

from mitmproxy import http

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from mitmproxy.test import tflow, tutils

from tests.support.transcripts import CC16, cc_dumps, fixture_body, grow

RAW = cc_dumps(grow(fixture_body(CC16), 3)[-1])


def provider_flow(raw: bytes = RAW) -> http.HTTPFlow:
    """An Anthropic turn of `raw`, with an API key."""
    req = tutils.treq(method=b"POST", path=b"/v1/messages", host="api.anthropic.com", content=raw)
    req.headers["x-api-key"] = "sk-test"
    return tflow.tflow(req=req)
