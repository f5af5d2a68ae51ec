"""Codex CLI, pinned, installed into a cache folder the suite owns, run non-interactively and
offline.

    binary = install()                       # .cache/codex; a no-op when already there
    run = run_codex(binary, prompt, workdir, base_url=proxy.url + "/v1")
    run = run_codex(binary, prompt, workdir, base_url=..., resume=True)   # `exec resume --last`

`install()` runs `npm install --prefix .cache/codex @openai/codex@VERSION` once, under a file
lock (two test runs may start together), and checks that the native binary (npm's platform
package, e.g. `@openai/codex-linux-x64`) reports the pinned version; anything else raises
`CodexUnavailable` with what to do about it.

`run_codex()` writes a scratch `CODEX_HOME` (`workdir/codex-home`, kept across runs of one test so
`exec resume --last` finds the session) whose `config.toml` (`config_toml()`) names one model
provider, `cg-test`, at `base_url` with `wire_api = "responses"` and the key from `env_key`
(`CG_TEST_API_KEY=sk-test`), no retries, `approval_policy = "never"` and the sandbox off
(`danger-full-access`, as the fixtures were recorded), and everything that would reach the
network off: the update check, analytics, OpenTelemetry export, plugins (which otherwise `git
ls-remote` github.com) and apps. `--strict-config` makes a key this version does not know an
error. It runs `codex exec --json --skip-git-repo-check PROMPT` in `workdir` with a clean
environment (a throwaway HOME in `workdir/home`, the test key, only the variables the test
passes), stdin closed, and stops it by its process group's id after `timeout` seconds.
Measured with strace (0.169.0): with this config the only connection it opens is the one to
`base_url`.

`run_codex(..., chatgpt=account)` signs Codex in with ChatGPT instead
(tests/support/signin.py): `auth.json` holds the account's fake tokens (their id token never
expires, so nothing is refreshed), the provider has `requires_openai_auth = true` and no key,
the credentials are read from the file (`cli_auth_credentials_store = "file"`), and
`chatgpt_base_url` is `base_url`'s `/backend-api/`, so the account checks and model list Codex
fetches there go where its turns go. `base_url` is then the `…/backend-api/codex` prefix: its
turns are `POST …/backend-api/codex/responses`, with `chatgpt-account-id` and `originator`.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.e2e import npm_pin
from tests.support.signin import ChatGPTAccount

VERSION = "0.171.0"
PACKAGE = f"@openai/codex@{VERSION}"
CACHE = Path(__file__).resolve().parents[2] / ".cache" / "codex"
# Both under pytest's per-test timeout (120 s), so ours is the failure that says what happened.
RUN_TIMEOUT = 60.0  # a scripted session takes a few seconds
API_KEY = "sk-test"
ENV_KEY = "CG_TEST_API_KEY"
MODEL = "my-local-model"  # not in Codex's catalogue, as in the fixtures
PROVIDER = "cg-test"


class CodexUnavailable(RuntimeError):
    pass


def _target() -> tuple[str, str]:
    """(npm's platform package, the Rust target triple) for this machine."""
    machine = platform.machine().lower()
    system = platform.system().lower()
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}
    rust = {"x64": "x86_64", "arm64": "aarch64"}
    a = arch.get(machine, machine)
    triple = {
        "linux": f"{rust.get(a, a)}-unknown-linux-musl",
        "darwin": f"{rust.get(a, a)}-apple-darwin",
    }.get(system, f"{machine}-{system}")
    return f"@openai/codex-{system}-{a}", triple


def _candidates() -> Iterator[Path]:
    package, triple = _target()
    modules = CACHE / "node_modules"
    # The native binary itself (the `codex` wrapper is a Node script that execs it).
    yield modules / package / "vendor" / triple / "bin" / "codex"
    yield modules / "@openai" / "codex" / "vendor" / triple / "bin" / "codex"


def _pin() -> npm_pin.Pin:
    return npm_pin.Pin(
        name="Codex",
        package=PACKAGE.rsplit("@", 1)[0],
        version=VERSION,
        cache=CACHE,
        command="codex",
        candidates=_candidates,
        unavailable=CodexUnavailable,
        needs=f"the npm registry and the platform package {_target()[0]} are needed",
    )


def find() -> Path | None:
    """The installed binary of the pinned version, if any."""
    return npm_pin.find(_pin())


def install() -> Path:
    """The pinned binary, npm-installed into CACHE unless it already is."""
    return npm_pin.install(_pin())


# -- its configuration --------------------------------------------------------------------------


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(str(value))  # a TOML basic string


def config_toml(
    base_url: str, extra: Mapping[str, Any] | None = None, chatgpt: bool = False
) -> str:
    """The scratch `config.toml`: the provider at `base_url`, offline switches; `extra` adds
    top-level keys (e.g. `model_auto_compact_token_limit`); `chatgpt`: the provider takes the
    ChatGPT sign-in of `auth.json` instead of a key."""
    signin: dict[str, Any] = {}
    if chatgpt:
        root = base_url.rstrip("/").removesuffix("/codex")
        signin = {"cli_auth_credentials_store": "file", "chatgpt_base_url": root + "/"}
    top: dict[str, Any] = {
        "model": MODEL,
        "model_provider": PROVIDER,
        "approval_policy": "never",
        "sandbox_mode": "danger-full-access",
        "check_for_update_on_startup": False,
        **signin,
        **(extra or {}),
    }
    auth: dict[str, Any] = {"requires_openai_auth": True} if chatgpt else {"env_key": ENV_KEY}
    tables: dict[str, dict[str, Any]] = {
        "analytics": {"enabled": False},
        "otel": {"exporter": "none"},
        "features": {"plugins": False, "apps": False},
        f"model_providers.{PROVIDER}": {
            "name": "context-guru test provider",
            "base_url": base_url,
            **auth,
            "wire_api": "responses",
            "request_max_retries": 0,
            "stream_max_retries": 0,
            "supports_websockets": False,
        },
    }
    lines = [f"{k} = {_toml(v)}" for k, v in top.items()]
    for name, table in tables.items():
        lines += ["", f"[{name}]", *(f"{k} = {_toml(v)}" for k, v in table.items())]
    return "\n".join(lines) + "\n"


# -- running it ----------------------------------------------------------------------------------


@dataclass
class Run:
    returncode: int
    events: list[dict[str, Any]]  # the --json lines
    stdout: str
    stderr: str
    seconds: float

    def describe(self) -> str:
        return (
            f"codex exited {self.returncode}\nstdout:\n{self.stdout[-4000:]}\n"
            f"stderr:\n{self.stderr[-4000:]}"
        )

    def items(self, kind: str) -> list[dict[str, Any]]:
        """Every completed item of `kind` (`agent_message`, `command_execution`, `error`, …)."""
        return [
            e["item"]
            for e in self.events
            if e.get("type") == "item.completed" and e.get("item", {}).get("type") == kind
        ]

    @property
    def final_message(self) -> str:
        messages = self.items("agent_message")
        assert messages, self.describe()
        return str(messages[-1].get("text"))

    def errors(self) -> list[dict[str, Any]]:
        """Every error Codex reported: `error` and `turn.failed` events, `error` items — but
        the one warning it always gives for a model outside its catalogue."""
        out = [e for e in self.events if e.get("type") in ("error", "turn.failed")]
        out += [i for i in self.items("error") if "Model metadata for" not in str(i.get("message"))]
        return out

    def assert_succeeded(self) -> None:
        """Codex finished its turn without an error."""
        assert self.returncode == 0, self.describe()
        assert self.errors() == [], self.describe()
        assert any(e.get("type") == "turn.completed" for e in self.events), self.describe()


def run_codex(
    binary: Path,
    prompt: str,
    workdir: Path,
    base_url: str,
    *,
    config: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    resume: bool = False,
    timeout: float = RUN_TIMEOUT,
    chatgpt: ChatGPTAccount | None = None,
) -> Run:
    """Run `codex exec` (or `codex exec resume --last`) once in `workdir`; CODEX_HOME and HOME
    live in `workdir` (`codex-home`, `home`), so a second run of the same test resumes the
    first run's session."""
    home = workdir / "home"
    home.mkdir(parents=True, exist_ok=True)
    codex_home = workdir / "codex-home"
    codex_home.mkdir(parents=True, exist_ok=True)
    toml = config_toml(base_url, config, chatgpt=chatgpt is not None)
    (codex_home / "config.toml").write_text(toml, encoding="utf-8")
    if chatgpt is not None:
        (codex_home / "auth.json").write_text(chatgpt.auth_json(), encoding="utf-8")
    full = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "CODEX_HOME": str(codex_home),
        "SHELL": shutil.which("bash") or "/bin/sh",
        "LANG": "C.UTF-8",
        **({} if chatgpt is not None else {ENV_KEY: API_KEY}),
        **(env or {}),
    }
    cmd = [str(binary), "exec"]
    if resume:
        cmd += ["resume", "--last"]
    cmd += ["--strict-config", "--json", "--skip-git-repo-check", prompt]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=workdir,
        env=full,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: a timeout stops the tools it runs too
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
        raise AssertionError(
            f"codex did not finish in {timeout:.0f}s (killed)\nstdout:\n{out[-4000:]}\n"
            f"stderr:\n{err[-4000:]}"
        ) from None
    finally:
        # Whatever it left behind in its group (a tool still running) goes with it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    events = []
    for line in out.splitlines():
        with contextlib.suppress(ValueError):
            events.append(json.loads(line))
    return Run(proc.returncode, events, out, err, time.monotonic() - t0)
