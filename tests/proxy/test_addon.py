"""cg.proxy.addon: the mitmproxy face — routing, pass-through, control endpoints, options."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from mitmproxy import ctx, exceptions, http

with warnings.catch_warnings():
    # mitmproxy.addons -> proxyauth -> ldap3 touches a name newer pyasn1 deprecates on import.
    warnings.simplefilter("ignore", DeprecationWarning)
    from mitmproxy.test import taddons, tflow, tutils

from cg import components as components_mod
from cg.pipeline.contract import RequestContext, Step
from cg.proxy import view as views
from cg.proxy.addon import (
    BYPASS_HEADER,
    META,
    ContextGuru,
    repeated_options,
    unknown_options,
)
from cg.wire.splice import Insert, Keep, Plan
from tests.support import hooks

MSGS = [
    {"role": "user", "content": "task"},
    {"role": "assistant", "content": "a1"},
    {"role": "user", "content": "u2"},
    {"role": "assistant", "content": "a3"},
    {"role": "user", "content": "now ☃"},
]
BODY = json.dumps({"model": "claude", "max_tokens": 9, "messages": MSGS}, indent=2).encode()
SUMMARY = {"role": "user", "content": "=== History Summary === <<cg:x>>"}
REWRITTEN = {"model": "claude", "max_tokens": 9, "messages": [MSGS[0], SUMMARY, MSGS[4]]}


class Toy:
    """Keeps the first and last message and puts a summary between them."""

    name = "toy"
    calls = 0

    def __init__(self, config: dict[str, Any]) -> None:
        self.role = config.get("role", "user")

    def apply(self, req: RequestContext, plan: Plan) -> Step:
        index = req.index
        Toy.calls += 1
        n = len(index.messages)
        summary = Insert.message({**SUMMARY, "role": self.role}, index.dialect)
        return Step([Keep(0), summary, Keep(n - 1)], "summarized")


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default store lives under ~: keep every test's store in its own tmp_path."""
    monkeypatch.setenv("HOME", str(tmp_path))


@pytest.fixture
def toy_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A cg_config file whose pipeline is the toy component, registered for this test only."""
    monkeypatch.setitem(components_mod.COMPONENTS, "toy", lambda raw, services: Toy(dict(raw)))
    Toy.calls = 0
    path = tmp_path / "cg.yaml"
    path.write_text("pipeline: [toy]\n", encoding="utf-8")
    yield str(path)


def make_flow(
    path: str = "/v1/messages",
    content: bytes | None = BODY,
    method: str = "POST",
    host: str = "api.anthropic.com",
    peer: tuple[Any, ...] = ("127.0.0.1", 50000),
    headers: dict[str, str] | None = None,
) -> http.HTTPFlow:
    req = tutils.treq(method=method.encode(), path=path.encode(), host=host, content=content)
    for k, v in (headers or {}).items():
        req.headers[k] = v
    f = tflow.tflow(req=req)
    f.client_conn.peername = peer
    return f


def setup(tctx: taddons.context, cg: ContextGuru, **options: Any) -> None:
    tctx.configure(cg, cg_preset="off", **options)


# -- pass-through ----------------------------------------------------------------------------


async def test_off_preset_passes_the_same_bytes_and_records_why() -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg)
        f = make_flow()
        raw = f.request.raw_content
        headers = list(f.request.headers.fields)
        cg.request(f)
        assert f.request.raw_content is raw
        assert list(f.request.headers.fields) == headers  # no header added
        rec = f.metadata[META]
        assert (rec["outcome"], rec["reason"], rec["dialect"]) == (
            "passed_through",
            "no components in the pipeline",
            "anthropic",
        )
        assert rec["messages_in"] == 5 and "hook" in rec["timings_ms"]
        assert f.response is None and not f.marked
        assert (cg.stats.requests, cg.stats.passed_through, cg.stats.rewritten) == (1, 1, 0)


@pytest.mark.parametrize(
    ("value", "skipped"),
    [("conv one", True), ("x" * 129, True), (" conv-1 ", False)],
)
async def test_a_session_header_that_is_no_usable_id_is_said_not_lost_unseen(
    value: str, skipped: bool
) -> None:
    """`x-context-guru-session: conv one` (a space) is not an allow-listed id: the session falls
    to the next source, and the record and mitmweb's view say which header was not used."""
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg)
        f = make_flow(headers={"x-context-guru-session": value})
        cg.request(f)
        rec, view = f.metadata[META], f.metadata[views.RECORD]
        lines = ["".join(str(t) for _, t in line) for line in views.header_lines(view)]
        said = [line for line in lines if "not a usable session id" in line]
        assert view["session"] == rec["session"]  # under `off` too: the ledger books under it
        assert f"session {rec['session']}, preset off" in lines[1]
        if skipped:
            assert rec["session"].startswith("h:")  # the head hash, the next source here
            assert rec["session_skipped"] == view["session_skipped"] == ["x-context-guru-session"]
            assert said == [
                "  not a usable session id, so not used: x-context-guru-session (ASCII letters, "
                "digits and ._:-, 1 to 128 characters)"
            ]
        else:
            assert rec["session"] == "conv-1"
            assert "session_skipped" not in rec and "session_skipped" not in view and not said


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/messages"),
        ("POST", "/v1/messages/count_tokens"),
        ("POST", "/v1/messages/batches"),
        ("POST", "/v1/models"),
        ("POST", "/_cg"),
        ("POST", "/v1/embeddings"),
    ],
)
async def test_non_provider_requests_are_not_touched(
    method: str, path: str, toy_config: str
) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg, cg_config=toy_config)
        f = make_flow(path=path, method=method)
        raw = f.request.raw_content
        cg.request(f)
        assert META not in f.metadata
        assert f.request.raw_content is raw and f.response is None
        assert cg.stats.requests == 0 and Toy.calls == 0


async def test_malformed_json_passes_through_with_a_reason() -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg)
        f = make_flow(path="/v1/chat/completions", content=b'{"messages": [')
        cg.request(f)
        assert f.request.raw_content == b'{"messages": ['
        rec = f.metadata[META]
        assert rec["outcome"] == "passed_through" and "malformed JSON" in rec["reason"]
        assert rec["dialect"] == "openai"


# -- rewriting through the hook --------------------------------------------------------------


async def test_a_rewrite_replaces_the_body_once_and_marks_the_flow(toy_config: str) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg, cg_config=toy_config)
        assert [c.name for c in cg.components] == ["toy"]
        f = make_flow(path="/v1/messages?beta=true")
        cg.request(f)
        assert Toy.calls == 1
        assert json.loads(f.request.content or b"") == REWRITTEN
        assert f.request.headers["content-length"] == str(len(f.request.raw_content or b""))
        rec = f.metadata[META]
        assert rec["outcome"] == "rewritten"
        assert f.marked == ":scissors:" and f.comment == "cg: rewritten 5→3 messages"
        assert cg.stats.rewritten == 1


@pytest.mark.parametrize("master", ["WebMaster", "DumpMaster"])
async def test_a_backup_for_revert_is_taken_only_where_a_ui_can_revert(
    master: str, toy_config: str
) -> None:
    """mitmweb (and the console) can Revert a rewritten flow; mitmdump has no UI, so it skips
    the backup (a flow it saves would hold the client's body twice)."""
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg, cg_config=toy_config)
        with mock.patch.object(ctx, "master", type(master, (), {})()):
            cg.running()
        await asyncio.gather(*cg._bg)  # the relay started: close it
        cg.relay.close()
        f = make_flow()
        original = f.request.raw_content
        cg.request(f)
        assert f.metadata[META]["outcome"] == "rewritten"  # vacuity: the body was replaced
        if master == "DumpMaster":
            assert not f.modified()
        else:
            assert f.modified()
            f.revert()
            assert f.request.raw_content == original


async def test_a_violating_rewrite_fails_open(tmp_path: Path, toy_config: str) -> None:
    Path(toy_config).write_text("pipeline: [toy]\ncomponents:\n  toy: {role: system}\n")
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg, cg_config=toy_config)
        f = make_flow()
        raw = f.request.raw_content
        cg.request(f)
        assert Toy.calls == 1
        assert f.request.raw_content is raw
        rec = f.metadata[META]
        assert rec["outcome"] == "failed_open"
        assert rec["violations"][0]["rule"] == "system-position"
        assert f.marked == ":warning:" and f.comment.startswith("cg: failed open: ")
        assert cg.stats.failed_open == 1


async def test_gzip_body_is_decoded_rewritten_and_reencoded(toy_config: str) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg, cg_config=toy_config)
        f = make_flow(content=gzip.compress(BODY), headers={"content-encoding": "gzip"})
        cg.request(f)
        assert f.metadata[META]["outcome"] == "rewritten"
        assert f.request.headers["content-encoding"] == "gzip"
        assert json.loads(gzip.decompress(f.request.raw_content or b"")) == REWRITTEN


async def test_gzip_body_passes_through_as_the_same_bytes() -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg)
        f = make_flow(content=gzip.compress(BODY), headers={"content-encoding": "gzip"})
        raw = f.request.raw_content
        cg.request(f)
        assert f.metadata[META]["outcome"] == "passed_through"
        assert f.metadata[META]["messages_in"] == 5  # it was decoded and read
        assert f.request.raw_content is raw


@pytest.mark.parametrize("encoding", ["gzip", "x-unheard-of"])
async def test_undecodable_body_passes_through(encoding: str, toy_config: str) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg, cg_config=toy_config)
        f = make_flow(content=b"not really compressed", headers={"content-encoding": encoding})
        cg.request(f)
        rec = f.metadata[META]
        assert rec["outcome"] == "passed_through" and "cannot decode body" in rec["reason"]
        assert f.request.raw_content == b"not really compressed" and Toy.calls == 0


async def test_streamed_body_passes_through(toy_config: str) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg, cg_config=toy_config)
        f = make_flow(content=None)
        assert f.request.raw_content is None
        cg.request(f)
        assert f.metadata[META]["reason"] == "body streamed" and Toy.calls == 0


# -- bypass, hosts, size cap -----------------------------------------------------------------


@pytest.mark.parametrize("value", [" 1 ", "true", "True", "yes", "ON"])
async def test_bypass_header(value: str, toy_config: str) -> None:
    """`1` is documented; `true`, `yes` and `on` are what people write for it."""
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg, cg_config=toy_config)
        f = make_flow(headers={BYPASS_HEADER: value})
        raw = f.request.raw_content
        cg.request(f)
        assert f.metadata[META]["outcome"] == "bypassed"
        assert f.metadata[META]["reason"] == f"{BYPASS_HEADER}: {value.strip()}"
        assert f.request.raw_content is raw and Toy.calls == 0
        assert cg.stats.bypassed == 1
        for off in ("0", "false", "no", ""):
            f2 = make_flow(headers={BYPASS_HEADER: off})
            cg.request(f2)
            assert f2.metadata[META]["outcome"] == "rewritten", off
            assert BYPASS_HEADER in f2.request.headers  # the addon adds and removes nothing


@pytest.mark.parametrize(
    ("hosts", "host", "touched"),
    [
        (["api.anthropic.com"], "api.anthropic.com", True),
        (["api.anthropic.com"], "api.openai.com", False),
        (["*.openai.com"], "api.openai.com", True),
        (["*.openai.com"], "openai.com", False),
        ([], "localhost", True),
    ],
)
async def test_cg_hosts_restricts_which_hosts_are_touched(
    hosts: list[str], host: str, touched: bool, toy_config: str
) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg, cg_config=toy_config, cg_hosts=hosts)
        f = make_flow(host=host)
        raw = f.request.raw_content
        cg.request(f)
        assert (META in f.metadata) is touched
        assert (f.request.raw_content is raw) is not touched
        assert cg.stats.requests == int(touched)


async def test_cg_hosts_takes_a_comma_list_as_set_on_the_command_line(toy_config: str) -> None:
    """`--set cg_hosts=a,b` reaches the addon as the one entry "a,b"."""
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg, cg_config=toy_config, cg_hosts=["api.anthropic.com, *.openai.com"])
        for host, touched in [
            ("api.anthropic.com", True),
            ("api.openai.com", True),
            ("x.io", False),
        ]:
            f = make_flow(host=host)
            cg.request(f)
            assert (META in f.metadata) is touched, host


async def test_cg_hosts_matches_the_host_name_not_the_address_connected_to(
    toy_config: str,
) -> None:
    """Transparent/local mode (and a CONNECT tunnel) set `request.host` to the address the
    connection went to; the provider's name is in the Host header."""
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg, cg_config=toy_config, cg_hosts=["api.anthropic.com"])
        f = make_flow(host="160.79.104.10", headers={"host": "api.anthropic.com"})
        cg.request(f)
        assert f.metadata[META]["dialect"] == "anthropic"
        other = make_flow(host="160.79.104.10", headers={"host": "api.openai.com"})
        cg.request(other)
        assert META not in other.metadata


async def test_body_size_cap(toy_config: str) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg, cg_config=toy_config, cg_max_body_mb=0)
        f = make_flow()
        raw = f.request.raw_content
        cg.request(f)
        rec = f.metadata[META]
        assert rec["outcome"] == "passed_through" and "over cg_max_body_mb" in rec["reason"]
        assert f.request.raw_content is raw and Toy.calls == 0


@pytest.mark.parametrize(("extra", "over"), [(0, False), (1, True)])
async def test_body_size_cap_boundary(extra: int, over: bool, toy_config: str) -> None:
    mib = 1024 * 1024
    pad = mib - len(json.dumps({"pad": "", "messages": MSGS}).encode()) + extra
    raw = json.dumps({"pad": "x" * pad, "messages": MSGS}).encode()
    assert len(raw) == mib + extra
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg, cg_config=toy_config, cg_max_body_mb=1)
        f = make_flow(content=raw)
        await hooks.request(cg, f)  # (1 MiB, cold: read in the worker thread)
        assert (f.metadata[META]["outcome"] == "passed_through") is over
        assert Toy.calls == int(not over)


# -- control endpoints -----------------------------------------------------------------------


def _json(f: http.HTTPFlow) -> Any:
    assert f.response is not None
    return json.loads(f.response.content or b"")


@pytest.mark.parametrize(
    "peer",
    [("127.0.0.1", 1), ("127.8.9.10", 1), ("::1", 1, 0, 0), ("::ffff:127.0.0.1", 1, 0, 0)],
)
async def test_health_answers_loopback_clients(peer: tuple[Any, ...]) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg)
        f = make_flow(path="/_cg/health", method="GET", host="anything.example", peer=peer)
        cg.request(f)
        assert f.response is not None and f.response.status_code == 200
        assert f.response.headers["content-type"] == "application/json"
        body = _json(f)
        assert body["ok"] is True and body["preset"] == "off"
        assert META not in f.metadata and cg.stats.requests == 0


@pytest.mark.parametrize("peer", [("203.0.113.9", 1), ("10.0.0.2", 1), ("2001:db8::1", 1, 0, 0)])
async def test_control_refuses_remote_clients_unless_allowed(peer: tuple[Any, ...]) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg)
        f = make_flow(path="/_cg/health", method="GET", peer=peer)
        cg.request(f)
        assert f.response is not None and f.response.status_code == 403
        assert "loopback" in _json(f)["error"]
        tctx.configure(cg, cg_control_remote=True)
        f2 = make_flow(path="/_cg/health", method="GET", peer=peer)
        cg.request(f2)
        assert f2.response is not None and f2.response.status_code == 200


async def test_stats_endpoint_counts_requests() -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg)
        cg.request(make_flow())
        cg.request(make_flow(headers={BYPASS_HEADER: "1"}))
        f = make_flow(path="/_cg/stats?x=1", method="GET")
        pending = cg.request(f)
        assert pending is not None  # the ledger's totals are read off the loop
        await pending
        stats = _json(f)
        for key in (
            "requests",
            "rewritten",
            "passed_through",
            "failed_open",
            "retried_original",
            "tokens_before",
            "tokens_after",
        ):
            assert key in stats
        assert set(stats["summaries"]) >= {
            "commissioned",
            "completed",
            "failed",
            "timed_out",
            "reused",
        }
        assert (stats["requests"], stats["passed_through"], stats["bypassed"]) == (2, 1, 1)


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("GET", "/_cg/nope", 404), ("POST", "/_cg/health", 405), ("HEAD", "/_cg/health", 200)],
)
async def test_control_errors(method: str, path: str, status: int) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg)
        f = make_flow(path=path, method=method)
        cg.request(f)
        assert f.response is not None and f.response.status_code == status


# -- streaming responses ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "content_type", "streamed"),
    [
        ("/v1/messages", "text/event-stream; charset=utf-8", True),
        ("/v1/messages", "application/json", False),
        ("/v1/models", "text/event-stream", False),
    ],
)
async def test_sse_responses_of_provider_flows_stream(
    path: str, content_type: str, streamed: bool
) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg)
        f = make_flow(path=path)
        cg.request(f)
        f.response = tutils.tresp(headers=http.Headers(content_type=content_type))
        cg.responseheaders(f)
        assert bool(f.response.stream) is streamed


# -- options ---------------------------------------------------------------------------------


async def test_unknown_preset_is_refused_naming_the_option() -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg)
        with pytest.raises(exceptions.OptionsError, match="cg_preset: unknown preset 'nope'"):
            tctx.configure(cg, cg_preset="nope")
        assert tctx.options.cg_preset == "off"  # rolled back


@pytest.mark.parametrize(
    ("yaml_text", "fragment"),
    [
        ("pipelin: [toy]\n", "pipelin"),
        ("store:\n  ttl_hours: -1\n", "store.ttl_hours"),
        ("pipeline: [ghost]\n", "unknown component 'ghost'"),
        ("pipeline: [\n", "not valid YAML"),
    ],
)
async def test_bad_config_file_is_refused_naming_the_key(
    tmp_path: Path, yaml_text: str, fragment: str, toy_config: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml_text, encoding="utf-8")
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg, cg_config=toy_config)
        with pytest.raises(exceptions.OptionsError) as e:
            tctx.configure(cg, cg_config=str(bad))
        assert fragment in str(e.value)
        assert [c.name for c in cg.components] == ["toy"]  # the good config stays in force


async def test_a_cg_hosts_entry_no_host_name_equals_is_refused_naming_it(toy_config: str) -> None:
    """A URL in `cg_hosts` would match no request's Host, so every request would pass through
    untouched without a word: refused, and the hosts in force stay as they were."""
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg, cg_config=toy_config, cg_hosts=["api.anthropic.com"])
        with pytest.raises(exceptions.OptionsError, match=r"'https://api\.openai\.com' is not a"):
            tctx.configure(cg, cg_hosts=["https://api.openai.com"])
        assert cg.hosts == ("api.anthropic.com",)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("CHEAP_MODEL_KEY", "CHEAP_MODEL_KEY: no such environment variable (did you mean "
         "CHEAP_MODEL_API_KEY?)"),
        ("CONTEXT_GURU_SUMMARIZE_TIMEOUT_S", "CONTEXT_GURU_SUMMARIZE_TIMEOUT_S: no such "
         "environment variable (did you mean CONTEXT_GURU_SUMMARIZE_TIMEOUT?)"),
    ],
)  # fmt: skip
async def test_a_misspelt_environment_variable_is_refused_naming_the_one_meant(
    name: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read by name, a misspelt variable was silent: `CHEAP_MODEL_KEY` left a config model on
    the process's provider key, `…_TIMEOUT_S` the default timeout."""
    monkeypatch.setenv(name, "1")
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        with pytest.raises(exceptions.OptionsError) as e:
            setup(tctx, cg)
        assert str(e.value) == message
        monkeypatch.delenv(name)
        setup(tctx, cg)  # the same options, the variable gone: accepted
        assert cg.preset == "off"


@pytest.mark.parametrize(
    ("preset", "config", "warned"),
    [
        ("summarize", None, True),  # model.source: incoming (the default)
        ("auto", None, True),  # claude-code, codex, opencode, summarize: all incoming
        ("summarize", {"model": {"source": "config", "provider": "anthropic"}}, False),
        ("off", None, False),  # nothing summarizes: no model of any kind is used
    ],
)
async def test_a_cheap_model_no_summarizer_reads_is_named(
    preset: str,
    config: dict[str, Any] | None,
    warned: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`CHEAP_MODEL` set while every summarizer in force takes the incoming request's model:
    the summaries are the agent's model's, at its price, and the user is told so."""
    monkeypatch.setenv("CHEAP_MODEL", "claude-haiku-4-5")
    monkeypatch.setenv("CHEAP_MODEL_API_KEY", "sk-cheap")
    options: dict[str, Any] = {"cg_preset": preset, "cg_db": str(tmp_path / "cg.sqlite3")}
    if config is not None:
        cfg = tmp_path / "cg.yaml"
        cfg.write_text(json.dumps({"components": {"summarize": config}}), encoding="utf-8")
        options["cg_config"] = str(cfg)
    cg = ContextGuru()
    with taddons.context(cg) as tctx, caplog.at_level(logging.WARNING, "context_guru"):
        tctx.configure(cg, **options)
        cg.done()
    told = [r.getMessage() for r in caplog.records if "set but not used" in r.getMessage()]
    assert bool(told) is warned
    if warned:
        assert told[0].startswith("context-guru: CHEAP_MODEL, CHEAP_MODEL_API_KEY set but")
        assert "sk-cheap" not in told[0]  # names, never values
    if preset != "off":  # vacuity: the preset in force does summarize
        assert any(c.name == "summarize" for c in cg.components)


async def test_missing_config_file_is_refused(tmp_path: Path) -> None:
    cg = ContextGuru()
    with (
        taddons.context(cg) as tctx,
        pytest.raises(exceptions.OptionsError, match="cg_config: cannot read"),
    ):
        tctx.configure(cg, cg_config=str(tmp_path / "absent.yaml"))


async def test_warm_sessions_sizes_the_message_cache_and_refuses_zero() -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg)
        assert cg.cache.max_lists == 16
        tctx.configure(cg, cg_warm_sessions=64)
        assert cg.cache.max_lists == 64
        assert cg.meter.ledger is not None and cg.meter.ledger._sent.max_lists == 64
        with pytest.raises(exceptions.OptionsError, match="cg_warm_sessions"):
            tctx.configure(cg, cg_warm_sessions=0)
        assert cg.cache.max_lists == 64  # the refused value changed nothing


async def test_mitmproxys_upstream_tls_settings_reach_our_own_calls_at_run_time() -> None:
    """`ssl_insecure` changed after start (no cg_ option with it) still reaches the
    summarizer's pool, the relay's continuation pool and the relay's HTTP/1.1 pool."""
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg)
        assert (cg.pool.verify, cg.relay_pool.verify, cg.relay.h1.verify) == (True, True, True)
        tctx.configure(cg, ssl_insecure=True)
        assert (cg.pool.verify, cg.relay_pool.verify, cg.relay.h1.verify) == (False, False, False)


async def test_negative_body_cap_is_refused() -> None:
    cg = ContextGuru()
    with (
        taddons.context(cg) as tctx,
        pytest.raises(exceptions.OptionsError, match="cg_max_body_mb"),
    ):
        tctx.configure(cg, cg_max_body_mb=-1)


def test_a_relayed_requests_text_is_decoded_only_when_asked() -> None:
    """The relay's continuation reads the request as `get_content(strict=False)` would: a
    gzip body decoded, an unreadable encoding left as sent (the text is made lazily, off the
    relayed turn's hot path)."""
    import gzip

    from cg.proxy.addon import _request_text

    body = '{"messages": [{"role": "user", "content": "café"}]}'.encode()
    assert _request_text(gzip.compress(body), "gzip") == body.decode()
    assert _request_text(body, None) == body.decode()
    assert _request_text(body, "identity") == body.decode()
    assert _request_text(body, "x-unknown") == body.decode()


def test_the_allocator_is_tuned_once_on_glibc_and_says_why_not_elsewhere() -> None:
    """`cg_tune_malloc`: mallopt is called once per process on glibc; elsewhere a reason."""
    import platform

    from cg.proxy import malloc

    first = malloc.tune()
    assert malloc.tune() == first  # once: the second call changes nothing
    if platform.libc_ver()[0] == "glibc":
        assert first is None, first
    else:
        assert first is not None


def test_repeated_options_are_our_single_valued_ones_given_twice() -> None:
    """Read from mitmproxy's own deferred `--set`s: ours given more than once, with their
    values; a list option repeated, another addon's option, or one given once is not."""
    from mitmproxy import options

    opts = options.Options()
    opts.set(
        "cg_preset=off", "cg_preset=codex", "cg_db=a", "cg_hosts=x", "cg_hosts=y",
        "other_addon=1", "other_addon=2", defer=True,
    )  # fmt: skip
    # As in the addon's `load`: its options added, the `--set`s not yet applied to them.
    opts.add_option("cg_preset", str, "auto", "")
    opts.add_option("cg_hosts", Sequence[str], [], "")  # a list option, as the addon's
    assert {"cg_preset", "cg_hosts"} <= set(opts.deferred)  # the state asked about
    assert repeated_options(opts) == [("cg_preset", ["off", "codex"])]
    assert repeated_options(options.Options()) == []


def test_unknown_options_are_cg_options_no_addon_of_ours_registered() -> None:
    """A misspelt `cg_` option stays deferred (mitmproxy waits for an addon to claim it, and
    never says so): it is named with the closest of ours; another addon's option is not ours
    to judge, and one of ours given is not unknown."""
    from mitmproxy import options

    opts = options.Options()
    opts.add_option("cg_preset", str, "auto", "")
    opts.add_option("cg_db", str, "", "")
    opts.set("cg_presett=off", "cg_preset=off", "cg_zzz=1", "other_addon=1", defer=True)
    assert sorted(unknown_options(opts)) == [("cg_presett", "cg_preset"), ("cg_zzz", None)]
