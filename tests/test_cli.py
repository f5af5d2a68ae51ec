"""cg.cli: `context-guru expand | sessions | stats | replay`, on real SQLite files.

Most tests call `cg.cli.main(argv)` in-process; one runs the installed console script.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cg.cli import main
from cg.state.records import Checkpoint, LedgerTurns, stash_key
from cg.state.sqlite import SqliteStore
from cg.wire.usage import Usage

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "claude_code_2.1.197_turn16.json"
SESSION = "cli-sess-1"
SOURCES = [
    '{"role":"user","content":"Fix the parser. caf\\u00e9 ✓"}',
    '{"role":"assistant","content":[{"type":"text","text":"Running the tests."},'
    '{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"cmd":"pytest -x"}}]}',
    '{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1",'
    '"content":"FAILED test_parse.py::test_nested"}]}',
]
OPENAI_SOURCES = [
    '{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",'
    '"function":{"name":"bash","arguments":"{\\"cmd\\":\\"ls\\"}"}}]}',
    '{"role":"tool","tool_call_id":"c1","content":"a.py b.py"}',
]
LOW = """\
components:
  summarize:
    cache_state: any
    min_tokens: 10
    trigger: {min_request_frac: 0, min_request_tokens: 0, min_messages: 4}
"""


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing may touch the real ~/.context-guru."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "cg.sqlite3"
    with SqliteStore(path) as st:
        st.put_stash(stash_key(SOURCES), SESSION, SOURCES, "anthropic")
        st.put_stash(stash_key(OPENAI_SOURCES), "cli-sess-2", OPENAI_SOURCES, "openai")
        st.touch_session(SESSION)
        st.put_checkpoint(
            Checkpoint(SESSION, "s", 1, 3, "h", stash_key(SOURCES), '{"role":"user"}')
        )
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- expand ----------------------------------------------------------------------------------


def test_expand_prints_the_span_readably(db: Path, capsys) -> None:
    key = stash_key(SOURCES)
    code, out, err = run(capsys, "expand", key, "--db", str(db))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"# {key}: 3 messages from session {SESSION}"
    # Each under the id that prints it alone.
    assert [ln for ln in lines if ln.startswith("---")] == [
        f"--- [{key}#1] user ---",
        f"--- [{key}#2] assistant ---",
        f"--- [{key}#3] user ---",
    ]
    assert "Fix the parser. café ✓" in lines  # escapes decoded for a reader
    assert "Running the tests." in lines
    assert '[tool_use Bash] {"cmd": "pytest -x"}' in lines
    assert "[tool_result] FAILED test_parse.py::test_nested" in lines


def test_expand_prints_openai_calls_readably(db: Path, capsys) -> None:
    code, out, _ = run(capsys, "expand", stash_key(OPENAI_SOURCES), "--db", str(db))
    assert code == 0
    assert '[tool_call bash] {"cmd":"ls"}' in out.splitlines()
    assert "a.py b.py" in out.splitlines()


def test_expand_json(db: Path, capsys) -> None:
    key = stash_key(SOURCES)
    code, out, err = run(capsys, "expand", key, "--db", str(db), "--json")
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert doc == {
        "id": key,
        "session": SESSION,
        "messages": [json.loads(s) for s in SOURCES],
    }


def test_expand_unknown_id_exits_1(db: Path, capsys) -> None:
    code, out, err = run(capsys, "expand", "f" * 24, "--db", str(db))
    assert code == 1
    assert out == ""
    assert err.startswith(f"{'f' * 24}: not in the store at {db} (unknown there, or no longer")
    assert "--db PATH, or ask the proxy with --proxy URL" in err


def test_expand_expired_id_exits_1(tmp_path: Path, capsys) -> None:
    path = tmp_path / "old.sqlite3"
    long_ago = time.time() - 100 * 3600  # past the default 72 h TTL
    key = stash_key(SOURCES)
    with SqliteStore(path, ttl_hours=1000, now=lambda: long_ago) as st:
        st.put_stash(key, SESSION, SOURCES, "anthropic")
    with SqliteStore(path, evict=False) as st:
        assert st.has_stash(key)  # the vacuity guard: it is there until a 72 h store opens it
    with SqliteStore(path) as st:  # the proxy, with the default 72 h TTL, evicts it on open
        assert not st.has_stash(key)
    code, out, err = run(capsys, "expand", key, "--db", str(path))
    assert code == 1
    assert "no longer available: expired" in err
    assert out == ""


KEY = stash_key(SOURCES)


@pytest.mark.parametrize(
    "bad",
    [
        "nope",
        "F" * 24,
        "a" * 25,
        "../../etc/passwd",
        "",
        f"{KEY}#",
        f"{KEY}#-1",
        f"{KEY}#x",
        f"{KEY}#1234567",
        f"{KEY}#1\n",
        f"#{KEY}",
    ],
)
def test_expand_malformed_id_exits_2(db: Path, capsys, bad: str) -> None:
    code, out, err = run(capsys, "expand", bad, "--db", str(db))
    assert code == 2
    assert out == ""
    assert err == f"not a context-guru id (KEY or KEY#N): {bad!r}\n"


def test_expand_one_message(db: Path, capsys) -> None:
    code, out, err = run(capsys, "expand", f"{KEY}#3", "--db", str(db))
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"# {KEY}#3: message 3 of 3 from session {SESSION}",
        "",
        f"--- [{KEY}#3] user ---",
        "[tool_result] FAILED test_parse.py::test_nested",
    ]
    code, out, err = run(capsys, "expand", f"{KEY}#1", "--db", str(db), "--json")
    assert (code, err) == (0, "")
    assert json.loads(out) == {
        "id": f"{KEY}#1",
        "session": SESSION,
        "n": 1,
        "message": json.loads(SOURCES[0]),
    }


@pytest.mark.parametrize("n", ["0", "4", "000000", "999999"])
def test_expand_a_message_the_stash_lacks_exits_1(db: Path, capsys, n: str) -> None:
    code, out, err = run(capsys, "expand", f"{KEY}#{n}", "--db", str(db))
    assert (code, out) == (1, "")
    assert err == f"{KEY}#{n}: the stash holds 3 messages, {KEY}#1 to {KEY}#3\n"


def test_expand_one_message_of_an_unknown_id_exits_1(db: Path, capsys) -> None:
    code, out, err = run(capsys, "expand", f"{'f' * 24}#1", "--db", str(db))
    assert (code, out) == (1, "")
    assert err.startswith(f"{'f' * 24}#1: not in the store at {db} (unknown there")


# -- sessions, stats -----------------------------------------------------------------------------


def test_sessions(db: Path, capsys) -> None:
    code, out, _ = run(capsys, "sessions", "--db", str(db))
    assert code == 0
    header, *lines = out.splitlines()
    assert header == f"# 2 sessions in the store at {db}"  # the CLI names the store it read
    assert len(lines) == 2
    mine = next(x for x in lines if x.startswith(f"{SESSION} "))
    assert "checkpoint covers 3 messages" in mine
    assert "1 stashes" in mine
    assert "last seen 20" in mine  # a date
    other = next(x for x in lines if x.startswith("cli-sess-2 "))
    assert "no checkpoint" in other and "last seen 20" in other  # its stash's last use

    code, out, _ = run(capsys, "sessions", "--db", str(db), "--json")
    assert code == 0
    rows = {r["session"]: r for r in json.loads(out)}
    assert set(rows) == {SESSION, "cli-sess-2"}
    assert rows[SESSION]["covered_count"] == 3
    assert rows[SESSION]["stashes"] == 1
    assert rows[SESSION]["stash_bytes"] > sum(len(s) for s in SOURCES)


def test_sessions_of_an_empty_store(tmp_path: Path, capsys) -> None:
    SqliteStore(tmp_path / "empty.sqlite3").close()
    code, out, _ = run(capsys, "sessions", "--db", str(tmp_path / "empty.sqlite3"))
    assert (code, out) == (
        0,
        f"# 0 sessions in the store at {tmp_path / 'empty.sqlite3'}\nno sessions\n",
    )


def test_stats(db: Path, capsys) -> None:
    code, out, _ = run(capsys, "stats", "--db", str(db), "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["path"] == str(db)
    assert doc["persistent"] is True
    assert doc["journal_mode"] == "wal"
    assert (doc["stashes"], doc["checkpoints"], doc["sessions"]) == (2, 1, 1)
    assert doc["file_bytes"] > 0


def _ledger(db: Path) -> None:
    with SqliteStore(db) as st:
        st.record_usage(
            SESSION,
            [
                ("agent", "claude-sonnet-5-5", "", Usage(1000, 0, 0, 100000, 500, 2)),
                ("estimate", "claude-sonnet-5-5", "", Usage(1000, 50000, 0, 90000, 500, 2)),
                ("summarizer", "my-local-model", "", Usage(3000, 0, 0, 0, 200, 1)),
            ],
            LedgerTurns(turns=2, rewritten=1, tokens_not_sent=40000),
        )


def test_stats_shows_usage_and_labels_the_estimates(db: Path, capsys) -> None:
    _ledger(db)
    code, out, _ = run(capsys, "stats", "--db", str(db), "--json")
    doc = json.loads(out)
    assert doc["usage"]["agent"] == {
        "input_tokens": 1000,
        "cache_write_tokens": 0,
        "cache_read_tokens": 100000,
        "output_tokens": 500,
        "requests": 2,
    }
    assert doc["usage"]["summarizer"]["input_tokens"] == 3000
    s = doc["savings"]
    # An unpriced summarizer model: every total it enters is unknown, and says which.
    assert s["unpriced_models"] == ["my-local-model"] and s["billed_usd"] is None
    # claude-sonnet-5-5: $2 in, $0.10 read, $10 out; 1000×2 + 100000×0.1 + 500×10 = 17,000 µ$
    assert s["billed_agent_usd"] == pytest.approx(0.017)
    assert s["tokens_not_sent"] == 40000 and s["rewritten_turns"] == 1
    code, out, _ = run(capsys, "stats", "--db", str(db))
    assert code == 0
    assert "without rewrite (ESTIMATE)   $0.141000" in out
    assert "saved (ESTIMATE)             unknown" in out and "$0.017000" in out
    assert "unpriced models (their cost is unknown, not zero): my-local-model" in out
    assert "40,000 over 1 rewritten of 2 turns" in out


def test_a_config_prices_the_unpriced_model(db: Path, tmp_path: Path, capsys) -> None:
    _ledger(db)
    config = tmp_path / "prices.yaml"
    config.write_text(
        "prices:\n  my-local-model: {input: 0, cache_write_5m: 0, "
        "cache_write_1h: 0, cache_read: 0, output: 0}\n"
    )
    _code, out, _ = run(capsys, "stats", "--db", str(db), "--config", str(config), "--json")
    s = json.loads(out)["savings"]
    # estimate: 1000×2 + 50000×2.5 + 90000×0.1 + 500×10 = 141,000 µ$; billed 17,000 µ$
    assert s["unpriced_models"] == [] and s["billed_usd"] == pytest.approx(0.017)
    assert s["without_rewrite_usd"] == pytest.approx(0.141)
    assert s["saved_usd"] == pytest.approx(0.124)


def test_sessions_show_each_sessions_usage_and_savings(db: Path, capsys) -> None:
    _ledger(db)
    code, out, _ = run(capsys, "sessions", "--db", str(db), "--json")
    assert code == 0
    rows = {r["id"]: r for r in json.loads(out)}
    mine = rows[SESSION]
    assert mine["usage"]["agent"]["cache_read_tokens"] == 100000
    assert mine["checkpoint"]["covered_messages"] == 3
    assert mine["savings"]["tokens_not_sent"] == 40000
    assert rows["cli-sess-2"]["usage"]["agent"]["requests"] == 0
    _code, out, _ = run(capsys, "sessions", "--db", str(db))
    assert "billed" in out and "(ESTIMATE)" in out


# -- replay ------------------------------------------------------------------------------------


def test_replay_shows_the_spliced_messages(tmp_path: Path, capsys) -> None:
    config = tmp_path / "low.yaml"
    config.write_text(LOW)
    code, out, err = run(
        capsys,
        "replay",
        str(FIXTURE),
        "--config",
        str(config),
        "--summary",
        "The agent ran fifteen Bash steps.",
    )
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == "request 0: anthropic passed_through — no component acted"
    assert "  summarize: commissioned a summary; this turn forwards untouched" in lines
    assert "  next turn: rewritten — rewritten" in lines
    sent = lines[lines.index("  messages sent:") + 1 :]
    assert sent[0].startswith("    [0] user: ")
    assert sent[1].startswith(
        "    [1] user: === History Summary === <summary> The agent ran fifteen Bash steps."
    )
    assert len(sent) < 34  # the fixture's 34 messages, fewer after the splice


def test_replay_json_and_without_a_summary(tmp_path: Path, capsys) -> None:
    config = tmp_path / "low.yaml"
    config.write_text(LOW)
    code, out, _ = run(capsys, "replay", str(FIXTURE), "--config", str(config), "--json")
    assert code == 0
    (report,) = json.loads(out)
    assert report["record"]["outcome"] == "passed_through"
    assert report["record"]["components"][0]["commission"] == "trigger fired"
    assert "next_turn" not in report and "messages_after" not in report

    code, out, _ = run(
        capsys, "replay", str(FIXTURE), "--config", str(config), "--summary", "S.", "--json"
    )
    (report,) = json.loads(out)
    assert report["next_turn"]["outcome"] == "rewritten"
    assert report["messages_after"][1].startswith("user: === History Summary === <summary> S.")


def test_replay_of_a_recorded_codex_request_with_the_codex_preset(tmp_path: Path, capsys) -> None:
    """A recorded request (method, path, header pairs, the body as text) replays as the
    `responses` dialect; Codex's own headers name the session; the summary is one item."""
    config = tmp_path / "low.yaml"
    config.write_text(LOW)
    codex = REPO / "tests" / "fixtures" / "codex-0.169.0" / "resumed_last.json"
    code, out, err = run(
        capsys,
        "replay",
        str(codex),
        "--preset",
        "codex",
        "--config",
        str(config),
        "--summary",
        "Ten steps of ls.",
    )
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == "request 0: responses passed_through — no component acted"
    assert "  next turn: rewritten — rewritten" in lines
    sent = lines[lines.index("  messages sent:") + 1 :]
    assert [x.split(":")[0] for x in sent[:5]] == [
        "    [0] developer",
        "    [1] developer",
        "    [2] user",
        "    [3] user",
        "    [4] user",
    ]
    assert sent[4].startswith("    [4] user: === History Summary === <summary> Ten steps of ls.")
    assert len(sent) < 44


def test_replay_of_a_missing_file_exits_2(tmp_path: Path, capsys) -> None:
    code, _, err = run(capsys, "replay", str(tmp_path / "nope.json"))
    assert code == 2
    assert "nope.json" in err


# -- the installed console script ----------------------------------------------------------------


def test_the_console_script(db: Path, tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "context-guru"
    assert script.exists(), script
    key = stash_key(SOURCES)
    done = subprocess.run(
        [str(script), "expand", key, "--db", str(db), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"HOME": str(tmp_path / "home"), "PATH": ""},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["messages"][1]["content"][1]["name"] == "Bash"
    bad = subprocess.run(
        [str(script), "expand", "xyz", "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"HOME": str(tmp_path / "home"), "PATH": ""},
    )
    assert bad.returncode == 2
    assert "not a context-guru id" in bad.stderr


def test_the_cli_never_evicts_a_store_configured_with_a_longer_ttl(tmp_path: Path, capsys) -> None:
    path = tmp_path / "long.sqlite3"
    old = time.time() - 100 * 3600
    key = stash_key(SOURCES)
    with SqliteStore(path, ttl_hours=168, now=lambda: old) as st:
        st.put_stash(key, SESSION, SOURCES, "anthropic")
    for args in (["sessions"], ["stats"], ["expand", key]):
        assert run(capsys, *args, "--db", str(path))[0] == 0
    with SqliteStore(path, ttl_hours=168) as st:
        assert st.has_stash(key)


def test_a_mistyped_db_path_is_refused_not_created(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "nope" / "cg.sqlite3"
    code, _, err = run(capsys, "sessions", "--db", str(missing))
    assert code == 2 and "no context-guru store" in err
    assert not missing.parent.exists()


def test_the_default_store_missing_says_where_else_to_look(capsys) -> None:
    """No `--db`: the default store (under the test's HOME, absent) is named, with the two
    ways to read the store a proxy was started with."""
    code, _, err = run(capsys, "expand", "f" * 24)
    assert code == 2
    assert "no context-guru store at " in err and ".context-guru/cg.sqlite3" in err
    assert "pass --db PATH, or ask the proxy with --proxy URL" in err


def test_db_and_proxy_are_one_or_the_other(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["sessions", "--db", "x.sqlite3", "--proxy", "http://127.0.0.1:9"])
    assert e.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_stats_of_a_running_proxy_prints_its_retention(capsys) -> None:
    """`stats --proxy`: the proxy's `/_cg/stats` (served here by a stand-in on 127.0.0.1, the
    document a proxy answers) printed, retention included."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    doc = {
        "requests": 5,
        "rewritten": 2,
        "passed_through": 3,
        "failed_open": 0,
        "usage": None,
        "savings": None,
        "retention": {
            "turns": 2,
            "mean": 0.6905,
            "min": 0.6667,
            "by_kind": {"user": 1.0, "file": None, "command": 0.5, "error": None},
            "failed": 1,
        },
    }

    class Stats(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(doc).encode() if self.path == "/_cg/stats" else b"{}"
            self.send_response(200 if self.path == "/_cg/stats" else 404)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Stats)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        code, out, _ = run(capsys, "stats", "--proxy", url)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert code == 0, out
    assert "5 requests, 2 rewritten" in out  # vacuity: the proxy's document was read
    assert "turns measured  2  mean 69.0%  least 66.7%" in out
    assert "user 100.0%  file none  command 50.0%  error none" in out
    assert "not measured (failed): 1" in out


def test_proxy_runs_mitmdump_or_mitmweb_with_the_packaged_addon(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from cg.cli import addon_path, main, proxy_command

    path = Path(addon_path())
    assert path.is_file() and path.parts[-3:] == ("cg", "proxy", "entry.py")
    assert main(["addon-path"]) == 0 and capsys.readouterr().out.strip() == str(path)
    cmd = proxy_command(["--mode", "reverse:http://127.0.0.1:9", "--web", "-q"])
    assert cmd[0] == sys.executable and "mitmweb" in cmd[2] and "mitmdump" not in cmd[2]
    assert cmd[3:] == ["-s", str(path), "--mode", "reverse:http://127.0.0.1:9", "-q"]
    assert "mitmdump" in proxy_command([])[2]
    done = subprocess.run(
        [sys.executable, "-m", "cg", "proxy", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "Mitmproxy:" in done.stdout, done.stderr


def test_stats_labels_a_subscription_sessions_dollars_and_its_rate_limit_share(
    db: Path, capsys
) -> None:
    """A session a plan pays for (`cg.billing.plan`): its dollars are API-list-price
    equivalents, its savings in tokens, and its share of the plan's limits an estimate."""
    _ledger(db)
    limits = json.dumps(
        {"v": 1, "windows": {"5h": {"first": 10.0, "last": 30.0, "spent": 0.0, "reset": "1"}}}
    )
    with SqliteStore(db) as st:
        st.record_plan(SESSION, "claude-subscription", limits)
    code, out, _ = run(capsys, "stats", "--db", str(db))
    assert code == 0
    assert "on a subscription" in out and "API-list-price equivalents" in out
    assert "claude-subscription: 1 sessions, 1 rewritten of 2 turns" in out
    assert "5h window: 20.00 points used; not spent (ESTIMATE)" in out
    code, out, _ = run(capsys, "stats", "--db", str(db), "--json")
    plan = json.loads(out)["plans"]["claude-subscription"]
    assert plan["tokens_not_sent"] == 40000 and plan["rate_limits"]["estimate"] is True


def test_stats_of_a_store_without_subscription_sessions_names_no_plan(db: Path, capsys) -> None:
    _ledger(db)
    code, out, _ = run(capsys, "stats", "--db", str(db))
    assert code == 0 and "subscription" not in out and "savings:" in out
    assert "plans" not in json.loads(run(capsys, "stats", "--db", str(db), "--json")[1])
