"""Which agent sent a request, told from its own headers (SPEC §9: `cg_preset: auto`).

Claude Code compacts its own transcript near the window, so its traffic gets the `claude-code`
preset's thresholds out of the box; everything else gets `summarize`'s. Claude Code (and the
Claude Agent SDK, which runs it) marks every request it sends: `x-claude-code-session-id`, a
`user-agent` of `claude-cli/…`, and `x-app: cli`. Only headers are read, never a credential.
"""

from __future__ import annotations

from collections.abc import Mapping

from cg.state.session import header

CLAUDE_CODE = "claude-code"


def claude_code(headers: Mapping[str, str]) -> str | None:
    """Why this request is Claude Code's (the header that says so), or None."""
    if (header(headers, "x-claude-code-session-id") or "").strip():
        return "x-claude-code-session-id"
    if (header(headers, "user-agent") or "").startswith("claude-cli/"):
        return "user-agent: claude-cli/"
    return None
