"""`context-guru` (also `python -m cg`): look at what the proxy did, and what it would do.

    context-guru replay FILE [--preset P] [--config F] [--summary TEXT] [--json]
    context-guru expand KEY[#N] [--db PATH|URL | --proxy URL [--token T]] [--json]
    context-guru sessions [--db PATH|URL | --proxy URL [--token T]] [--config F] [--json]
    context-guru stats [--db PATH|URL | --proxy URL [--token T]] [--config F] [--json]
    context-guru simulate FILE… [--preset P]… [--config F] [--json] [--summary-ratio R]
                         [--summary-latency S] [--model NAME] [--plot OUT.png]
    context-guru eval FILE… [--preset P] [--config F] [--probes N] [--max-calls N] [--yes]
                     [--model NAME] [--base-url URL] [--summary-model NAME] [--json]
    context-guru proxy [--web] [MITMDUMP ARGS…]
    context-guru addon-path
    context-guru claude|codex|opencode|gemini [AGENT ARGS…]

`proxy` runs mitmdump (mitmweb with `--web`) with the addon that ships in the package, every
other argument passed to it as given; `addon-path` prints that addon's path, for
`mitmdump -s "$(context-guru addon-path)"`.

`claude`, `codex`, `opencode` and `gemini` run that agent through the proxy in one command
(`cg.launch`): a proxy serving on `$CG_PORT` is reused, else one is started in reverse mode to the
agent's provider and stopped when the agent exits; every argument is the agent's, its exit status
ours, and one line on stderr says what the session saved. Its settings are `CG_*` variables.

`expand`, `sessions` and `stats` read a store (the default one unless `--db` names another; each
says which it read) or ask a running proxy (`--proxy URL`: its `/_cg/` endpoints, whatever store
it was started with).

`replay` runs a captured body (a raw request body, a `{"provider", "body"}` fixture, or a
mitmproxy flow file) through a preset offline, against a throwaway store, and shows what would
change. With `--summary`, a commissioned summary is completed with that text and the next turn is
spliced, so the rewrite itself can be inspected without a model.

`simulate` replays recorded sessions (mitmproxy flow files, JSONL traces) through each preset's
real pipeline offline and bills every request under the prompt-cache model
(docs/behaviour.md#usage-cost-and-savings): what each preset would have cost, as an estimate
(`cg.simulate`).

`eval` replays the same sessions through one preset and asks the user's own model (real calls,
billed to the key in ANTHROPIC_API_KEY / OPENAI_API_KEY) questions about the facts each rewrite
replaced, of the original request, the rewritten one, and the rewritten one with expand allowed
(docs/eval.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cg.launch.agents import AGENTS
from cg.launch.mitm import addon_path as addon_path  # (public here too: `context-guru proxy`)
from cg.launch.mitm import proxy_command as proxy_command
from cg.settings import StoreConfig
from cg.wire.dialects import DIALECTS, Dialect, route

EXIT_USAGE = 2
EXIT_NOT_FOUND = 1
SESSIONS_FROM_PROXY_MAX = 10_000  # `sessions --proxy` reads pages until this many


# Where else a store may be: said wherever the one read lacks what was asked for.
ELSEWHERE = (
    "a proxy started with `--set cg_db=…` keeps its own: pass --db PATH, or ask the proxy with "
    "--proxy URL"
)


def _store_path(db: str | None) -> Path:
    return Path(db or StoreConfig().path).expanduser()


def _store(db: str | None) -> Any:
    """The store, opened to read: the CLI never evicts (the proxy's config sets the TTL)."""
    from cg.state import is_url, open_reader  # psycopg itself only loads for a URL

    if db is not None and is_url(db):
        return open_reader(db)  # the shared store several proxies use
    path = _store_path(db)
    if not path.is_file():
        hint = f" (the default store; {ELSEWHERE})" if db is None else ""
        raise ValueError(f"no context-guru store at {path}{hint}")
    return open_reader(str(path))


def _store_name(db: str | None) -> str:
    """Where the store read lives, as it may be shown (a URL's password masked)."""
    from cg.state import is_url, redact_url

    return redact_url(db) if db is not None and is_url(db) else str(_store_path(db))


def _ask_proxy(args: argparse.Namespace, path: str) -> tuple[int, Any]:
    """GET a running proxy's control endpoint `path` (with the control token, if any): its
    status and JSON answer. The proxy's own store answers, whatever `--db` would say."""
    import httpx

    from cg.proxy.environ import CONTROL_TOKEN_ENV

    token = args.token or os.environ.get(CONTROL_TOKEN_ENV, "")
    headers = {"authorization": f"Bearer {token}"} if token else {}
    resp = httpx.get(args.proxy.rstrip("/") + path, headers=headers, timeout=10, trust_env=False)
    try:
        doc = resp.json()
    except ValueError:
        doc = {"error": f"not a context-guru control answer ({resp.status_code})"}
    return resp.status_code, doc


def _refused(args: argparse.Namespace, status: int, doc: Any) -> int:
    """Say what the proxy answered instead of 200, and the exit code for it."""
    error = doc.get("error", "") if isinstance(doc, dict) else ""
    print(f"context-guru: {args.proxy} answered {status}: {error}", file=sys.stderr)
    return EXIT_NOT_FOUND


def _out(obj: Any) -> None:
    print(json.dumps(obj, ensure_ascii=False, indent=2))


# -- replay --------------------------------------------------------------------------------------


def load_capture(path: Path) -> list[tuple[bytes, Dialect, dict[str, str]]]:
    """Provider requests from a capture: a body, a fixture wrapper (`{"provider", "body"}`, or a
    recorded request `{"method", "path", "headers", "body": "<text>"}`), or a mitmproxy flow
    file."""
    raw = path.read_bytes()
    try:
        doc = json.loads(raw)
    except ValueError:
        return _load_flows(path)
    if isinstance(doc, dict) and isinstance(doc.get("body"), str) and "path" in doc:
        # A recorded request (the Codex fixtures): method, path, header pairs, the body text.
        dialect = route(str(doc.get("method", "POST")), str(doc["path"]))
        if dialect is None:
            raise ValueError(f"{path}: {doc.get('method')} {doc['path']} is not a provider request")
        headers = {str(k): str(v) for k, v in doc.get("headers") or ()}
        return [(doc["body"].encode("utf-8"), dialect, headers)]
    if isinstance(doc, dict) and "body" in doc and "messages" not in doc:
        provider = str(doc.get("provider", "anthropic"))
        body = json.dumps(doc["body"], ensure_ascii=False, separators=(",", ":")).encode()
        return [(body, DIALECTS[provider], {})]
    if isinstance(doc, dict) and "input" in doc and "messages" not in doc:
        return [(raw, DIALECTS["responses"], {})]
    if isinstance(doc, dict) and "messages" in doc:
        msgs = doc.get("messages") or []
        openai = any(isinstance(m, dict) and m.get("role") in ("tool", "developer") for m in msgs)
        return [(raw, DIALECTS["openai" if openai or "system" not in doc else "anthropic"], {})]
    raise ValueError(f"{path}: not a request body, a fixture or a flow file")


def _load_flows(path: Path) -> list[tuple[bytes, Dialect, dict[str, str]]]:
    from cg.proxy.flows import provider_requests

    found, fault = provider_requests(path)
    if fault is not None and not found:
        raise ValueError(f"{path}: not a flow file ({fault})")
    return [(r.body, r.dialect, r.headers) for r in found]


def replay(args: argparse.Namespace) -> int:
    from cg.components import Services, build_pipeline
    from cg.pipeline.rewrite import rewrite_body
    from cg.settings import load_config
    from cg.state import open_store
    from cg.state.tokens import TokenCounter

    config = load_config(args.preset, args.config, ["summarize"])
    captures = load_capture(Path(args.file))
    if not captures:
        print(f"{args.file}: no provider requests found", file=sys.stderr)
        return EXIT_NOT_FOUND
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(StoreConfig(), str(Path(tmp) / "replay.sqlite3"))
        components = build_pipeline(
            config.pipeline,
            config.components,
            Services(store, TokenCounter(), config.model_windows),
        )
        reports = []
        for n, (body, dialect, headers) in enumerate(captures):
            now = time.time()
            result = rewrite_body(body, dialect, components, headers=headers, now=now)
            report: dict[str, Any] = {"request": n, "record": result.record}
            if result.commissions and args.summary is not None:

                async def fake(prompt: str, job: Any) -> str:
                    return f"<summary>{args.summary}</summary>"

                for comp, job in result.commissions:
                    report["commission"] = asyncio.run(comp.complete(job, fake))  # type: ignore[attr-defined]
                again = rewrite_body(body, dialect, components, headers=headers, now=now + 1)
                report["next_turn"] = again.record
                result = again
            elif result.commissions:
                for comp, job in result.commissions:
                    comp.abandon(job)  # type: ignore[attr-defined]
            if result.body is not None:
                report["messages_after"] = [
                    _brief(m) for m in json.loads(result.body).get(dialect.array_key, [])
                ]
            reports.append(report)
        store.close()
    if args.json:
        _out(reports)
        return 0
    for r in reports:
        rec = r["record"]
        print(f"request {r['request']}: {rec['dialect']} {rec['outcome']} — {rec['reason']}")
        for c in rec.get("components", []):
            print(f"  {c.get('component')}: {c.get('reason') or c.get('error')}")
            for k in ("span", "tokens", "window", "trigger", "commission", "checkpoint"):
                if k in c:
                    print(f"    {k}: {json.dumps(c[k], ensure_ascii=False)}")
        if "next_turn" in r:
            nt = r["next_turn"]
            print(f"  next turn: {nt['outcome']} — {nt['reason']}")
        if "messages_after" in r:
            print("  messages sent:")
            for i, line in enumerate(r["messages_after"]):
                print(f"    [{i}] {line}")
    return 0


def _brief(m: Any, width: int = 100) -> str:
    if not isinstance(m, dict):
        return repr(m)[:width]
    content = m.get("content")
    if isinstance(content, list):
        text = " ".join(str(b.get("text") or b.get("type")) for b in content if isinstance(b, dict))
    else:
        text = str(content)
    kind = m.get("type")
    if kind not in (None, "message"):  # a Responses item: reasoning, a call, an output, …
        text = f"[{kind}]" if "content" not in m else f"[{kind}] {text}"
    text = " ".join(text.split())
    return f"{m.get('role') or 'item'}: {text[:width]}{'…' if len(text) > width else ''}"


# -- expand, sessions, stats ---------------------------------------------------------------------


def expand(args: argparse.Namespace) -> int:
    """A stashed span (`KEY`), or its N-th message alone (`KEY#N`, 1-based)."""
    from cg.expand.tool import parse_id

    parsed = parse_id(args.key)
    if parsed is None:
        print(f"not a context-guru id (KEY or KEY#N): {args.key[:64]!r}", file=sys.stderr)
        return EXIT_USAGE
    key, n = parsed
    if args.proxy:
        return _expand_from_proxy(args, key, n)
    store = _store(args.db)
    try:
        stash = store.get_stash(key)
    finally:
        store.close()
    if stash is None:
        print(
            f"{args.key}: not in the store at {_store_name(args.db)} (unknown there, or no "
            f"longer available: expired); {ELSEWHERE}",
            file=sys.stderr,
        )
        return EXIT_NOT_FOUND
    if n is None:
        if args.json:
            _out({"id": stash.key, "session": stash.session, "messages": stash.messages()})
            return 0
        _print_expanded(args.key, key, n, stash.session, stash.messages(), stash.count, "")
        return 0
    sources = stash.sources()
    if not 1 <= n <= len(sources):
        print(
            f"{args.key}: the stash holds {len(sources)} messages, {key}#1 to {key}#{len(sources)}",
            file=sys.stderr,
        )
        return EXIT_NOT_FOUND
    message = json.loads(sources[n - 1])
    if args.json:
        _out({"id": args.key, "session": stash.session, "n": n, "message": message})
        return 0
    _print_expanded(args.key, key, n, stash.session, [message], len(sources), "")
    return 0


def _expand_from_proxy(args: argparse.Namespace, key: str, n: int | None) -> int:
    """`expand --proxy URL`: the proxy's `/_cg/expand`, printed as from a store."""
    import urllib.parse

    status, doc = _ask_proxy(args, "/_cg/expand?" + urllib.parse.urlencode({"id": args.key}))
    if status != 200 or not isinstance(doc, dict):
        return _refused(args, status, doc)
    if args.json:
        _out(doc)
        return 0
    shown = doc.get("messages") or [] if n is None else [doc.get("message")]
    _print_expanded(
        args.key, key, n, doc.get("session"), shown, doc.get("count"), f" (via {args.proxy})"
    )
    return 0


def _print_expanded(
    ident: str, key: str, n: int | None, session: Any, shown: list[Any], total: Any, via: str
) -> None:
    """The span (`n` None: every message of it) or its message `n`, each under its own id."""
    if n is None:
        print(f"# {ident}: {total} messages from session {session}{via}")
    else:
        print(f"# {ident}: message {n} of {total} from session {session}{via}")
    for i, m in enumerate(shown, n or 1):
        _print_message(key, i, m)


def _print_message(key: str, n: int, m: Any) -> None:
    """One message, under the id that fetches it alone."""
    print(f"\n--- [{key}#{n}] {m.get('role') if isinstance(m, dict) else '?'} ---")
    print(_readable(m))


def _readable(m: Any) -> str:
    if not isinstance(m, dict):
        return json.dumps(m, ensure_ascii=False)
    content = m.get("content")
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for b in content if isinstance(content, list) else []:
        if not isinstance(b, dict):
            continue
        kind = b.get("type")
        if kind == "text":
            parts.append(str(b.get("text", "")))
        elif kind == "tool_use":
            parts.append(
                f"[tool_use {b.get('name')}] {json.dumps(b.get('input'), ensure_ascii=False)}"
            )
        elif kind == "tool_result":
            parts.append(f"[tool_result] {_readable({'content': b.get('content')})}")
        else:
            parts.append(f"[{kind}]")
    for c in m.get("tool_calls") or []:
        fn = c.get("function", {}) if isinstance(c, dict) else {}
        parts.append(f"[tool_call {fn.get('name')}] {fn.get('arguments')}")
    return "\n".join(parts)


def _prices(config: str | None) -> Any:
    """The price table: the shipped one, under a config file's `prices` map when given."""
    from cg.billing.prices import price_table

    if not config:
        return price_table()
    from cg.settings import load_config

    return price_table(load_config("summarize", config, ["summarize"]).prices)


def _usd(x: Any) -> str:
    return "unknown" if x is None else f"${x:,.6f}"


def _usage_lines(usage: Any, indent: str = "  ") -> list[str]:
    if not isinstance(usage, dict):
        return [f"{indent}usage: unavailable"]
    out = []
    for kind in ("agent", "summarizer"):
        u = usage.get(kind) or {}
        out.append(
            f"{indent}{kind:<10}  input {u.get('input_tokens', 0):>12,}  cache write "
            f"{u.get('cache_write_tokens', 0):>12,}  cache read {u.get('cache_read_tokens', 0):>13,}"
            f"  output {u.get('output_tokens', 0):>10,}  requests {u.get('requests', 0):>6,}"
        )
    return out


def _savings_lines(s: Any, indent: str = "  ") -> list[str]:
    if not isinstance(s, dict):
        return [f"{indent}savings: unavailable"]
    out = [
        f"{indent}tokens not sent (our count)  {s['tokens_not_sent']:,} over "
        f"{s['rewritten_turns']} rewritten of {s['turns']} turns",
        f"{indent}billed                       {_usd(s['billed_usd'])}  (agent "
        f"{_usd(s['billed_agent_usd'])}, summarizer {_usd(s['billed_summarizer_usd'])})",
        f"{indent}without rewrite (ESTIMATE)   {_usd(s['without_rewrite_usd'])}",
        f"{indent}saved (ESTIMATE)             {_usd(s['saved_usd'])}"
        + (f"  ({_share(s['saved_share'])} of the cost without rewrite)"
           if isinstance(s.get("saved_share"), int | float) else ""),
    ]  # fmt: skip
    if s.get("estimate_skipped_turns"):
        out.append(
            f"{indent}rewritten turns without usage, not estimated: {s['estimate_skipped_turns']}"
        )
    if s.get("unpriced_models"):
        out.append(
            f"{indent}unpriced models (their cost is unknown, not zero): "
            + ", ".join(s["unpriced_models"])
        )
    return out


def sessions(args: argparse.Namespace) -> int:
    """Every session the store holds anything of (offline: the whole store, not a page; also
    sessions with no answer booked yet, which `/_cg/sessions` does not list), most recently
    seen by any of its parts first."""
    if args.proxy:
        return _sessions_from_proxy(args)
    from cg.billing.listing import PAGE_MAX, entry
    from cg.state.tokens import TokenCounter

    prices = _prices(args.config)
    store = _store(args.db)
    count = TokenCounter().count_text
    rows: list[dict[str, Any]] = []
    try:
        infos = {r.session: r for r in store.sessions()}
        ids = list(infos)
        for i in range(0, len(ids), PAGE_MAX):
            for d in store.session_details(ids[i : i + PAGE_MAX]):
                rows.append(entry(d, prices, count, infos[d.session].last_seen))
    finally:
        store.close()
    if args.json:
        _out([{**_asdict(infos[r["id"]]), **r} for r in rows])
        return 0
    print(f"# {len(rows)} sessions in the store at {_store_name(args.db)}")
    _print_sessions(rows, {k: (v.stashes, v.stash_bytes) for k, v in infos.items()})
    return 0


def _sessions_from_proxy(args: argparse.Namespace) -> int:
    """`sessions --proxy URL`: every page of the proxy's `/_cg/sessions` (a remote caller's
    own session only, as the endpoint answers it), printed as from a store."""
    import urllib.parse

    rows: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        query = f"?{urllib.parse.urlencode({'cursor': cursor})}" if cursor else ""
        status, doc = _ask_proxy(args, "/_cg/sessions" + query)
        if status != 200 or not isinstance(doc, dict):
            return _refused(args, status, doc)
        rows.extend(r for r in doc.get("sessions") or () if isinstance(r, dict))
        cursor = doc.get("next") or None
        if cursor is None or len(rows) >= SESSIONS_FROM_PROXY_MAX:
            break
    if args.json:
        _out(rows)
        return 0
    more = " (the first pages)" if cursor else ""
    print(f"# {len(rows)} sessions{more} from the proxy at {args.proxy}")
    if isinstance(doc.get("error"), str):
        print(f"# the proxy's store answered: {doc['error']}")
    _print_sessions(rows, {})
    return 0


def _print_sessions(rows: list[dict[str, Any]], stashes: dict[str, tuple[int, int]]) -> None:
    if not rows:
        print("no sessions")
    for r in rows:
        seen = (
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["last_seen"]))
            if r["last_seen"]
            else "-"
        )
        cp = r["checkpoint"]
        what = (
            f"checkpoint covers {cp['covered_messages']} messages "
            f"(summary {cp['summary_tokens']:,} tokens)"
            if cp
            else "no checkpoint"
        )
        held = stashes.get(r["id"])
        kept = f"  {held[0]} stashes ({held[1]} bytes)" if held else ""
        print(f"{r['id']}  last seen {seen}  {what}{kept}")
        usage = r.get("usage") or {}
        if usage.get("agent", {}).get("requests") or usage.get("summarizer", {}).get("requests"):
            print("\n".join(_usage_lines(usage, "    ")))
            print("\n".join(_savings_lines(r.get("savings"), "    ")))


def _asdict(obj: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(obj)


def stats(args: argparse.Namespace) -> int:
    if args.proxy:
        status, doc = _ask_proxy(args, "/_cg/stats")
        code = 0 if status == 200 else EXIT_NOT_FOUND
        if code and not args.json:
            return _refused(args, status, doc)
    else:
        from cg.billing.plan import plan_report
        from cg.billing.savings import report

        prices = _prices(args.config)
        store = _store(args.db)
        try:
            doc = {**store.stats().to_json(), **report(store, prices)}
            plans = plan_report(store)
            if plans:
                doc["plans"] = plans
        finally:
            store.close()
        code = 0
    if args.json:
        _out(doc)
        return code
    if "path" in doc:
        print(
            f"store {doc['path']}: {doc['sessions']} sessions, {doc['checkpoints']} "
            f"checkpoints, {doc['stashes']} stashes ({doc['file_bytes']:,} bytes on disk)"
        )
    else:
        since = doc.get("started")
        when = (
            time.strftime(" (since %Y-%m-%d %H:%M:%S)", time.localtime(since))
            if isinstance(since, int | float)
            else ""
        )
        print(
            f"proxy {args.proxy}, since it started{when}: {doc.get('requests', 0)} requests, "
            f"{doc.get('rewritten', 0)} rewritten, {doc.get('passed_through', 0)} passed "
            f"through, {doc.get('failed_open', 0)} failed open"
        )
    scope = " since it started" if "path" not in doc else ""
    print(f"usage{scope} (as the provider reported it):")
    print("\n".join(_usage_lines(doc.get("usage"))))
    print(f"savings{scope}:")
    print("\n".join(_savings_lines(doc.get("savings"))))
    from cg.billing.plan import plan_lines

    # Subscription sessions (what the dollars mean): the store's, all time, as the ledger is.
    ledger = doc.get("ledger")
    if isinstance(ledger, dict):  # (a running proxy's: its store's whole ledger, all time)
        if ledger.get("ledger_error"):
            print(f"all time (its store's ledger): unreadable: {ledger['ledger_error']}")
        else:
            print("all time (its store's ledger), usage:")
            print("\n".join(_usage_lines(ledger.get("usage"))))
            print("all time, savings:")
            print("\n".join(_savings_lines(ledger.get("savings"))))
            for line in plan_lines(ledger.get("plans")):
                print(line)
    else:
        for line in plan_lines(doc.get("plans")):
            print(line)
    if "retention" in doc:  # (a running proxy's: the store does not keep it)
        print("retention (the facts of rewritten turns still visible in the request sent):")
        print("\n".join(_retention_lines(doc["retention"])))
    return code


def _share(x: Any) -> str:
    return f"{x * 100:.1f}%" if isinstance(x, int | float) else "none"


def _retention_lines(r: Any, indent: str = "  ") -> list[str]:
    if not isinstance(r, dict):
        return [f"{indent}retention: unavailable"]
    kinds = r.get("by_kind") if isinstance(r.get("by_kind"), dict) else {}
    out = [
        f"{indent}turns measured  {r.get('turns', 0):,}  mean {_share(r.get('mean'))}  "
        f"least {_share(r.get('min'))}",
        f"{indent}by kind         "
        + "  ".join(f"{k} {_share(v)}" for k, v in (kinds or {}).items()),
    ]
    if r.get("failed"):
        out.append(f"{indent}not measured (failed): {r['failed']}")
    return out


# -- simulate -------------------------------------------------------------------------------------


def simulate(args: argparse.Namespace) -> int:
    from cg.simulate.proxy import Options
    from cg.simulate.report import text
    from cg.simulate.run import DEFAULT_PRESETS, simulate, stderr_warn

    if not 0 < args.summary_ratio <= 1:
        print(f"--summary-ratio: must be in (0, 1] (got {args.summary_ratio})", file=sys.stderr)
        return EXIT_USAGE
    if args.summary_latency < 0:
        print(f"--summary-latency: must be >= 0 (got {args.summary_latency})", file=sys.stderr)
        return EXIT_USAGE
    from cg.simulate import plot

    missing = plot.missing() if args.plot else None
    if missing:  # said at once; the tables are still worth the run
        print(f"context-guru simulate: {missing}", file=sys.stderr)
    result = simulate(
        args.files,
        args.preset or DEFAULT_PRESETS,
        config_file=args.config,
        options=Options(args.summary_ratio, args.summary_latency),
        model=args.model,
        warn=stderr_warn,
        progress=None if args.no_progress else sys.stderr,
    )
    if args.json:
        _out(result.to_json())
    else:
        print(text(result))
    if args.plot and not missing:
        plot.write(result, Path(args.plot))
        print(f"plot written to {args.plot}", file=sys.stderr)
    return EXIT_NOT_FOUND if missing else 0


# -- eval ---------------------------------------------------------------------------------------


def evaluate(args: argparse.Namespace) -> int:
    from cg.eval.report import text
    from cg.eval.run import Plan, evaluate
    from cg.simulate.proxy import Options
    from cg.simulate.run import stderr_warn

    if not 0 < args.summary_ratio <= 1 or args.summary_latency < 0:
        print("--summary-ratio: must be in (0, 1]; --summary-latency: >= 0", file=sys.stderr)
        return EXIT_USAGE
    for name in ("probes", "concurrency", "max_calls"):
        value = getattr(args, name)
        if value is not None and value < 1:
            print(f"--{name.replace('_', '-')}: must be >= 1 (got {value})", file=sys.stderr)
            return EXIT_USAGE

    def confirm(plan: Plan) -> bool:
        print(f"context-guru eval: {plan.describe()}", file=sys.stderr)
        if args.yes:
            return True
        if not sys.stdin.isatty():
            print(
                "context-guru eval: not confirmed: pass --yes to make these calls", file=sys.stderr
            )
            return False
        sys.stderr.write("Proceed? [y/N] ")  # (stdout may be the --json report)
        sys.stderr.flush()
        return sys.stdin.readline().strip().lower() in ("y", "yes")

    result = evaluate(
        args.files,
        args.preset,
        config_file=args.config,
        options=Options(args.summary_ratio, args.summary_latency),
        summary_model=args.summary_model,
        model=args.model,
        base_url=args.base_url,
        probes=args.probes,
        seed=args.seed,
        concurrency=args.concurrency,
        max_calls=args.max_calls,
        confirm=confirm,
        warn=stderr_warn,
    )
    if result is None:
        return EXIT_USAGE
    if args.json:
        _out(result.to_json())
    else:
        print(text(result))
    return 0


def _where(p: argparse.ArgumentParser) -> None:
    """`--db PATH|URL` (a store; the default one when neither is given) or `--proxy URL`."""
    where = p.add_mutually_exclusive_group()
    where.add_argument("--db", default=None, help=f"default: {StoreConfig().path}")
    where.add_argument("--proxy", default=None, help="a running proxy, e.g. http://127.0.0.1:8080")
    p.add_argument(
        "--token",
        default=None,
        help="with --proxy: its cg_control_token (default: $CONTEXT_GURU_CONTROL_TOKEN)",
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="context-guru", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("replay", help="run a captured body through a preset, offline")
    r.add_argument("file")
    r.add_argument("--preset", default="summarize")
    r.add_argument("--config", default=None, help="a YAML config merged over the preset")
    r.add_argument("--summary", default=None, help="complete commissions with this text")
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=replay)

    e = sub.add_parser("expand", help="print a stashed span (KEY) or one message of it (KEY#N)")
    e.add_argument("key", metavar="KEY[#N]")
    _where(e)
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=expand)

    s = sub.add_parser("sessions", help="sessions: checkpoints, usage and savings")
    _where(s)
    s.add_argument("--config", default=None, help="a YAML config whose `prices` apply")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=sessions)

    t = sub.add_parser("stats", help="usage and savings in the store, or a running proxy's")
    _where(t)
    t.add_argument("--config", default=None, help="a YAML config whose `prices` apply")
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=stats)

    m = sub.add_parser(
        "simulate",
        help="estimate what each preset would have cost on recorded sessions (offline)",
        description="Replay recorded sessions (mitmproxy flow files; JSONL with one "
        '{"t", "headers", "body"} per line) through each preset\'s real pipeline offline and '
        "bill every request under the prompt-cache model. The figures are estimates.",
    )
    m.add_argument("files", nargs="+", metavar="FILE")
    m.add_argument(
        "--preset",
        action="append",
        help="a preset to run (repeatable; `agent-compaction` is the agent compacting itself); "
        "default: off, summarize, summarizer1509, claude-code, agent-compaction",
    )
    m.add_argument("--config", default=None, help="a YAML config merged over every preset")
    m.add_argument("--json", action="store_true")
    m.add_argument(
        "--summary-ratio",
        type=float,
        default=0.05,
        help="the stand-in summary's size, as a share of the tokens it covers (default 0.05)",
    )
    m.add_argument(
        "--summary-latency",
        type=float,
        default=0.0,
        help="seconds a summary takes to write; 0 (default): ready from the next turn",
    )
    m.add_argument(
        "--model",
        default=None,
        help="have summaries written by this model (real calls, as `model.source: config` with "
        "CHEAP_MODEL_* for the endpoint and key), billed as standalone prompts at its price",
    )
    m.add_argument("--plot", default=None, metavar="OUT.png", help="cumulative cost per turn")
    m.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    m.set_defaults(func=simulate)

    # (Run by `main` before the parser reads anything else: every argument goes to mitmdump.)
    sub.add_parser(
        "proxy",
        help="run mitmdump (mitmweb with --web) with the packaged addon; every other argument "
        "is mitmdump's",
        add_help=False,
    ).set_defaults(func=lambda a: 2)
    sub.add_parser(
        "addon-path", help="print the packaged addon's path, for mitmdump -s"
    ).set_defaults(func=lambda a: (print(addon_path()), 0)[1])
    for name in AGENTS:  # (run by `main` too: every argument goes to the agent)
        sub.add_parser(
            name,
            help=f"run {name} through the proxy (reused on $CG_PORT, else started in reverse "
            "mode and stopped at the end); every other argument is the agent's",
            add_help=False,
        ).set_defaults(func=lambda a: 2)

    v = sub.add_parser(
        "eval",
        help="ask your model what each rewrite lost, on recorded sessions (real, billed calls)",
        description="Replay recorded sessions through a preset offline and, at each checkpoint, "
        "ask the model probe questions about the facts of the replaced span: of the original "
        "request, of the rewritten one, and of the rewritten one with expand allowed. Scored by "
        "exact match. The calls are billed to the key in ANTHROPIC_API_KEY / OPENAI_API_KEY.",
    )
    v.add_argument("files", nargs="+", metavar="FILE")
    v.add_argument("--preset", default="summarize")
    v.add_argument("--config", default=None, help="a YAML config merged over the preset")
    v.add_argument("--probes", type=int, default=12, help="at most this many per checkpoint")
    v.add_argument("--seed", default="0", help="which facts are asked (deterministic)")
    v.add_argument("--concurrency", type=int, default=4, help="calls in flight at once")
    v.add_argument("--max-calls", type=int, default=None, help="never more calls than this")
    v.add_argument("--yes", action="store_true", help="make the calls without asking")
    v.add_argument("--model", default=None, help="ask this model (default: each request's own)")
    v.add_argument(
        "--base-url", default=None, help="the provider's base URL (default: the dialect's own)"
    )
    v.add_argument(
        "--summary-model",
        default=None,
        help="have summaries written by this model (as simulate's --model); default: the "
        "offline stand-in",
    )
    v.add_argument(
        "--summary-ratio",
        type=float,
        default=0.05,
        help="the stand-in summary's size, as a share of the tokens it covers (default 0.05)",
    )
    v.add_argument(
        "--summary-latency",
        type=float,
        default=0.0,
        help="seconds a summary takes to write; 0 (default): ready from the next turn",
    )
    v.add_argument("--json", action="store_true")
    v.set_defaults(func=evaluate)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["addon-path"] and len(given) == 1:
        print(addon_path())
        return 0
    if given[:1] == ["proxy"]:
        cmd = proxy_command(given[1:])
        os.execv(cmd[0], cmd)  # the terminal, signals and exit status are mitmproxy's
    if given[:1] and given[0] in AGENTS:  # every argument after the name is the agent's
        from cg.launch.run import launch

        return launch(given[0], given[1:])
    args = parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except (ValueError, OSError) as e:
        print(f"context-guru: {e}", file=sys.stderr)
        return EXIT_USAGE
    return code
