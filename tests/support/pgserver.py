"""A real PostgreSQL server for the tests: `initdb` into a temp dir, `postgres` on a loopback port.

Why this shape: the PostgreSQL store's semantics (claims under concurrency, LISTEN/NOTIFY, a server
that goes away) can only be shown against a real server, and the suite must not depend on one
being installed and configured on the machine. Debian's `postgresql` package puts the binaries in
`/usr/lib/postgresql/*/bin`; `$CG_PG_BIN` names another directory.

PostgreSQL refuses to run as root. Run as root (CI containers), the server runs as `nobody`:
`subprocess.Popen(user=…, group=…)` drops the privileges in the child right before `exec`, so the
PID we hold is the server's own (a `runuser`/`su` wrapper would put a process between us and it)
and stopping it by PID is exact. Its data directory is made in /tmp (traversable by `nobody`,
unlike pytest's root-owned 0700 tmp dirs) and handed to that user.

Authentication is scram-sha-256 with a password on TCP, so the tests can show the password never
leaks; the URL is `postgresql://cg:PASSWORD@127.0.0.1:PORT/DB`.

`CG_REQUIRE_POSTGRES=1` (set by `.ci/run`) turns "no PostgreSQL here" from a skip into a failure.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PASSWORD_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
USER = "cg"
START_TIMEOUT = 30.0


def bindir() -> Path | None:
    """The directory holding `initdb` and `postgres`, or None."""
    env = os.environ.get("CG_PG_BIN")
    candidates = [env] if env else []
    candidates += sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True
    )
    for c in candidates:
        if c and (Path(c) / "initdb").exists() and (Path(c) / "postgres").exists():
            return Path(c)
    found = shutil.which("initdb")
    return Path(found).parent if found and shutil.which("postgres") else None


def missing() -> str | None:
    """Why the PostgreSQL tests cannot run here, or None."""
    if bindir() is None:
        return "no PostgreSQL server binaries (apt-get install postgresql, or set CG_PG_BIN)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'context-guru[postgres]')"
    return None


def required() -> bool:
    return os.environ.get("CG_REQUIRE_POSTGRES", "") == "1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class PgServer:
    """One running server (`start()`), restartable on the same port and data (`restart()`)."""

    bin: Path
    root: Path
    port: int
    password: str
    proc: subprocess.Popen[bytes] | None = None
    log: Path = field(init=False)
    _ids: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        self.log = self.root / "server.log"

    @classmethod
    def create(cls) -> PgServer:
        b = bindir()
        if b is None:
            raise RuntimeError("no PostgreSQL binaries")
        root = Path(tempfile.mkdtemp(prefix="cg-pg-", dir="/tmp"))
        srv = cls(
            b, root, free_port(), "".join(secrets.choice(PASSWORD_ALPHABET) for _ in range(20))
        )
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            srv._ids = (nobody.pw_uid, nobody.pw_gid)
            os.chmod(root, 0o700)
            os.chown(root, *srv._ids)
        pwfile = root / "pw"
        pwfile.write_text(srv.password + "\n")
        if srv._ids:
            os.chown(pwfile, *srv._ids)
        subprocess.run(
            [
                str(b / "initdb"),
                "-D",
                str(root / "data"),
                "-U",
                USER,
                "--pwfile",
                str(pwfile),
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            **srv._as_user(),
        )
        pwfile.unlink()
        return srv

    def _as_user(self) -> dict[str, Any]:
        if self._ids is None:
            return {}
        return {"user": self._ids[0], "group": self._ids[1], "extra_groups": []}

    def start(self) -> None:
        """Start the server and wait until it accepts a login (a condition, not a sleep)."""
        with open(self.log, "ab") as out:
            if self._ids:
                os.chown(self.log, *self._ids)
            self.proc = subprocess.Popen(
                [
                    str(self.bin / "postgres"),
                    "-D",
                    str(self.root / "data"),
                    "-p",
                    str(self.port),
                    "-k",
                    str(self.root),
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    "fsync=off",
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    "full_page_writes=off",
                    "-c",
                    "max_connections=100",
                    "-c",
                    "shared_buffers=16MB",
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                **self._as_user(),
            )
        import psycopg

        pause = threading.Event()
        end = time.monotonic() + START_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("postgres exited:\n" + self.log.read_text(errors="replace"))
            try:
                psycopg.connect(self.url("postgres"), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > end:
                    raise RuntimeError(
                        "postgres did not accept logins:\n" + self.log.read_text(errors="replace")
                    ) from None
                pause.wait(0.05)

    def stop(self) -> None:
        """Fast shutdown by PID (SIGINT), then SIGKILL after a deadline."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, db: str) -> str:
        return f"postgresql://{USER}:{self.password}@127.0.0.1:{self.port}/{db}"

    def new_database(self) -> str:
        """A fresh, empty database; its URL."""
        import psycopg

        name = "t_" + uuid.uuid4().hex[:16]
        with psycopg.connect(self.url("postgres"), autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)
