"""A proxy that says what it does, through a real `mitmdump -s cg_addon.py`
(docs/control.md "What the proxy says"):

- the start-up block: preset, store, listening address, dashboard URL (which answers);
- one line per turn: `passed`, `commissioned`, `rewritten N→M tokens`; none under `cg_quiet`;
  and no httpx INFO line although the summarizer's calls went through httpx;
- a store that cannot be opened: the proxy serves (`serving`), passing through, `ok` false
  with the store's error, said loudly at start;
- a config error (a preset, a `--set` value, a YAML key) as one line naming the key;
- `/_cg/stats` after a restart on an existing ledger: this process's figures at the top, the
  whole ledger's under `ledger`, in the JSON, the CLI and the dashboard;
- `/_cg/metrics` parsed by prometheus-client's own parser, agreeing with `/_cg/stats`, and
  refused without the control token as every control endpoint is.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from cg.cli import main as cli
from tests.e2e.harness import MITMDUMP, REPO, Proxy, hermetic, low, poll, start_summarize
from tests.e2e.sdk_sessions import SdkClient, anthropic_messages
from tests.support.fakeprovider import FakeProvider, Reply

pytestmark = pytest.mark.e2e

LOW = low(resummarize_tokens=200)
USAGE = {"input_tokens": 30, "cache_read_input_tokens": 900, "output_tokens": 12}
MSGS = [{"role": "user", "content": "hello"}]


def wait_log(proxy: Proxy, pattern: str, timeout: float = 10.0) -> list[str]:
    """The log lines matching `pattern`, once there is one."""
    rx = re.compile(pattern)
    for _ in poll(timeout):
        found = [x for x in proxy.log if rx.search(x)]
        if found:
            return found
    raise TimeoutError(f"no log line matched {pattern!r}:\n{proxy.log_text()}")


def metrics(proxy: Proxy) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """`/_cg/metrics` parsed: sample name → {sorted labels: value}."""
    with proxy.client(timeout=5.0) as c:
        r = c.get("/_cg/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


@pytest.fixture(scope="module")
def sproxy(provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory) -> Any:
    with start_summarize(provider.url, tmp_path_factory.mktemp("observe"), LOW) as p:
        yield p


def test_the_start_up_block_names_preset_store_address_and_dashboard(sproxy: Proxy, provider):
    head = wait_log(sproxy, r"context-guru \S+: preset summarize$")
    at = sproxy.log.index(head[0])
    block = sproxy.log[at : at + 5]
    args = sproxy.proc.args
    assert isinstance(args, list)
    db = next(str(o) for o in args if str(o).startswith("cg_db=")).partition("=")[2]
    assert block[1] == f"  store      sqlite {db}"
    assert block[2] == f"  listening  127.0.0.1:{sproxy.port}, reverse to {provider.url}"
    url = f"http://127.0.0.1:{sproxy.port}/_cg/"
    assert block[3].startswith(f"  dashboard  {url} ")
    assert "cg_quiet" in block[4]
    with httpx.Client(trust_env=False, timeout=10) as c:
        assert c.get(url).status_code == 200  # the URL it gave answers: the dashboard


def test_each_turn_logs_one_line_and_httpx_logs_none(sproxy: Proxy, provider):
    session = uuid.uuid4().hex
    short = session[:8]
    before = sproxy.counts()
    with SdkClient(sproxy, "anthropic", session=session, breakpoint=True) as agent:
        agent.turn(anthropic_messages(session, 3))  # under min_messages: passed
        agent.turn(anthropic_messages(session, 7))  # commissions a summary
        sproxy.wait_count(before, "completed")  # the summarizer's call, made through httpx
        t3 = agent.turn(anthropic_messages(session, 9))  # the summary spliced: rewritten
    lines = wait_log(sproxy, rf"context-guru {short} .*: rewritten ")
    mine = [x for x in sproxy.log if f"context-guru {short} " in x]
    assert len(mine) == 3, mine  # one line per turn
    assert re.search(rf"context-guru {short} anthropic summarize: passed \(", mine[0]), mine
    assert re.search(r": commissioned a summary of messages \d+–\d+$", mine[1]), mine
    assert re.search(r": rewritten [\d,]+→[\d,]+ tokens \(9→\d+ messages\)", lines[0]), mine
    got = re.search(r"rewritten ([\d,]+)→([\d,]+) tokens", lines[0])
    assert got is not None
    acted = [c for c in sproxy.records.cg(t3.eid)["components"] if c.get("acted")]
    assert [int(got[1].replace(",", "")), int(got[2].replace(",", ""))] == [
        acted[-1]["tokens"],
        acted[-1]["tokens_after"],
    ]  # the tokens the decision record gives, as mitmweb's comment shows them
    assert not [x for x in sproxy.log if "HTTP Request:" in x or "httpx" in x]


def test_cg_quiet_silences_the_block_and_the_turn_lines(provider, tmp_path: Path):
    p = Proxy.start(provider.url, tmp_path, options=["cg_quiet=true"])
    with p:
        provider.script(Reply(usage=USAGE))
        with SdkClient(p, "anthropic") as client:
            eid = client.call(model="claude-sonnet-5-5", max_tokens=9, messages=MSGS).eid
        assert p.records.cg(eid)["outcome"] == "passed_through"  # the turn was intercepted
    text = p.log_text()  # (stopped: the whole log is read)
    assert "listening at" in text
    assert "context-guru" not in text, text


def test_a_store_that_cannot_open_serves_and_says_so(provider, tmp_path: Path):
    broken = tmp_path / "a-directory"
    broken.mkdir()
    with Proxy.start(provider.url, tmp_path, preset="summarize", options=[f"cg_db={broken}"]) as p:
        with p.client(timeout=5.0) as c:
            health = c.get("/_cg/health").json()
        assert health["serving"] is True and health["ok"] is False
        assert health["mode"] and health["mode"][0].startswith("reverse:")
        assert health["store"]["ok"] is False and str(broken) in health["store"]["error"]
        assert "passing every request through" in health["error"]
        loud = wait_log(p, r"^  STORE      UNAVAILABLE: ")
        assert str(broken) in loud[0]
        provider.script(Reply(usage=USAGE))
        with SdkClient(p, "anthropic") as client:
            eid = client.call(model="claude-sonnet-5-5", max_tokens=9, messages=MSGS).eid
        cg = p.records.cg(eid)
        assert cg["outcome"] == "passed_through" and "store is unavailable" in cg["reason"]
        assert metrics(p)["context_guru_store_up"][()] == 0.0


def _mitmdump(tmp_path: Path, *sets: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(MITMDUMP), "--listen-host", "127.0.0.1", "--listen-port", "0"]
    cmd += ["-s", str(REPO / "cg_addon.py"), "--set", f"confdir={tmp_path / 'conf'}"]
    for s in sets:
        cmd += ["--set", s]
    env = {k: v for k, v in os.environ.items() if not hermetic(k)}
    return subprocess.run(
        cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("cg_preset=nosuch", "cg_preset: unknown preset 'nosuch'"),
        ("cg_max_body_mb=lots", "--set cg_max_body_mb=lots: Not an integer"),
        ("cg_config={bad}", "min_tokenz: Extra inputs are not permitted (got 3) (did you mean min_tokens?)"),
    ],
)  # fmt: skip
def test_a_config_error_is_one_line_naming_the_key(tmp_path: Path, given: str, says: str):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"components": {"summarize": {"min_tokenz": 3}}}))
    done = _mitmdump(tmp_path, given.format(bad=bad))
    out = (done.stdout + done.stderr).splitlines()
    assert done.returncode != 0, out  # refused: the proxy does not run on a bad config
    ours = [x for x in out if "context-guru" in x]
    assert len(ours) == 1 and says in ours[0], out
    assert not [x for x in out if "Traceback" in x or x.startswith(("  File", "    "))], out
    listening = [i for i, x in enumerate(out) if "listening at" in x]
    assert not listening or out.index(ours[0]) < listening[0], out


def test_stats_after_a_restart_are_this_processes_with_the_ledger_apart(
    provider, tmp_path: Path, capsys
):
    db = tmp_path / "cg.sqlite3"
    with Proxy.start(provider.url, tmp_path / "one", options=[f"cg_db={db}"]) as first:
        provider.script(Reply(usage=USAGE), Reply(usage=USAGE))
        with SdkClient(first, "anthropic") as client:
            for _ in range(2):
                client.call(model="claude-sonnet-5-5", max_tokens=9, messages=MSGS)
        assert first.stats()["usage"]["agent"]["requests"] == 2
    with Proxy.start(provider.url, tmp_path / "two", options=[f"cg_db={db}"]) as second:
        provider.script(Reply(usage=USAGE))
        with SdkClient(second, "anthropic") as client:
            client.call(model="claude-sonnet-5-5", max_tokens=9, messages=MSGS)
        s = second.wait_stats(lambda d: d["usage"]["agent"]["requests"] == 1)
        assert (s["scope"], s["requests"]) == ("since_start", 1)
        assert s["savings"]["turns"] == 1 and s["ledger"]["savings"]["turns"] == 3
        assert s["ledger"]["usage"]["agent"]["requests"] == 3
        assert s["usage"]["agent"]["cache_read_tokens"] == 900
        assert s["ledger"]["usage"]["agent"]["cache_read_tokens"] == 2700
        assert "saved_share" in s["savings"] and "saved_share" in s["ledger"]["savings"]
        assert cli(["stats", "--proxy", second.url]) == 0
        text = capsys.readouterr().out
        assert "since it started" in text and "all time (its store's ledger)" in text
        assert "requests 1" in text.split("all time")[0].replace(",", "") or "1 requests" in text
        with second.client(timeout=10.0) as c:
            page = c.get("/_cg/").text
        assert 'id="since-start"' in page and 'id="all-time"' in page
        assert 'data-figure="ledger.turns" data-value="3"' in page
        m = metrics(second)
        assert m["context_guru_requests_total"][()] == 1.0  # this process's, as the stats
        assert m["context_guru_usage_tokens_total"][(("bucket", "cache_read"), ("kind", "agent"))] == 900.0  # fmt: skip
        assert m["context_guru_store_up"][()] == 1.0
        assert m["context_guru_turns_total"][(("outcome", "passed_through"),)] == 1.0


def test_metrics_need_the_token_as_every_control_endpoint(provider, tmp_path: Path):
    token = "observe-" + uuid.uuid4().hex
    with Proxy.start(provider.url, tmp_path, options=[f"cg_control_token={token}"]) as p:
        with httpx.Client(base_url=p.url, trust_env=False, timeout=5) as c:
            assert c.get("/_cg/metrics").status_code == 401
        m = metrics(p)  # (the harness's client sends the token)
        assert m["context_guru_info"]
        assert token not in p.log_text()
