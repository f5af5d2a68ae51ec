"""The mitmproxy face of context-guru: options, hooks and control endpoints, kept thin.

One request, in order: control endpoint? -> provider route? -> allowed host? -> bypass? -> size
cap? -> `rewrite_body` (index, pipeline, splice, validate) -> assign the new body once, or leave
the original untouched. Every provider flow ends with its decision record in
`flow.metadata["context_guru"]`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from mitmproxy import command, contentviews, ctx, exceptions, http
from mitmproxy.net import encoding as net_encoding

from cg import __version__
from cg.billing.cache import prompt_of
from cg.billing.ledger import Ledger, chart_of
from cg.billing.listing import PAGE_DEFAULT, BadPage, page_key, page_limit
from cg.billing.prices import price_table
from cg.components import COMPONENTS, Services, build_pipeline
from cg.expand import continuation
from cg.expand import tool as expand_mod
from cg.expand.tool import TOOL_NAME, names_tool
from cg.pipeline.contract import Commissioner, Component
from cg.pipeline.rewrite import ExpandPolicy, Rewrite, rewrite_body
from cg.proxy import control, dashboard, malloc, offload, pages
from cg.proxy import view as views
from cg.proxy.agents import CLAUDE_CODE, CODEX, claude_code, codex, codex_compaction
from cg.proxy.calls import call_flow
from cg.proxy.environ import CONTROL_TOKEN_ENV, unknown_variables, unused_cheap_model
from cg.proxy.flowstate import Flows, FlowState
from cg.proxy.message import bounded_content, content, content_type, set_content
from cg.proxy.meter import Meter, late_index
from cg.proxy.providers import ProviderHosts
from cg.proxy.relay import HEADER as RELAY_HEADER
from cg.proxy.relay import Relay, RelayJob
from cg.proxy.resend import resend
from cg.proxy.stats import Stats
from cg.settings import (
    AUTO,
    Config,
    host_allowed,
    host_patterns,
    load_presets,
    no_such,
    unknown_names,
)
from cg.state.facts import FactsCache
from cg.state.session import header
from cg.state.store import Store, StoreClaimed, StoreError, valid_key
from cg.state.tenant import ANONYMOUS, fingerprint
from cg.state.tokens import TokenCounter
from cg.summarize.client import HttpPool, Origin, SummarizerClient, timeout_from_env
from cg.summarize.component import Summarize
from cg.wire import decode
from cg.wire.answers import Reply, ResponseParseError, tool_calls
from cg.wire.body import MAX_MESSAGES, MessageCache
from cg.wire.dialects import Dialect, route
from cg.wire.upstream import Exchange, provider_message, sni_name, upstream_verify

log = logging.getLogger("context_guru")

META = "context_guru"
BYPASS_HEADER = "x-context-guru-bypass"
# What people write to switch a thing on: `1` is documented, `true` was silently not a bypass.
BYPASS_VALUES = frozenset({"1", "true", "yes", "on"})
# Every store call runs on the event loop: a file another process holds locked may stall all
# traffic this long per call, never the 5 s a reader (the CLI) may wait.
STORE_BUSY_MS = 250
# A store that failed passes every request through for this long before it is tried again
# (an unopenable one is re-opened at most this often), so a broken file costs one request's
# error per period instead of one per call.
STORE_RETRY = 2.0
# The headers that carry a provider credential: replaced in a provider flow once its answer is
# done (option cg_redact_credentials), so a saved flow, a viewer or a later addon never has them:
# a turn the addon routed, and any other flow to a provider host (`cg.proxy.providers`). Our
# `response` and `error` hooks run before mitmproxy's Save (`-w`) and Dumper (the printout) see
# the finished flow: a script's hooks run at the script loader's place, ahead of both.
CREDENTIAL_HEADERS = ("authorization", "x-api-key", "api-key", "x-goog-api-key")
REDACTED = "[redacted by context-guru]"
_CREDENTIAL_NAMES = frozenset(n.encode() for n in CREDENTIAL_HEADERS)
_REDACTED_BYTES = REDACTED.encode()
FACTS_INLINE = 200  # token counts written back on the loop after an answer, at most


def _redacted(fields: tuple[tuple[bytes, bytes], ...]) -> tuple[tuple[bytes, bytes], ...]:
    """Raw header fields with every credential's value replaced (the names stay)."""
    return tuple([(k, _REDACTED_BYTES if k.lower() in _CREDENTIAL_NAMES else v) for k, v in fields])


def redact(headers: http.Headers) -> None:
    """Every credential header's value replaced by REDACTED (the names stay: what was sent).
    One pass over the raw fields: four lookups and a `set_all` each were ~0.02 ms a flow; a
    loop, not `any` of a generator and `tuple` of another, 2.25 -> 0.94 µs."""
    fields = headers.fields
    for k, _ in fields:
        if k.lower() in _CREDENTIAL_NAMES:
            headers.fields = _redacted(fields)
            return


def redact_backup(flow: http.HTTPFlow) -> None:
    """The credential out of the flow's backup too (`flow.backup()`, taken before a rewrite for
    mitmweb's Revert): a saved flow file carries the backup, headers included."""
    backup = getattr(flow, "_backup", None)
    req = backup.get("request") if isinstance(backup, dict) else None
    if not isinstance(req, dict) or "headers" not in req:
        return
    req["headers"] = _redacted(req["headers"])


def _request_text(raw: bytes, encoding: str | None) -> str:
    """A relayed request's text as `get_content(strict=False)` would give it (decoded when its
    content-encoding is readable), made only when a continuation needs it."""
    body = raw
    if encoding:
        with contextlib.suppress(ValueError):
            decoded = net_encoding.decode(raw, encoding)
            if isinstance(decoded, bytes):
                body = decoded
    return body.decode("utf-8")  # a rewritten body: valid UTF-8


def repeated_options(options: Any) -> list[tuple[str, list[str]]]:
    """Our single-valued options given more than once on the command line (`--set cg_x=a
    --set cg_x=b`), with their values, read from mitmproxy's deferred settings: it refuses
    them once the script's options are added, and then drops the script silently. A list
    option (`Sequence[str]`, as mitmproxy tells them apart) is given by repeating it."""
    lists = {k for k, o in options.items() if o.typespec == Sequence[str]}
    out: list[tuple[str, list[str]]] = []
    for name, value in getattr(options, "deferred", {}).items():
        values = getattr(value, "val", None)  # (mitmproxy's `_UnconvertedStrings`)
        if (
            name.startswith("cg_")
            and name not in lists
            and isinstance(values, list)
            and len(values) > 1
        ):
            out.append((name, [str(v) for v in values]))
    return out


def unknown_options(options: Any) -> list[tuple[str, str | None]]:
    """`cg_*` options set on the command line that no addon claimed (a misspelt `cg_preset`),
    each with the closest one that exists, asked once every script's options are added:
    mitmproxy holds them for an addon that may claim them later, and never says so."""
    known = list(options.keys())
    return unknown_names(getattr(options, "deferred", {}), known, ("cg_",))


def _warn_unused_cheap_model(pipelines: dict[str, list[Component]]) -> None:
    """`CHEAP_MODEL*` set where every summarizer in force reuses the incoming request's model:
    say so, or the user believes a cheap model writes summaries the agent's model writes."""
    sources = [
        c.cfg.model.source for comps in pipelines.values() for c in comps
        if isinstance(c, Summarize)
    ]  # fmt: skip
    unused = unused_cheap_model(os.environ, sources)
    if unused:
        log.warning(
            "context-guru: %s set but not used: the summaries of every preset in force are "
            "written by the incoming request's own model (model.source: incoming); set "
            "components.summarize.model.source: config (cg_config) to use a cheap model",
            ", ".join(unused),
        )


def control_token(given: str) -> str:
    """`cg_control_token`, or `$CONTEXT_GURU_CONTROL_TOKEN` when the option is empty (a token
    kept off the command line, which `ps` shows). One a client could not send as it is (a
    space, a control character, beyond ASCII) is refused; never shown."""
    token = given or os.environ.get(CONTROL_TOKEN_ENV, "")
    source = "cg_control_token" if given else CONTROL_TOKEN_ENV
    if token and not (token.isascii() and token.isprintable() and " " not in token):
        raise ValueError(
            f"{source}: must be printable ASCII without spaces (the value is not shown)"
        )
    return token


def _passed(dialect: str, outcome: str, reason: str) -> dict[str, Any]:
    """The record of a request whose body was not read."""
    record: dict[str, Any] = {"dialect": dialect, "outcome": outcome, "reason": reason}
    if reason.endswith("is over cg_max_body_mb"):
        record["bound"] = "cg_max_body_mb"
    return record


def _over_cap(dialect: str, e: decode.TooLarge) -> dict[str, Any]:
    record = _passed(
        dialect,
        "passed_through",
        f"body {e} (cg_max_body_mb): passed through without being decoded further",
    )
    record["bound"] = "cg_max_body_mb"
    return record


def upstream_sni(req: http.Request) -> str | None:
    """The provider's name for our own calls' TLS when `req.url` names the address connected
    to (transparent and local modes): the name the agent asked for (`Host`, `:authority`).

    Remembered by what `pretty_host` reads (the host connected to, the HTTP version, the
    `:authority` and the `Host` header): a relayed turn asked it every time, and mitmproxy's
    `pretty_host` parses the authority afresh (~0.05 ms)."""
    data = req.data
    key = (data.host, data.http_version, data.authority, header(req.headers, "host"))
    if key not in _SNI:
        if len(_SNI) >= SNI_MEMO_MAX:
            _SNI.clear()
        _SNI[key] = sni_name(data.host, req.pretty_host)
    return _SNI[key]


SNI_MEMO_MAX = 256
_SNI: dict[tuple[str, bytes, bytes, str | None], str | None] = {}


class ContextGuru:
    def __init__(self) -> None:
        self.stats = Stats()
        self.cache = MessageCache()
        self.config = Config()
        self.pipelines: dict[str, list[Component]] = {}
        self.preset = ""
        self.hosts: Sequence[str] = ()
        self.max_body = 32 * 1024 * 1024
        self.max_messages = MAX_MESSAGES
        self.offload = offload.Offload()
        self._flushing: asyncio.Task[None] | None = None  # a write-back of many token counts
        self.control = control.ControlPolicy()
        self.redact = True
        # Provider flows in flight, each with its state; ending one redacts its credential.
        self.flows = Flows(self._ended)
        self.providers = ProviderHosts()  # which flows the addon does not route are providers'
        self.store_error: str | None = None  # why the configured store could not be opened
        self.started = False  # `running` was called: start-up is over
        self._store_retry_at = 0.0
        self.tokens = TokenCounter()
        self.facts = FactsCache(self.tokens)
        self.store: Store | None = None
        self.store_note = ""
        self.tasks: dict[str, asyncio.Task[str]] = {}
        self.pool = HttpPool()
        # Streamed answers of turns offered the expand tool go through the relay (its own
        # pool, uncapped: each holds a connection for a whole generation).
        self.relay_pool = HttpPool(max_connections=None)
        self.relay = Relay(self.relay_pool.client)
        self._bg: set[asyncio.Task[None]] = set()  # held, so that they are not collected
        self.keep_backup = True  # `flow.backup()` before a rewrite, for a UI's Revert
        self.meter = Meter(self.stats.usage_reads, self.flows)
        self.expand = ExpandPolicy("auto", None)
        self.views = views.all_views(self._stash)
        # Flows shown for our own calls, being added (kept referenced until done).
        self.showing: set[asyncio.Task[None]] = set()
        self.off_loop = pages.OffLoop()  # the control answers that read pages of the store

    @property
    def live(self) -> dict[str, http.HTTPFlow]:
        """The provider flows in flight (whose credential is redacted when done), by id."""
        return {st.flow.id: st.flow for st in self.flows}

    @property
    def awaiting(self) -> dict[str, list[Any]]:
        """Summary jobs waiting for their commissioning flow's answer to begin, by flow id."""
        return {st.flow.id: list(st.awaiting) for st in self.flows if st.awaiting}

    def _stash(self, key: str) -> Any:
        """A stash for the views (mitmweb's thread or the loop: a read, never raises out)."""
        return self.store.get_stash(key) if self.store is not None else None

    def _set_verify(self, verify: bool | str) -> None:
        self.pool.verify = verify
        self.relay_pool.verify = verify
        self.relay.h1.verify = verify

    def load(self, loader: Any) -> None:
        # mitmproxy enables DEBUG on the root logger and filters in its handlers, so httpcore
        # made (and mitmproxy dropped) ~12 debug records per relayed turn: ~0.25 ms of its
        # CPU. httpcore logs nothing above DEBUG.
        logging.getLogger("httpcore").setLevel(logging.INFO)
        for v in [v for v in contentviews.views if v.name in views.names()]:
            contentviews.remove(v)  # a reloaded script leaves its predecessor's views behind
        for v in self.views:
            contentviews.add(v)
        loader.add_option(
            "cg_preset",
            str,
            AUTO,
            "context-guru preset: auto (default: claude-code for requests carrying Claude "
            "Code's own headers, codex for Codex CLI's, summarize for everything else), or a "
            "name from presets/ (summarize, claude-code, codex, summarizer1509, off) applied to "
            "all traffic.",
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
            "cg_shared",
            bool,
            False,
            "A proxy shared by several users: a summarizer model with model.source: config "
            "and no key of its own never falls back to the process's provider key "
            "(ANTHROPIC_API_KEY, OPENAI_API_KEY).",
        )
        if not control.capture_client_host():
            log.warning(
                "context-guru: this mitmproxy hides the Host a client sent in reverse mode; "
                "/_cg/ requests through a reverse-mode listener are refused"
            )
        try:
            repeated = repeated_options(loader.master.options)
        except Exception:  # noqa: BLE001 - mitmproxy's internals moved: no check, no harm
            repeated = []
        for name, values in repeated:
            # Right after this hook mitmproxy refuses the option and drops the whole script
            # without a word: the proxy would run as plain mitmdump. Logged as an error, it
            # stops mitmdump and mitmweb at start-up with this message instead.
            log.error(
                "context-guru: --set %s was given %d times (%s); mitmproxy refuses an option "
                "given more than once and would run without context-guru: give it once",
                name,
                len(values),
                ", ".join(repr(v) for v in values),
            )

    def configure(self, updated: set[str]) -> None:
        opts = ctx.options
        if updated & {"ssl_insecure", "ssl_verify_upstream_trusted_ca"}:
            # Our own calls verify as mitmproxy's upstream leg does, changed at run time too.
            self._set_verify(upstream_verify(opts))
        if not any(k.startswith("cg_") for k in updated):
            return
        if "cg_tune_malloc" in updated and opts.cg_tune_malloc:
            why = malloc.tune()
            if why is not None:
                log.info("context-guru: allocator left as it is: %s", why)
        try:
            if opts.cg_max_body_mb < 0:
                raise ValueError(f"cg_max_body_mb: must be >= 0 (got {opts.cg_max_body_mb})")
            if opts.cg_max_messages < 1:
                raise ValueError(f"cg_max_messages: must be >= 1 (got {opts.cg_max_messages})")
            if opts.cg_warm_sessions < 1:
                raise ValueError(f"cg_warm_sessions: must be >= 1 (got {opts.cg_warm_sessions})")
            if not 0 <= opts.cg_store_batch_ms <= 60_000:
                raise ValueError(
                    f"cg_store_batch_ms: must be in 0..60000 (got {opts.cg_store_batch_ms})"
                )
            unknown = unknown_variables(os.environ)
            if unknown:
                raise ValueError(
                    "; ".join(no_such(n, close, "environment variable") for n, close in unknown)
                )
            configs = load_presets(opts.cg_preset, opts.cg_config, list(COMPONENTS))
            # The last one is the default: `summarize` under auto, else the one named.
            preset = list(configs)[-1]
            config = configs[preset]
            acting = any(c.pipeline for c in configs.values())
            # The usage ledger persists with any pipeline, or wherever cg_db names a file.
            store = self._open_store(config, opts.cg_db) if acting or opts.cg_db else self.store
            ledger = Ledger(
                store or Store.memory(),
                price_table(config.prices),
                self.facts,
                sent_bodies=opts.cg_warm_sessions,
            )
            ledger.store.batch_delay = opts.cg_store_batch_ms / 1000
            timeout = timeout_from_env()
            self._set_verify(upstream_verify(opts))
            pipelines = {
                name: build_pipeline(
                    c.pipeline,
                    c.components,
                    Services(
                        store or Store.memory(),
                        self.tokens,
                        c.model_windows,
                        summarizers=lambda cfg, level: SummarizerClient(
                            cfg,
                            self.pool,
                            level=level,
                            timeout=timeout,
                            on_usage=self.meter.summarizer,
                            shared_proxy=opts.cg_shared,
                            on_call=self._summary_call,
                        ),
                        facts=self.facts,
                    ),
                )
                for name, c in configs.items()
            }
        except ValueError as e:
            raise exceptions.OptionsError(str(e)) from None  # type: ignore[no-untyped-call]
        _warn_unused_cheap_model(pipelines)
        try:
            hosts = host_patterns(opts.cg_hosts)
            control_hosts = control.control_hosts(opts.cg_control_hosts)
            token = control_token(opts.cg_control_token)
        except ValueError as e:
            raise exceptions.OptionsError(str(e)) from None  # type: ignore[no-untyped-call]
        if opts.cg_expand_inject not in ("auto", "always", "never"):
            raise exceptions.OptionsError(  # type: ignore[no-untyped-call]
                f"cg_expand_inject: must be auto, always or never (got {opts.cg_expand_inject!r})"
            )
        self.cache.resize(opts.cg_warm_sessions)
        self.config = config
        self.pipelines = pipelines
        self.preset = preset
        self.meter.ledger = ledger
        self.expand = ExpandPolicy(opts.cg_expand_inject, store)
        self.hosts = hosts
        self.providers = ProviderHosts(hosts, self.providers.seen)
        self.max_body = opts.cg_max_body_mb * 1024 * 1024
        self.max_messages = opts.cg_max_messages
        self.meter.max_messages = opts.cg_max_messages
        self.control = control.ControlPolicy(opts.cg_control_remote, token, control_hosts)
        self.redact = opts.cg_redact_credentials

    @property
    def components(self) -> list[Component]:
        """The pipeline of requests no rule picks another for (`summarize` under auto)."""
        return self.pipelines.get(self.preset, [])

    def pipeline_for(
        self, headers: Any, dialect: str | None = None
    ) -> tuple[str, list[Component], str]:
        """(preset, its pipeline, why) for one request: under `auto`, Claude Code's own headers
        pick `claude-code` and Codex's `codex`; a preset the user named applies to everything."""
        if len(self.pipelines) > 1:
            why = claude_code(headers)
            if why is not None and CLAUDE_CODE in self.pipelines:
                return CLAUDE_CODE, self.pipelines[CLAUDE_CODE], f"auto: {why}"
            why = codex(headers, dialect)
            if why is not None and CODEX in self.pipelines:
                return CODEX, self.pipelines[CODEX], f"auto: {why}"
            return self.preset, self.components, "auto: neither Claude Code nor Codex"
        return self.preset, self.components, "cg_preset"

    def _open_store(self, config: Config, cg_db: str) -> Store:
        """The store for this config; reopened only when its file changes.

        A store that cannot be opened is not fatal: the proxy runs on an in-memory store, and
        `full` markers degrade to none (nothing could be restored from them).
        """
        path = cg_db or config.store.url or config.store.path
        if self.store is not None and self.store_note == path and self.store_error is None:
            return self.store
        if self.store is not None:
            self.store.close()
        # A process reading a flow file (`-r`: mitmweb or mitmdump showing saved flows) serves
        # no traffic of its own: it reads the store beside the proxy that holds it.
        claim = not getattr(ctx.options, "rfile", None)
        try:
            self.store = Store.open(
                config.store, cg_db or None, busy_timeout_ms=STORE_BUSY_MS, claim=claim
            )
            if self.store_error is not None:
                log.warning("context-guru: the store %s opened; acting again", self.store.path)
            self.store_error = None
        except StoreClaimed as e:
            # Another proxy holds the file: refused at start (mitmdump stops, saying so); a
            # proxy already running passes through until the file is free.
            self.store_error = str(e)
            self._store_retry_at = time.monotonic() + STORE_RETRY
            self.store = Store.memory()
            self.store_note = path
            if not self.started:
                raise ValueError(f"cg_db: {e}") from None
        except StoreError as e:
            if self.store_error is None:
                log.warning(
                    "context-guru: %s; passing every request through until it opens (retried "
                    "every %gs; /_cg/health says why)",
                    e,
                    STORE_RETRY,
                )
            self.store_error = str(e)
            self._store_retry_at = time.monotonic() + STORE_RETRY
            self.store = Store.memory()  # the ledger, in memory meanwhile
        self.store_note = path
        return self.store

    def store_state(self) -> dict[str, Any]:
        """`/_cg/health`'s `store`: `{"ok": true}` or `{"ok": false, "error": why}` (SPEC §9).
        Asking is also a retry: a store that failed is tried again (as a request would)."""
        try:
            down = self._store_down()
        except Exception as e:  # noqa: BLE001 - the endpoint answers whatever happened
            down = f"the store could not be checked ({type(e).__name__}: {e})"
        store = self.store
        out: dict[str, Any] = {"ok": down is None}
        if store is not None:
            out["persistent"] = store.persistent
            with contextlib.suppress(Exception):
                out.update(store.describe())
        if down is not None:
            out["error"] = down
        return out

    def _reopen_store(self) -> str | None:
        """Try the configured store again, rebuilding the pipelines on it; the error, or None."""
        try:
            self.configure({"cg_db"})
        except exceptions.OptionsError as e:
            return str(e)
        return self.store_error

    def _store_down(self) -> str | None:
        """Why provider requests pass through untouched now (the store is unusable), or None.

        An unopenable store is re-opened at most every STORE_RETRY seconds; one whose file was
        deleted under it is written back from the open connection; one whose last operation
        failed (locked, read-only, full) is left alone for STORE_RETRY seconds, then tried.
        """
        now = time.monotonic()
        if self.store_error is not None:
            if now < self._store_retry_at:
                return f"the store is unavailable ({self.store_error})"
            error = self._reopen_store()
            return None if error is None else f"the store is unavailable ({error})"
        store = self.store
        if store is None or not store.persistent:
            return None
        problem = store.file_problem()
        if problem is not None:
            if store.error is not None and now - store.error_at < STORE_RETRY:
                return f"{problem}; {store.error}"
            try:
                store.restore_file()
                log.warning("context-guru: %s; written back from the open store", problem)
            except StoreError as e:
                return f"{problem}; {e}"
        if store.error is not None:
            if now - store.error_at < STORE_RETRY:
                return f"the store failed ({store.error}); retried after {STORE_RETRY:g}s"
            try:
                store.probe()  # writes again? (sets error_at anew when not)
            except StoreError as e:
                return f"the store failed ({e}); retried after {STORE_RETRY:g}s"
        return None

    def running(self) -> None:
        """Freeze the start-up heap: a full GC then skips it (~35 ms -> ~2 ms with 1 MiB bodies).
        Start the expand relay, unless requests go through an upstream proxy (which would
        never reach a relay on our loopback)."""
        self.started = True
        gc.freeze()
        try:  # (here: every script's options are added by now, another's `cg_` ones too)
            unknown = unknown_options(ctx.options)
        except Exception:  # noqa: BLE001 - mitmproxy's internals moved: no check, no harm
            unknown = []
        for name, close in unknown:
            # mitmproxy keeps an option no addon claims and never says so: a typo would leave
            # the default in force (`auto`, where `off` was meant). Logged as an error at
            # start-up, it stops mitmdump and mitmweb with this message.
            log.error("context-guru: --set %s", no_such(name, close, "option"))
        # Revert needs a UI: mitmdump has none, and a flow it saves (`-w`) would hold the
        # client's body twice. `flow.backup()` was ~0.2 ms of a 1 MB reuse turn's hook.
        self.keep_backup = type(ctx.master).__name__ != "DumpMaster"
        modes = getattr(ctx.options, "mode", None) or []
        if any(str(m).startswith("upstream") for m in modes):
            return
        with contextlib.suppress(RuntimeError):  # no running loop: turns are buffered instead
            self._bg = {asyncio.get_running_loop().create_task(self.relay.start())}

    def done(self) -> None:
        for v in self.views:
            if v in contentviews.views:
                contentviews.remove(v)
        self.flows.end_all()  # flows in flight at exit: a saved file gets them redacted
        for task in list(self.tasks.values()):
            task.cancel()
        self.tasks.clear()
        self.relay.close()
        self.offload.close()
        with contextlib.suppress(RuntimeError):  # no running loop: nothing left to close
            loop = asyncio.get_running_loop()
            self._bg = {
                loop.create_task(self.pool.aclose()),
                loop.create_task(self.relay_pool.aclose()),
            }
        self.meter.close()
        self.off_loop.close()
        if self.store is not None:
            self.store.close()
            self.store = None

    # -- hooks -------------------------------------------------------------------------------

    def request(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        """A provider request: guards, then its body read (bounded) and rewritten, assigned
        once. A body too long to read on the event loop is read in the worker thread
        (`cg.proxy.offload`), and a control request that reads pages of the store is answered
        in another (`cg.proxy.pages`): then an awaitable is returned, which mitmproxy awaits
        (other flows go on meanwhile)."""
        if not flow.live:
            # A flow read from a file (`-r`, mitmweb's open) or one of our own calls shown as a
            # flow: nothing goes upstream, so nothing is rewritten, counted or booked.
            return None
        req = flow.request
        if control.is_control(req.path):
            return control.answer(flow, self._routes(), self.control)
        dialect = route(req.method, req.path)
        # By name (the Host header): in transparent/local mode, and in a CONNECT tunnel,
        # `req.host` is the address connected to, not the provider's name.
        if dialect is None or (self.hosts and not host_allowed(req.pretty_host, self.hosts)):
            # (`pretty_host` parses the Host header: only asked when cg_hosts is set)
            if self.redact and self.providers(flow):
                self._hold(flow)  # count_tokens, /v1/models: its key is redacted once done
            return None
        self.stats.requests += 1
        self.flows.begin(flow)
        if req.data.host not in self.providers.seen:  # its siblings are a provider's too
            self.providers.learn(req.data.host)
        t0 = time.perf_counter()
        try:
            down = self._store_down() if any(self.pipelines.values()) else None
        except Exception as e:  # noqa: BLE001 - a hook never raises: pass through, say why
            down = f"the store could not be checked ({type(e).__name__}: {e})"
        passing = self._passing(req, down)
        if passing is not None:
            self._conclude(flow, t0, _passed(dialect.name, *passing))
            return None
        encoding = header(req.headers, "content-encoding")
        if encoding and len(req.raw_content or b"") > offload.ENCODED_INLINE:
            return self._aside(flow, dialect, t0, None, "a content-encoded body to decode")
        # A content-encoded body is decoded here only as far as a turn is read here: one that
        # goes on decoding past that (a 1.7 KB brotli body of 1 GiB) goes on in the worker.
        inline = min(self.max_body, offload.INLINE[0]) if encoding else self.max_body
        try:
            raw = bounded_content(req, inline)
        except decode.TooLarge as e:
            if inline < self.max_body:
                return self._aside(flow, dialect, t0, None, "a content-encoded body to decode")
            self._conclude(flow, t0, _over_cap(dialect.name, e))
            return None
        except ValueError as e:
            self._conclude(
                flow, t0, _passed(dialect.name, "passed_through", f"cannot decode body: {e}")
            )
            return None
        preset, components, why = self.pipeline_for(req.headers, dialect.name)
        tenant = self.tenant_of(req.headers)
        result = rewrite_body(
            raw,
            dialect,
            components,
            headers=req.headers,
            cache=self.cache,
            expand=self.expand,
            agent_compaction=codex_compaction(req.headers),
            max_messages=self.max_messages,
            inline=offload.INLINE,
            tenant=tenant,
        )
        if result.deferred is not None:
            return self._aside(flow, dialect, t0, raw, result.deferred)
        self._conclude(flow, t0, result.record, raw, result, preset, why, tenant)
        return None

    def _aside(
        self,
        flow: http.HTTPFlow,
        dialect: Dialect,
        t0: float,
        raw: bytes | None,
        why: str,
    ) -> Awaitable[None] | None:
        """The request read in the worker thread (`raw`: its decoded body, or None to decode it
        there too); while too many wait for it, passed through instead."""
        if self.offload.full():
            self.offload.busy += 1
            reason = (
                f"{self.offload.waiting} large bodies are being read already: this one "
                f"({why}) passes through unread"
            )
            record = _passed(dialect.name, "passed_through", reason)
            record["bound"] = "large bodies in flight"
            self._conclude(flow, t0, record)
            return None
        return self._read_aside(flow, dialect, t0, raw, why)

    async def _read_aside(
        self, flow: http.HTTPFlow, dialect: Dialect, t0: float, raw: bytes | None, why: str
    ) -> None:
        req = flow.request
        preset, components, reason = self.pipeline_for(req.headers, dialect.name)
        tenant = self.tenant_of(req.headers)
        started = time.perf_counter()
        try:
            raw, result = await self.offload.run(
                self._read_whole,
                raw,
                req.raw_content or b"",
                header(req.headers, "content-encoding") or "",
                dialect,
                components,
                req.headers,
                codex_compaction(req.headers),
                tenant,
            )
        except Exception as e:  # noqa: BLE001 - a hook never raises: pass through, say why
            record = _passed(
                dialect.name, "failed_open", f"internal error: {type(e).__name__}: {e}"
            )
            self._conclude(flow, t0, record)
            return
        if isinstance(result, dict):  # (a record: the body was not read)
            result["read_aside"] = why
            result.setdefault("timings_ms", {})["aside"] = round(
                (time.perf_counter() - started) * 1000, 3
            )
            self._conclude(flow, t0, result)
            return
        result.record.setdefault("timings_ms", {})["aside"] = round(
            (time.perf_counter() - started) * 1000, 3
        )
        result.record["read_aside"] = why
        if result.index is not None:
            self.cache.remember(result.index)  # (on the loop: the cache is the loop's alone)
        self._conclude(flow, t0, result.record, raw, result, preset, reason, tenant)

    def _read_whole(
        self,
        raw: bytes | None,
        content: bytes,
        encoding: str,
        dialect: Dialect,
        components: list[Component],
        headers: Any,
        compaction: str | None,
        tenant: str,
    ) -> tuple[bytes | None, Rewrite | dict[str, Any]]:
        """In the worker thread: the body decoded (bounded) unless it was, and rewritten, read
        whole (no message cache: it is the loop's). Returns the decoded body and the rewrite,
        or a pass-through record when the body cannot be read."""
        if raw is None:
            try:
                raw = decode.decode(content, encoding, self.max_body)
            except decode.TooLarge as e:
                return None, _over_cap(dialect.name, e)
            except ValueError as e:
                return None, _passed(dialect.name, "passed_through", f"cannot decode body: {e}")
        result = rewrite_body(
            raw,
            dialect,
            components,
            headers=headers,
            expand=self.expand,
            agent_compaction=compaction,
            max_messages=self.max_messages,
            tenant=tenant,
        )
        if result.index is not None and "components" in result.record:
            # The usage ledger's prompt-cache shape of it, made here (memoised on the index):
            # the answer books it on the loop, where ~20,000 messages took ~50 ms.
            with contextlib.suppress(Exception):
                prompt_of(result.index, self.facts)
        return raw, result

    def _conclude(
        self,
        flow: http.HTTPFlow,
        t0: float,
        record: dict[str, Any],
        raw: bytes | None = None,
        result: Rewrite | None = None,
        preset: str = "",
        why: str = "",
        tenant: str = ANONYMOUS,
    ) -> None:
        """The request's end, on the loop: a rewrite assigned once (or the original left
        untouched), its summaries commissioned, its record kept, its usage metered."""
        req = flow.request
        summary_flow: str | None = None
        index = result.index if result is not None else None
        shape = result.shape if result is not None else None
        if result is not None and raw is not None:
            record["preset"] = preset
            record["preset_reason"] = why
            self._count_components(record)
            if result.body is not None:
                original, fields = req.raw_content, req.headers.fields
                if self.keep_backup:  # mitmweb's Revert: the request as it came (by reference)
                    flow.backup()  # type: ignore[no-untyped-call]
                try:
                    set_content(req, result.body)
                    self.flows.begin(flow).original = original
                except Exception as e:  # noqa: BLE001 - an encoder error must fail open
                    req.headers.fields, req.raw_content = fields, original
                    record["outcome"] = "failed_open"
                    record["reason"] = f"cannot re-encode body: {e}"
            if result.commissions:
                # The body as it goes upstream: what the provider caches for this session.
                sent = result.body if record["outcome"] == "rewritten" else raw
                origin = Origin.of(req.url, req.headers, upstream_sni(req))
                summary_flow = str(uuid.uuid4())
                for _, job in result.commissions:
                    job.flow_id, job.call_flow_id = flow.id, summary_flow
                self._commission(result.commissions, origin, sent, flow.id)
            # Last: the summary's origin above is the provider, never the relay.
            try:
                self._relay(flow, record, tenant)
            except Exception as e:  # noqa: BLE001 - without the relay the answer is buffered
                log.warning("context-guru: relay not used: %s", type(e).__name__)
        self.stats.count(record["outcome"])
        record.setdefault("timings_ms", {})["hook"] = round((time.perf_counter() - t0) * 1000, 3)
        flow.metadata[META] = record
        self.meter.note(flow, record, index, self.max_body, shape)
        self.meter.arm()  # the session's clock, if the pipeline held one
        views.mark(
            flow,
            views.view_record(
                record,
                commissioned=summary_flow is not None,
                summary_flow=summary_flow,
                client_bytes=len(raw) if raw is not None else None,
            ),
        )
        if record["outcome"] == "failed_open":
            log.warning("context-guru failed open on %s: %s", req.path, record["reason"])
        return None

    def _passing(self, req: http.Request, down: str | None) -> tuple[str, str] | None:
        """(outcome, reason) for a provider request passed through without reading its body:
        bypassed, the store down, a streamed body, or one whose very bytes are over
        cg_max_body_mb (what it decodes to is bounded as it is decoded); else None."""
        asked = header(req.headers, BYPASS_HEADER)
        if asked is not None and asked.strip().lower() in BYPASS_VALUES:
            return "bypassed", f"{BYPASS_HEADER}: {asked.strip()}"
        if down is not None:
            return "passed_through", f"{down}: passing through until it works"
        if req.raw_content is None:
            return "passed_through", "body streamed"
        if len(req.raw_content) > self.max_body:
            return "passed_through", f"body of {len(req.raw_content)} bytes is over cg_max_body_mb"
        return None

    def tenant_of(self, headers: Any) -> str:
        """Who a request is (`cg.state.tenant`): its credential's fingerprint under the
        store's key; anonymous without a store (nothing is kept then)."""
        store = self.store
        return fingerprint(store.tenant_key, headers) if store is not None else ANONYMOUS

    def _relay(self, flow: http.HTTPFlow, record: dict[str, Any], tenant: str) -> None:
        """A streamed turn offered our tool goes to the relay (`cg.proxy.relay`), so its answer
        streams and is held only if it calls the tool; without a relay it is buffered."""
        expand = record.get("expand")
        if (
            not self.relay.port
            or not record.get("stream")
            or not isinstance(expand, dict)
            or not expand.get("injected")
            or record.get("outcome") != "rewritten"
        ):
            return
        req = flow.request
        job = RelayJob(
            req.url,
            req.headers.fields,
            req.raw_content or b"",
            functools.partial(
                _request_text, req.raw_content or b"", req.headers.get("content-encoding")
            ),
            record["dialect"],
            upstream_sni(req),
            self._resolver(record.get("session"), tenant),
            (req.data.scheme, req.data.host, req.data.port),
        )
        job.times.append(time.perf_counter())
        job.token = self.relay.add(job)
        # The hop carries neither the body nor the agent's headers (the job holds both, and
        # the relay sends them upstream): mitmproxy writes, and the relay reads, a head of
        # three fields, not ~1 MB and ~20 headers. The flow's own are restored when the
        # answer's headers arrive (`_unrelay`).
        req.headers.fields = (
            (b"host", b"127.0.0.1:%d" % self.relay.port),
            (b"content-length", b"0"),
            (RELAY_HEADER.encode(), job.token.encode()),
        )
        req.data.content = b""
        # The data fields: the `host` setter would rewrite the Host header as well.
        req.data.scheme, req.data.host, req.data.port = b"http", "127.0.0.1", self.relay.port
        self.flows.begin(flow).job = job
        expand["relayed"] = True

    def _resolver(self, session: str | None, tenant: str) -> Callable[[str], str]:
        """What answers the model's `context_guru_expand` calls for `session`: the stashed span
        from the store as it is now, when `tenant` (the credential that carries the answer
        upstream) may read it (none: the id is no longer available)."""
        store = self.store

        def resolve(key: str) -> str:
            if store is None:
                return f"context_guru_expand: id {key!r} is no longer available."
            return expand_mod.resolve(store, key, session, tenant)

        return resolve

    def _unrelay(self, flow: http.HTTPFlow) -> RelayJob | None:
        """The flow's request as it went upstream again (URL, headers, body), and its relay
        token gone."""
        st = self.flows.get(flow.id)
        job = st.job if st is not None else None
        if job is not None:
            self.relay.jobs.pop(job.token, None)  # never reached the relay: forget it (its key)
        if job is not None and header(flow.request.headers, RELAY_HEADER) is not None:
            flow.request.headers.fields = job.headers
            req = flow.request.data
            req.content = job.body
            req.scheme, req.host, req.port = job.origin
        return job

    def _drop(self, flow: http.HTTPFlow) -> tuple[bytes | None, RelayJob | None]:
        """The flow is answered or failed: its URL as the agent sent it again, and its client
        bytes (a rewritten flow's) and relay job forgotten here; both returned."""
        self._unrelay(flow)
        st = self.flows.get(flow.id)
        if st is None:
            return None, None
        original, job, st.original, st.job = st.original, st.job, None, None
        return original, job

    # -- summaries, off the hot path ------------------------------------------------------------

    def _count_components(self, record: dict[str, Any]) -> None:
        for rec in record.get("components", ()):
            if rec.get("reused") and record.get("outcome") == "rewritten":
                self.stats.summaries.reused += 1
                self.stats.tokens_before += int(rec.get("tokens", 0))
                self.stats.tokens_after += int(rec.get("tokens_after", 0))

    def _commission(
        self,
        commissions: list[tuple[Component, Any]],
        origin: Origin,
        forwarded: bytes | None = None,
        flow_id: str | None = None,
    ) -> None:
        """Start each commissioned summary as a background task; the turn is not held.

        `origin` (the request's endpoint and credential, for an `incoming` summary) and
        `forwarded` (its body as sent upstream, for the shared-cache call) are handed to the job
        in memory and dropped when the job ends. The job may wait for flow `flow_id`'s answer to
        begin (`_answer_began`), when the provider's cache entry for that body exists.
        """
        for comp, job in commissions:
            job.origin = origin
            if forwarded is not None and hasattr(job, "answer_began"):
                job.forwarded = forwarded
                st = self.flows.get(flow_id) if flow_id is not None else None
                if st is not None:
                    job.began = asyncio.Event()
                    st.awaiting.append(job)
            self.stats.summaries.commissioned += 1
            if not isinstance(comp, Commissioner):
                continue
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no event loop (an offline caller): the job cannot run
                self._unawait(flow_id, job)
                comp.abandon(job)
                continue
            task = loop.create_task(self._run(comp.complete, job, flow_id))
            self.tasks[job.session] = task
            task.add_done_callback(functools.partial(self._forget, job.session))

    async def _run(
        self, complete: Callable[[Any], Awaitable[str]], job: Any, flow_id: str | None = None
    ) -> str:
        try:
            outcome = await complete(job)
        except Exception as e:  # noqa: BLE001 - a job's bug is a failed summary, never a crash
            # The type only: a message could quote a header value, i.e. a credential.
            log.warning("context-guru: summary for %s failed: %s", job.session, type(e).__name__)
            outcome = "failed"
        finally:
            self._unawait(flow_id, job)
        counts = self.stats.summaries
        if outcome == "completed":
            counts.completed += 1
        elif outcome == "timed_out":
            counts.timed_out += 1
        elif outcome == "deferred":
            counts.deferred += 1
        else:
            counts.failed += 1
        path = getattr(job, "path", None)
        if path in ("shared", "fallback", "standalone"):
            setattr(counts, path, getattr(counts, path) + 1)
        # The job's decision line: its outcome, which request wrote it, and why that one.
        note = getattr(job, "note", "")
        log.info(
            "context-guru: summary for %s: %s via %s%s",
            job.session,
            outcome,
            path or "no request",
            f" ({note})" if note else "",
        )
        return outcome

    def _answer_began(self, flow: http.HTTPFlow) -> None:
        """The flow's answer began (or the flow failed): release the jobs it commissioned."""
        st = self.flows.get(flow.id)
        if st is None or not st.awaiting:
            return
        jobs, st.awaiting = st.awaiting, []
        status = flow.response.status_code if flow.response is not None else None
        for job in jobs:
            job.answer_began(status)

    def _unawait(self, flow_id: str | None, job: Any) -> None:
        """Forget a job that ended (or never ran) before its flow's answer began."""
        st = self.flows.get(flow_id) if flow_id is not None else None
        if st is not None:
            st.awaiting = [j for j in st.awaiting if j is not job]

    def _forget(self, session: str, task: asyncio.Task[str]) -> None:
        if self.tasks.get(session) is task:
            del self.tasks[session]

    async def wait_for_summary(self, session: str, timeout: float = 30.0) -> str | None:
        """Wait for the session's summary in flight, if any; its outcome, or None. For tests."""
        task = self.tasks.get(session)
        if task is None:
            return None
        return await asyncio.wait_for(asyncio.shield(task), timeout)

    # -- our own calls, shown as flows ----------------------------------------------------------

    def _summary_call(self, job: Any, kind: str, exchange: Exchange) -> None:
        """A summarizer request and its answer: a flow of its own in mitmweb (and in `-w`),
        marked, commented, its credential redacted; never processed by the pipeline."""
        first = job.call_flow_id
        job.call_flow_id = None  # a later attempt or the fallback gets an id of its own
        rec = {
            "v": views.VERSION,
            "action": "summary",
            "dialect": job.dialect,
            "session": job.session,
            "summarizing": [job.head, job.end],
            "call": kind,
            "for_flow": job.flow_id,
            "status": exchange.status,
            "error": exchange.error,
            "reason": f"{kind} request for the summary commissioned by flow {job.flow_id}",
        }
        self._show(call_flow(exchange, rec, first))

    def _expand_round(self, flow: http.HTTPFlow, record: dict[str, Any], ex: Exchange) -> None:
        """One expand round sent on `flow`'s behalf: a flow of its own."""
        rounds = record.setdefault("expand", {}).setdefault("shown", 0) + 1
        record["expand"]["shown"] = rounds
        rec = {
            "v": views.VERSION,
            "action": "expand",
            "dialect": record.get("dialect"),
            "session": (flow.metadata.get(views.RECORD) or {}).get("session"),
            "round": rounds,
            "for_flow": flow.id,
            "status": ex.status,
            "reason": f"the model called {TOOL_NAME}; round {rounds} re-sent for flow {flow.id}",
        }
        self._show(call_flow(ex, rec))

    def _show(self, flow: http.HTTPFlow) -> None:
        """Add a finished flow to whatever shows flows (mitmweb's list, `-w`, the dumper): the
        master runs it through the addons' hooks as a flow read from a file (not live, so no
        addon sends it anywhere, and ours skips it)."""
        master = getattr(ctx, "master", None)
        if master is None or not hasattr(master, "load_flow"):
            return
        try:
            task = asyncio.get_running_loop().create_task(master.load_flow(flow))
        except RuntimeError:
            return
        self.showing.add(task)
        task.add_done_callback(self.showing.discard)

    # -- the 400 safety net --------------------------------------------------------------------

    async def response(self, flow: http.HTTPFlow) -> None:
        """The answer of a provider flow: continue an expand call, or re-send a refused
        rewrite; then book the usage the provider reported (every round, each once); then the
        request's credential is no longer needed here."""
        if not flow.live:
            return  # read from a file, or our own call shown: booked when it happened
        try:
            late = self.meter.late(flow)
            if late is not None and len(flow.request.raw_content or b"") > offload.ENCODED_INLINE:
                # A bypassed turn's body, read for its session: a long read, off the loop.
                turn, dialect = late
                with contextlib.suppress(Exception):
                    turn.index = await self.offload.run(
                        late_index, flow, dialect, self.max_body, self.max_messages
                    )
                self.meter.tried_late(flow)
            replies = await self._answer(flow)
            record = flow.metadata.get(META)
            if isinstance(record, dict):
                self.meter.answered(flow, record, replies)
        finally:
            self._release(flow)
            self._flush_facts()

    def _flush_facts(self) -> None:
        """New messages' token counts, to the store (after the answer): a few at once; many (a
        large body's, being counted in the worker meanwhile) by the worker, later, never
        awaited here (the answer would wait behind the large body the worker is reading)."""
        pending = self.facts.pending()
        if not pending:
            return
        if pending <= FACTS_INLINE:
            self.facts.flush()
            return
        if self._flushing is not None and not self._flushing.done():
            return  # one at a time: it takes what is pending when it runs
        with contextlib.suppress(RuntimeError):  # (no loop: the next answer flushes)
            self._flushing = asyncio.get_running_loop().create_task(
                self.offload.chore(self.facts.flush)
            )

    def _hold(self, flow: http.HTTPFlow) -> None:
        """A provider flow in flight: its credential is redacted when it is done (or at exit,
        or once `MAX_FLOWS` newer ones are)."""
        self.flows.begin(flow)

    def _release(self, flow: http.HTTPFlow) -> None:
        """The flow is done with upstream: end its state (`_ended`), and redact its credential
        (a turn's, or another provider flow's)."""
        if self.flows.end(flow.id) is None and self.redact and META in flow.metadata:
            redact(flow.request.headers)
            redact_backup(flow)

    def _ended(self, st: FlowState) -> None:
        """The one cleanup of a flow's state, whatever ended it (its answer, an error, the exit,
        the cap): its relay token forgotten, its credential redacted."""
        if st.job is not None:
            self.relay.jobs.pop(st.job.token, None)
        if self.redact:
            redact(st.flow.request.headers)
            redact_backup(st.flow)

    async def _answer(self, flow: http.HTTPFlow) -> list[Reply] | None:
        """A 400 to a rewritten request: re-send the original bytes once, return that answer.
        Returns the continuation's replies when the model called `context_guru_expand`.

        The provider's message is recorded: it is the live signal of a shape bug.
        """
        original, job = self._drop(flow)
        if original is None or flow.response is None:
            return None
        record = flow.metadata.get(META, {})
        if job is not None and len(job.times) == 4:
            t = job.times
            record.setdefault("timings_ms", {})["relay"] = {
                "to_relay": round((t[1] - t[0]) * 1000, 3),
                "upstream_headers": round((t[2] - t[1]) * 1000, 3),
                "body": round((t[3] - t[2]) * 1000, 3),
                "relay_to_response_hook": round((time.perf_counter() - t[3]) * 1000, 3),
            }
        if job is not None and job.gated:
            # Streamed through the relay, which ran any continuation itself.
            if job.continued:
                record["expand"]["rounds"] = job.rounds
                record["expand"]["log"] = job.log
                self.stats.expansions += job.rounds
            if job.error is not None:
                record["expand"]["error"] = job.error
            return job.replies if job.rounds else None
        if job is not None and job.error is not None:
            # Relayed but not gated, for a reason (an encoding the relay cannot read): the
            # answer streamed past as it came, so there is nothing here to read again.
            record["expand"]["error"] = job.error
            return None
        if flow.response.status_code == 200 and record.get("expand", {}).get("injected"):
            return await self._continue(flow, record)
        if flow.response.status_code != 400:
            return None
        self._forget_checkpoints(record)
        record["provider_400"] = provider_message(flow.response.get_content(strict=False))
        try:
            sni = upstream_sni(flow.request)
            flow.response = await resend(self.pool.client(sni), flow.request, original, sni)
        except Exception as e:  # noqa: BLE001 - the client then gets the provider's own 400
            record["retry_error"] = f"{type(e).__name__}: {e}"
            log.warning("context-guru: re-sending the original failed: %s", e)
            return None
        self.stats.retried_original += 1
        record["outcome"] = "retried_original"
        record["reason"] = "the provider refused the rewrite (400); the original was re-sent"
        rec = flow.metadata.get(views.RECORD)
        if isinstance(rec, dict):
            rec["action"] = "retried_original"
            rec["reason"] = record["reason"]
            views.mark(flow, rec)
        log.warning("context-guru: provider refused a rewrite: %s", record["provider_400"])
        return None

    def _forget_checkpoints(self, record: dict[str, Any]) -> None:
        """A checkpoint the provider refused would be refused every turn: drop it."""
        if self.store is None:
            return
        for rec in record.get("components", ()):
            conv = rec.get("conversation")
            if rec.get("reused") and isinstance(conv, str):
                self.store.delete_checkpoint(conv)

    # -- the expand continuation --------------------------------------------------------------

    async def _continue(self, flow: http.HTTPFlow, record: dict[str, Any]) -> list[Reply] | None:
        """The model called `context_guru_expand`: answer it here, re-send, return the end.
        Returns every round's reply (for the ledger), or None when nothing was continued."""
        assert flow.response is not None
        dialect = record["dialect"]
        ctype = content_type(flow.response)
        body = content(flow.response, strict=False) or b""
        if not names_tool(body):  # no call to find: not parsed on every turn
            return None
        try:
            first = continuation.parse(dialect, body, ctype)
        except ResponseParseError as e:
            record["expand"]["error"] = f"unreadable response: {e}"
            return None
        if not any(c.name == TOOL_NAME for c in tool_calls(first)):
            return None  # nothing of ours in it: the client gets the provider's bytes as they are
        sent = (flow.request.get_content(strict=False) or b"").decode("utf-8")
        sni = upstream_sni(flow.request)
        out = await continuation.run(
            self.pool.client(sni),
            flow.request.url,
            flow.request.headers.fields,
            dialect,
            sent,
            first,
            bool(record.get("stream")) or ctype.startswith("text/event-stream"),
            # The credential the rounds go upstream with is the one the ids must resolve for.
            self._resolver(record.get("session"), self.tenant_of(flow.request.headers)),
            sni=sni,
            on_round=functools.partial(self._expand_round, flow, record),
        )
        record["expand"]["rounds"] = out.rounds
        record["expand"]["log"] = out.log
        self.stats.expansions += out.rounds
        resp = flow.response
        resp.headers.pop("content-encoding", None)
        resp.headers["content-type"] = out.content_type
        resp.content = out.body
        return out.replies

    def error(self, flow: http.HTTPFlow) -> None:
        if not flow.live and flow.id not in self.flows:
            return
        self._answer_began(flow)
        self._drop(flow)
        record = flow.metadata.get(META)
        if isinstance(record, dict):
            self.meter.failed(flow, record)
        self._release(flow)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        """Stream provider SSE straight through: the agent sees tokens as they arrive, and a
        `UsageTap` reads the usage off the passing bytes (changing none, holding none back).

        When the expand tool was injected the answer may call it, and the client must never see
        that call: a streamed one comes through the relay, which holds it only from such a
        call on; one that could not be relayed is buffered and read whole.
        """
        if not flow.live:
            return
        self._answer_began(flow)
        relayed = self._unrelay(flow) is not None
        record = flow.metadata.get(META)
        if record is None or flow.response is None:
            return
        expand = record.get("expand")
        if expand is not None and expand.get("injected") and not relayed:
            return
        if content_type(flow.response).startswith("text/event-stream"):
            flow.response.stream = self.meter.stream(flow)

    # -- control endpoints -------------------------------------------------------------------

    def _routes(self) -> dict[str, control.Handler]:
        return {
            "": self._dashboard_endpoint,
            "health": self._health_endpoint,
            "stats": self._stats_endpoint,
            "sessions": self._sessions_endpoint,
            "expand": self._expand_endpoint,
        }

    def _dashboard_endpoint(
        self, flow: http.HTTPFlow, caller: control.Caller
    ) -> http.Response | Awaitable[http.Response]:
        """`GET /_cg/`: the savings dashboard (HTML) with one page of sessions (`limit`,
        `cursor` as `/_cg/sessions`), for a local caller; a remote one reads its own session
        only, as `/_cg/sessions`. Read and rendered off the loop (`cg.proxy.pages`)."""
        scope = caller.scope()
        if scope == "":
            return control.no_session()
        page = pages.page_args(flow)
        if isinstance(page, http.Response):
            return page
        limit, cursor = page
        # Copied here, on the loop, which counts (the chart's points: once the page is known).
        counters = self.stats.to_json() if scope is None else None
        ledger, meter, count = self.meter.ledger, self.meter, self.tokens.count_text

        def read() -> tuple[dict[str, Any], dict[str, Any]]:
            doc = pages.sessions_doc(ledger, count, scope, limit, cursor)
            return doc, ({**counters, **meter.report()} if counters is not None else {})

        def render(doc: dict[str, Any], totals: dict[str, Any], history: Any) -> http.Response:
            listed = [str(s.get("id")) for s in doc["sessions"]]
            charts = chart_of(history, ledger.prices, listed) if ledger is not None else {}
            nxt = doc.get("next")
            html = dashboard.render(
                totals,
                doc["sessions"],
                charts,
                error=doc.get("error"),
                next_href=pages.href(limit, nxt) if nxt else None,
                first_href=pages.href(limit, None) if cursor else None,
            )
            return http.Response.make(
                200,
                html.encode("utf-8"),
                {
                    "content-type": "text/html; charset=utf-8",
                    "cache-control": "no-store",
                    "content-security-policy": dashboard.CSP,
                    "x-content-type-options": "nosniff",
                },
            )

        async def board() -> http.Response:
            doc, totals = await self.off_loop.run(read)
            listed = [str(s.get("id")) for s in doc["sessions"]]
            history = ledger.history_copy(listed) if ledger is not None else {}  # on the loop
            return await self.off_loop.run(functools.partial(render, doc, totals, history))

        return board()

    def _health_endpoint(self, flow: http.HTTPFlow, caller: control.Caller) -> http.Response:
        """`{"ok": true, …, "store": {"ok": …}}`: `ok` says the addon answers (it serves, as a
        pass-through if need be); `store` whether the store is usable, and if not why (the
        reason to a local caller only: it names the file)."""
        store = self.store_state()
        if not caller.local:
            store = {"ok": store["ok"]}
        return control.json_response(
            200,
            {"ok": True, "version": __version__, "preset": ctx.options.cg_preset, "store": store},
        )

    def _sessions_endpoint(
        self, flow: http.HTTPFlow, caller: control.Caller
    ) -> http.Response | Awaitable[http.Response]:
        """`GET /_cg/sessions?limit=N&cursor=C`: a page of sessions, read off the loop."""
        scope = caller.scope()
        if scope == "":
            return control.no_session()
        page = pages.page_args(flow)
        if isinstance(page, http.Response):
            return page
        ledger, count = self.meter.ledger, self.tokens.count_text
        return self.off_loop.run(
            lambda: control.json_response(200, pages.sessions_doc(ledger, count, scope, *page))
        )

    def _stats_endpoint(
        self, flow: http.HTTPFlow, caller: control.Caller
    ) -> Awaitable[http.Response]:
        """`GET /_cg/stats`: the counters (copied here, on the loop, which counts) with the
        ledger's totals (summed in the store, off the loop)."""
        counters, meter = self.stats.to_json(), self.meter
        return self.off_loop.run(lambda: control.json_response(200, {**counters, **meter.report()}))

    def stats_json(self) -> dict[str, Any]:
        """The counters, with the ledger's `usage` and `savings` (SPEC §9, §11)."""
        return {**self.stats.to_json(), **self.meter.report()}

    def sessions_json(
        self, session: str | None = None, limit: int = PAGE_DEFAULT, cursor: str | None = None
    ) -> dict[str, Any]:
        """`GET /_cg/sessions`: a page of sessions (or only `session`) with its checkpoint,
        usage and savings, and `next`, the cursor of the page after it (None: the last)."""
        return pages.sessions_doc(self.meter.ledger, self.tokens.count_text, session, limit, cursor)

    @command.command("cg.stats")  # type: ignore[untyped-decorator]
    def stats_command(self) -> str:
        """context-guru's counters, usage and savings (as /_cg/stats), as JSON."""
        return json.dumps(self.stats_json(), ensure_ascii=False, indent=1)

    @command.command("cg.sessions")  # type: ignore[untyped-decorator]
    def sessions_command(self, cursor: str = "", limit: int = PAGE_DEFAULT) -> str:
        """A page of sessions with their checkpoint, usage and savings (as /_cg/sessions), as
        JSON; `cursor`: a page's `next`, for the page after it."""
        try:
            page = page_limit(str(limit)), cursor or None
            if cursor:
                page_key(cursor)
        except BadPage as e:
            raise exceptions.CommandError(str(e)) from None
        return json.dumps(self.sessions_json(None, *page), ensure_ascii=False, indent=1)

    def _expand_endpoint(self, flow: http.HTTPFlow, caller: control.Caller) -> http.Response:
        """`GET /_cg/expand?id=KEY`: the stashed span as JSON; 404 unknown, 400 malformed. A
        remote caller reads only its own session's stashes."""
        key = flow.request.query.get("id", "")
        if not valid_key(key):
            return control.json_response(400, {"error": f"not a context-guru id: {key[:64]!r}"})
        scope = caller.scope()
        if scope == "":
            return control.no_session()
        try:
            stash = self.store.get_stash(key, scope) if self.store is not None else None
        except StoreError as e:
            return control.json_response(503, {"error": f"the store is unavailable: {e}"})
        if stash is None:
            return control.json_response(
                404, {"error": f"id {key} is unknown or no longer available (expired)"}
            )
        return control.json_response(
            200,
            {
                "id": stash.key,
                "session": stash.session,
                "created": stash.created,
                "count": stash.count,
                "dialect": stash.dialect,
                "messages": stash.messages(),
            },
        )
