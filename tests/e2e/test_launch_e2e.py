"""`context-guru claude|codex|opencode …`, the one command per agent (docs/agents.md#one-command-per-agent),
with the real pinned CLIs against the fake provider: a session through a proxy the command
started (and stopped: its PID gone, its port closed), the agent's exit status and arguments
passed through, the closing line's figures as the store's ledger has them, and a proxy already
serving on CG_PORT reused and left running.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cg.billing.prices import price_table
from cg.billing.savings import report
from cg.state import open_reader
from tests.e2e import claude_code as cc
from tests.e2e import codex as cx
from tests.e2e import gemini_cli as gc
from tests.e2e import opencode as oc
from tests.e2e.codex_sessions import codex_steps
from tests.e2e.harness import Proxy
from tests.e2e.launch_runs import (
    LaunchRun,
    free_port,
    launch,
    listening,
    low_config,
    pid_gone,
    settled,
)
from tests.support.agent_script import AgentScript, session
from tests.support.codex_script import CodexScript
from tests.support.fakeprovider import DEFAULT_TEXT, FakeProvider
from tests.support.signin import CHATGPT_PATH, ChatGPTAccount

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CLAUDE_ARGS = ["--dangerously-skip-permissions", "--output-format", "stream-json", "--verbose"]


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeProvider]:
    with FakeProvider() as p:
        yield p


def claude_env(binary: Path, workdir: Path, fake: FakeProvider) -> dict[str, str]:
    home = workdir / "home"
    return {
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "ANTHROPIC_API_KEY": cc.API_KEY,
        **cc.OFFLINE,
        "CG_AGENT_BIN": str(binary),
        "CG_UPSTREAM": fake.url,
        "CG_LOG": str(workdir / "proxy.log"),
    }


def events(run: LaunchRun) -> list[dict[str, Any]]:
    out = []
    for line in run.stdout.splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def final_result(run: LaunchRun) -> dict[str, Any]:
    (result,) = [e for e in events(run) if e.get("type") == "result"]
    return result


def ledger(home: Path) -> dict[str, Any]:
    """The savings of the default store under `home`, as `context-guru stats` reads them."""
    store = open_reader(str(home / ".context-guru" / "cg.sqlite3"))
    try:
        return report(store, price_table())["savings"]  # type: ignore[no-any-return]
    finally:
        store.close()


def money(text: str) -> float:
    return float(text.replace("$", "").replace(",", ""))


# -- Claude Code ---------------------------------------------------------------------------------


def test_context_guru_claude_runs_a_session_through_a_proxy_it_starts_and_stops(
    claude_code: Path, fake: FakeProvider, tmp_path: Path
) -> None:
    port = free_port()
    tag = f"CG-{tmp_path.name}"
    script = AgentScript(tag, session(8), before=lambda step: settled(port))
    env = {
        **claude_env(claude_code, tmp_path, fake),
        "CG_PORT": str(port),
        "CG_PROXY_ARGS": f"--set cg_config={low_config(tmp_path)}",
    }
    fake.responder = script
    try:
        run = launch(
            "claude", ["-p", f"{tag}: run the scripted steps.", *CLAUDE_ARGS], tmp_path, env
        )
    finally:
        fake.responder = None

    assert run.returncode == 0, run.describe()
    result = final_result(run)
    assert result["subtype"] == "success" and result["result"] == script.final_text
    assert script.refusals == []
    assert [a.step for a in script.answers if a.expand is None] == list(range(9))
    # The closing line: this session's figures, as the default store's ledger has them.
    closing = run.closing
    assert closing["how"].startswith("started and stopped") and int(closing["port"]) == port
    assert (int(closing["turns"]), int(closing["rewritten"]) > 0) == (9, True), closing
    saved = ledger(tmp_path / "home")
    assert (
        saved["tokens_not_sent"]
        and int(closing["tokens"].replace(",", "")) == saved["tokens_not_sent"]
    )
    assert closing["retention"].endswith("%")
    assert money(closing["saved"]) == pytest.approx(saved["saved_usd"], abs=1e-4)
    assert money(closing["billed"]) == pytest.approx(saved["billed_usd"], abs=1e-4)
    # The proxy it started is gone, and its output went to CG_LOG, not the agent's terminal.
    assert pid_gone(int(closing["pid"])) and not listening(port)
    assert Path(closing["log"]) == tmp_path / "proxy.log"
    assert "listening at" in (tmp_path / "proxy.log").read_text()
    assert "listening at" not in run.stdout + run.stderr


def test_context_guru_claude_passes_a_failing_agents_arguments_and_exit_status_through(
    claude_code: Path, fake: FakeProvider, tmp_path: Path
) -> None:
    bad = ["--no-such-option-for-claude"]
    direct = subprocess.run(
        [str(claude_code), *bad], capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **cc.OFFLINE},
    )  # fmt: skip
    assert direct.returncode not in (0, 127), direct  # vacuity: claude itself refuses it

    run = launch("claude", bad, tmp_path, claude_env(claude_code, tmp_path, fake))

    assert run.returncode == direct.returncode, run.describe()
    assert "no-such-option-for-claude" in run.stderr  # claude's own complaint, passed through
    closing = run.closing  # said on a free port (no CG_PORT), with nothing to report
    assert (closing["turns"], closing["rewritten"]) == ("0", "0")
    assert pid_gone(int(closing["pid"])) and not listening(int(closing["port"]))


def test_context_guru_claude_help_is_claudes_own(
    claude_code: Path, fake: FakeProvider, tmp_path: Path
) -> None:
    run = launch("claude", ["--help"], tmp_path, claude_env(claude_code, tmp_path, fake))
    assert run.returncode == 0, run.describe()
    assert "Usage: claude" in run.stdout


def test_context_guru_claude_reuses_a_proxy_serving_on_cg_port_and_leaves_it_running(
    claude_code: Path, fake: FakeProvider, tmp_path: Path
) -> None:
    with Proxy.start(fake.url, tmp_path / "proxy", preset="claude-code") as proxy:
        before = proxy.counts()
        tag = f"CG-{tmp_path.name}"
        script = AgentScript(tag, session(3))
        env = {**claude_env(claude_code, tmp_path, fake), "CG_PORT": str(proxy.port)}
        fake.responder = script
        try:
            run = launch("claude", ["-p", f"{tag}: go.", *CLAUDE_ARGS], tmp_path, env)
        finally:
            fake.responder = None

        assert run.returncode == 0, run.describe()
        assert final_result(run)["result"] == script.final_text
        closing = run.closing
        assert closing["how"] == "reused, left running" and int(closing["port"]) == proxy.port
        assert proxy.proc.poll() is None and proxy.stats()["requests"] == before["requests"] + 4
        assert closing["turns"] == "4"  # this run's turns only, not the proxy's before it
        assert not (tmp_path / "proxy.log").exists()  # nothing started, nothing logged


# -- Codex CLI -----------------------------------------------------------------------------------

CODEX_MODEL = "gpt-5.5"  # in Codex's catalogue and priced, so the closing line has dollars
CODEX_CONFIG = f"""model = "{CODEX_MODEL}"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[analytics]
enabled = false

[otel]
exporter = "none"

[features]
plugins = false
apps = false
"""


def codex_env(binary: Path, workdir: Path, fake: FakeProvider) -> dict[str, str]:
    """A scratch CODEX_HOME with no model provider of its own (the launcher names one) and
    Codex's API-key sign-in (`codex login --with-api-key` writes this auth.json)."""
    codex_home = workdir / "codex-home"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(CODEX_CONFIG)
    auth = {"auth_mode": "apikey", "OPENAI_API_KEY": cx.API_KEY}
    (codex_home / "auth.json").write_text(json.dumps(auth))
    return {
        "CODEX_HOME": str(codex_home),
        "CG_AGENT_BIN": str(binary),
        "CG_UPSTREAM": fake.url,
        "CG_LOG": str(workdir / "proxy.log"),
    }


def codex_args(prompt: str) -> list[str]:
    return ["exec", "--strict-config", "--json", "--skip-git-repo-check", prompt]


def codex_final(run: LaunchRun) -> str:
    messages = [
        e["item"]
        for e in events(run)
        if e.get("type") == "item.completed" and e["item"].get("type") == "agent_message"
    ]
    assert messages, run.describe()
    return str(messages[-1]["text"])


def test_context_guru_codex_exec_runs_a_session_through_a_proxy_it_starts_and_stops(
    codex: Path, fake: FakeProvider, tmp_path: Path
) -> None:
    port = free_port()
    script = CodexScript(f"CG-{tmp_path.name}", codex_steps(8), before=lambda step: settled(port))
    env = {
        **codex_env(codex, tmp_path, fake),
        "CG_PORT": str(port),
        "CG_PROXY_ARGS": f"--set cg_config={low_config(tmp_path)}",
    }
    fake.responder = script
    try:
        run = launch("codex", codex_args(f"{script.tag}: run the scripted steps."), tmp_path, env)
    finally:
        fake.responder = None

    assert run.returncode == 0, run.describe()
    assert codex_final(run) == script.final_text
    assert script.refusals == []
    # Every turn went through the proxy over HTTP (no WebSocket), as an API key's requests.
    turns = [r for r in fake.requests if r.path == "/v1/responses" and not r.is_summarizer]
    assert turns and {r.method for r in turns} == {"POST"}
    assert {r.header("authorization") for r in turns} == {f"Bearer {cx.API_KEY}"}
    closing = run.closing
    assert closing["how"].startswith("started and stopped") and int(closing["port"]) == port
    assert int(closing["turns"]) == len(turns) == 9 and int(closing["rewritten"]) > 0, closing
    assert closing["plan"] is None  # an API key's session: billed by the token
    saved = ledger(tmp_path / "home")
    assert (
        saved["tokens_not_sent"]
        and int(closing["tokens"].replace(",", "")) == saved["tokens_not_sent"]
    )
    assert money(closing["saved"]) == pytest.approx(saved["saved_usd"], abs=1e-4)
    assert pid_gone(int(closing["pid"])) and not listening(port)


def test_context_guru_codex_reuses_a_proxy_and_passes_a_failing_exit_status_through(
    codex: Path, fake: FakeProvider, tmp_path: Path
) -> None:
    with Proxy.start(fake.url, tmp_path / "proxy", preset="codex") as proxy:
        before = proxy.counts()
        script = CodexScript(f"CG-{tmp_path.name}", codex_steps(2))
        env = {**codex_env(codex, tmp_path, fake), "CG_PORT": str(proxy.port)}
        fake.responder = script
        try:
            run = launch("codex", codex_args(f"{script.tag}: go."), tmp_path, env)
        finally:
            fake.responder = None
        assert run.returncode == 0, run.describe()
        assert codex_final(run) == script.final_text
        closing = run.closing
        assert closing["how"] == "reused, left running"
        assert proxy.proc.poll() is None and proxy.stats()["requests"] == before["requests"] + 3
        assert closing["turns"] == "3"

        failed = launch("codex", ["exec", "--no-such-flag"], tmp_path, env)
        assert failed.returncode == 2, failed.describe()  # clap's usage error, Codex's own
        assert "--no-such-flag" in failed.stderr
        assert failed.closing["turns"] == "0" and proxy.proc.poll() is None


# -- opencode ------------------------------------------------------------------------------------


OPENCODE_OFFLINE = {
    f"OPENCODE_DISABLE_{x}": "1"
    for x in ("AUTOUPDATE", "MODELS_FETCH", "LSP_DOWNLOAD", "DEFAULT_PLUGINS", "SHARE")
}


@pytest.fixture(scope="module")
def opencode_bin() -> Path:
    try:
        return oc.install()
    except oc.OpencodeUnavailable as e:
        pytest.fail(str(e), pytrace=False)


@pytest.mark.parametrize(
    ("model", "path"),
    [("anthropic/claude-sonnet-4-5", "/v1/messages"), ("openai/gpt-5.5", "/v1/responses")],
)
def test_context_guru_opencode_run_goes_through_a_proxy_it_starts_and_stops(
    opencode_bin: Path, fake: FakeProvider, tmp_path: Path, model: str, path: str
) -> None:
    mine = {"autoupdate": False, "share": "disabled"}  # the user's own inline config, kept
    env = {
        "ANTHROPIC_API_KEY": "sk-test",
        "OPENAI_API_KEY": "sk-test",
        "OPENCODE_CONFIG_CONTENT": json.dumps(mine),
        **OPENCODE_OFFLINE,
        "CG_AGENT_BIN": str(opencode_bin),
        "CG_UPSTREAM": fake.url,
        "CG_LOG": str(tmp_path / "proxy.log"),
    }
    seen = len(fake.requests)
    run = launch("opencode", ["run", "-m", model, "Say hello."], tmp_path, env)

    assert run.returncode == 0, run.describe()
    assert DEFAULT_TEXT in run.stdout
    turns = [r for r in fake.requests[seen:] if r.method == "POST" and r.path == path]
    assert turns, [r.path for r in fake.requests[seen:]]  # reached the provider, by its path
    closing = run.closing
    assert int(closing["turns"]) == len(turns), closing  # every one of them through the proxy
    assert pid_gone(int(closing["pid"])) and not listening(int(closing["port"]))


def test_context_guru_codex_signed_in_with_chatgpt_goes_by_its_chatgpt_route(
    codex: Path, fake: FakeProvider, tmp_path: Path
) -> None:
    """Codex signed in with ChatGPT (auth.json `auth_mode: chatgpt`): the launcher points it at
    `…/backend-api/codex` on the proxy, whose turns reach the ChatGPT backend with the account's
    bearer and `chatgpt-account-id`, and the closing line says its dollars are plan-equivalent."""
    account = ChatGPTAccount()
    port = free_port()
    script = CodexScript(f"CG-{tmp_path.name}", codex_steps(8), before=lambda step: settled(port))
    env = {
        **codex_env(codex, tmp_path, fake),
        "CG_PORT": str(port),
        "CG_PROXY_ARGS": f"--set cg_config={low_config(tmp_path)}",
    }
    (Path(env["CODEX_HOME"]) / "auth.json").write_text(account.auth_json(), encoding="utf-8")
    fake.responder, fake.chatgpt = script, account
    seen = len(fake.requests)  # (the fake serves the module: earlier tests' requests are there)
    try:
        run = launch("codex", codex_args(f"{script.tag}: run the scripted steps."), tmp_path, env)
    finally:
        fake.responder, fake.chatgpt = None, None

    assert run.returncode == 0, run.describe()
    assert codex_final(run) == script.final_text
    mine = fake.requests[seen:]
    turns = [r for r in mine if r.path == CHATGPT_PATH and not r.is_summarizer]
    assert turns, [r.path for r in mine]
    assert {r.header("chatgpt-account-id") for r in turns} == {account.account_id}
    assert {r.header("authorization") for r in turns} == {f"Bearer {account.access_token}"}
    assert not [r for r in mine if r.path == "/v1/responses"]
    closing = run.closing
    assert int(closing["turns"]) == len(turns) and int(closing["rewritten"]) > 0, closing
    assert closing["plan"], run.describe()
    assert pid_gone(int(closing["pid"])) and not listening(port)


# -- Gemini CLI ----------------------------------------------------------------------------------


def test_context_guru_gemini_goes_through_a_proxy_it_starts_and_stops(
    gemini: Path, fake: FakeProvider, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    (home / ".gemini").mkdir(parents=True)
    (home / ".gemini" / "settings.json").write_text(json.dumps(gc.settings()))
    env = {
        "HOME": str(home),
        "GEMINI_API_KEY": gc.API_KEY,
        **gc.OFFLINE,
        "CG_AGENT_BIN": str(gemini),
        "CG_UPSTREAM": fake.url,
        "CG_LOG": str(tmp_path / "proxy.log"),
    }
    seen = len(fake.requests)
    args = ["-m", gc.MODEL, "-p", "Say hello.", "--output-format", "json"]
    run = launch("gemini", args, tmp_path, env)

    assert run.returncode == 0, run.describe()
    assert json.loads(run.stdout[run.stdout.find("{") :])["response"] == DEFAULT_TEXT
    path = f"/v1beta/models/{gc.MODEL}:streamGenerateContent?alt=sse"
    turns = [r for r in fake.requests[seen:] if r.method == "POST" and r.path == path]
    assert turns, [r.path for r in fake.requests[seen:]]  # reached the provider, by its path
    assert {r.header("x-goog-api-key") for r in turns} == {gc.API_KEY}
    closing = run.closing
    assert int(closing["turns"]) == len(turns), closing  # every one of them through the proxy
    assert pid_gone(int(closing["pid"])) and not listening(int(closing["port"]))
