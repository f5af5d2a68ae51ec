"""The launcher's `CG_*` settings: parsed, or refused naming the variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from cg.launch.agents import AGENTS, Route
from cg.launch.settings import NAMES, read, state_dir, with_upstreams


def test_defaults_are_a_free_port_the_agents_preset_and_a_log_beside_the_default_store(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    s = read({}, "claude")
    assert (s.port, s.upstream, s.agent_bin, s.preset, s.proxy_args) == (None, "", None, None, [])
    assert s.log == tmp_path / ".context-guru" / "claude-proxy.log"
    assert state_dir() == tmp_path / ".context-guru"


def test_each_variable_is_read() -> None:
    s = read(
        {
            "CG_PORT": "8080",
            "CG_UPSTREAM": "http://127.0.0.1:9",
            "CG_AGENT_BIN": "/opt/claude",
            "CG_PRESET": "summarize",
            "CG_PROXY_ARGS": "--set cg_db='/tmp/a b.sqlite3' -q",
            "CG_LOG": "/tmp/x.log",
        },
        "claude",
    )
    assert (s.port, s.upstream, s.agent_bin, s.preset) == (
        8080,
        "http://127.0.0.1:9",
        "/opt/claude",
        "summarize",
    )
    assert s.proxy_args == ["--set", "cg_db=/tmp/a b.sqlite3", "-q"]
    assert s.log == Path("/tmp/x.log")


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"CG_PORT": "eighty"}, "CG_PORT"),
        ({"CG_PORT": "70000"}, "CG_PORT"),
        ({"CG_PORT": "0"}, "CG_PORT"),
        ({"CG_PROXY_ARGS": "--set 'unclosed"}, "CG_PROXY_ARGS"),
    ],
)
def test_a_bad_value_is_refused_naming_its_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        read(env, "claude")


def test_cg_upstream_one_url_for_every_provider_or_pairs_by_name() -> None:
    routes = AGENTS["opencode"].routes({})
    assert with_upstreams(routes, "") == routes
    one = with_upstreams(routes, "http://127.0.0.1:9/")
    assert [r.upstream for r in one] == ["http://127.0.0.1:9"] * 2
    assert [r.path for r in one] == ["/v1", "/v1"]  # the agent's paths kept
    pairs = with_upstreams(routes, "openai=https://gw.example:8443")
    assert [r.upstream for r in pairs] == ["https://api.anthropic.com", "https://gw.example:8443"]
    assert with_upstreams((Route("a", "https://x"),), "a=https://y") == (Route("a", "https://y"),)


@pytest.mark.parametrize(
    "given",
    ["gemini=https://x.example", "openai", "ftp://x.example", "https://x.example/v1"],
)
def test_cg_upstream_refuses_what_reverse_mode_cannot_take(given: str) -> None:
    with pytest.raises(ValueError, match="CG_UPSTREAM"):
        with_upstreams(AGENTS["opencode"].routes({}), given)


def test_every_setting_is_documented_where_a_user_looks() -> None:
    import cg.launch.settings as module

    docs = (Path(__file__).resolve().parents[2] / "docs" / "agents.md").read_text()
    assert len(NAMES) == 6
    for name in NAMES:
        assert f"| `{name}` |" in docs, name  # a row of the settings table
        assert name in (module.__doc__ or ""), name
