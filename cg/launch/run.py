"""`context-guru AGENT [ARGS…]`: find or start the proxy, run the agent through it, stop what was
started, say what the session saved.

The order holds the promises: the agent's binary is found before any proxy starts (a missing one
is exit 127 and nothing else), the proxy answers before the agent starts, the agent's exit status
is returned whatever the proxy did, and a proxy this run started is stopped on every way out.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from cg.launch import child, closing, proxy, settings
from cg.launch.agents import AGENTS, LOOPBACK, Agent, Route, no_proxy
from cg.settings import preset_names

EXIT_USAGE = 2
EXIT_PROXY = 1  # no proxy to run through: the agent was not started
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127  # as a shell says of a command it cannot find
EXIT_INTERRUPTED = 130  # Ctrl-C while no agent ran (128 + SIGINT)


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def find_binary(agent: Agent, given: str | None, env: Mapping[str, str]) -> str | None:
    """The agent's executable: CG_AGENT_BIN (a path, or a name on PATH), else its own name."""
    name = given or agent.binary
    if os.sep in name:
        return name if os.path.isfile(name) and os.access(name, os.X_OK) else None
    return shutil.which(name, path=env.get("PATH", os.defpath))


def preset_for(agent: Agent, given: str | None) -> str:
    if given:
        return given
    return agent.preset if agent.preset in preset_names() else "auto"


def _stats(port: int) -> Any:
    try:
        return proxy.ask(port, "/_cg/stats", timeout=30.0)
    except proxy.NotAProxy:
        return None


def launch(name: str, args: Sequence[str], environ: Mapping[str, str] | None = None) -> int:
    """Run agent `name` with `args` through a proxy; the agent's exit status."""
    env = dict(os.environ if environ is None else environ)
    agent = AGENTS[name]
    prog = f"context-guru {name}"
    try:
        conf = settings.read(env, name)
        routes = settings.with_upstreams(agent.routes(env), conf.upstream)
    except ValueError as e:
        say(f"{prog}: {e}")
        return EXIT_USAGE
    binary = find_binary(agent, conf.agent_bin, env)
    if binary is None:
        say(
            f"{prog}: `{conf.agent_bin or agent.binary}` not found: install it with "
            f"`npm install -g {agent.package}`, or name it with CG_AGENT_BIN"
        )
        return EXIT_NOT_FOUND

    ports = (
        [conf.port + i for i in range(len(routes))]
        if conf.port is not None
        else proxy.free_ports(len(routes))
    )
    try:
        serving = [proxy.found(p) for p in ports] if conf.port is not None else [False]
    except proxy.NotAProxy as e:
        say(f"{prog}: {e}; choose another CG_PORT")
        return EXIT_PROXY
    if any(serving) and not all(serving):
        say(f"{prog}: of ports {ports} only some have a proxy: this agent needs {len(ports)}")
        return EXIT_PROXY

    started: proxy.Started | None = None
    try:
        if not all(serving):
            try:
                started = proxy.Started.start(
                    routes, ports, preset_for(agent, conf.preset), conf.proxy_args, conf.log
                )
            except (RuntimeError, OSError) as e:
                say(f"{prog}: could not start the proxy: {e}")
                if conf.port is None:
                    say(f"{prog}: to go through a proxy already running, set CG_PORT to its port")
                return EXIT_PROXY
        return _session(prog, agent, binary, args, env, routes, ports, started)
    except KeyboardInterrupt:  # (while the agent runs, Ctrl-C is the agent's: child.run)
        say(f"{prog}: interrupted")
        return EXIT_INTERRUPTED
    finally:
        if started is not None:
            started.stop()


def _session(
    prog: str,
    agent: Agent,
    binary: str,
    args: Sequence[str],
    env: dict[str, str],
    routes: tuple[Route, ...],
    ports: list[int],
    started: proxy.Started | None,
) -> int:
    bases = {r.provider: proxy.base_url(p) + r.path for r, p in zip(routes, ports, strict=True)}
    try:
        pointing = agent.point(bases, env)
    except ValueError as e:
        say(f"{prog}: {e}")
        return EXIT_USAGE
    before = _stats(ports[0])
    try:
        code = child.run([binary, *pointing.args, *args], {**env, **no_proxy(env), **pointing.env})
    except OSError as e:
        say(f"{prog}: could not run {binary}: {e}")
        return EXIT_NOT_EXECUTABLE
    after = _stats(ports[0])
    where = f"proxy {LOOPBACK}:{ports[0]}"
    if started is not None:
        started.stop()
        where += f" started and stopped (pid {started.pid}, log {started.log})"
    else:
        where += " reused, left running"
    if before is None or after is None:
        say(f"context-guru: the proxy's /_cg/stats could not be read — {where}")
    else:
        say(closing.line(before, after, where, plan=any(r.plan for r in routes)))
    return code
