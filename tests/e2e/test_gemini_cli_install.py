"""The pinned Gemini CLI install (tests/e2e/gemini_cli.py): idempotent, the version checked, a
clear failure; and the settings it runs with."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e import gemini_cli as gc
from tests.e2e import npm_pin


@pytest.mark.slow  # needs the install
def test_install_is_a_no_op_once_the_pinned_version_is_there(
    gemini: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("shutil.which", lambda *a, **kw: None)  # npm must not be needed again
    assert gc.install() == gemini
    assert gemini.is_relative_to(gc.CACHE)
    assert npm_pin.version(gc._pin(), gemini) == gc.VERSION == "0.61.0"
    assert gc.PACKAGE == "@google/gemini-cli@0.61.0"


def test_without_npm_the_install_fails_saying_what_is_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gc, "CACHE", tmp_path / "gemini-cli")
    monkeypatch.setattr("shutil.which", lambda *a, **kw: None)
    with pytest.raises(gc.GeminiCliUnavailable) as e:
        gc.install()
    message = str(e.value)
    assert f"Gemini CLI {gc.VERSION} is not in {tmp_path / 'gemini-cli'}" in message
    assert "npm" in message and "-m 'not slow'" in message


def test_the_settings_sign_in_by_key_phone_nowhere_and_merge_extra() -> None:
    s = gc.settings({"model": {"compressionThreshold": 0.2}, "general": {"vimMode": False}})
    assert s["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert s["privacy"]["usageStatisticsEnabled"] is False
    assert s["telemetry"]["enabled"] is False and s["ide"]["enabled"] is False
    assert s["general"]["enableAutoUpdate"] is False and s["general"]["vimMode"] is False
    assert s["model"] == {"compressionThreshold": 0.2}
