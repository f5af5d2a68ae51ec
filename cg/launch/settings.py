"""The launcher's own settings, from `CG_*` variables only: every argument after the agent's name
is the agent's (`context-guru claude --help` is Claude Code's help).

    CG_PORT        the port to find a proxy serving on and reuse, else to start one on (an agent
                   with several providers: this port and the next ones); unset: a free port,
                   never a reused proxy
    CG_UPSTREAM    the provider's URL instead of the agent's default (reverse mode's upstream):
                   a URL for every provider the agent talks to, or `name=URL,name=URL`
                   (`anthropic`, `openai`, `chatgpt`)
    CG_AGENT_BIN   the agent's binary (default: its name, looked up on PATH)
    CG_PRESET      the preset of a started proxy (default: the agent's, e.g. claude-code)
    CG_PROXY_ARGS  extra mitmdump arguments for a started proxy, split as a shell would
    CG_LOG         where a started proxy's output goes (default: STATE_DIR/AGENT-proxy.log, beside
                   the default store; the agent's terminal stays the agent's)
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path

from cg.frozen import frozen
from cg.launch.agents import Route
from cg.settings import StoreConfig

NAMES = ("CG_PORT", "CG_UPSTREAM", "CG_AGENT_BIN", "CG_PRESET", "CG_PROXY_ARGS", "CG_LOG")


@frozen
class Settings:
    port: int | None
    upstream: str  # CG_UPSTREAM as given ("" unset)
    agent_bin: str | None
    preset: str | None
    proxy_args: list[str]
    log: Path


def state_dir() -> Path:
    """Where the default store lives (~/.context-guru)."""
    return Path(StoreConfig().path).expanduser().parent


def read(env: Mapping[str, str], agent: str) -> Settings:
    """The settings `env` gives; a bad value raises ValueError naming its variable."""
    port: int | None = None
    if env.get("CG_PORT"):
        try:
            port = int(env["CG_PORT"])
        except ValueError:
            port = -1
        if not 0 < port < 65536:
            raise ValueError(f"CG_PORT: not a port number: {env['CG_PORT']!r}")
    try:
        extra = shlex.split(env.get("CG_PROXY_ARGS", ""))
    except ValueError as e:
        raise ValueError(f"CG_PROXY_ARGS: {e}") from None
    log = env.get("CG_LOG") or str(state_dir() / f"{agent}-proxy.log")
    return Settings(
        port,
        env.get("CG_UPSTREAM", "").strip(),
        env.get("CG_AGENT_BIN") or None,
        env.get("CG_PRESET") or None,
        extra,
        Path(log).expanduser(),
    )


def with_upstreams(routes: tuple[Route, ...], given: str) -> tuple[Route, ...]:
    """`routes` with CG_UPSTREAM applied: one URL for all, or `name=URL` pairs by provider."""
    if not given:
        return routes
    if "=" not in given.split(",")[0]:
        url = _url(given)
        return tuple(Route(r.provider, url, r.path, r.plan) for r in routes)
    pairs: dict[str, str] = {}
    for part in given.split(","):
        name, eq, url = part.strip().partition("=")
        if not eq or not name:
            raise ValueError(f"CG_UPSTREAM: {part!r} is not name=URL")
        pairs[name.strip()] = _url(url)
    unknown = sorted(set(pairs) - {r.provider for r in routes})
    if unknown:
        known = ", ".join(r.provider for r in routes)
        raise ValueError(f"CG_UPSTREAM: this agent talks to {known}, not {', '.join(unknown)}")
    return tuple(
        Route(r.provider, pairs.get(r.provider, r.upstream), r.path, r.plan) for r in routes
    )


def _url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")) or len(url.split("/")) != 3:
        raise ValueError(f"CG_UPSTREAM: {url!r} is not scheme://host[:port] (reverse mode's form)")
    return url
