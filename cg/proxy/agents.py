"""Which agent sent a request, told from its own headers (docs/behaviour.md#summarize-presets:
`cg_preset: auto`).

Claude Code, Codex CLI, opencode and Gemini CLI compact their own transcripts near the window,
so their traffic gets the `claude-code`, `codex`, `opencode` and `gemini-cli` presets'
thresholds out of the box;
everything else gets `summarize`'s. Claude Code (and the Claude Agent SDK, which runs it) marks
every request it sends: `x-claude-code-session-id`, a `user-agent` of `claude-cli/…`, and
`x-app: cli`. Codex marks its own: `originator: codex_exec` (`codex_cli_rs`, `codex_vscode`, …
by front end), a `user-agent` of `codex_exec/0.171.0 (…)`, `x-codex-turn-metadata`, and
`session-id`. opencode sends a `user-agent` of `opencode/1.18.33 ai-sdk/provider-utils/…
runtime/bun/…` on every provider's requests, and on Responses requests `originator: opencode`
and Codex's `session-id` too: `auto` asks about opencode before Codex. Gemini CLI sends a
`user-agent` of `GeminiCLI-tui/0.61.0/gemini-2.5-flash (linux; x64; terminal)` (`GeminiCLI/…`
or `GeminiCLI-CLIENT/…` by front end) on every request.
Only headers are read, never a credential.

Codex's own compaction request (`x-codex-turn-metadata` with `request_kind: "compaction"`) is
told apart too: it passes through untouched (`codex_compaction`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from cg.state.session import header
from cg.wire.dialects import DIALECTS

CLAUDE_CODE = "claude-code"
CODEX = "codex"
OPENCODE = "opencode"
GEMINI_CLI = "gemini-cli"
CODEX_METADATA = "x-codex-turn-metadata"


def claude_code(headers: Mapping[str, str]) -> str | None:
    """Why this request is Claude Code's (the header that says so), or None."""
    if (header(headers, "x-claude-code-session-id") or "").strip():
        return "x-claude-code-session-id"
    if (header(headers, "user-agent") or "").startswith("claude-cli/"):
        return "user-agent: claude-cli/"
    return None


def codex(headers: Mapping[str, str], dialect: str | None = None) -> str | None:
    """Why this request is Codex CLI's (the header that says so), or None. A bare `session-id`
    header counts only on a Responses request (the name is generic; Codex speaks only that)."""
    if (header(headers, "originator") or "").strip().startswith("codex_"):
        return "originator: codex_"
    if (header(headers, "user-agent") or "").startswith("codex_"):
        return "user-agent: codex_"
    if header(headers, CODEX_METADATA) is not None:
        return CODEX_METADATA
    known = DIALECTS.get(dialect) if dialect is not None else None
    if (
        known is not None
        and known.codex_session_header
        and (header(headers, "session-id") or "").strip()
    ):
        return "session-id"
    return None


def opencode(headers: Mapping[str, str]) -> str | None:
    """Why this request is opencode's (the header that says so), or None."""
    if (header(headers, "user-agent") or "").startswith("opencode/"):
        return "user-agent: opencode/"
    return None


def gemini_cli(headers: Mapping[str, str]) -> str | None:
    """Why this request is Gemini CLI's (the header that says so), or None."""
    agent = header(headers, "user-agent") or ""
    if agent.startswith(("GeminiCLI/", "GeminiCLI-")):
        return "user-agent: GeminiCLI"
    return None


def codex_compaction(headers: Mapping[str, str]) -> str | None:
    """The reason to pass a request through when it is Codex compacting its own history
    (`x-codex-turn-metadata` names `request_kind: "compaction"`), else None."""
    raw = header(headers, CODEX_METADATA)
    if not raw:
        return None
    try:
        meta = json.loads(raw)
    except ValueError:
        return None
    if isinstance(meta, dict) and meta.get("request_kind") == "compaction":
        return (
            "Codex's own compaction request (x-codex-turn-metadata request_kind: compaction): "
            "passed through; the conversation's checkpoint is invalidated"
        )
    return None
