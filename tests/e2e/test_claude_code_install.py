"""The pinned Claude Code install (tests/e2e/claude_code.py): idempotent, and a clear failure."""

from __future__ import annotations

import pytest

from tests.e2e import claude_code as cc


@pytest.mark.slow  # needs the install
def test_install_is_a_no_op_once_the_pinned_version_is_there(claude_code, monkeypatch):
    monkeypatch.setattr("shutil.which", lambda *a, **kw: None)  # npm must not be needed again
    assert cc.install() == claude_code
    assert claude_code.is_relative_to(cc.CACHE)


def test_without_npm_the_install_fails_saying_what_is_needed(tmp_path, monkeypatch):
    monkeypatch.setattr(cc, "CACHE", tmp_path / "claude-code")
    monkeypatch.setattr("shutil.which", lambda *a, **kw: None)
    with pytest.raises(cc.ClaudeCodeUnavailable) as e:
        cc.install()
    message = str(e.value)
    assert f"Claude Code {cc.VERSION} is not in {tmp_path / 'claude-code'}" in message
    assert "npm" in message and "-m 'not slow'" in message
