"""How each agent is pointed at the proxy: the variables and `-c` overrides it reads, and
Codex's route by its sign-in."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from cg.launch.agents import (
    AGENTS,
    CHATGPT_ROUTE,
    CODEX_PROVIDER,
    OPENAI_ROUTE,
    claude_on_subscription,
    codex_overrides,
    no_proxy,
    opencode_config,
    signed_in_with_chatgpt,
)

BASE = "http://127.0.0.1:4321"


def test_claude_is_pointed_by_anthropic_base_url_alone() -> None:
    agent = AGENTS["claude"]
    (route,) = agent.routes({})
    assert (route.provider, route.upstream, route.path) == (
        "anthropic",
        "https://api.anthropic.com",
        "",
    )
    pointing = agent.point({"anthropic": BASE}, {})
    assert (pointing.env, pointing.args) == ({"ANTHROPIC_BASE_URL": BASE}, [])


def test_codex_overrides_name_a_provider_at_the_proxy_with_its_own_sign_in_and_no_websocket() -> (
    None
):
    args = codex_overrides(BASE + "/v1")
    assert args[::2] == ["-c"] * (len(args) // 2)
    doc = tomllib.loads("\n".join(args[1::2]))  # each value is TOML, as Codex parses it
    assert doc["model_provider"] == CODEX_PROVIDER
    provider = doc["model_providers"][CODEX_PROVIDER]
    assert provider["base_url"] == BASE + "/v1"
    assert provider["wire_api"] == "responses"
    assert provider["requires_openai_auth"] is True  # the user's login or CODEX_API_KEY
    assert provider["supports_websockets"] is False  # frames the addon could not read


def test_codex_goes_to_the_chatgpt_backend_only_when_signed_in_with_chatgpt(tmp_path: Path) -> None:
    env = {"CODEX_HOME": str(tmp_path)}
    auth = tmp_path / "auth.json"
    assert not signed_in_with_chatgpt(env)  # no auth.json: an API key's route
    assert AGENTS["codex"].routes(env) == (OPENAI_ROUTE,)
    auth.write_text(json.dumps({"auth_mode": "chatgpt", "tokens": {"id_token": "x"}}))
    assert signed_in_with_chatgpt(env)
    assert AGENTS["codex"].routes(env) == (CHATGPT_ROUTE,)
    assert (
        CHATGPT_ROUTE.upstream == "https://chatgpt.com"
        and CHATGPT_ROUTE.path == "/backend-api/codex"
    )
    assert CHATGPT_ROUTE.plan and not OPENAI_ROUTE.plan  # a subscription, billed by the plan
    assert not signed_in_with_chatgpt({**env, "CODEX_API_KEY": "sk-x"})  # exec prefers the key
    auth.write_text(json.dumps({"auth_mode": "apikey", "OPENAI_API_KEY": "sk-x"}))
    assert not signed_in_with_chatgpt(env)
    auth.write_text(json.dumps({"OPENAI_API_KEY": None, "tokens": {"id_token": "x"}}))
    assert signed_in_with_chatgpt(env)  # a file from before `auth_mode`
    auth.write_text("not json")
    assert not signed_in_with_chatgpt(env)


def test_codex_home_defaults_to_dot_codex_under_home(tmp_path: Path) -> None:
    (tmp_path / ".codex").mkdir()
    (tmp_path / ".codex" / "auth.json").write_text(json.dumps({"auth_mode": "chatgpt"}))
    assert signed_in_with_chatgpt({"HOME": str(tmp_path)})


def test_opencode_config_sets_each_providers_base_url_over_the_users_own() -> None:
    given = json.dumps(
        {"model": "anthropic/claude-sonnet-4-5", "provider": {"openai": {"models": {}}}}
    )
    bases = {"anthropic": BASE + "/v1", "openai": "http://127.0.0.1:4322/v1"}
    doc = json.loads(opencode_config(bases, given))
    assert doc["model"] == "anthropic/claude-sonnet-4-5"
    assert doc["provider"]["anthropic"]["options"]["baseURL"] == BASE + "/v1"
    assert doc["provider"]["openai"] == {"models": {}, "options": {"baseURL": bases["openai"]}}
    pointing = AGENTS["opencode"].point(bases, {})
    assert list(pointing.env) == ["OPENCODE_CONFIG_CONTENT"] and pointing.args == []
    with pytest.raises(ValueError, match="OPENCODE_CONFIG_CONTENT"):
        AGENTS["opencode"].point(bases, {"OPENCODE_CONFIG_CONTENT": "[1]"})
    with pytest.raises(ValueError, match="OPENCODE_CONFIG_CONTENT"):
        AGENTS["opencode"].point(bases, {"OPENCODE_CONFIG_CONTENT": "{"})


def test_opencode_talks_to_both_providers_through_one_listener_each() -> None:
    routes = AGENTS["opencode"].routes({})
    assert [(r.provider, r.upstream, r.path) for r in routes] == [
        ("anthropic", "https://api.anthropic.com", "/v1"),
        ("openai", "https://api.openai.com", "/v1"),
    ]


def test_no_proxy_adds_the_loopback_address_once() -> None:
    assert no_proxy({}) == {"NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
    assert no_proxy({"NO_PROXY": "corp.example", "no_proxy": "127.0.0.1"}) == {
        "NO_PROXY": "corp.example,127.0.0.1",
        "no_proxy": "127.0.0.1",
    }


def test_every_agent_names_the_npm_package_that_installs_it() -> None:
    assert {n: a.package for n, a in AGENTS.items()} == {
        "claude": "@anthropic-ai/claude-code",
        "codex": "@openai/codex",
        "opencode": "opencode-ai",
        "gemini": "@google/gemini-cli",
    }


def test_claude_on_a_subscription_is_told_by_its_oauth_credentials(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    assert not claude_on_subscription(env)
    assert claude_on_subscription({"CLAUDE_CODE_OAUTH_TOKEN": "sk-ant-oat01-x"})
    (tmp_path / ".claude").mkdir()
    (tmp_path / ".claude" / ".credentials.json").write_text(
        json.dumps({"claudeAiOauth": {"accessToken": "sk-ant-oat01-x"}})
    )
    assert claude_on_subscription(env)
    assert AGENTS["claude"].routes(env)[0].plan
    assert not claude_on_subscription({**env, "ANTHROPIC_API_KEY": "sk-ant-api03-x"})
    assert not AGENTS["claude"].routes({**env, "ANTHROPIC_API_KEY": "sk"})[0].plan


def test_gemini_is_pointed_by_google_gemini_base_url_alone() -> None:
    agent = AGENTS["gemini"]
    (route,) = agent.routes({})
    assert (route.provider, route.upstream, route.path) == (
        "gemini",
        "https://generativelanguage.googleapis.com",
        "",
    )
    assert (agent.binary, agent.package, agent.preset) == (
        "gemini",
        "@google/gemini-cli",
        "gemini-cli",
    )
    pointing = agent.point({"gemini": BASE}, {})
    assert (pointing.env, pointing.args) == ({"GOOGLE_GEMINI_BASE_URL": BASE}, [])
