"""The agent's credential is used upstream — its turns, the `incoming` summary, the expand round,
the re-send after a 400 — and kept nowhere: not in the SQLite file, the proxy's log, a saved flow
file (`mitmdump -w`), the flows' metadata, the `context-guru` view, or any `/_cg/` endpoint. A
config model's `model.api_key` is write-only in the same way.

Each test first shows the key really went through (the provider received it, the client's own tap
holds it: the search finds a key where there is one), then searches every place.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from mitmproxy import http, io

from cg.proxy.view import RewriteView
from cg.state.sqlite import SqliteStore
from tests.e2e.agents import LOW, start_proxy
from tests.e2e.harness import Proxy, low, start_summarize
from tests.e2e.sdk_agent import API_KEY, SdkAgent, run_scripted
from tests.e2e.sdk_sessions import SdkClient, anthropic_messages
from tests.support.fakeprovider import FakeProvider, anthropic_error

pytestmark = pytest.mark.e2e

CONFIG_KEY = "sk-config-write-only-0042"
# The test's own records of what the client sent (they hold the key by design) and the user's
# own config file (which holds model.api_key): not the addon's.
NOT_THE_ADDONS = {"tap.jsonl", "cg.yaml"}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeProvider]:
    with FakeProvider() as p:
        yield p


def endpoints(proxy: Proxy, db: Path) -> dict[str, bytes]:
    """Every control endpoint's answer, and /_cg/expand for every stash the store holds."""
    out: dict[str, bytes] = {}
    with sqlite3.connect(db) as conn:
        keys = {k for (k,) in conn.execute("SELECT key FROM stashes")}
    conn.close()
    assert keys, "nothing was stashed: the expand endpoint would go unsearched"
    with proxy.client() as c:
        for name in ("health", "stats", "sessions", "nope"):
            out[f"/_cg/{name}"] = c.get(f"/_cg/{name}").content
        for key in keys:
            r = c.get("/_cg/expand", params={"id": key})
            assert r.status_code == 200
            out[f"/_cg/expand?id={key}"] = r.content
    return out


def saved_flows(path: Path, store: Path) -> dict[str, bytes]:
    """Each saved flow's request headers, metadata and `context-guru` view, as text."""
    out: dict[str, bytes] = {}
    st = SqliteStore(store, evict=False)
    view = RewriteView(lambda key: st.get_stash(key))
    try:
        with path.open("rb") as f:
            for n, flow in enumerate(io.FlowReader(f).stream()):
                assert isinstance(flow, http.HTTPFlow)
                out[f"flow {n} headers"] = repr(flow.request.headers.fields).encode()
                out[f"flow {n} metadata"] = json.dumps(flow.metadata, default=str).encode()
                _, lines = view(flow.request.content or b"", flow=flow, http_message=flow.request)
                out[f"flow {n} view"] = json.dumps(list(lines), default=str).encode()
    finally:
        st.close()
    return out


def everything(proxy: Proxy, workdir: Path, flows: Path) -> dict[str, bytes]:
    """Every place the key must not be. Call with the proxy running (endpoints), it is stopped
    here so its files are flushed."""
    found = endpoints(proxy, workdir / "cg.sqlite3")
    proxy.stop()
    found["proxy log"] = proxy.log_text().encode()
    for f in workdir.rglob("*"):
        if f.is_file() and f.name not in NOT_THE_ADDONS:
            found[str(f.relative_to(workdir))] = f.read_bytes()
    found.update(saved_flows(flows, workdir / "cg.sqlite3"))
    assert any(k.startswith("cg.sqlite3") for k in found), sorted(found)
    assert flows.name in found and len(found[flows.name]) > 0
    return found


def assert_nowhere(secret: str, places: dict[str, bytes]) -> None:
    needle = secret.encode()
    hits = [where for where, data in places.items() if needle in data]
    assert hits == [], f"{secret!r} found in {hits}"


@pytest.mark.parametrize("dialect", ["anthropic", "openai"])
async def test_the_agents_key_reaches_the_provider_and_is_kept_nowhere(
    fake, tmp_path, proxies, dialect
):
    flows = tmp_path / "flows.mitm"
    options = [f"save_stream_file={flows}", "termlog_verbosity=debug"]
    proxy = proxies(start_proxy(fake.url, tmp_path, "summarize", LOW, options=options))
    before = len(fake.requests)
    agent = SdkAgent(dialect, is_async=True, stream=True, base_url=proxy.url)
    _, turns = await run_scripted(fake, proxy, tmp_path, agent)
    # The key went everywhere it is meant to: the agent's turns, the summarizer's call, the
    # expand round (each authenticated as the agent).
    got = fake.requests[before:]
    assert any(t.outcome == "rewritten" for t in turns)
    assert any(t.continuation is not None for t in turns)
    summaries = [r for r in got if r.is_summarizer]
    assert summaries
    cred = "x-api-key" if dialect == "anthropic" else "authorization"
    for r in got:
        assert API_KEY in (r.header(cred) or ""), (r.path, r.headers)
    tap = (tmp_path / "tap.jsonl").read_bytes()
    assert API_KEY.encode() in tap  # the search finds the key where it is
    assert_nowhere(API_KEY, everything(proxy, tmp_path, flows))


def test_the_key_of_a_resend_after_a_400_is_kept_nowhere(fake, tmp_path, proxies):
    flows = tmp_path / "flows.mitm"
    key = "sk-resend-kept-nowhere-77"
    proxy = proxies(
        start_summarize(
            fake.url,
            tmp_path,
            {**low(), "model": {"share_cache": "never"}},
            options=[f"save_stream_file={flows}", "termlog_verbosity=debug"],
        )
    )
    with SdkClient(proxy, "anthropic", key=key) as agent:
        c0 = proxy.counts()
        agent.turn(anthropic_messages(agent.session, 7))
        proxy.wait_count(c0, "completed")
        fake.script(anthropic_error(400, "invalid_request_error", "no"))
        t = agent.turn(anthropic_messages(agent.session, 9))
    assert proxy.records.cg(t.eid)["outcome"] == "retried_original"
    resent = [r for r in fake.requests if r.header("x-e2e-id") == t.eid]
    assert len(resent) == 2 and all(r.header("x-api-key") == key for r in resent)
    assert_nowhere(key, everything(proxy, tmp_path, flows))


def test_a_config_models_api_key_is_write_only(fake, tmp_path, proxies):
    with FakeProvider() as cheap:
        flows = tmp_path / "flows.mitm"
        model = {
            "source": "config",
            "provider": "anthropic",
            "base_url": cheap.url,
            "model": "cheap-1",
            "api_key": CONFIG_KEY,
        }
        proxy = proxies(
            start_summarize(
                fake.url,
                tmp_path,
                {**low(), "model": model},
                options=[f"save_stream_file={flows}", "termlog_verbosity=debug"],
            )
        )
        with SdkClient(proxy, "anthropic") as agent:
            c0 = proxy.counts()
            agent.turn(anthropic_messages(agent.session, 7))
            proxy.wait_count(c0, "completed")
            agent.turn(anthropic_messages(agent.session, 9))
        (call,) = cheap.summarizer_requests
        assert call.header("x-api-key") == CONFIG_KEY  # used, where it is meant for
        assert CONFIG_KEY.encode() in (tmp_path / "cg.yaml").read_bytes()
        assert_nowhere(CONFIG_KEY, everything(proxy, tmp_path, flows))
