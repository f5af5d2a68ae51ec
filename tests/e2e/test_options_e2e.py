"""Size options on a real mitmdump: `cg_max_body_mb` and mitmproxy's own `stream_large_bodies`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.harness import Capture, Proxy, assert_forwarded_unchanged, new_id, received
from tests.fakeprovider import FakeProvider

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
