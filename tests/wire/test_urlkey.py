"""A credential in the query (`?key=`, the Gemini API's) names the tenant as a header's does and
is replaced wherever a URL is shown (cg.wire.urlkey, cg.state.tenant, cg.proxy.redact)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from mitmproxy.test import tflow

from cg.proxy.redact import redact_flow
from cg.state.tenant import ANONYMOUS, fingerprint
from cg.wire.urlkey import REDACTED, query_key, redact_key
from tests.support.strategies import SETTINGS

KEY = "AIzaSyD-not-a-real-key-0123456789"
PATH = f"/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse&key={KEY}"


def test_the_query_key_is_found_and_replaced_and_nothing_else_is() -> None:
    assert query_key(PATH) == KEY
    assert redact_key(PATH) == (
        f"/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse&key={REDACTED}"
    )
    assert query_key("/x?monkey=1&key=") is None
    assert redact_key("/x?monkey=1") == "/x?monkey=1"
    assert redact_key(f"https://h/x?key={KEY}#f") == f"https://h/x?key={REDACTED}#f"


@given(st.text(alphabet=st.characters(blacklist_characters="&#"), min_size=1, max_size=40))
@SETTINGS
def test_no_key_survives_redaction(secret: str) -> None:
    for url in (f"/p?key={secret}", f"/p?a=1&key={secret}&b=2", f"https://h:1/p?key={secret}"):
        assert redact_key(url) == url.replace(f"key={secret}", f"key={REDACTED}")
        assert query_key(url) == secret


def test_a_query_key_is_a_tenant_of_its_own() -> None:
    k = b"k" * 32
    a = fingerprint(k, {}, PATH)
    assert a != ANONYMOUS
    assert a == fingerprint(k, {}, PATH.replace("alt=sse&", ""))  # the key, not the URL
    assert a != fingerprint(k, {}, PATH.replace(KEY, KEY + "x"))
    # The same value in the header is another credential's form: it is told apart.
    assert a != fingerprint(k, {"x-goog-api-key": KEY}, "")
    assert fingerprint(k, {"x-goog-api-key": KEY}, PATH) == fingerprint(k, {"x-goog-api-key": KEY})
    assert fingerprint(k, {}, "/v1beta/models/m:generateContent") == ANONYMOUS


def test_a_finished_flows_key_is_out_of_its_path_and_its_backup() -> None:
    f = tflow.tflow(resp=True)
    f.request.path = PATH
    f.request.headers["x-goog-api-key"] = KEY
    f.backup()
    redact_flow(f)
    assert KEY not in f.request.path and KEY not in f.request.headers["x-goog-api-key"]
    backup: Any = f._backup
    assert isinstance(backup, dict)
    assert KEY.encode() not in backup["request"]["path"]
    assert all(KEY.encode() not in v for _, v in backup["request"]["headers"])
