"""What the addons of context-guru share: the configuration made of the `cg_*` options, the
store, the pipelines, the counters, the connection pools, the relay and the flows in flight.

The runtime is itself the first addon: it declares the options (`cg.proxy.options`) in `load`,
makes everything the options describe in `configure`, and starts and stops what runs in the
background (`running`, `done`). The addons after it (`cg.proxy.addon.addons`) read it; none
of them configures anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from mitmproxy import ctx, http

from cg.billing.ledger import Ledger
from cg.billing.prices import price_table
from cg.billing.tally import Tally
from cg.components import COMPONENTS, Services, build_pipeline
from cg.expand import tool as expand_mod
from cg.pipeline.contract import Component
from cg.pipeline.rewrite import ExpandPolicy
from cg.proxy import configerrors, control, malloc, offload, options, pages, startup
from cg.proxy.agents import (
    CLAUDE_CODE,
    CODEX,
    GEMINI_CLI,
    OPENCODE,
    claude_code,
    codex,
    gemini_cli,
    opencode,
)
from cg.proxy.environ import CONTROL_TOKEN_ENV, unknown_variables, unused_cheap_model
from cg.proxy.flowstate import Flows, FlowState
from cg.proxy.meter import Meter
from cg.proxy.providers import ProviderHosts
from cg.proxy.redact import redact_flow
from cg.proxy.relay import Relay
from cg.proxy.stats import Stats
from cg.proxy.summaries import Summaries
from cg.proxy.view import META
from cg.settings import Config, host_patterns, load_presets, no_such, unknown_names
from cg.state import Store, StoreClaimed, StoreError, memory, open_store
from cg.state.facts import FactsCache
from cg.state.tenant import ANONYMOUS, fingerprint
from cg.state.tokens import TokenCounter
from cg.summarize.client import HttpPool, SummarizerClient, timeout_from_env
from cg.summarize.component import Summarize
from cg.wire.body import MAX_MESSAGES, MessageCache
from cg.wire.upstream import upstream_verify

log = logging.getLogger("context_guru")

# Every store call runs on the event loop: a file another process holds locked may stall all
# traffic this long per call, never the 5 s a reader (the CLI) may wait.
STORE_BUSY_MS = 250
# A store that failed passes every request through for this long before it is tried again
# (an unopenable one is re-opened at most this often), so a broken file costs one request's
# error per period instead of one per call.
STORE_RETRY = 2.0
FACTS_INLINE = 200  # token counts written back on the loop after an answer, at most


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


# What each group of options makes (`configure` remakes only what a change touches).
VERIFY_OPTIONS = frozenset({"ssl_insecure", "ssl_verify_upstream_trusted_ca"})
PIPELINE_OPTIONS = frozenset({"cg_preset", "cg_config", "cg_db", "cg_shared"})
LEDGER_OPTIONS = PIPELINE_OPTIONS | {"cg_warm_sessions"}
CONTROL_OPTIONS = frozenset({"cg_control_remote", "cg_control_token", "cg_control_hosts"})


def _check_bounds(opts: Any, changed: set[str]) -> None:
    """The numeric options that changed, each within its bounds (ValueError naming it)."""
    if "cg_max_body_mb" in changed and opts.cg_max_body_mb < 0:
        raise ValueError(f"cg_max_body_mb: must be >= 0 (got {opts.cg_max_body_mb})")
    if "cg_max_messages" in changed and opts.cg_max_messages < 1:
        raise ValueError(f"cg_max_messages: must be >= 1 (got {opts.cg_max_messages})")
    if "cg_warm_sessions" in changed and opts.cg_warm_sessions < 1:
        raise ValueError(f"cg_warm_sessions: must be >= 1 (got {opts.cg_warm_sessions})")
    if "cg_store_batch_ms" in changed and not 0 <= opts.cg_store_batch_ms <= 60_000:
        raise ValueError(f"cg_store_batch_ms: must be in 0..60000 (got {opts.cg_store_batch_ms})")


class Runtime:
    name = "contextguru"  # (its name in mitmproxy: `ctx.master.addons.get("contextguru")`)

    def __init__(self) -> None:
        self.stats = Stats()
        self.tally = Tally()  # usage and savings booked since start (every ledger's, kept)
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
        self.quiet = False  # cg_quiet: no start-up block, no line per turn
        self.started = False  # `running` was called: start-up is over
        self._store_retry_at = 0.0
        self.tokens = TokenCounter()
        self.facts = FactsCache(self.tokens)
        self.store: Store | None = None
        self.store_note = ""
        self.pool = HttpPool()
        # Streamed answers of turns offered the expand tool go through the relay (its own
        # pool, uncapped: each holds a connection for a whole generation).
        self.relay_pool = HttpPool(max_connections=None)
        self.relay = Relay(self.relay_pool.client)
        self._bg: set[asyncio.Task[None]] = set()  # held, so that they are not collected
        self.keep_backup = True  # `flow.backup()` before a rewrite, for a UI's Revert
        self.meter = Meter(self.stats.usage_reads, self.flows)
        self.summaries = Summaries(self.stats, self.flows, self.show)
        self.expand = ExpandPolicy("auto", None)
        # Flows shown for our own calls, being added (kept referenced until done).
        self.showing: set[asyncio.Task[None]] = set()
        self.off_loop = pages.OffLoop()  # the control answers that read pages of the store
        self.configs: dict[str, Config] = {}  # every preset in force, the default last
        self._configured = False  # `configure` made everything once
        self._cg_db, self._shared, self._warm = "", False, 16  # (for `reopen_store`)

    def load(self, loader: Any) -> None:
        # httpcore logs nothing above DEBUG, and mitmproxy enables DEBUG on the root logger
        # and filters in its handlers: the records of every relayed turn, made to be dropped.
        # httpx logs each request at INFO (our summarizer's calls, the relay's): mitmdump would
        # print them among its own lines. Both kept at WARNING.
        for name in ("httpx", "httpcore"):
            logging.getLogger(name).setLevel(logging.WARNING)
        options.declare(loader)
        if not control.capture_client_host():
            log.warning(
                "context-guru: this mitmproxy hides the Host a client sent in reverse mode; "
                "/_cg/ requests through a reverse-mode listener are refused"
            )
        try:
            repeated = repeated_options(loader.master.options)
        except Exception:  # noqa: BLE001 - mitmproxy's internals moved: no check, no harm
            repeated = []
        configerrors.install()
        try:
            unconvertible = configerrors.unconvertible(loader.master.options)
        except Exception:  # noqa: BLE001 - mitmproxy's internals moved: no check, no harm
            unconvertible = []
        for name, value, why in unconvertible:
            # mitmproxy would drop the whole script without a word (plain mitmdump): said here
            # as an error, which stops mitmdump and mitmweb at start-up.
            log.error("context-guru: --set %s=%s: %s", name, value, why)
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
        """Make what the changed options describe, and only that: a change of cg_hosts leaves
        the pipelines (and the summaries they hold in flight) as they are. The first call makes
        everything. Every value is checked before any is used: a bad one raises OptionsError
        naming it (mitmproxy then keeps the old values), and nothing changes."""
        opts = ctx.options
        first = not self._configured
        if first:
            known: Any = opts  # (mitmproxy's `keys` is untyped)
            updated = set(updated) | {k for k in known.keys() if k.startswith("cg_")}  # noqa: SIM118
        if first or updated & VERIFY_OPTIONS:
            # Our own calls verify as mitmproxy's upstream leg does, changed at run time too.
            self.set_verify(upstream_verify(opts))
        changed = {k for k in updated if k.startswith("cg_")}
        if not changed:
            return
        if "cg_tune_malloc" in changed and opts.cg_tune_malloc:
            why = malloc.tune()
            if why is not None:
                log.info("context-guru: allocator left as it is: %s", why)
        try:
            _check_bounds(opts, changed)
            configs, store, pipelines = self.configs, self.store, self.pipelines
            if changed & PIPELINE_OPTIONS:
                unknown = unknown_variables(os.environ)
                if unknown:
                    raise ValueError(
                        "; ".join(no_such(n, close, "environment variable") for n, close in unknown)
                    )
                configs = load_presets(opts.cg_preset, opts.cg_config, list(COMPONENTS))
                config = configs[list(configs)[-1]]
                acting = any(c.pipeline for c in configs.values())
                # The usage ledger persists with any pipeline, or wherever cg_db names a file.
                store = self._open_store(config, opts.cg_db) if acting or opts.cg_db else store
                pipelines = self._build(configs, store, opts.cg_shared)
            ledger = self.meter.ledger
            if ledger is None or changed & LEDGER_OPTIONS:
                ledger = self._ledger(configs, store, opts.cg_warm_sessions)
            ledger.store.batch_delay = opts.cg_store_batch_ms / 1000
            hosts = host_patterns(opts.cg_hosts) if "cg_hosts" in changed else self.hosts
            policy = self.control
            if changed & CONTROL_OPTIONS:
                control_hosts = control.control_hosts(opts.cg_control_hosts)
                token = control_token(opts.cg_control_token)
                policy = control.ControlPolicy(opts.cg_control_remote, token, control_hosts)
            if opts.cg_expand_inject not in ("auto", "always", "never"):
                raise ValueError(
                    "cg_expand_inject: must be auto, always or never "
                    f"(got {opts.cg_expand_inject!r})"
                )
        except ValueError as e:
            # One line naming the key at start-up, not a traceback (`cg.proxy.configerrors`).
            raise configerrors.ConfigError(str(e)) from None  # type: ignore[no-untyped-call]
        if changed & PIPELINE_OPTIONS:
            _warn_unused_cheap_model(pipelines)
            self._carry_inflight(pipelines)
            self.configs, self.pipelines = configs, pipelines
            self.preset = list(configs)[-1]  # the default: `summarize` under auto, else the one
            self.config = configs[self.preset]
        self._cg_db, self._shared = opts.cg_db, opts.cg_shared
        if "cg_warm_sessions" in changed:
            self.cache.resize(opts.cg_warm_sessions)
        self._warm = opts.cg_warm_sessions
        self.meter.ledger = ledger
        self.expand = ExpandPolicy(opts.cg_expand_inject, store)
        if "cg_hosts" in changed:
            self.hosts = hosts
            self.providers = ProviderHosts(hosts, self.providers.seen)
        self.max_body = opts.cg_max_body_mb * 1024 * 1024
        self.max_messages = opts.cg_max_messages
        self.meter.max_messages = opts.cg_max_messages
        self.control = policy
        self.redact = opts.cg_redact_credentials
        self.quiet = opts.cg_quiet
        self._configured = True

    def _build(
        self, configs: dict[str, Config], store: Store | None, shared: bool
    ) -> dict[str, list[Component]]:
        """Every preset's pipeline, on `store` (an in-memory one if none)."""
        timeout = timeout_from_env()
        return {
            name: build_pipeline(
                c.pipeline,
                c.components,
                Services(
                    store or memory(),
                    self.tokens,
                    c.model_windows,
                    summarizers=lambda cfg, level: SummarizerClient(
                        cfg,
                        self.pool,
                        level=level,
                        timeout=timeout,
                        on_usage=self.meter.summarizer,
                        shared_proxy=shared,
                        on_call=self.summaries.summary_call,
                    ),
                    facts=self.facts,
                ),
            )
            for name, c in configs.items()
        }

    def _ledger(self, configs: dict[str, Config], store: Store | None, warm: int) -> Ledger:
        config = configs[list(configs)[-1]] if configs else Config()
        ledger = Ledger(store or memory(), price_table(config.prices), self.facts, sent_bodies=warm)
        ledger.tally = self.tally
        return ledger

    def _carry_inflight(self, pipelines: dict[str, list[Component]]) -> None:
        """The sessions whose summary is in flight, kept by the pipelines that replace the
        ones in force (by preset, in order): a summary job ends on the component that
        commissioned it, and the new component must not commission the same session again
        meanwhile (on SQLite nothing else stops it). The set is shared, not copied, so that
        the old component's job still frees its session when it ends."""
        for name, comps in pipelines.items():
            old = [c for c in self.pipelines.get(name, ()) if isinstance(c, Summarize)]
            new = [c for c in comps if isinstance(c, Summarize)]
            for before, after in zip(old, new, strict=False):
                after.inflight = before.inflight

    def reopen_store(self) -> None:
        """Open the configured store again (after it failed), and rebuild on it what holds it:
        the pipelines (their summaries in flight kept), the usage ledger, the expand policy.
        The configuration is the one in force; raises ValueError as `_open_store` does."""
        config = self.configs[list(self.configs)[-1]] if self.configs else self.config
        store = self._open_store(config, self._cg_db)
        pipelines = self._build(self.configs, store, self._shared)
        self._carry_inflight(pipelines)
        self.pipelines = pipelines
        batch = self.meter.ledger.store.batch_delay if self.meter.ledger is not None else 0.25
        self.meter.ledger = self._ledger(self.configs, store, self._warm)
        self.meter.ledger.store.batch_delay = batch
        self.expand = ExpandPolicy(self.expand.mode, store)

    @property
    def components(self) -> list[Component]:
        """The pipeline of requests no rule picks another for (`summarize` under auto)."""
        return self.pipelines.get(self.preset, [])

    def pipeline_for(
        self, headers: Any, dialect: str | None = None
    ) -> tuple[str, list[Component], str]:
        """(preset, its pipeline, why) for one request: under `auto`, Claude Code's own headers
        pick `claude-code`, Codex's `codex`, opencode's `opencode` and Gemini CLI's
        `gemini-cli`; a preset the user named
        applies to everything."""
        if len(self.pipelines) > 1:
            why = claude_code(headers)
            if why is not None and CLAUDE_CODE in self.pipelines:
                return CLAUDE_CODE, self.pipelines[CLAUDE_CODE], f"auto: {why}"
            # opencode before Codex: on Responses it sends Codex's generic `session-id` too.
            why = opencode(headers)
            if why is not None and OPENCODE in self.pipelines:
                return OPENCODE, self.pipelines[OPENCODE], f"auto: {why}"
            why = codex(headers, dialect)
            if why is not None and CODEX in self.pipelines:
                return CODEX, self.pipelines[CODEX], f"auto: {why}"
            why = gemini_cli(headers)
            if why is not None and GEMINI_CLI in self.pipelines:
                return GEMINI_CLI, self.pipelines[GEMINI_CLI], f"auto: {why}"
            return (
                self.preset,
                self.components,
                "auto: neither Claude Code, Codex, opencode nor Gemini CLI",
            )
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
            self.store = open_store(
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
            self.store = memory()
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
            self.store = memory()  # the ledger, in memory meanwhile
        self.store_note = path
        return self.store

    def store_state(self) -> dict[str, Any]:
        """`/_cg/health`'s `store`: `{"ok": true}` or `{"ok": false, "error": why}`
        (docs/behaviour.md#the-control-surface). Asking is also a retry: a store that failed is
        tried again (as a request would)."""
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
        """Try the configured store again, rebuilding on it what holds it; the error, or None.
        (From the request hook: never through `configure`, which is mitmproxy's to call.)"""
        try:
            self.reopen_store()
        except ValueError as e:
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
        return None if self.store is None else self.store.health(STORE_RETRY)

    def running(self) -> None:
        """Freeze the start-up heap: a full GC then skips it (docs/benchmarks.md).
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
        # client's body twice, and `flow.backup()` is a share of a large turn's hook.
        self.keep_backup = type(ctx.master).__name__ != "DumpMaster"
        if not unknown and not getattr(ctx.options, "rfile", None):
            startup.announce(self, ctx.master, ctx.options)
        modes = getattr(ctx.options, "mode", None) or []
        if any(str(m).startswith("upstream") for m in modes):
            return
        with contextlib.suppress(RuntimeError):  # no running loop: turns are buffered instead
            self._bg = {asyncio.get_running_loop().create_task(self.relay.start())}

    def done(self) -> None:
        self.flows.end_all()  # flows in flight at exit: a saved file gets them redacted
        self.summaries.cancel()
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

    def tenant_of(self, headers: Any, path: str = "") -> str:
        """Who a request is (`cg.state.tenant`): its credential's fingerprint under the
        store's key (a header's, or a `?key=` in its `path`); anonymous without a store
        (nothing is kept then)."""
        store = self.store
        return fingerprint(store.tenant_key, headers, path) if store is not None else ANONYMOUS

    def resolver(self, session: str | None, tenant: str) -> Callable[[str], str]:
        """What answers the model's `context_guru_expand` calls for `session`: the stashed span
        (or, for `KEY#N`, one message of it) from the store as it is now, when `tenant` (the
        credential that carries the answer upstream) may read it (none: the id is no longer
        available)."""
        store = self.store

        def resolve(ident: str) -> str:  # `KEY` or `KEY#N` (`cg.expand.tool.parse_id`)
            if store is None:
                return f"context_guru_expand: id {ident[:64]!r} is no longer available."
            return expand_mod.resolve(store, ident, session, tenant)

        return resolve

    def show(self, flow: http.HTTPFlow) -> None:
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

    def flush_facts(self) -> None:
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

    def release(self, flow: http.HTTPFlow) -> None:
        """The flow is done with upstream: end its state (`_ended`), and redact its credential
        (a turn's, or another provider flow's)."""
        if self.flows.end(flow.id) is None and self.redact and META in flow.metadata:
            redact_flow(flow)

    def _ended(self, st: FlowState) -> None:
        """The one cleanup of a flow's state, whatever ended it (its answer, an error, the exit,
        the cap): its relay token forgotten, its credential redacted."""
        if st.job is not None:
            self.relay.jobs.pop(st.job.token, None)
        if self.redact:
            redact_flow(st.flow)

    def stash(self, key: str) -> Any:
        """A stash for the views (mitmweb's thread or the loop: a read, never raises out)."""
        return self.store.get_stash(key) if self.store is not None else None

    def set_verify(self, verify: bool | str) -> None:
        self.pool.verify = verify
        self.relay_pool.verify = verify
        self.relay.h1.verify = verify
