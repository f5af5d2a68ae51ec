"""Codex through `mitmdump -s cg_addon.py` as a regular HTTPS proxy with TLS interception: its
model provider keeps the real `base_url` (https://api.openai.com/v1), Codex gets `HTTPS_PROXY`
and trusts mitmproxy's CA through `CODEX_CA_CERTIFICATE`.

Nothing leaves the machine: as in tests/e2e/test_regular_proxy_e2e.py the fake provider serves
api.openai.com over TLS on 127.0.0.1 with a certificate from a throwaway CA that mitmproxy
trusts, and the tap's route connects mitmproxy to it, SNI and Host unchanged.

These need the `responses` dialect (the decision records, summarizing).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.agents import LOW, start_proxy
from tests.e2e.codex_sessions import (
    NEEDS_RESPONSES,
    assert_codex_expanded_once,
    assert_codex_summarized,
    codex_steps,
    drive_codex,
)
from tests.e2e.harness import Proxy
from tests.e2e.pki import Pki, make_pki
from tests.e2e.test_regular_proxy_e2e import hosts, mitm_ca
from tests.support.codex_script import CodexScript
from tests.support.fakeprovider import FakeProvider

pytestmark = [pytest.mark.e2e, pytest.mark.slow, NEEDS_RESPONSES]

HOST = "api.openai.com"
BASE_URL = f"https://{HOST}/v1"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), [HOST])


@pytest.fixture(scope="module")
def fake(pki: Pki) -> Iterator[FakeProvider]:
    with FakeProvider(tls=pki.server_context()) as p:
        yield p


def start_regular(
    fake: FakeProvider, pki: Pki, workdir: Path, preset: str = "auto", **kw: Any
) -> Proxy:
    options = [
        f"tap_route={HOST}=127.0.0.1:{fake.port}",
        f"ssl_verify_upstream_trusted_ca={pki.ca}",
        f"cg_hosts={HOST}",
    ]
    return start_proxy("", workdir, preset, options=options, mode="regular", **kw)


def codex_env(proxy: Proxy) -> dict[str, str]:
    return {"HTTPS_PROXY": proxy.url, "CODEX_CA_CERTIFICATE": str(mitm_ca(proxy))}


def test_codex_through_https_proxy_default_preset_byte_identical(
    codex, fake, pki, tmp_path, proxies
):
    proxy = proxies(start_regular(fake, pki, tmp_path / "proxy"))
    script = CodexScript(f"CG-{tmp_path.name}", codex_steps(5))
    s = drive_codex(
        codex, fake, proxy, tmp_path / "codex", script, base_url=BASE_URL, env=codex_env(proxy)
    )
    assert s.run.final_message == script.final_text
    assert [t.outcome for t in s.turns] == ["passed_through"] * 6
    assert all(t.cg["dialect"] == "responses" for t in s.turns)  # decided: cg_hosts matched
    assert hosts(proxy) == {HOST}  # everything it sent went through the proxy
    assert all(t.got.header("host") == HOST for t in s.turns)
    assert proxy.stats()["summaries"]["commissioned"] == 0


def test_codex_through_https_proxy_is_summarized_reused_and_expanded(
    codex, fake, pki, tmp_path, proxies
):
    proxy = proxies(start_regular(fake, pki, tmp_path / "proxy", preset="summarize", summarize=LOW))
    script = CodexScript(f"CG-{tmp_path.name}", codex_steps(10), expand=True)
    s = drive_codex(
        codex,
        fake,
        proxy,
        tmp_path / "codex",
        script,
        base_url=BASE_URL,
        env=codex_env(proxy),
        settle=True,
    )
    assert s.run.final_message == script.final_text
    assert hosts(proxy) == {HOST}
    assert_codex_summarized(s.turns, proxy)
    assert_codex_expanded_once(s, proxy)
