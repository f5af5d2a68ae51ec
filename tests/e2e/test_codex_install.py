"""The pinned Codex install (tests/e2e/codex.py): idempotent, the version checked, a clear
failure; and the scratch config it runs with."""

from __future__ import annotations

import tomllib

import pytest

from tests.e2e import codex as cx
from tests.e2e import npm_pin


@pytest.mark.slow  # needs the install
def test_install_is_a_no_op_once_the_pinned_version_is_there(codex, monkeypatch):
    monkeypatch.setattr("shutil.which", lambda *a, **kw: None)  # npm must not be needed again
    assert cx.install() == codex
    assert codex.is_relative_to(cx.CACHE)
    assert npm_pin.version(cx._pin(), codex) == cx.VERSION == "0.171.0"


def test_without_npm_the_install_fails_saying_what_is_needed(tmp_path, monkeypatch):
    monkeypatch.setattr(cx, "CACHE", tmp_path / "codex")
    monkeypatch.setattr("shutil.which", lambda *a, **kw: None)
    with pytest.raises(cx.CodexUnavailable) as e:
        cx.install()
    message = str(e.value)
    assert f"Codex {cx.VERSION} is not in {tmp_path / 'codex'}" in message
    assert "npm" in message and "-m 'not slow'" in message


def test_the_scratch_config_names_the_provider_and_keeps_codex_offline():
    config = tomllib.loads(
        cx.config_toml("http://127.0.0.1:9/v1", {"model_auto_compact_token_limit": 40_000})
    )
    assert config["model_provider"] == cx.PROVIDER
    provider = config["model_providers"][cx.PROVIDER]
    assert provider["base_url"] == "http://127.0.0.1:9/v1"
    assert (provider["wire_api"], provider["env_key"]) == ("responses", cx.ENV_KEY)
    assert (provider["request_max_retries"], provider["stream_max_retries"]) == (0, 0)
    assert config["approval_policy"] == "never"
    assert config["sandbox_mode"] == "danger-full-access"
    assert config["check_for_update_on_startup"] is False
    assert config["analytics"] == {"enabled": False}
    assert config["features"] == {"plugins": False, "apps": False}
    assert config["model_auto_compact_token_limit"] == 40_000
