"""Tenancy on the hot path (docs/behaviour.md#bounded-work-and-shared-use): `rewrite_body` with the
`summarize` component over real Claude Code captures, each request carrying its tenant (the
fingerprint the addon makes of its credential). A session id is only what a request says: another
credential naming it gets none of its checkpoints, stashes or expand tool, and cannot destroy them;
state written before tenancy stays its session's, and the record says it was unbound."""

from __future__ import annotations

import copy
import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from cg.expand.tool import resolve
from cg.pipeline.rewrite import ExpandPolicy
from cg.state.sqlite import SqliteStore
from cg.state.tenant import fingerprint
from tests.support.transcripts import (
    CC16,
    MARKER_RE,
    Driver,
    FakeSummarizer,
    cc_dumps,
    config,
    fixture_body,
    grow,
    make,
    out_messages,
    record,
    summary_of,
    two_turns,
)

ONE, TWO = "sk-ant-user-one-0001", "sk-ant-user-two-0002"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "cg.sqlite3"


def by_tenant(prompt: str, job: Any) -> str:
    """A summary that names the tenant it was written for (a prefix of its fingerprint)."""
    return f"<summary>written for {job.tenant[:8] or 'nobody'}</summary>"


def pair(store: SqliteStore, session: str = "A") -> tuple[Driver, Driver]:
    """Two users of one proxy (one component) naming the same session, each with their key."""
    fake = FakeSummarizer(by_tenant)
    expand = ExpandPolicy("auto", store)
    one = make(config(), store, summarizer=fake, session=session, expand=expand)
    two = make(config(), store, summarizer=fake, session=session, expand=expand)
    two.component = one.component
    one.tenant = fingerprint(store.tenant_key, {"x-api-key": ONE})
    two.tenant = fingerprint(store.tenant_key, {"x-api-key": TWO})
    return one, two


def marker(r: Any) -> str:
    m = MARKER_RE.search(summary_of(r)[1])
    assert m is not None
    return m.group(1)


def diverged(turns: list[dict[str, Any]], at: int = 2) -> list[dict[str, Any]]:
    """The same conversation (session, first message) but for message `at`: another user's
    (its first text, or tool output, reworded)."""
    other = [copy.deepcopy(t) for t in turns]
    for body in other:
        content = body["messages"][at]["content"]
        if isinstance(content, str):
            body["messages"][at]["content"] = content + " (user two's)"
            continue
        block = next(b for b in content if b.get("type") in ("text", "tool_result"))
        field = "text" if block["type"] == "text" else "content"
        block[field] = f"{block[field]} (user two's)"
    return other


def test_another_credential_naming_the_session_neither_gets_nor_destroys_its_checkpoint(db: Path):
    with SqliteStore(db) as store:
        turns = grow(fixture_body(CC16), 5, output_words=30)
        other = diverged(turns)
        one, two = pair(store)
        r = two_turns(one, turns[0], turns[1])
        mine = summary_of(r)[1]
        assert f"written for {one.tenant[:8]}" in mine
        assert r.record["tenant"] == "bound"

        # User two names session A, with one's first message but its own steps: nothing of one's.
        theirs = two.send(other[1])
        assert theirs.outcome == "passed_through" and theirs.body is None, theirs.record
        rec = record(theirs)
        assert rec["conversation"] != record(r)["conversation"]
        assert rec["conversation"].endswith("@" + two.tenant[:16])
        assert "handover" not in rec
        assert len(two.pending) == 1  # it commissions a summary of its own
        assert theirs.record["tenant"] == "bound"
        # One's checkpoint is untouched, byte for byte.
        again = one.send(turns[2])
        assert again.outcome == "rewritten" and summary_of(again)[1] == mine

        assert two.drain() == ["completed"]
        own = two.send(other[2])
        assert f"written for {two.tenant[:8]}" in summary_of(own)[1]
        assert summary_of(one.send(turns[3]))[1] == mine
        assert summary_of(two.send(other[3]))[1] == summary_of(own)[1]
        assert len(one.summarizer.calls) == 2  # one summary each, none re-made


def test_a_refreshed_credential_takes_its_conversation_over_byte_for_byte(db: Path):
    """The same user after its OAuth token refreshed (a new tenant): its next turn repeats every
    message the summary was made from, so it takes the checkpoint over, the same bytes (the
    provider's cache stays warm), its stash copied for it; no summary is made again, and the
    old credential's rows stay as they were."""
    with SqliteStore(db) as store:
        turns = grow(fixture_body(CC16), 5, output_words=30)
        one, two = pair(store)  # `two`: one's next key
        r = two_turns(one, turns[0], turns[1])
        mine, key = summary_of(r)[1], marker(r)
        after = two.send(turns[2])
        assert after.outcome == "rewritten", after.record
        assert summary_of(after)[1] == mine
        rec = record(after)
        assert "handover" in rec and rec["conversation"].endswith("@" + two.tenant[:16])
        assert after.record["expand"] == {"injected": True, "reason": f"marker {key} resolves"}
        assert not two.pending
        assert "verbatim" in resolve(store, key, "A", two.tenant)
        assert "verbatim" in resolve(store, key, "A", one.tenant)
        later = two.send(turns[3])  # its own checkpoint now
        assert summary_of(later)[1] == mine and "handover" not in record(later)
        assert summary_of(one.send(turns[4]))[1] == mine
        assert len(one.summarizer.calls) == 1


def test_holding_the_summarized_span_without_the_turns_it_was_written_from_takes_nothing(
    db: Path,
):
    """The summary was grounded in the commissioning request's last turns too: a request that
    repeats the span it covers but not those turns is another user's, and gets nothing."""
    with SqliteStore(db) as store:
        turns = grow(fixture_body(CC16), 4, output_words=30)
        one, two = pair(store)
        r = two_turns(one, turns[0], turns[1])
        n = len(turns[0]["messages"])
        covered = record(r)["checkpoint"]["covered"][1]
        assert covered < n  # vacuity: a message between the span's end and the summary's seen
        other = diverged(turns, at=covered)  # the first message after the summarized span
        theirs = two.send(other[2])
        assert "handover" not in record(theirs)
        assert theirs.outcome == "passed_through" or summary_of(theirs)[1] != summary_of(r)[1]


def test_a_marker_in_another_credentials_request_offers_no_tool_and_expands_to_nothing(
    db: Path,
):
    with SqliteStore(db) as store:
        turns = grow(fixture_body(CC16), 3, output_words=30)
        one, two = pair(store)
        r = two_turns(one, turns[0], turns[1])
        key = marker(r)
        assert r.record["expand"] == {"injected": True, "reason": f"marker {key} resolves"}
        # User two sends the messages user one's turn went upstream with, marker and all.
        copied = dict(turns[1], messages=out_messages(r))
        theirs = two.send(copied)
        assert theirs.record["expand"] == {"injected": False, "reason": "no resolvable marker"}
        assert "no longer available" in resolve(store, key, "A", two.tenant)
        assert "no longer available" in resolve(store, key, "A", "")  # nor without a key
        assert "verbatim" in resolve(store, key, "A", one.tenant)
        assert "verbatim" in resolve(store, key, None)  # the operator's (/_cg/expand, CLI)


def test_an_agent_compaction_under_another_credential_keeps_the_sessions_checkpoint(db: Path):
    from cg.pipeline.rewrite import rewrite_body

    with SqliteStore(db) as store:
        turns = grow(fixture_body(CC16), 3, output_words=30)
        one, two = pair(store)
        mine = summary_of(two_turns(one, turns[0], turns[1]))[1]
        compacted = rewrite_body(
            cc_dumps(turns[1]), one.dialect, [one.component],
            headers={"x-context-guru-session": "A"}, agent_compaction="compact",
            tenant=two.tenant,
        )  # fmt: skip
        assert compacted.record["invalidated"] == []
        assert summary_of(one.send(turns[2]))[1] == mine


def test_the_head_hash_sessions_of_two_credentials_with_one_opening_keep_their_own_checkpoints(
    db: Path,
):
    """No session header: the same system prompt and first message used to be one session,
    each user's turn invalidating the other's checkpoint (a summary every turn)."""
    with SqliteStore(db) as store:
        turns = grow(fixture_body(CC16), 6, output_words=30)
        for body in turns:
            del body["metadata"]  # Claude Code's session id: the head hash is the next source
        one, two = pair(store, session=None)  # type: ignore[arg-type]
        other = [copy.deepcopy(t) for t in turns]
        for body in other:  # user two's conversation: the same opening, its own steps
            body["messages"][2]["content"][1]["text"] = "Running user two's step 1."
        r1 = two_turns(one, turns[0], turns[1])
        r2 = two_turns(two, other[0], other[1])
        assert r1.record["session"] != r2.record["session"]
        assert r1.record["session"].startswith("h:") and r2.record["session"].startswith("h:")
        s1, s2 = summary_of(r1)[1], summary_of(r2)[1]
        for i in range(2, 6):  # alternating turns, each re-emitting its own summary
            a, b = one.send(turns[i]), two.send(other[i])
            assert (summary_of(a)[1], summary_of(b)[1]) == (s1, s2)
            assert not one.pending and not two.pending
        assert len(one.summarizer.calls) == 2


def _legacy(db: Path) -> tuple[list[dict[str, Any]], str, str]:
    """A session A summarized before tenancy: its rows as the v4 migration leaves them
    (tenant `*`; tests/state/test_tenancy.py migrates a v3 file). The turns, the summary
    message and its stash key."""
    turns = grow(fixture_body(CC16), 5, output_words=30)
    with SqliteStore(db) as store:
        before = make(config(), store, session="A")
        r = two_turns(before, turns[0], turns[1])
        summary, key = summary_of(r)[1], marker(r)
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("UPDATE stashes SET tenant = '*'").rowcount == 1
        assert conn.execute("UPDATE checkpoints SET tenant = '*'").rowcount == 1
        conn.commit()
    return turns, summary, key


def test_a_checkpoint_from_before_tenancy_serves_its_session_said_unbound(db: Path):
    turns, summary, key = _legacy(db)
    with SqliteStore(db) as store:  # the proxy upgraded and restarted
        one, two = pair(store)
        for user in (one, two):
            r = user.send(turns[2])
            assert r.outcome == "rewritten", r.record
            assert summary_of(r)[1] == summary  # the same bytes: the cache stays warm
            assert r.record["tenant"] == "unbound"
            rec = record(r)
            assert rec["tenant"] == "unbound" and rec["reused"] is True
            assert rec["conversation"].startswith("A#")
            assert "@" not in rec["conversation"]  # the key it had before tenancy
            assert r.record["expand"]["injected"] is True  # its stash resolves for either
            assert "verbatim" in resolve(store, key, "A", user.tenant)
        assert not one.pending and not one.summarizer.calls


def test_a_diverging_credential_never_deletes_a_checkpoint_from_before_tenancy(db: Path):
    turns, summary, _ = _legacy(db)
    with SqliteStore(db) as store:
        one, two = pair(store)
        diverged = copy.deepcopy(turns[2])
        diverged["messages"][2]["content"][1]["text"] = "Running another step 1."
        r = two.send(diverged)
        assert record(r)["checkpoint"] == "diverged"
        assert r.body is None and len(two.pending) == 1  # its own summary, under its own key
        assert record(r)["conversation"].endswith("@" + two.tenant[:16])
        assert summary_of(one.send(turns[3]))[1] == summary  # still there for the session


def test_no_credential_reaches_the_store_or_the_record(db: Path):
    with SqliteStore(db) as store:
        turns = grow(fixture_body(CC16), 3, output_words=30)
        one, _ = pair(store)
        one.headers = {"x-api-key": ONE}
        r = two_turns(one, turns[0], turns[1])
        assert ONE not in json.dumps(r.record)
        assert one.tenant not in json.dumps(r.record)  # the fingerprint, in full, neither
    for suffix in ("", "-wal"):
        path = Path(str(db) + suffix)
        if path.exists():
            assert ONE.encode() not in path.read_bytes()


def test_a_request_without_a_credential_and_one_with_one_keep_apart(db: Path):
    """No credential is a tenant too (`anonymous`): its checkpoint sits under the key from
    before tenancy, and a credentialed request of the session does not take it for an unbound
    one (nor the other way round)."""
    with SqliteStore(db) as store:
        turns = grow(fixture_body(CC16), 4, output_words=30)
        one, nobody = pair(store)
        nobody.tenant = ""
        r = two_turns(nobody, turns[0], turns[1])
        assert r.record["tenant"] == "anonymous" and "@" not in record(r)["conversation"]
        other = diverged(turns)  # (the same transcript would take it over: a handover)
        theirs = one.send(other[1])
        assert theirs.body is None and len(one.pending) == 1  # none of the anonymous one's
        assert one.drain() == ["completed"]
        mine = summary_of(one.send(other[2]))[1]
        assert f"written for {one.tenant[:8]}" in mine
        assert "written for nobody" in summary_of(nobody.send(turns[3]))[1]
