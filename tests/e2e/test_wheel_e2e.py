"""The package as a user installs it: a wheel built from the repository, installed in a fresh
venv, run from a directory with no checkout in it, carries its presets, its tables and its
addon entry (`context-guru addon-path`, `context-guru proxy`), summarizes a session, and runs
an agent through the proxy it starts (`context-guru claude`).

The fresh venv gets the wheel alone (`--no-deps`); its dependencies are the test
environment's, reached through one `.pth` line (the registry is not asked for them again). The
checkout is not among them: the test proves `cg` is imported from the venv's own site-packages.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.e2e.harness import REPO, Proxy, low, new_id
from tests.e2e.sdk_sessions import anthropic_messages
from tests.support.fakeprovider import FakeProvider

pytestmark = pytest.mark.e2e
SITE = next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())


def run(*cmd: str | Path, cwd: Path, timeout: float = 300) -> str:
    done = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env={"PATH": "/usr/bin:/bin", "HOME": str(cwd)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv holding the wheel built from this repository, and nothing of the checkout."""
    root = tmp_path_factory.mktemp("wheel")
    dist = root / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(REPO)],
        check=True, capture_output=True, timeout=300, cwd=root,
    )  # fmt: skip
    (wheel,) = dist.glob("context_guru-*.whl")
    env = root / "venv"
    run(sys.executable, "-m", "venv", env, cwd=root)
    py = env / "bin" / "python"
    run(py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel, cwd=root)
    site = Path(
        run(py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=root).strip()
    )
    (site / "_cg_test_deps.pth").write_text(SITE + "\n")  # the dependencies, not the package
    yield env


def test_the_wheel_carries_its_presets_tables_and_addon(venv: Path) -> None:
    py, cli = venv / "bin" / "python", venv / "bin" / "context-guru"
    where = venv.parent
    found = run(py, "-c", "import cg; print(cg.__file__)", cwd=where).strip()
    assert found.startswith(str(venv)) and not found.startswith(str(REPO))  # not the checkout
    names = run(py, "-c", "from cg.settings import preset_names; print(*preset_names())", cwd=where)
    assert set(names.split()) >= {"claude-code", "codex", "mask", "off", "summarize"}
    prices = "from cg.billing.prices import price_table; print(len(price_table().prices))"
    assert int(run(py, "-c", prices, cwd=where)) > 0
    addon = Path(run(cli, "addon-path", cwd=where).strip())
    assert addon.is_file() and addon.is_relative_to(venv) and addon.name == "entry.py"


def test_context_guru_proxy_from_the_wheel_summarizes_a_session(venv: Path, tmp_path: Path) -> None:
    config = tmp_path / "cg.yaml"
    config.write_text(yaml.safe_dump({"components": {"summarize": low(resummarize_tokens=200)}}))
    with (
        FakeProvider() as provider,
        Proxy.start(
            provider.url,
            tmp_path,
            preset="summarize",
            program=venv / "bin" / "context-guru",
            args=["proxy"],
            addon=None,  # `context-guru proxy` loads the packaged one
            cwd=tmp_path,
            options=[f"cg_config={config}", f"cg_db={tmp_path / 'cg.sqlite3'}"],
        ) as proxy,
    ):
        tag = new_id()
        c0 = proxy.counts()

        def turn(messages: list[Any]) -> dict[str, Any]:
            eid = new_id()
            r = httpx.post(
                f"{proxy.url}/v1/messages",
                json={"model": "claude-test", "max_tokens": 64, "messages": messages},
                headers={
                    "x-api-key": "sk-ant-wheel-test",
                    "anthropic-version": "2023-06-01",
                    "x-context-guru-session": tag,
                    "x-e2e-id": eid,
                },
                timeout=30,
            )
            assert r.status_code == 200, r.text
            return proxy.records.cg(eid)

        first = turn(anthropic_messages(tag, 7))
        assert first["outcome"] == "passed_through" and first["preset"] == "summarize"
        proxy.wait_count(c0, "completed")
        second = turn(anthropic_messages(tag, 9))
        assert second["outcome"] == "rewritten", second  # the summary spliced in
        summarize = next(c for c in second["components"] if c["component"] == "summarize")
        assert summarize["reused"] is True


def test_context_guru_claude_from_the_wheel_runs_an_agent_through_the_packaged_addon(
    venv: Path, tmp_path: Path
) -> None:
    """`context-guru claude` as installed: the proxy it starts is the wheel's (no checkout in
    the way), the agent (a stand-in that sends one turn) reaches the provider through it, and
    its exit status and the closing line come back."""
    agent = tmp_path / "agent"
    agent.write_text(
        f"#!{venv / 'bin' / 'python'}\n"
        "import os, sys, httpx\n"
        "r = httpx.post(os.environ['ANTHROPIC_BASE_URL'] + '/v1/messages', trust_env=False,\n"
        "    json={'model': 'claude-test', 'max_tokens': 8, 'messages': [{'role': 'user', 'content': 'hi'}]},\n"
        "    headers={'x-api-key': 'sk-ant-wheel-test', 'anthropic-version': '2023-06-01'})\n"
        "sys.exit(3 if r.status_code == 200 else 1)\n"
    )
    agent.chmod(0o755)
    with FakeProvider() as provider:
        done = subprocess.run(
            [str(venv / "bin" / "context-guru"), "claude", "-p", "hi"],
            cwd=tmp_path, capture_output=True, text=True, timeout=120,
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "CG_AGENT_BIN": str(agent),
                 "CG_UPSTREAM": provider.url},
        )  # fmt: skip
        got = [r for r in provider.requests if r.path == "/v1/messages"]
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-3000:]
    assert len(got) == 1
    assert "context-guru: 0 of 1 turns rewritten" in done.stderr
    assert "started and stopped" in done.stderr
    assert (tmp_path / ".context-guru" / "claude-proxy.log").is_file()
