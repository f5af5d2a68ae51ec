"""The block the proxy logs once it listens: what it will do, where it keeps things, and where
a person looks (docs/control.md "What the proxy says").

    context-guru 0.1.0: preset auto (claude-code for Claude Code, codex for Codex CLI, summarize otherwise)
      store      sqlite /home/me/.context-guru/cg.sqlite3
      listening  127.0.0.1:8080, reverse to https://api.anthropic.com
      dashboard  http://127.0.0.1:8080/_cg/  (also /_cg/health, /_cg/stats, /_cg/metrics)
      turns      one line each (--set cg_quiet=true to silence)

A store that could not be opened is said here too, in capitals: the proxy serves on, passing
every request through (fail open), and `/_cg/health`'s `ok` is false. That line is a WARNING,
not an ERROR: mitmdump and mitmweb stop at start-up on any ERROR logged (their `errorcheck`),
and a proxy that cannot keep state must still forward. Nothing here shows a secret: a
PostgreSQL URL is shown without its password (`redact_url`), and the control token never.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from cg import __version__
from cg.proxy.control import DEFAULT_HOSTS
from cg.settings import AUTO
from cg.state.records import redact_url

log = logging.getLogger("context_guru")

AUTO_NOTE = "claude-code for Claude Code, codex for Codex CLI, summarize otherwise"


def address(host: str, port: int) -> str:
    """`host:port`, an IPv6 host bracketed; the wildcard addresses as the loopback a local
    browser reaches them by."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def store_line(target: str, store: Any, error: str | None) -> tuple[str, bool]:
    """(what the store line says, whether it is the loud one: the store is unavailable)."""
    shown = redact_url(target) if "://" in target else target
    if error is not None:
        return (
            f"UNAVAILABLE: {error}. Passing every request through unchanged until it "
            f"opens (retried every 2 s; /_cg/health says why)",
            True,
        )
    if store is None:
        return "none (cg_preset=off and no cg_db: the usage ledger is in memory)", False
    engine = "postgresql" if shown.startswith("postgres") else "sqlite"
    return (f"{engine} {shown}" if store.persistent else f"in memory ({shown or 'none'})"), False


def listening_lines(modes: Sequence[str], addrs: Sequence[tuple[Any, ...]]) -> tuple[str, str]:
    """(the listening line, the dashboard line) for mitmproxy's modes and bound addresses."""
    where = ", ".join(dict.fromkeys(address(str(a[0]), int(a[1])) for a in addrs)) or "?"
    mode = modes[0] if modes else "regular"
    if mode.startswith("reverse:"):
        how = f"reverse to {mode.partition(':')[2]}"
    elif mode.startswith("upstream:"):
        how = f"through the upstream proxy {mode.partition(':')[2]}"
    else:
        how = f"{mode} mode"
    first = address(str(addrs[0][0]), int(addrs[0][1])) if addrs else "PROXY"
    if mode.startswith(("regular", "upstream")):
        # A regular proxy is asked for the dashboard through itself, by the reserved name.
        board = f"http://{DEFAULT_HOSTS[0]}/_cg/ through the proxy (http_proxy=http://{first})"
    else:
        board = f"http://{first}/_cg/"
    return f"{where}, {how}", board


def block(
    preset: str,
    store: tuple[str, bool],
    listening: tuple[str, str],
) -> list[str]:
    """The block's lines (the first is the headline)."""
    shown = f"{preset} ({AUTO_NOTE})" if preset == AUTO else preset
    where, board = listening
    return [
        f"context-guru {__version__}: preset {shown}",
        f"  store      {store[0]}",
        f"  listening  {where}",
        f"  dashboard  {board}  (also /_cg/health, /_cg/stats, /_cg/metrics)",
        "  turns      one line each (--set cg_quiet=true to silence)",
    ]


def announce(rt: Any, master: Any, options: Any) -> None:
    """Log the block (unless cg_quiet), and a store that could not be opened in any case."""
    try:
        server = master.addons.get("proxyserver") if master is not None else None
        addrs = list(server.listen_addrs()) if server is not None else []
    except Exception:  # noqa: BLE001 - mitmproxy's internals moved: no address, no harm
        addrs = []
    modes = [str(m) for m in (getattr(options, "mode", None) or [])]
    store = store_line(rt.store_note or getattr(options, "cg_db", ""), rt.store, rt.store_error)
    lines = block(str(getattr(options, "cg_preset", AUTO)), store, listening_lines(modes, addrs))
    quiet = bool(getattr(options, "cg_quiet", False))
    if store[1]:
        if quiet:
            log.warning("context-guru: STORE %s", store[0])
        else:
            log.warning("%s", "\n".join([*lines[:1], f"  STORE      {store[0]}", *lines[2:]]))
        return
    if not quiet:
        log.info("%s", "\n".join(lines))
