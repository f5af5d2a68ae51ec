"""The pinned opencode install (tests/e2e/opencode.py): idempotent, the version checked, a clear
failure; and the configuration it runs with."""

from __future__ import annotations

import pytest

from tests.e2e import npm_pin
from tests.e2e import opencode as oc


@pytest.mark.slow  # needs the install
def test_install_is_a_no_op_once_the_pinned_version_is_there(opencode, monkeypatch):
    monkeypatch.setattr("shutil.which", lambda *a, **kw: None)  # npm must not be needed again
    assert oc.install() == opencode
    assert opencode.is_relative_to(oc.CACHE)
    assert npm_pin.version(oc._pin(), opencode) == oc.VERSION == "1.18.33"
    assert oc.PACKAGE == "opencode-ai@1.18.33"


def test_without_npm_the_install_fails_saying_what_is_needed(tmp_path, monkeypatch):
    monkeypatch.setattr(oc, "CACHE", tmp_path / "opencode")
    monkeypatch.setattr("shutil.which", lambda *a, **kw: None)
    with pytest.raises(oc.OpencodeUnavailable) as e:
        oc.install()
    message = str(e.value)
    assert f"opencode {oc.VERSION} is not in {tmp_path / 'opencode'}" in message
    assert "npm" in message and "-m 'not slow'" in message


def test_the_config_points_each_provider_at_its_url_and_merges_extra():
    limit = {"context": 50_000, "output": 8_000}
    config = oc.config(
        "anthropic/claude-haiku-4-5",
        anthropic_url="http://127.0.0.1:9/v1",
        extra={"provider": {"anthropic": {"models": {"claude-haiku-4-5": {"limit": limit}}}}},
    )
    anthropic = config["provider"]["anthropic"]
    assert anthropic["options"] == {"baseURL": "http://127.0.0.1:9/v1", "apiKey": oc.API_KEY}
    assert anthropic["models"]["claude-haiku-4-5"]["limit"] == limit
    assert "openai" not in config["provider"]
    assert (config["model"], config["small_model"]) == ("anthropic/claude-haiku-4-5",) * 2
    assert (config["autoupdate"], config["share"]) == (False, "disabled")
    assert config["permission"] == {"*": "allow"}
    assert oc.OFFLINE["npm_config_offline"] == "true"
