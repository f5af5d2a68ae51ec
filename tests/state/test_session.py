"""cg.state.session: the first usable source wins, explicit ids are allow-listed, and the fallback hash
is stable across a conversation's turns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mitmproxy.http import Headers

from cg.state.session import (
    HEADER_CG,
    HEADER_CLAUDE_CODE,
    SOURCE_HEAD,
    SOURCE_METADATA,
    conversation_head,
    head_hash,
    resolve_session,
    session_from_user_id,
    session_of,
    valid_session_id,
)
from cg.wire.body import index_body
from cg.wire.dialects import ANTHROPIC, OPENAI

TURN16 = next(
    (
        d / "claude_code_2.1.197_turn16.json"
        for d in (Path(__file__).resolve().parents[1] / "fixtures",)
        if (d / "claude_code_2.1.197_turn16.json").is_file()
    ),
    Path("missing"),
)
CC_SID = "f8e1c462-b91a-42bd-a7aa-b16df1f9a2c3"
# Verbatim from that capture, so these tests hold without the fixture file.
CC_REAL_USER_ID = (
    '{"device_id":"bb0e5635ca0c5ae0234da88d336751726f3e8c8279ea59ff27cb27223fe94e1b",'
    '"account_uuid":"","session_id":"f8e1c462-b91a-42bd-a7aa-b16df1f9a2c3"}'
)
CC_USER_ID = json.dumps(
    {"device_id": "bb0e5635ca0c", "account_uuid": "", "session_id": "from-metadata"},
    separators=(",", ":"),
)
SYSTEM = "You are a helpful agent."
FIRST_USER = {"role": "user", "content": "fix the bug"}


def test_sources_in_order_each_wins_over_the_next():
    meta = {"user_id": CC_USER_ID}
    both = {HEADER_CG: "cg-1", HEADER_CLAUDE_CODE: "cc-1"}
    assert resolve_session(both, meta, SYSTEM, FIRST_USER).id == "cg-1"
    sid = resolve_session({HEADER_CLAUDE_CODE: "cc-1"}, meta, SYSTEM, FIRST_USER)
    assert (sid.id, sid.source) == ("cc-1", HEADER_CLAUDE_CODE)
    sid = resolve_session({}, meta, SYSTEM, FIRST_USER)
    assert (sid.id, sid.source) == ("from-metadata", SOURCE_METADATA)
    sid = resolve_session({}, None, SYSTEM, FIRST_USER)
    assert sid.source == SOURCE_HEAD
    assert sid.id == head_hash(SYSTEM, FIRST_USER)
    assert sid.id.startswith("h:") and len(sid.id) == 34 and valid_session_id(sid.id)
    assert sid.skipped == ()


def test_header_lookup_is_case_insensitive_for_dicts_and_mitmproxy_headers():
    assert resolve_session({"X-Context-Guru-Session": "abc"}).id == "abc"
    assert resolve_session(Headers(x_claude_code_session_id="s-2")).id == "s-2"
    h = Headers([(b"X-Context-Guru-Session", b"  padded  ")])
    assert resolve_session(h).id == "padded"


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "   ",
        "has space",
        "semi;colon",
        "slash/",
        "ünïcode",
        "new\nline",
        "x" * 129,
        "a, b",  # a repeated header, joined
    ],
)
def test_an_id_off_the_allow_list_falls_through_to_the_next_source(bad: str):
    sid = resolve_session({HEADER_CG: bad, HEADER_CLAUDE_CODE: "cc-ok"})
    assert (sid.id, sid.source, sid.skipped) == ("cc-ok", HEADER_CLAUDE_CODE, (HEADER_CG,))
    sid = resolve_session({HEADER_CG: bad, HEADER_CLAUDE_CODE: bad}, None, SYSTEM, FIRST_USER)
    assert sid.id == head_hash(SYSTEM, FIRST_USER)
    assert sid.skipped == (HEADER_CG, HEADER_CLAUDE_CODE)
    bad_meta = {"user_id": json.dumps({"session_id": bad})}
    sid = resolve_session({}, bad_meta, SYSTEM, FIRST_USER)
    assert sid.source == SOURCE_HEAD and sid.skipped == (SOURCE_METADATA,)


def test_allow_list_bounds():
    assert valid_session_id("x" * 128)
    assert not valid_session_id("x" * 129)
    assert valid_session_id("Az09._:-")
    assert not valid_session_id(None)
    assert not valid_session_id(12)


def test_claude_code_metadata_user_id_json_string_gives_its_session_id():
    assert session_from_user_id(CC_REAL_USER_ID) == CC_SID
    sid = resolve_session({"x-claude-code-session-id": CC_SID, "x-api-key": "sk-test"})
    assert (sid.id, sid.source) == (CC_SID, HEADER_CLAUDE_CODE)
    assert session_from_user_id(CC_USER_ID) == "from-metadata"
    # Claude Code 1.x: user_<hash>_account_<uuid>_session_<uuid>
    legacy = "user_" + "ab" * 32 + "_account_" + "_session_" + CC_SID
    assert session_from_user_id(legacy) == CC_SID
    sid = resolve_session({}, {"user_id": legacy})
    assert (sid.id, sid.source) == (CC_SID, SOURCE_METADATA)


@pytest.mark.parametrize(
    "user_id",
    [
        "user-42",  # a plain user id names a user, not a conversation
        '{"device_id": "d"}',
        '{"session_id": 7}',
        "{not json",
        '["session_id"]',
        42,
        None,
    ],
)
def test_a_user_id_that_names_no_session_falls_through_to_the_hash(user_id: object):
    sid = resolve_session({}, {"user_id": user_id}, SYSTEM, FIRST_USER)
    assert sid.source == SOURCE_HEAD
    assert sid.skipped == ()


def test_metadata_that_is_not_an_object_is_ignored():
    assert resolve_session({}, "user_id", SYSTEM, FIRST_USER).source == SOURCE_HEAD
    assert resolve_session({}, ["x"], SYSTEM, FIRST_USER).source == SOURCE_HEAD


def test_head_hash_depends_on_system_and_first_user_only():
    base = head_hash(SYSTEM, FIRST_USER)
    assert head_hash(SYSTEM, FIRST_USER) == base
    assert head_hash(SYSTEM + ".", FIRST_USER) != base
    assert head_hash(SYSTEM, {"role": "user", "content": "other task"}) != base
    assert head_hash(None, None) == head_hash(None, None)
    assert head_hash(None, FIRST_USER) != base


def test_head_hash_ignores_moving_cache_control_markers():
    # Turn 1: the first user message is also the last, so it carries the cache breakpoint.
    turn1 = {
        "role": "user",
        "content": [{"type": "text", "text": "go", "cache_control": {"type": "ephemeral"}}],
    }
    turn2 = {"role": "user", "content": [{"type": "text", "text": "go"}]}
    system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    assert head_hash(system, turn1) == head_hash(system, turn2)


def test_the_hash_is_stable_as_the_conversation_grows():
    msgs = [FIRST_USER, {"role": "assistant", "content": "ok"}]
    later = [*msgs, {"role": "user", "content": "and more"}]
    top = {"system": SYSTEM}
    a = resolve_session({}, None, *conversation_head("anthropic", top, msgs))
    b = resolve_session({}, None, *conversation_head("anthropic", top, later))
    assert a == b


def test_conversation_head_per_dialect():
    sysmsg = {"role": "system", "content": "be brief"}
    msgs = [sysmsg, {"role": "user", "content": "q"}]
    assert conversation_head("openai", {}, msgs) == (sysmsg, msgs[1])
    dev = {"role": "developer", "content": "be brief"}
    assert conversation_head("openai", {}, [dev, msgs[1]]) == (dev, msgs[1])
    assert conversation_head("openai", {}, [msgs[1]]) == (None, msgs[1])
    # Anthropic: the top-level system; a mid-array system message is not the system prompt.
    amsgs = [{"role": "user", "content": "q"}, {"role": "system", "content": "reminder"}]
    assert conversation_head("anthropic", {"system": "S"}, amsgs) == ("S", amsgs[0])
    assert conversation_head("anthropic", {}, []) == (None, None)


def _turn16() -> tuple[bytes, dict[str, str]]:
    raw = TURN16.read_bytes()
    hdr = json.loads(TURN16.with_name(TURN16.stem + ".headers.json").read_text())
    return raw, dict(hdr["headers"])


@pytest.mark.skipif(not TURN16.is_file(), reason="Claude Code fixture not available")
def test_claude_code_fixture_resolves_to_its_session_header():
    raw, headers = _turn16()
    idx = index_body(raw, ANTHROPIC)
    sid = session_of(headers, idx)
    assert (sid.id, sid.source) == (CC_SID, HEADER_CLAUDE_CODE)
    # Without the header, the metadata.user_id JSON string names the same session.
    del headers[HEADER_CLAUDE_CODE]
    sid = session_of(headers, idx)
    assert (sid.id, sid.source) == (CC_SID, SOURCE_METADATA)
    # The credential in the headers is never part of the result.
    assert "sk-test" not in repr(sid)


@pytest.mark.skipif(not TURN16.is_file(), reason="Claude Code fixture not available")
def test_claude_code_fixture_without_ids_hashes_its_head_stably():
    raw, _ = _turn16()
    body = json.loads(raw)
    body.pop("metadata")
    full = index_body(json.dumps(body).encode(), ANTHROPIC)
    sid = session_of({}, full)
    assert sid.source == SOURCE_HEAD
    # An earlier turn of the same conversation (a prefix of its messages) hashes the same.
    body["messages"] = body["messages"][:3]
    earlier = index_body(json.dumps(body).encode(), ANTHROPIC)
    assert session_of({}, earlier) == sid


def test_openai_body_hashes_messages0_system_and_ignores_metadata():
    body: dict[str, Any] = {
        "model": "m",
        "metadata": {"user_id": CC_USER_ID},
        "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}],
    }
    idx = index_body(json.dumps(body).encode(), OPENAI)
    sid = session_of({}, idx)
    assert sid.source == SOURCE_HEAD
    assert sid.id == head_hash(body["messages"][0], body["messages"][1])
    assert session_of({HEADER_CG: "mine"}, idx).id == "mine"


def _body(system: str, messages: list[dict[str, Any]]) -> bytes:
    return json.dumps({"model": "m", "system": system, "messages": messages}).encode()


def test_a_warm_turn_reuses_the_head_hash_until_its_head_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The head hash is memoised on the index (`memo["head"]`) and inherited by a next turn
    that repeats the messages up to the first user message; a turn that edits them, or that
    is not indexed from the previous one, hashes afresh, and always to what a fresh index
    hashes to."""
    from cg.state import session as session_mod
    from cg.wire.body import MessageCache

    calls: list[int] = []
    real = session_mod.head_hash

    def counted(system: object, first_user: object) -> str:
        calls.append(1)
        return real(system, first_user)

    monkeypatch.setattr(session_mod, "head_hash", counted)
    cache = MessageCache()
    asst = {"role": "assistant", "content": "ok"}
    msgs: list[dict[str, Any]] = [
        {"role": "assistant", "content": "hello first"},  # the head may start elsewhere
        {"role": "user", "content": "the task"},
    ]
    ids = []
    for turn in range(4):
        index = index_body(_body(SYSTEM, msgs), ANTHROPIC, cache)
        assert (index.shared > 0) == (turn > 0)  # vacuity guard: warm from the second turn
        ids.append(session_of({}, index).id)
        msgs = [*msgs, asst, {"role": "user", "content": f"next {turn}"}]
    assert len(set(ids)) == 1 and calls == [1]
    assert ids[0] == real(SYSTEM, {"role": "user", "content": "the task"})
    # The first user message edited: the memo is cut with the shared prefix.
    edited = [msgs[0], {"role": "user", "content": "another task"}, *msgs[2:]]
    index = index_body(_body(SYSTEM, edited), ANTHROPIC, cache)
    assert session_of({}, index).id == real(SYSTEM, {"role": "user", "content": "another task"})
    assert calls == [1, 1]
    # A header wins without hashing at all.
    fresh = index_body(_body(SYSTEM, edited), ANTHROPIC)
    assert session_of({HEADER_CG: "explicit"}, fresh).id == "explicit"
    assert calls == [1, 1]


def test_a_body_without_a_user_message_is_hashed_every_time_never_memoised() -> None:
    from cg.wire.body import MessageCache

    cache = MessageCache()
    first = index_body(_body(SYSTEM, [{"role": "assistant", "content": "a"}]), ANTHROPIC, cache)
    assert session_of({}, first).id == head_hash(SYSTEM, None)
    assert first.memo.head == (None, None)
    grown = [{"role": "assistant", "content": "a"}, {"role": "user", "content": "now a task"}]
    index = index_body(_body(SYSTEM, grown), ANTHROPIC, cache)
    assert index.shared == 1
    assert session_of({}, index).id == head_hash(SYSTEM, grown[1])
