"""opencode (`opencode-ai`), pinned, installed into a cache folder the suite owns, run
non-interactively and offline.

    binary = install()                       # .cache/opencode; a no-op when already there
    run = run_opencode(binary, prompt, workdir, anthropic_url=proxy.url + "/v1")
    run = run_opencode(binary, prompt, workdir, openai_url=..., model="openai/gpt-5.5")

`install()` runs `npm install --prefix .cache/opencode opencode-ai@VERSION` once, under a file
lock (two test runs may start together), and checks that the native binary (npm's platform
package, e.g. `opencode-linux-x64`) reports the pinned version; anything else raises
`OpencodeUnavailable` with what to do about it.

`run_opencode()` runs `opencode run --format json PROMPT` in `workdir/project` with a clean
environment: HOME and the four XDG folders in `workdir/home` (never the developer's; kept across
runs of one test, so `continue_=True` (`--continue`) resumes the last session), the test key
`sk-test` in `ANTHROPIC_API_KEY` and `OPENAI_API_KEY`, and its configuration in
`OPENCODE_CONFIG_CONTENT` (`config()`): the model, the providers' `baseURL` (the proxy, or the
fake provider), every tool allowed, sharing and auto-update off. What would reach the network is
off: the models.dev catalogue fetch (`OPENCODE_DISABLE_MODELS_FETCH`: the catalogue built into
the binary is used), the update check, LSP downloads, and the `@opencode-ai/plugin` install it
starts in its config folder (`npm_config_offline=true`: its bundled npm fails at once, and says
so in its log). Measured with strace (1.18.33): with this environment the only connections it
opens are to 127.0.0.1. Stdin is closed; it is stopped by its process group's id after
`timeout` seconds.
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

REPO = Path(__file__).resolve().parents[2]
VERSION = "1.18.33"
PACKAGE = f"opencode-ai@{VERSION}"
CACHE = REPO / ".cache" / "opencode"
# Both under pytest's per-test timeout (120 s), so ours is the failure that says what happened.
RUN_TIMEOUT = 60.0  # a scripted session takes a few seconds
API_KEY = "sk-test"
MODEL = "anthropic/claude-haiku-4-5"  # in its built-in catalogue: a 200k window, 64k output
OFFLINE = {
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "npm_config_offline": "true",
}


class OpencodeUnavailable(RuntimeError):
    pass


def _platform_packages() -> list[str]:
    """npm's platform packages for this machine, the one postinstall would pick first."""
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}
    machine = platform.machine().lower()
    system = platform.system().lower()
    base = f"opencode-{system}-{arch.get(machine, machine)}"
    musl = system == "linux" and "musl" in (platform.libc_ver()[0] or "glibc").lower()
    names = [base, f"{base}-baseline"]
    return [f"{n}-musl" for n in names] if musl else names


def _candidates() -> Iterator[Path]:
    modules = CACHE / "node_modules"
    for package in _platform_packages():
        yield modules / package / "bin" / "opencode"  # the native binary itself
    yield modules / "opencode-ai" / "bin" / "opencode.exe"  # the same, linked by the package


def _pin() -> npm_pin.Pin:
    return npm_pin.Pin(
        name="opencode",
        package=PACKAGE.rsplit("@", 1)[0],
        version=VERSION,
        cache=CACHE,
        command="opencode",
        candidates=_candidates,
        unavailable=OpencodeUnavailable,
        env=OFFLINE,
        needs=f"the npm registry and the platform package {_platform_packages()[0]} are needed",
    )


def find() -> Path | None:
    """The installed binary of the pinned version, if any."""
    return npm_pin.find(_pin())


def install() -> Path:
    """The pinned binary, npm-installed into CACHE unless it already is."""
    return npm_pin.install(_pin())


# -- its configuration --------------------------------------------------------------------------


def config(
    model: str = MODEL,
    anthropic_url: str | None = None,
    openai_url: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """What `OPENCODE_CONFIG_CONTENT` holds: `model` (also the small model, which writes the
    session's title), each provider given a URL pointed there, every tool allowed; `extra` is
    merged over the top level (e.g. `provider.anthropic.models` to give a model a smaller
    `limit`)."""
    providers: dict[str, Any] = {}
    for name, url in (("anthropic", anthropic_url), ("openai", openai_url)):
        if url is not None:
            providers[name] = {"options": {"baseURL": url, "apiKey": API_KEY}}
    out: dict[str, Any] = {
        "$schema": "https://opencode.ai/config.json",
        "model": model,
        "small_model": model,
        "autoupdate": False,
        "share": "disabled",
        "permission": {"*": "allow"},
        "provider": providers,
    }
    return _merged(out, dict(extra or {}))


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` merged into `base`, object by object."""
    out = dict(base)
    for key, value in over.items():
        old = out.get(key)
        out[key] = (
            _merged(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
        )
    return out


# -- running it ----------------------------------------------------------------------------------


@dataclass
class Run:
    returncode: int
    events: list[dict[str, Any]]  # the --format json lines
    stdout: str
    stderr: str
    seconds: float

    def describe(self) -> str:
        return (
            f"opencode exited {self.returncode}\nstdout:\n{self.stdout[-4000:]}\n"
            f"stderr:\n{self.stderr[-4000:]}"
        )

    def parts(self, kind: str) -> list[dict[str, Any]]:
        """Every part of `kind` (`text`, `tool_use`, `step_finish`, …) opencode printed."""
        return [e.get("part", {}) for e in self.events if e.get("type") == kind]

    @property
    def final_text(self) -> str:
        texts = self.parts("text")
        assert texts, self.describe()
        return str(texts[-1].get("text"))

    def errors(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("type") == "error"]

    def assert_succeeded(self) -> None:
        """opencode finished its turn without an error, and every tool it ran completed."""
        assert self.returncode == 0, self.describe()
        assert self.errors() == [], self.describe()
        tools = self.parts("tool_use")
        assert all(t.get("state", {}).get("status") == "completed" for t in tools), self.describe()
        finishes = self.parts("step_finish")
        assert finishes and finishes[-1].get("reason") == "stop", self.describe()


def run_opencode(
    binary: Path,
    prompt: str,
    workdir: Path,
    *,
    anthropic_url: str | None = None,
    openai_url: str | None = None,
    model: str = MODEL,
    extra: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    continue_: bool = False,
    timeout: float = RUN_TIMEOUT,
) -> Run:
    """Run `opencode run` once in `workdir/project`; HOME and its XDG folders live in
    `workdir/home`, so a second run of the same test (`continue_`) resumes the first's
    session."""
    home = workdir / "home"
    project = workdir / "project"
    for d in (home, project):
        d.mkdir(parents=True, exist_ok=True)
    content = config(model, anthropic_url, openai_url, extra)
    full = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "SHELL": shutil.which("bash") or "/bin/sh",
        "LANG": "C.UTF-8",
        "ANTHROPIC_API_KEY": API_KEY,
        "OPENAI_API_KEY": API_KEY,
        "OPENCODE_CONFIG_CONTENT": json.dumps(content),
        **OFFLINE,
        **(env or {}),
    }
    cmd = [str(binary), "run", "--format", "json"]
    if continue_:
        cmd.append("--continue")
    cmd.append(prompt)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=project,
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
            f"opencode did not finish in {timeout:.0f}s (killed)\nstdout:\n{out[-4000:]}\n"
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
