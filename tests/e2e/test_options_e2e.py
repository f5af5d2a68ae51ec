"""Size options on a real mitmdump: `cg_max_body_mb` and mitmproxy's own `stream_large_bodies`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.harness import Capture, Proxy, assert_forwarded_unchanged, new_id, received
from tests.support.fakeprovider import FakeProvider

pytestmark = pytest.mark.e2e

MB = 1024 * 1024


@pytest.fixture(scope="module")
def small_proxy(
    provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Proxy]:
    with Proxy.start(
        provider.url,
        tmp_path_factory.mktemp("proxy-small"),
        options=["cg_max_body_mb=1", "stream_large_bodies=3m"],
    ) as p:
        yield p


def _body(size: int) -> bytes:
    head, tail = b'{"model":"m","messages":[{"role":"user","content":"', b'"}]}'
    return head + b"y" * (size - len(head) - len(tail)) + tail


@pytest.mark.parametrize(
    ("size", "reason"),
    [
        (MB // 2, "no components in the pipeline"),
        (2 * MB, "over cg_max_body_mb"),
        (4 * MB, "body streamed"),
    ],
    ids=["under-cap", "over-cg-cap", "streamed-by-mitmproxy"],
)
def test_body_size_options_pass_through_with_reason(small_proxy, provider, size, reason):
    body, eid, capture = _body(size), new_id(), Capture()
    with small_proxy.client(event_hooks=capture.hooks()) as c:
        r = c.post("/v1/messages", content=body, headers={"x-e2e-id": eid})
    assert r.status_code == 200
    got = received(provider, eid)
    assert_forwarded_unchanged(capture.only(), got)
    assert got.body == body
    cg = small_proxy.records.cg(eid)
    assert cg["outcome"] == "passed_through"
    assert reason in cg["reason"]


def test_an_option_given_twice_stops_mitmdump_naming_it(provider, tmp_path):
    """mitmproxy refuses a single-valued option given twice and then drops the script without
    a word, so the proxy ran as plain mitmdump: the addon names the option and its values as
    an error, and mitmdump will not start. A list option (`cg_hosts`) repeated is how it is
    given, and starts."""
    with pytest.raises(RuntimeError) as e:
        Proxy.start(provider.url, tmp_path / "twice", preset="off", options=["cg_preset=codex"])
    log = str(e.value)
    assert "--set cg_preset was given 2 times ('off', 'codex')" in log
    assert "Error logged during startup" in log
    hosts = ["cg_hosts=127.0.0.1", "cg_hosts=localhost"]
    with Proxy.start(provider.url, tmp_path / "list", preset="off", options=hosts) as p:
        assert "given 2 times" not in p.log_text()


def test_a_misspelt_option_stops_mitmdump_naming_the_one_meant(provider, tmp_path):
    """mitmproxy keeps an option no addon claims and says nothing, so `cg_presett=codex` left
    the default preset in force: it is named, with the option meant, and mitmdump will not
    start."""
    with pytest.raises(RuntimeError) as e:
        Proxy.start(provider.url, tmp_path, preset="off", options=["cg_presett=codex"])
    assert "--set cg_presett: no such option (did you mean cg_preset?)" in str(e.value)
    assert "Error logged during startup" in str(e.value)


def test_a_misspelt_environment_variable_stops_mitmdump_naming_the_one_meant(provider, tmp_path):
    """`CHEAP_MODEL_KEY` (for `CHEAP_MODEL_API_KEY`) was read by no one, so a `config`
    summarizer fell back to the process's provider key: named, and mitmdump will not start."""
    with pytest.raises(RuntimeError) as e:
        Proxy.start(provider.url, tmp_path, preset="off", env={"CHEAP_MODEL_KEY": "sk-x"})
    log = str(e.value)
    assert (
        "CHEAP_MODEL_KEY: no such environment variable (did you mean CHEAP_MODEL_API_KEY?)" in log
    )
    assert "Error logged during startup" in log
    assert "sk-x" not in log  # the name, never the value
