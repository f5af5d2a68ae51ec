"""The agents the launcher runs, and how each one is pointed at the proxy.

Each agent names the providers it talks to (a `Route`: the provider's name, its real URL — the
proxy's reverse-mode upstream — and the path the agent's base URL carries), the npm package that
installs it, and the preset for its traffic. `point` turns the proxy's base URLs into what that
agent reads, as it reads it (docs/agents.md#one-command-per-agent):

    claude     ANTHROPIC_BASE_URL
    codex      `-c` overrides before the user's arguments: a model provider at the proxy, with
               Codex's own sign-in (`requires_openai_auth`) and no WebSocket transport (its
               frames would pass the addon unread). Pinned 0.171.0 reads no OPENAI_BASE_URL, and
               `openai_base_url` keeps the WebSocket transport; `chatgpt_base_url` moves only
               the account calls, not the turns. Signed in with ChatGPT (auth.json
               `auth_mode: chatgpt`) its turns go to chatgpt.com/backend-api/codex instead.
    opencode   OPENCODE_CONFIG_CONTENT (merged over any given): the `anthropic` and `openai`
               providers' `options.baseURL`, one listener each
    gemini     GOOGLE_GEMINI_BASE_URL (Gemini CLI reads it for its API-key sign-in, plain
               http allowed for loopback). Its Code Assist sign-in (a Google account) talks to
               cloudcode-pa.googleapis.com instead, which the proxy does not serve yet: those
               turns go straight to Google, untouched.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

from cg.frozen import frozen

LOOPBACK = "127.0.0.1"


@frozen
class Route:
    """One provider an agent talks to: reverse mode to `upstream`, the agent's base URL the
    listener's address plus `path`."""

    provider: str
    upstream: str
    path: str = ""
    plan: bool = False  # a subscription's route: billed by the plan, not by the token (§14)


@frozen
class Pointing:
    """What the agent is run with: variables set over the environment, and arguments put
    before the user's."""

    env: dict[str, str]
    args: list[str]


@frozen
class Agent:
    name: str
    binary: str  # looked up on PATH unless CG_AGENT_BIN names it
    package: str  # what `npm install -g` installs it from
    preset: str  # the preset for its traffic, when the package has it (else `auto`)
    routes: Callable[[Mapping[str, str]], tuple[Route, ...]]
    point: Callable[[Mapping[str, str], Mapping[str, str]], Pointing]  # (base URLs, env)


# -- Claude Code ---------------------------------------------------------------------------------


def claude_on_subscription(env: Mapping[str, str]) -> bool:
    """Whether Claude Code signs in with a Pro/Max subscription (OAuth): no API key or token in
    the environment, and CLAUDE_CODE_OAUTH_TOKEN, or the OAuth credentials `claude login` keeps
    (`CLAUDE_CONFIG_DIR` or ~/.claude, `.credentials.json`). A key helper or the keychain (macOS)
    read as an API key: only the closing line's label depends on it."""
    if env.get("ANTHROPIC_API_KEY") or env.get("ANTHROPIC_AUTH_TOKEN"):
        return False
    if env.get("CLAUDE_CODE_OAUTH_TOKEN"):
        return True
    home = env.get("HOME")
    config = env.get("CLAUDE_CONFIG_DIR") or str((Path(home) if home else Path.home()) / ".claude")
    try:
        doc = json.loads((Path(config).expanduser() / ".credentials.json").read_text("utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and bool(doc.get("claudeAiOauth"))


def _claude_routes(env: Mapping[str, str]) -> tuple[Route, ...]:
    return (Route("anthropic", "https://api.anthropic.com", plan=claude_on_subscription(env)),)


def _claude_point(bases: Mapping[str, str], env: Mapping[str, str]) -> Pointing:
    return Pointing({"ANTHROPIC_BASE_URL": bases["anthropic"]}, [])


# -- Codex CLI -----------------------------------------------------------------------------------

CODEX_PROVIDER = "context-guru"
OPENAI_ROUTE = Route("openai", "https://api.openai.com", "/v1")
CHATGPT_ROUTE = Route("chatgpt", "https://chatgpt.com", "/backend-api/codex", plan=True)


def codex_home(env: Mapping[str, str]) -> Path:
    given = env.get("CODEX_HOME")
    if given:
        return Path(given).expanduser()
    home = env.get("HOME")
    return (Path(home) if home else Path.home()) / ".codex"


def signed_in_with_chatgpt(env: Mapping[str, str]) -> bool:
    """Whether Codex would send its turns to the ChatGPT backend: its auth.json says so
    (`auth_mode: chatgpt`, or tokens and no API key in a file from before `auth_mode`), and no
    CODEX_API_KEY overrides it. An unreadable file, or credentials in the keyring, read as an API
    key's route."""
    if env.get("CODEX_API_KEY"):
        return False
    try:
        doc = json.loads((codex_home(env) / "auth.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(doc, dict):
        return False
    mode = doc.get("auth_mode")
    if isinstance(mode, str):
        return mode.lower().startswith("chatgpt")
    return bool(doc.get("tokens")) and not doc.get("OPENAI_API_KEY")


def _codex_routes(env: Mapping[str, str]) -> tuple[Route, ...]:
    return (CHATGPT_ROUTE if signed_in_with_chatgpt(env) else OPENAI_ROUTE,)


def _toml(value: str | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)  # a TOML basic string


def codex_overrides(base_url: str) -> list[str]:
    """`-c key=value` pairs naming a model provider at `base_url` and selecting it."""
    table = f"model_providers.{CODEX_PROVIDER}"
    pairs: list[tuple[str, str | bool]] = [
        ("model_provider", CODEX_PROVIDER),
        (f"{table}.name", "OpenAI through context-guru"),
        (f"{table}.base_url", base_url),
        (f"{table}.wire_api", "responses"),
        (f"{table}.requires_openai_auth", True),
        (f"{table}.supports_websockets", False),
    ]
    out: list[str] = []
    for key, value in pairs:
        out += ["-c", f"{key}={_toml(value)}"]
    return out


def _codex_point(bases: Mapping[str, str], env: Mapping[str, str]) -> Pointing:
    (base,) = bases.values()
    return Pointing({}, codex_overrides(base))


# -- opencode ------------------------------------------------------------------------------------

OPENCODE_CONFIG_ENV = "OPENCODE_CONFIG_CONTENT"


def _opencode_routes(env: Mapping[str, str]) -> tuple[Route, ...]:
    return (
        Route("anthropic", "https://api.anthropic.com", "/v1"),
        Route("openai", "https://api.openai.com", "/v1"),
    )


def opencode_config(bases: Mapping[str, str], given: str | None) -> str:
    """OPENCODE_CONFIG_CONTENT: `given` (a JSON object, if set) with each provider's
    `options.baseURL` at its listener."""
    doc = json.loads(given) if given else {}
    if not isinstance(doc, dict):
        raise ValueError(f"{OPENCODE_CONFIG_ENV} is not a JSON object")
    providers = doc.setdefault("provider", {})
    for name, base in bases.items():
        entry = providers.setdefault(name, {})
        entry.setdefault("options", {})["baseURL"] = base
    return json.dumps(doc)


def _opencode_point(bases: Mapping[str, str], env: Mapping[str, str]) -> Pointing:
    try:
        content = opencode_config(bases, env.get(OPENCODE_CONFIG_ENV))
    except (ValueError, AttributeError) as e:
        raise ValueError(f"{OPENCODE_CONFIG_ENV}: not a JSON config object ({e})") from None
    return Pointing({OPENCODE_CONFIG_ENV: content}, [])


# -- Gemini CLI ----------------------------------------------------------------------------------


def _gemini_routes(env: Mapping[str, str]) -> tuple[Route, ...]:
    return (Route("gemini", "https://generativelanguage.googleapis.com"),)


def _gemini_point(bases: Mapping[str, str], env: Mapping[str, str]) -> Pointing:
    (base,) = bases.values()  # its one route
    return Pointing({"GOOGLE_GEMINI_BASE_URL": base}, [])


# By the command's name (`context-guru NAME`); "gemini" is the agent's name here, not a dialect's.
AGENTS: dict[str, Agent] = {
    a.name: a
    for a in (
        Agent(
            "claude",
            "claude",
            "@anthropic-ai/claude-code",
            "claude-code",
            _claude_routes,
            _claude_point,
        ),
        Agent("codex", "codex", "@openai/codex", "codex", _codex_routes, _codex_point),
        Agent("opencode", "opencode", "opencode-ai", "opencode", _opencode_routes, _opencode_point),
        Agent(
            "gemini", "gemini", "@google/gemini-cli", "gemini-cli", _gemini_routes, _gemini_point
        ),
    )
}


def no_proxy(env: Mapping[str, str]) -> dict[str, str]:
    """NO_PROXY and no_proxy with the loopback address added: an agent given HTTPS_PROXY or
    HTTP_PROXY would otherwise send its turns for the proxy through that one."""
    out = {}
    for name in ("NO_PROXY", "no_proxy"):
        have = [h for h in env.get(name, "").split(",") if h.strip()]
        out[name] = ",".join(have if LOOPBACK in have else [*have, LOOPBACK])
    return out
