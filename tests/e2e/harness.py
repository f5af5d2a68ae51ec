"""A real `mitmdump -s cg_addon.py` subprocess (reverse mode unless told), its config, and the
recorder's decision log.

`Proxy.start(upstream, workdir)` has mitmdump listen on port 0, reads the port from mitmdump's startup line, then
polls `/_cg/health` until the addon answers (`serving`: a proxy whose store is broken serves too) (with the `cg_control_token` its options or `env`
give, which `Proxy.client` then sends on every request). `Proxy.stop()` terminates the process by PID (kill
after a deadline); `with Proxy.start(...) as p:` stops it on leaving and then checks its log for
addon errors. `start_summarize` adds the proxy's own SQLite file and a summarize config
(`low(...)`: triggers a short transcript passes). Waits are bounded condition waits, never sleeps.

The process environment is the test run's own minus the variables that steer the summarizer
(`CHEAP_MODEL*`, `CONTEXT_GURU_SUMMARIZE_TIMEOUT`, the providers' API keys): a developer's shell
never leaks into a test; pass them with `Proxy.start(..., env={...})`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from cg.proxy import environ
from tests.support.fakeprovider import FakeProvider, Recorded

REPO = Path(__file__).resolve().parents[2]
RECORDER = Path(__file__).resolve().parent / "recorder.py"
MITMDUMP = Path(sys.executable).parent / "mitmdump"
LISTENING = re.compile(r"listening at 127\.0\.0\.1:(\d+)")
STARTUP_TIMEOUT = 30.0
POLL = 0.02  # seconds between polls of a file or an endpoint
# Inherited variables that would change what the summarizer does; only `env=` may set them.
HERMETIC = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")  # and every name under `environ.PREFIXES`


def hermetic(name: str) -> bool:
    """Whether the test proxies drop this variable of the developer's environment: a key, or
    one of ours (an unknown one would refuse every proxy's options)."""
    return name in HERMETIC or name.startswith(environ.PREFIXES)


def low(min_messages: int = 4, **over: Any) -> dict[str, Any]:
    """A summarize config whose triggers a short transcript passes: any cache state, 10 tokens
    to summarize, no window fraction or token floor, `min_messages` messages; `over` adds keys
    (`resummarize_tokens`, `keep_first`, `model`, ...)."""
    trigger = {"min_request_frac": 0, "min_request_tokens": 0, "min_messages": min_messages}
    return {"cache_state": "any", "min_tokens": 10, "trigger": trigger, **over}


def new_id() -> str:
    """A value for the `x-e2e-id` header that ties a test's request to its records."""
    return uuid.uuid4().hex


def poll(timeout: float) -> Iterator[None]:
    """Yield until `timeout` seconds have passed, pausing POLL seconds between rounds."""
    end = time.monotonic() + timeout
    pause = threading.Event()  # never set: wait() is a bounded pause, not a sleep
    while True:
        yield
        if time.monotonic() >= end:
            return
        pause.wait(POLL)


class DecisionLog:
    """The recorder's JSON lines: one per finished flow."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def lines(self) -> list[dict[str, Any]]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        return [json.loads(x) for x in text.split("\n")[:-1]]  # the last piece is unfinished

    def wait(self, e2e_id: str, timeout: float = 10.0) -> dict[str, Any]:
        """The line of the flow whose request carried `x-e2e-id: e2e_id`."""
        for _ in poll(timeout):
            found = [x for x in self.lines() if x["id"] == e2e_id]
            if found:
                assert len(found) == 1, found
                return found[0]
        raise TimeoutError(f"no recorder line for x-e2e-id {e2e_id} within {timeout}s")

    def cg(self, e2e_id: str, timeout: float = 10.0) -> dict[str, Any]:
        """The addon's decision record (`cg`) of that flow, which must have one."""
        cg: dict[str, Any] | None = self.wait(e2e_id, timeout)["cg"]
        assert cg is not None, f"the flow of x-e2e-id {e2e_id} got no decision record"
        return cg


@dataclass
class Proxy:
    proc: subprocess.Popen[str]
    port: int
    records: DecisionLog
    log: list[str] = field(default_factory=list)
    _reader: threading.Thread | None = None
    regular: bool = False  # a forward proxy: its own endpoints are reached through it
    token: str = ""  # its cg_control_token, which every `/_cg/` request then needs

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, **kw: Any) -> httpx.Client:
        """A client for the addon's `/_cg/` endpoints (and, in reverse mode, the upstream)."""
        if self.regular:
            kw = {"base_url": "http://context-guru.test", "proxy": self.url, **kw}
        if self.token:
            kw = {
                **kw,
                "headers": {"authorization": f"Bearer {self.token}", **kw.get("headers", {})},
            }
        return httpx.Client(**{"base_url": self.url, "trust_env": False, "timeout": 30.0, **kw})

    @classmethod
    def start(
        cls,
        upstream: str,
        workdir: Path,
        preset: str = "off",
        options: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        mode: str | None = None,
        scripts: Sequence[Path] = (),
        program: Path = MITMDUMP,
        args: Sequence[str] = (),
        addon: Path | None = REPO / "cg_addon.py",
        cwd: Path = REPO,
    ) -> Proxy:
        """Start mitmdump in front of `upstream`; `options` are extra `--set` values, `env`
        extra environment variables (see HERMETIC). `mode` replaces `reverse:{upstream}` (e.g.
        `regular`); `scripts` load before cg_addon.py, so their hooks see a request first.
        `program` (mitmweb, say) replaces mitmdump, `args` go first on its command line;
        `addon` None: the program loads the addon itself (`context-guru proxy`); `cwd` where
        it runs."""
        confdir = workdir / "confdir"
        confdir.mkdir(parents=True, exist_ok=True)
        record = workdir / "decisions.jsonl"
        cmd = [
            str(program),
            *args,
            "--mode",
            mode or f"reverse:{upstream}",
            "--listen-host",
            "127.0.0.1",
            "--listen-port",
            "0",
            *(arg for script in scripts for arg in ("-s", str(script))),
            *(("-s", str(addon)) if addon is not None else ()),
            "-s",
            str(RECORDER),
            "--set",
            f"confdir={confdir}",
            "--set",
            f"cg_preset={preset}",
            "--set",
            f"cg_record={record}",
        ]
        for opt in options:
            cmd += ["--set", opt]
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={
                **{k: v for k, v in os.environ.items() if not hermetic(k)},
                **(env or {}),
                "PYTHONUNBUFFERED": "1",
            },
        )
        given = [o.partition("=")[2] for o in options if o.startswith("cg_control_token=")]
        token = given[-1] if given else (env or {}).get(environ.CONTROL_TOKEN_ENV, "")
        regular = (mode or "").startswith("regular")
        proxy = cls(proc, 0, DecisionLog(record), regular=regular, token=token)
        listening = threading.Event()

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                proxy.log.append(line.rstrip("\n"))
                m = LISTENING.search(line)
                if m and not listening.is_set():
                    proxy.port = int(m.group(1))
                    listening.set()
            listening.set()  # EOF: the process is gone; start() notices

        proxy._reader = threading.Thread(target=read, name="mitmdump-log", daemon=True)
        proxy._reader.start()
        try:
            if not listening.wait(STARTUP_TIMEOUT) or proxy.port == 0:
                raise RuntimeError("mitmdump did not start:\n" + proxy.log_text())
            proxy._wait_healthy()
        except BaseException:
            proxy.stop()
            raise
        return proxy

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        """Stop the process; on a clean exit its log must be free of addon errors."""
        self.stop()
        if exc_type is None:
            assert not self.addon_errors(), self.log_text()

    def _wait_healthy(self) -> None:
        with self.client(timeout=2.0) as c:
            for _ in poll(STARTUP_TIMEOUT):
                if self.proc.poll() is not None:
                    break
                try:
                    r = c.get("/_cg/health")
                    # `serving`: up and forwarding (`ok` is false while its store is unusable)
                    if r.status_code == 200 and r.json().get("serving") is True:
                        return
                except httpx.TransportError:
                    pass
        raise RuntimeError("mitmdump never answered /_cg/health:\n" + self.log_text())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self._reader is not None:
            self._reader.join(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def log_text(self) -> str:
        return "\n".join(self.log)

    def stats(self) -> dict[str, Any]:
        """`GET /_cg/stats`."""
        with self.client(timeout=5.0) as c:
            r = c.get("/_cg/stats")
        assert r.status_code == 200, r.text
        doc: dict[str, Any] = r.json()
        return doc

    def sessions(self) -> dict[str, dict[str, Any]]:
        """Every session `/_cg/sessions` lists, by id: its pages followed by `next` to the
        last (a page holds at most 500)."""
        out: dict[str, dict[str, Any]] = {}
        cursor: str | None = None
        with self.client(timeout=10.0) as c:
            while True:
                query = {"limit": "500", **({"cursor": cursor} if cursor else {})}
                r = c.get("/_cg/sessions", params=query)
                assert r.status_code == 200, r.text
                page = r.json()
                for row in page["sessions"]:
                    assert row["id"] not in out, f"{row['id']} listed twice"
                    out[row["id"]] = row
                cursor = page["next"]
                if cursor is None:
                    return out

    def wait_stats(
        self, until: Callable[[dict[str, Any]], bool], timeout: float = 10.0
    ) -> dict[str, Any]:
        """Poll `/_cg/stats` until `until(stats)` holds; the stats that satisfied it."""
        doc: dict[str, Any] = {}
        for _ in poll(timeout):
            doc = self.stats()
            if until(doc):
                return doc
        raise TimeoutError(f"stats never satisfied the condition within {timeout}s: {doc}")

    def counts(self) -> dict[str, int]:
        """The stats' counters in one flat dict: the top-level numbers and `summaries.*`."""
        s = self.stats()
        return {**{k: v for k, v in s.items() if isinstance(v, int)}, **s["summaries"]}

    def wait_count(
        self, before: Mapping[str, int], key: str, by: int = 1, timeout: float = 10.0
    ) -> dict[str, int]:
        """Wait until counter `key` (top level or `summaries.*`) has moved by `by` from
        `before[key]`; the counters then."""

        def moved(s: dict[str, Any]) -> bool:
            flat = {**s, **s["summaries"]}
            return bool(flat[key] >= before[key] + by)

        self.wait_stats(moved, timeout)
        return self.counts()

    def addon_errors(self) -> list[str]:
        """Log lines that show a hook raised (mitmproxy logs hook exceptions, never raises)."""
        return [x for x in self.log if "Traceback" in x or "Addon error" in x]


def start_summarize(
    upstream: str,
    workdir: Path,
    summarize: Mapping[str, Any] | None = None,
    *,
    preset: str = "summarize",
    db: Path | None = None,
    options: Sequence[str] = (),
    store: Mapping[str, Any] | None = None,
    **kw: Any,
) -> Proxy:
    """`Proxy.start` on its own SQLite file (`db`, default `workdir/cg.sqlite3`) with
    `summarize`, if given, as the summarize component's config over `preset`, and `store`, if
    given, as the config's `store:` block (`max_mb`, `ttl_hours`; both written to
    `workdir/cg.yaml`); `kw` as `Proxy.start`'s."""
    workdir.mkdir(parents=True, exist_ok=True)
    opts = [f"cg_db={db or workdir / 'cg.sqlite3'}", *options]
    doc: dict[str, Any] = {}
    if summarize is not None:
        doc["components"] = {"summarize": dict(summarize)}
    if store is not None:
        doc["store"] = dict(store)
    if doc:
        config = workdir / "cg.yaml"
        config.write_text(yaml.safe_dump(doc))
        opts.append(f"cg_config={config}")
    return Proxy.start(upstream, workdir, preset=preset, options=opts, **kw)


# -- what a client sent vs what the provider got ---------------------------------------------


class Capture:
    """An httpx request hook (sync or async) that keeps every request a client sends.

    Pass `event_hooks=capture.hooks()` (or `.async_hooks()`) to the httpx client handed to an SDK;
    `request.content` is then the exact body bytes that went on the wire.
    """

    def __init__(self) -> None:
        self.sent: list[httpx.Request] = []

    def _keep(self, request: httpx.Request) -> None:
        self.sent.append(request)

    async def _akeep(self, request: httpx.Request) -> None:
        self.sent.append(request)

    def hooks(self) -> dict[str, list[Any]]:
        return {"request": [self._keep]}

    def async_hooks(self) -> dict[str, list[Any]]:
        return {"request": [self._akeep]}

    def only(self) -> httpx.Request:
        assert len(self.sent) == 1, [str(r.url) for r in self.sent]
        return self.sent[0]


def by_id(e2e_id: str) -> Any:
    return lambda r: r.header("x-e2e-id") == e2e_id


def header_pairs(
    items: Iterable[tuple[str, str]], skip: Collection[str] = ("host",)
) -> list[tuple[str, str]]:
    """Headers as sorted (lower-case name, value) pairs without the names in `skip` (lower
    case): the form in which two requests' headers are compared."""
    return sorted((k.lower(), v) for k, v in items if k.lower() not in skip)


def assert_forwarded_unchanged(sent: httpx.Request, got: Recorded) -> None:
    """Method, path, body bytes and every header but `host` (reverse mode rewrites it) as sent."""
    assert got.method == sent.method
    assert got.path == sent.url.raw_path.decode("ascii")
    assert got.body == sent.content, "body bytes changed on the way through the proxy"
    assert header_pairs(got.headers) == header_pairs(sent.headers.multi_items())


def received(provider: FakeProvider, e2e_id: str) -> Recorded:
    """The one request the provider received carrying `x-e2e-id: e2e_id` (waits for it)."""
    got = provider.wait_for(1, where=by_id(e2e_id))
    assert len(got) == 1, f"the provider received {len(got)} requests for one send"
    return got[0]


# -- an independent reader of a body's `messages` array ------------------------------------------


def _ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in " \t\r\n":
        i += 1
    return i


def message_sources(body: bytes) -> tuple[bytes, list[bytes], bytes]:
    """(bytes before the top-level `messages` array, each element's bytes, bytes after it).

    Written apart from `cg.wire.jsonspan` with `json.JSONDecoder.raw_decode`, so a test can compare
    the bytes a client sent with the bytes a provider received without trusting the code under
    test to find them.
    """
    s = body.decode("utf-8")
    dec = json.JSONDecoder()
    i = _ws(s, 0)
    assert s[i] == "{", "the body is not a JSON object"
    i += 1
    while True:
        i = _ws(s, i)
        assert s[i] != "}", "the body has no messages array"
        key, i = dec.raw_decode(s, i)
        i = _ws(s, i)
        assert s[i] == ":"
        i = _ws(s, i + 1)
        if key == "messages":
            assert s[i] == "["
            start, i = i, i + 1
            elements: list[bytes] = []
            while True:
                i = _ws(s, i)
                if s[i] == "]":
                    break
                _, j = dec.raw_decode(s, i)
                elements.append(s[i:j].encode("utf-8"))
                i = _ws(s, j)
                if s[i] == ",":
                    i += 1
            return s[:start].encode("utf-8"), elements, s[i + 1 :].encode("utf-8")
        _, i = dec.raw_decode(s, i)
        i = _ws(s, i)
        if s[i] == ",":
            i += 1
