"""The `cg_*` options, each declared once: name, type, default and help (the public names,
docs/configuration.md).

Declared by the runtime addon's `load` (`cg.proxy.runtime`); every other addon reads them from
`ctx.options` or from what the runtime made of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cg.proxy import control
from cg.proxy.environ import CONTROL_TOKEN_ENV
from cg.settings import AUTO
from cg.wire.body import MAX_MESSAGES


def declare(loader: Any) -> None:
    """Add every `cg_*` option to mitmproxy's loader."""
    loader.add_option(
        "cg_preset",
        str,
        AUTO,
        "context-guru preset: auto (default: claude-code for requests carrying Claude "
        "Code's own headers, codex for Codex CLI's, opencode for opencode's, gemini-cli for "
        "Gemini CLI's, summarize for everything else), or a name from cg/presets/ (summarize, "
        "claude-code, codex, opencode, gemini-cli, mask, summarizer1509, off) applied to all "
        "traffic.",
    )
    loader.add_option(
        "cg_config",
        str | None,
        None,
        "A context-guru YAML config file, merged over the preset.",
    )
    loader.add_option(
        "cg_db",
        str,
        "",
        "The store for stashes, checkpoints and session clocks: an SQLite file, or a "
        "postgresql://user@host:port/db URL shared by several proxies (its password is "
        "never shown; PGPASSWORD or ~/.pgpass keep it out of the option); empty means the "
        "config's store.url or store.path (default ~/.context-guru/cg.sqlite3).",
    )
    loader.add_option(
        "cg_expand_inject",
        str,
        "auto",
        "Offer the model the context_guru_expand tool: auto (when the request declares "
        "tools and carries a resolvable marker), always, or never.",
    )
    loader.add_option(
        "cg_hosts",
        Sequence[str],
        [],
        "Hosts whose provider requests context-guru may rewrite (exact or *.example.com, "
        "comma-separated or repeated); empty means any host. Other hosts' traffic passes "
        "through untouched.",
    )
    loader.add_option(
        "cg_tune_malloc",
        bool,
        True,
        "Raise glibc's mmap and trim thresholds once at start (cg/proxy/malloc.py), so the "
        "~1 MB buffers of each turn reuse heap pages instead of faulting fresh ones in: "
        "about 1-3 ms per 1 MB turn. Linux/glibc only; false leaves the allocator alone.",
    )
    loader.add_option(
        "cg_max_body_mb",
        int,
        32,
        "Request bodies larger than this many MiB pass through without being parsed.",
    )
    loader.add_option(
        "cg_max_messages",
        int,
        MAX_MESSAGES,
        "Requests whose transcript (messages, or a Responses request's input items) holds "
        "more elements than this pass through untouched; the count stops at the first "
        "element over, so a longer one costs no more to refuse.",
    )
    loader.add_option(
        "cg_warm_sessions",
        int,
        16,
        "How many sessions' last request bodies are kept to index each next turn from "
        "(only its new messages are read: ~0.5 ms for 1 MB). Beyond it a session's turn "
        "is indexed whole (~6 ms for 1 MB). Each costs ~7 MB per 1 MB body kept, and "
        "as many bodies sent upstream (summarized: smaller) are kept for the usage ledger.",
    )
    loader.add_option(
        "cg_store_batch_ms",
        int,
        250,
        "The SQLite store commits each turn's bookkeeping (the usage ledger's bookings, the "
        "session's clock) with the others of this many milliseconds, in one transaction "
        "(one per turn each was half of a small turn's cost); a read of the ledger and a "
        "clean exit commit at once. A crash loses at most this window of bookings; 0 "
        "commits every one as it is made. Checkpoints and stashes are always written at "
        "once.",
    )
    loader.add_option(
        "cg_control_remote",
        bool,
        False,
        "Answer /_cg/ control endpoints for non-loopback clients too (each scoped to the "
        "session it names); prefer cg_control_token.",
    )
    loader.add_option(
        "cg_control_token",
        str,
        "",
        "A token every /_cg/ control request must present, loopback included "
        "(Authorization: Bearer TOKEN, or HTTP Basic with it as the password); it also "
        "admits non-loopback clients, each scoped to the session it names. Empty: "
        f"${CONTROL_TOKEN_ENV}, if set. Never logged.",
    )
    loader.add_option(
        "cg_control_hosts",
        Sequence[str],
        list(control.DEFAULT_HOSTS),
        "Host names, besides loopback addresses and localhost, that /_cg/ control "
        "requests may be sent to (exact or *.example.com, comma-separated or repeated); "
        "a request to any other Host is refused (DNS rebinding, pages through a regular "
        "proxy).",
    )
    loader.add_option(
        "cg_redact_credentials",
        bool,
        True,
        "Replace the credential headers (authorization, x-api-key, …) of every provider "
        "flow with a placeholder once its answer is done (or at exit), so saved flows "
        "(-w), mitmdump's printout, mitmweb and later addons never hold the key: the turns "
        "the addon routes, and every other flow in reverse mode or to a provider host "
        "(api.anthropic.com, api.openai.com, chatgpt.com, cg_hosts, or one that served a "
        "provider request).",
    )
    loader.add_option(
        "cg_quiet",
        bool,
        False,
        "Log neither the start-up block (preset, store, listening address, dashboard URL) "
        "nor the line per turn (passed, commissioned, rewritten N→M tokens); a turn that "
        "failed open and a store that cannot be opened are still logged.",
    )
    loader.add_option(
        "cg_shared",
        bool,
        False,
        "A proxy shared by several users: a summarizer model with model.source: config "
        "and no key of its own never falls back to the process's provider key "
        "(ANTHROPIC_API_KEY, OPENAI_API_KEY).",
    )
