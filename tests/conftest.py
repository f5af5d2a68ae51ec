"""Suite-wide fixtures: a real PostgreSQL server for the PostgreSQL store's tests.

The server is started once per session, only when a test asks for it (`pg_server`, `pg_url`),
and stopped by PID at the end. Without PostgreSQL here those tests skip saying why, unless
`CG_REQUIRE_POSTGRES=1` (`.ci/run`), which makes them fail instead.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.pgserver import PgServer, missing, required


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    why = missing()
    if why is not None:
        if required():
            pytest.fail(f"CG_REQUIRE_POSTGRES=1 but {why}")
        pytest.skip(f"PostgreSQL tests skipped: {why}")
    srv = PgServer.create()
    try:
        srv.start()
        yield srv
    finally:
        srv.destroy()


@pytest.fixture
def pg_url(pg_server: PgServer) -> str:
    """A fresh database on the suite's server (its URL carries the password)."""
    if pg_server.proc is None or pg_server.proc.poll() is not None:
        pg_server.start()  # a test stopped it and failed before starting it again
    return pg_server.new_database()
