"""Crash safety, bounded for the default suite: two rounds of `kill -9` with summaries in flight
and a restart on the same file (the long run is `python -m tests.e2e.crash`)."""

from __future__ import annotations

import pytest

from tests.e2e.crash import run

pytestmark = pytest.mark.e2e


def test_kill_9_with_summaries_in_flight_leaves_a_store_that_opens_whole(tmp_path):
    doc = run(rounds=2, sessions=8, workdir=tmp_path)
    assert doc["problems"] == [], doc["problems"]
    # not vacuous: each kill hit summaries still running, over a store with checkpoints
    assert doc["kills_with_summaries_in_flight"] == 2, doc["per_round"]
    assert doc["checkpoints_at_end"] > 0 and doc["stashes_at_end"] > 0
    for r in doc["per_round"]:
        assert r["integrity"] == "ok" and r["restart_ok"] and r["orphans"] == []


def test_the_orphan_check_sees_a_checkpoint_without_its_stash(tmp_path):
    """Vacuity guard: a checkpoint whose stash is gone is reported; one with its stash is not."""
    from cg.state.records import Checkpoint, stash_key
    from cg.state.sqlite import SqliteStore
    from tests.e2e.crash import Round, inspect

    db = tmp_path / "cg.sqlite3"
    with SqliteStore(db) as st:
        for sid, stashed in (("kept", True), ("lost", False)):
            key = stash_key([sid])
            if stashed:
                st.put_stash(key, sid, [sid], "anthropic")
            st.put_checkpoint(Checkpoint(f"{sid}#abc", "s", 1, 2, "h", key, "{}"))
    r = Round()
    inspect(db, r)
    assert r.integrity == "ok" and r.checkpoints == 2
    assert r.orphans == [f"lost#abc -> {stash_key(['lost'])}"]
