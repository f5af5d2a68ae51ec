"""cg.summarize.component: checkpoints and their reuse
(docs/behaviour.md#summarize-checkpoints-and-reuse), the commission loop, marker modes and the store
(docs/behaviour.md#expand, #the-store), sessions (#sessions), over real Claude Code captures grown
turn by turn and over random transcripts in both dialects.

Every test drives `rewrite_body` (the real hot path) with the component alone and completes the
commissions it returns with an in-process fake summarizer; `two_turns` and the explicit
`len(d.pending)` guards fail when a fixture stops reaching the acting path.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cg.pipeline.rewrite import Rewrite
from cg.state import Store, memory
from cg.state.sqlite import SqliteStore
from cg.summarize import component
from cg.summarize.component import NoModel, prefix_hash
from cg.summarize.prompt import SENTINEL, SUMMARY_HEADER
from cg.summarize.span import select_span
from cg.wire.body import MessageCache, index_body
from cg.wire.dialects import DIALECTS, OPENAI
from cg.wire.shape import introduced, validate_shape
from tests.support.strategies import (
    DIALECT_NAMES,
    SETTINGS,
    Dialect,
    NextTurn,
    Sample,
    Style,
    bodies,
    dumps,
    messages,
    next_turns,
    styles,
)
from tests.support.transcripts import (
    CC16,
    CC_TOOL_USE,
    MARKER_RE,
    FakeSummarizer,
    cc_dumps,
    config,
    fixture_body,
    fixture_headers,
    grow,
    make,
    out_messages,
    record,
    sources,
    summarizer_raising,
    summary_of,
    two_turns,
)

Json = Any


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "cg.sqlite3"


@pytest.fixture
def store(db: Path) -> Iterator[Store]:
    s = SqliteStore(db)
    yield s
    s.close()


def restorable(r: Rewrite, raw: bytes, store: Store) -> tuple[int, str, str | None]:
    """Check one rewritten turn against its input: retained messages byte-identical, and in
    `full` mode head + stash + tail == the input. Returns (summary index, its source, key)."""
    dialect = DIALECTS[r.record["dialect"]]
    src = sources(raw, dialect)
    out = sources(r.body or b"", dialect)
    i, summary = summary_of(r)
    tail = out[i + 1 :]
    assert out[:i] == src[:i]
    assert tail == src[len(src) - len(tail) :]
    m = MARKER_RE.search(summary)
    if m is not None:
        stash = store.get_stash(m.group(1))
        assert stash is not None
        assert out[:i] + stash.sources() + tail == src
    return i, summary, m.group(1) if m else None


# --------------------------------------------------------------------------------------------
# Checkpoint reuse on Claude Code traffic
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", [CC16, CC_TOOL_USE])
def test_a_checkpoint_is_reused_byte_identically_with_no_model_call(
    store: Store, fixture: str
) -> None:
    turns = grow(fixture_body(fixture), 12, output_words=40)
    d = make(config(), store)
    first = two_turns(d, turns[0], turns[1])
    _, summary, key = restorable(first, cc_dumps(turns[1]), store)
    assert key is not None
    for body in turns[2:]:
        raw = cc_dumps(body)
        r = d.send(raw)
        assert r.outcome == "rewritten", r.record
        assert restorable(r, raw, store)[1] == summary  # the same bytes, every turn
        assert not d.pending  # the middle stays under resummarize_tokens: no new commission
    assert len(d.summarizer.calls) == 1


def test_a_reuse_turn_hashes_the_covered_prefix_once_per_session_not_per_turn(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    turns = grow(fixture_body(CC16), 8, output_words=30)
    d = make(config(), store, cache=MessageCache())
    two_turns(d, turns[0], turns[1])
    hashed: list[int] = []

    def counted(digests: Sequence[bytes]) -> str:
        hashed.append(len(digests))
        return prefix_hash(digests)

    monkeypatch.setattr(component, "prefix_hash", counted)
    for body in turns[2:]:
        r = d.send(body)
        assert r.outcome == "rewritten", r.record  # vacuity: the checkpoint was compared
    assert hashed == []  # turn 1's hash, inherited over the prefix every turn repeats


@SETTINGS
@given(next_turns())
def test_running_totals_memoised_on_a_warm_index_equal_ones_summed_afresh(turn: NextTurn) -> None:
    """`_totals` adds only the messages a warm index did not inherit: whatever the next turn
    keeps, appends or changes, its totals equal the sums over every message's facts."""
    dialect = DIALECTS[turn.sample.dialect]
    with tempfile.TemporaryDirectory() as tmp:
        st_ = SqliteStore(str(Path(tmp) / "t.db"))
        try:
            comp = make(config(), st_).component
            cache = MessageCache()
            first = index_body(turn.first, dialect, cache)
            comp._totals(first, comp.facts.all(first))
            second = index_body(turn.second, dialect, cache)
            stats = comp.facts.all(second)
            got = comp._totals(second, stats)
        finally:
            st_.close()
    assert len(got) == len(stats)
    for k, (tokens, outputs, top, long) in enumerate(got):
        upto = stats[: k + 1]
        assert tokens == sum(f.tokens for f in upto)
        assert outputs == sum(sum(f.outputs) for f in upto)
        assert top == max((max(f.outputs) for f in upto if f.outputs), default=0)
        assert long == any(f.long_ttl for f in upto)
    if second.shared:  # vacuity guard: the warm index inherited the first one's entries
        warm, cold = second.memo.totals[1], first.memo.totals[1]
        assert warm is not None and cold is not None
        assert warm[: second.shared] == cold[: second.shared]


@pytest.mark.parametrize("keep_last", [0, 1, 3])
def test_cache_control_moving_to_the_last_message_keeps_the_checkpoint(
    store: Store, keep_last: int
) -> None:
    # With keep_last 0 the covered prefix ends with the message that carried the breakpoint
    # when the summary was commissioned; the next turn sends it without.
    turns = grow(fixture_body(CC16), 6, output_words=30)
    assert "cache_control" in json.dumps(turns[0]["messages"][-1])
    assert "cache_control" not in json.dumps(turns[1]["messages"][len(turns[0]["messages"]) - 1])
    d = make(config(keep_last=keep_last), store)
    summaries = set()
    r = two_turns(d, turns[0], turns[1])
    summaries.add(summary_of(r)[1])
    for body in turns[2:]:
        r = d.send(body)
        assert r.outcome == "rewritten" and record(r)["checkpoint"] != "diverged: invalidated"
        summaries.add(summary_of(r)[1])
    assert len(summaries) == 1 and len(d.summarizer.calls) == 1


def test_breakpoints_on_the_last_two_user_turns_moving_keep_the_checkpoint(
    store: Store,
) -> None:
    """Clients that mark the last two user turns (a pattern other agents use) move a breakpoint
    off a message inside the covered prefix."""

    def body(k: int) -> dict[str, Json]:
        msgs: list[Json] = []
        for i in range(k):
            msgs.append({"role": "user", "content": [{"type": "text", "text": f"u{i} " * 60}]})
            msgs.append({"role": "assistant", "content": [{"type": "text", "text": f"a{i}"}]})
        msgs.append({"role": "user", "content": [{"type": "text", "text": f"u{k}"}]})
        users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
        for i in users[-2:]:
            msgs[i]["content"][-1]["cache_control"] = {"type": "ephemeral"}
        return {"model": "claude-sonnet-4-5", "max_tokens": 9, "messages": msgs}

    d = make(config(keep_last=2), store)
    r = two_turns(d, body(5))
    summary = summary_of(r)[1]
    for k in (6, 7, 8):
        r = d.send(body(k))
        assert r.outcome == "rewritten", r.record
        assert summary_of(r)[1] == summary
    assert len(d.summarizer.calls) == 1


def test_the_checkpoint_rolls_forward_past_resummarize_tokens(store: Store) -> None:
    turns = grow(fixture_body(CC16), 14, output_words=120)
    d = make(config(resummarize_tokens=1500), store)
    r = two_turns(d, turns[0], turns[1])
    old_i, old_summary, old_key = restorable(r, cc_dumps(turns[1]), store)
    old_covered = record(r)["checkpoint"]["covered"]
    rolled_at = None
    for t, body in enumerate(turns[2:], start=2):
        raw = cc_dumps(body)
        r = d.send(raw)
        assert r.outcome == "rewritten", r.record
        _, summary, _ = restorable(r, raw, store)
        assert summary == old_summary  # the old checkpoint keeps serving meanwhile
        if d.pending:
            rolled_at = t
            break
    assert rolled_at is not None, "the middle never grew past resummarize_tokens"
    assert record(r)["middle_tokens"] > 1500
    job = d.pending[0]
    assert job.previous_summary is not None and job.previous_summary in old_summary
    assert job.head == old_covered[0] and job.end > old_covered[1]
    assert len(job.span) == job.end - old_covered[1]  # only the new middle is summarized ...
    assert len(job.sources) == job.end - job.head  # ... but the whole span is stashed
    prompt_checked = d.drain()
    assert prompt_checked == ["completed"]
    assert "<previous_summary>" in d.summarizer.calls[-1][0]
    raw = cc_dumps(turns[rolled_at + 1])
    r = d.send(raw)
    i, summary, key = restorable(r, raw, store)
    assert i == old_i and summary != old_summary and key != old_key
    assert record(r)["checkpoint"]["covered"] == [job.head, job.end]
    assert store.get_stash(old_key or "") is not None  # the old stash still resolves


def test_a_sent_request_at_the_ceiling_rolls_forward_whatever_resummarize_tokens(
    store: Store,
) -> None:
    turns = grow(fixture_body(CC16), 30, output_words=400)
    window = 60_000
    cfg = config(resummarize_tokens=10**9, trigger={"ceiling_frac": 0.5})
    d = make(cfg, store, model_windows={"claude-opus-4-8": window})
    two_turns(d, turns[0], turns[1])
    rolled = None
    for body in turns[2:]:
        r = d.send(body)
        assert r.outcome == "rewritten", r.record
        rec = record(r)
        if d.pending:
            rolled = rec
            break
        assert rec["tokens_after"] < 0.5 * window
    assert rolled is not None, "the request sent never reached the ceiling: vacuous"
    assert rolled["tokens_after"] >= 0.5 * window > rolled["middle_tokens"]
    assert rolled["commission"].startswith("rolling forward: the request sent is")
    assert d.drain() == ["completed"]
    after = record(d.send(turns[turns.index(body) + 1]))
    assert after["tokens_after"] < 0.5 * window  # the fresh checkpoint took the middle


@pytest.mark.parametrize("warm", [False, True])
def test_a_diverged_prefix_invalidates_the_checkpoint(store: Store, warm: bool) -> None:
    """Warm, the edited turn shares 3 messages with the previous one: the covered prefix's
    memoised hash must not outlive them."""
    turns = grow(fixture_body(CC16), 4, output_words=30)
    d = make(config(), store, cache=MessageCache() if warm else None)
    two_turns(d, turns[0], turns[1])
    edited = json.loads(json.dumps(turns[2]))
    edited["messages"][3]["content"][0]["content"] = "step 1 (edited by the agent)"
    r = d.send(edited)
    rec = record(r)
    assert rec["checkpoint"] == "diverged: invalidated"
    assert r.outcome == "passed_through"
    assert len(d.pending) == 1  # a fresh summary of the edited history is commissioned
    assert d.drain() == ["completed"]
    r = d.send(edited)
    restorable(r, cc_dumps(edited), store)


def test_the_agents_own_compaction_invalidates_the_checkpoint(store: Store) -> None:
    turns = grow(fixture_body(CC16), 3, output_words=30)
    d = make(config(), store)
    two_turns(d, turns[0], turns[1])
    compacted = dict(turns[2])
    compacted["messages"] = [
        {"role": "user", "content": "This session continues from a compacted conversation."},
        *turns[2]["messages"][-6:],
    ]
    r = d.send(compacted)
    # A new first message is a new conversation: the old checkpoint is never reused for it.
    assert "checkpoint" not in record(r), record(r)
    assert r.outcome == "passed_through"
    assert len(d.pending) == 1 and d.pending[0].end <= len(compacted["messages"])
    assert d.pending[0].conversation != d.pending[0].session


def test_two_conversations_under_one_session_id_keep_their_own_checkpoints(
    store: Store,
) -> None:
    """An agent and its subagent share a session id but not a first message."""
    main = grow(fixture_body(CC16), 3, output_words=30)
    d = make(config(), store)
    two_turns(d, main[0], main[1])
    sub = json.loads(json.dumps(main[1]))
    sub["messages"][0] = {"role": "user", "content": "Subagent: find the config file."}
    r = d.send(sub)
    assert r.outcome == "passed_through"  # the subagent has no checkpoint of its own yet
    assert d.drain() == ["completed"]
    r = d.send(main[2])  # the main conversation's checkpoint survived the subagent
    assert r.outcome == "rewritten", record(r)
    assert record(r)["checkpoint"]["covered"]


def test_resummarize_tokens_0_summarizes_afresh_every_eligible_turn(store: Store) -> None:
    turns = grow(fixture_body(CC16), 6, output_words=30)
    d = make(config(resummarize_tokens=0, keep_first=2), store)
    r = two_turns(d, turns[0], turns[1])
    seen = [summary_of(r)[1]]
    assert len(d.pending) == 1  # turn 2 splices AND commissions a fresh one
    for body in turns[2:]:
        assert d.drain() == ["completed"]
        raw = cc_dumps(body)
        r = d.send(raw)
        assert r.outcome == "rewritten", r.record
        summary = restorable(r, raw, store)[1]
        assert summary not in seen  # the newest completed summary, new bytes each turn
        assert f"summary #{len(d.summarizer.calls)} of" in summary
        seen.append(summary)
        assert len(d.pending) == 1
    assert len(d.summarizer.calls) == len(turns) - 1


def test_resummarize_tokens_0_still_honours_the_trigger(store: Store) -> None:
    turns = grow(fixture_body(CC16), 3, output_words=30)
    d = make(config(resummarize_tokens=0, trigger={"min_messages": 10_000}), store)
    r = d.send(turns[0])
    assert r.outcome == "passed_through" and not d.pending
    assert record(r)["trigger"]["fire"] is False


def test_at_most_one_summary_is_in_flight_per_session(store: Store) -> None:
    turns = grow(fixture_body(CC16), 4, output_words=30)
    d = make(config(), store)
    d.send(turns[0])
    assert len(d.pending) == 1
    for body in turns[1:3]:
        r = d.send(body)
        assert r.outcome == "passed_through"
        assert record(r)["commission"] == "a summary for this session is already in flight"
    assert len(d.pending) == 1
    other = make(config(), store, session="sess-2")
    other.component = d.component  # the same component, another session: not blocked
    other.send(turns[0])
    assert len(other.pending) == 1
    assert d.drain() == ["completed"] and other.drain() == ["completed"]
    r = d.send(turns[3])
    assert r.outcome == "rewritten"


@pytest.mark.parametrize(
    ("summarizer", "outcome"),
    [
        (FakeSummarizer(None), "blank"),
        (FakeSummarizer(""), "blank"),
        (FakeSummarizer("   \n\t "), "blank"),
        (FakeSummarizer("<summary>  \n </summary>"), "blank"),
        (summarizer_raising("error"), "failed"),
        (summarizer_raising("timeout"), "timed_out"),
        (FakeSummarizer(NoModel("model.source config: no model.model set")), "no_model"),
    ],
)
def test_a_blank_or_failed_summary_is_a_no_op(
    store: Store, summarizer: FakeSummarizer, outcome: str
) -> None:
    turns = grow(fixture_body(CC16), 3, output_words=30)
    d = make(config(), store, summarizer=summarizer)
    d.send(turns[0])
    assert len(d.pending) == 1
    assert d.drain() == [outcome]
    assert not store.checkpoints_of(d.session or "")
    assert store.stats().stashes == 0
    r = d.send(turns[1])
    assert r.outcome == "passed_through"
    assert len(d.pending) == 1  # nothing in flight any more: the next turn commissions again
    d.summarizer = FakeSummarizer()
    assert d.drain() == ["completed"]
    assert d.send(turns[2]).outcome == "rewritten"


def test_a_job_with_no_summarizer_at_all_is_a_no_model_no_op(store: Store) -> None:
    turns = grow(fixture_body(CC16), 2, output_words=30)
    d = make(config(), store)
    d.send(turns[0])
    job = d.pending.pop()
    assert asyncio.run(d.component.complete(job)) == "no_model"
    assert not store.checkpoints_of(d.session or "")
    d.send(turns[1])
    assert len(d.pending) == 1  # the session was freed for the next commission


def test_an_abandoned_job_frees_its_session(store: Store) -> None:
    turns = grow(fixture_body(CC16), 3, output_words=30)
    d = make(config(), store)
    d.send(turns[0])
    d.component.abandon(d.pending.pop())
    d.send(turns[1])
    assert len(d.pending) == 1
    assert d.drain() == ["completed"]
    assert d.send(turns[2]).outcome == "rewritten"


# --------------------------------------------------------------------------------------------
# Marker modes and the store
# --------------------------------------------------------------------------------------------


def test_full_marker_mode_stashes_the_span_under_a_resolvable_key(store: Store) -> None:
    raw = cc_dumps(fixture_body(CC16))
    r = two_turns(make(config(marker_mode="full"), store), raw)
    i, _, key = restorable(r, raw, store)  # the marker resolves to exactly the replaced span
    msg = out_messages(r)[i]
    assert msg["role"] == "user" and isinstance(msg["content"], str)
    content = msg["content"]
    assert content.startswith(SUMMARY_HEADER + "\n<summary>\nsummary #1 of")
    assert key is not None and content.endswith(f"<<cg:{key}>>")
    assert f'context_guru_expand tool with id "{key}"' in content


def test_summary_marker_mode_leaves_a_sentinel_and_stashes_nothing(store: Store) -> None:
    raw = cc_dumps(fixture_body(CC16))
    r = two_turns(make(config(marker_mode="summary"), store), raw)
    i, _, key = restorable(r, raw, store)
    content = out_messages(r)[i]["content"]
    assert key is None and content.endswith("\n" + SENTINEL)
    # The floor sits between the model's summary and the sentinel, without ids (no stash).
    floor = content[content.index("</summary>\n") + 11 : -len(SENTINEL) - 1]
    assert floor.startswith("<artifact_trail>\nCommands") and "- echo step 14\n" in floor
    assert "#" not in floor
    assert "<<cg:" not in content and "context_guru_expand" not in content
    assert store.stats().stashes == 0


def test_off_marker_mode_leaves_no_marker(store: Store) -> None:
    raw = cc_dumps(fixture_body(CC16))
    r = two_turns(make(config(marker_mode="off"), store), raw)
    i, _, key = restorable(r, raw, store)
    content = out_messages(r)[i]["content"]
    assert key is None and SENTINEL not in content and "<<cg:" not in content
    assert content.endswith("- echo step 14\n</artifact_trail>")  # the floor, last, no ids
    assert "</summary>\n<artifact_trail>" in content
    assert store.stats().stashes == 0


def test_full_mode_degrades_to_off_on_a_memory_store() -> None:
    mem = memory()
    assert mem.persistent is False
    raw = cc_dumps(fixture_body(CC16))
    d = make(config(marker_mode="full"), mem)
    assert d.component.marker_mode == "off"
    r = two_turns(d, raw)
    content = out_messages(r)[summary_of(r)[0]]["content"]
    assert "<<cg:" not in content and SENTINEL not in content
    assert mem.stats().stashes == 0
    mem.close()


def test_an_evicted_stash_degrades_honestly_and_stays_byte_stable(db: Path) -> None:
    store = SqliteStore(db)
    turns = grow(fixture_body(CC16), 5, output_words=30)
    d = make(config(), store)
    r = two_turns(d, turns[0], turns[1])
    _, before, key = restorable(r, cc_dumps(turns[1]), store)
    assert key is not None and store.has_stash(key)
    # The stash goes (expired, or evicted with its own session over its quota: another
    # session's flood cannot take it, tests/state/test_tenancy.py).
    assert store.delete_stash(key) == 1
    assert not store.has_stash(key)
    r = d.send(turns[2])
    assert r.outcome == "rewritten", r.record
    _, after, after_key = restorable(r, cc_dumps(turns[2]), store)
    assert after_key is None and "<<cg:" not in after
    assert "the originals have expired" in after
    assert after.split("</summary>")[0] == before.split("</summary>")[0]  # same summary text
    for body in turns[3:]:
        r = d.send(body)
        assert r.outcome == "rewritten" and summary_of(r)[1] == after
    assert len(d.summarizer.calls) == 1
    store.close()


def test_a_reopened_store_serves_the_checkpoint_byte_identically(db: Path) -> None:
    turns = grow(fixture_body(CC16), 3, output_words=30)
    store = SqliteStore(db)
    d = make(config(), store)
    r = two_turns(d, turns[0], turns[1])
    _, summary, key = restorable(r, cc_dumps(turns[1]), store)
    store.close()

    reopened = SqliteStore(db)  # a proxy restart: a new store and a new component
    d2 = make(config(), reopened, now=d.now)
    raw = cc_dumps(turns[2])
    r = d2.send(raw)
    assert r.outcome == "rewritten", r.record
    assert restorable(r, raw, reopened)[1] == summary
    assert key is not None and reopened.get_stash(key) is not None
    assert not d2.summarizer.calls
    reopened.close()


def test_two_sessions_never_share_a_checkpoint(store: Store) -> None:
    raw = cc_dumps(fixture_body(CC16))
    fake = FakeSummarizer(lambda prompt, job: f"<summary>for {job.session}</summary>")
    a = make(config(), store, summarizer=fake, session="sess-a")
    b = make(config(), store, summarizer=fake, session="sess-b")
    b.component = a.component
    two_turns(a, raw)
    # the very same body in another session: no splice from a's checkpoint
    r = b.send(raw)
    assert r.outcome == "passed_through" and "checkpoint" not in record(r)
    assert len(b.pending) == 1 and b.pending[0].session == "sess-b"
    assert b.drain() == ["completed"]
    ra, rb = a.send(raw), b.send(raw)
    assert "for sess-a" in summary_of(ra)[1] and "for sess-b" in summary_of(rb)[1]
    (cpa,), (cpb,) = store.checkpoints_of("sess-a"), store.checkpoints_of("sess-b")
    assert cpa != cpb and cpa.session.startswith("sess-a#") and cpb.session.startswith("sess-b#")


def test_sessions_resolve_from_claude_codes_own_header(store: Store) -> None:
    body = fixture_body(CC16)
    headers = fixture_headers(CC16)
    d = make(config(), store, session=None, headers=headers)
    two_turns(d, body)
    sid = headers["x-claude-code-session-id"]
    (cp,) = store.checkpoints_of(sid)
    assert cp.session.startswith(sid + "#")
    # the context-1m beta header raised claude-opus-4-8's window to 1M in the record
    assert record(d.send(body))["window"] == 1_000_000


# --------------------------------------------------------------------------------------------
# Long transcripts grown from the fixtures
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", [CC16, CC_TOOL_USE])
def test_a_long_grown_session_stays_legal_restorable_and_cache_stable(
    store: Store, fixture: str
) -> None:
    turns = grow(fixture_body(fixture), 40, output_words=60)
    d = make(config(resummarize_tokens=2500, keep_first=2), store)
    rewritten = 0
    changes = 0
    last_summary = None
    for body in turns:
        raw = cc_dumps(body)
        r = d.send(raw)
        if r.outcome == "rewritten":
            rewritten += 1
            out = out_messages(r)
            assert validate_shape(out, "anthropic") == []
            summary = restorable(r, raw, store)[1]
            changes += summary != last_summary
            last_summary = summary
        else:
            assert r.outcome == "passed_through", r.record
        assert d.drain() in ([], ["completed"])
    assert rewritten == len(turns) - 1
    assert 2 <= changes < rewritten / 3  # rolls forward now and then, reused in between
    assert len(d.summarizer.calls) == changes


# --------------------------------------------------------------------------------------------
# Properties over random transcripts
# --------------------------------------------------------------------------------------------


@settings(SETTINGS, max_examples=60)
@given(
    st.sampled_from(DIALECT_NAMES).flatmap(lambda d: bodies(dialect=d, min_turns=2, max_turns=8)),
    st.integers(0, 4),
    st.integers(0, 4),
    st.sampled_from(["full", "summary", "off"]),
)
def test_random_transcripts_round_trip_through_a_summary(
    sample: Sample, keep_first: int, keep_last: int, mode: str
) -> None:
    dialect = DIALECTS[sample.dialect]
    raw = sample.raw
    index = index_body(raw, dialect)
    span = select_span(index.views, keep_first, keep_last)
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "cg.sqlite3")
        cfg = config(keep_first=keep_first, keep_last=keep_last, marker_mode=mode)
        d = make(cfg, store, sample.dialect)
        r1 = d.send(raw)
        assert r1.body is None
        if isinstance(span, str):
            assert not d.pending
            store.close()
            return
        assert len(d.pending) == 1, record(r1)
        assert d.drain() == ["completed"]
        r2 = d.send(raw)
        assert r2.outcome == "rewritten", r2.record
        i, _, key = restorable(r2, raw, store)
        assert i == span.head
        n_out = len(out_messages(r2))
        tail = n_out - i - 1
        assert tail == len(index.messages) - span.end
        # no violation the rewrite introduced, judged as the addon judges it
        before = validate_shape(index.views, dialect)
        after = validate_shape(out_messages(r2), dialect)
        after_sources = [f"m{k}" for k in range(i)] + ["new#0"]
        after_sources += [f"m{k}" for k in range(span.end, len(index.messages))]
        assert introduced(before, after, after_sources) == []
        assert (key is not None) == (mode == "full")
        if mode == "full":
            stash = store.get_stash(key or "")
            assert stash is not None
            assert stash.sources() == [index.source(k) for k in range(span.head, span.end)]
        store.close()


@settings(SETTINGS, max_examples=60)
@given(
    st.sampled_from(DIALECT_NAMES).flatmap(
        lambda d: st.tuples(st.just(d), messages(d, 3, 10), styles)
    ),
    st.integers(0, 3),
    st.integers(0, 4),
    st.floats(0.3, 0.9),
)
def test_a_checkpoint_made_on_a_prefix_serves_the_grown_transcript(
    drawn: tuple[Dialect, list[Json], Style], keep_first: int, keep_last: int, at: float
) -> None:
    name, msgs, style = drawn
    dialect = DIALECTS[name]
    k = max(1, int(len(msgs) * at))
    while validate_shape(msgs[:k], name):  # a prefix a client could send (no dangling call)
        k += 1
    raw1 = dumps({"model": "m", "messages": msgs[:k]}, style).encode()
    raw2 = dumps({"model": "m", "messages": msgs}, style).encode()
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "cg.sqlite3")
        d = make(config(keep_first=keep_first, keep_last=keep_last), store, name)
        d.send(raw1)
        if not d.pending:
            assert isinstance(
                select_span(index_body(raw1, dialect).views, keep_first, keep_last), str
            )
            store.close()
            return
        job = d.pending[0]
        assert d.drain() == ["completed"]
        r = d.send(raw2)
        index = index_body(raw2, dialect)
        span = select_span(index.views, keep_first, keep_last)
        assert not isinstance(span, str)  # the grown transcript has at least the old span
        if job.end > span.end:  # the checkpoint reaches into this turn's tail
            assert record(r)["checkpoint"] == "covers into the tail: not reused this turn"
            store.close()
            return
        assert r.outcome == "rewritten", r.record
        assert record(r)["checkpoint"]["covered"] == [job.head, job.end]
        i, _, key = restorable(r, raw2, store)
        assert i == job.head and key is not None
        after_sources = [f"m{n}" for n in range(i)] + ["new#0"]
        after_sources += [f"m{n}" for n in range(job.end, len(index.messages))]
        before = validate_shape(index.views, dialect)
        after = validate_shape(out_messages(r), dialect)
        assert introduced(before, after, after_sources) == []
        store.close()


def test_the_openai_round_trip_keeps_system_and_task_with_keep_first_2(store: Store) -> None:
    msgs: list[Json] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "task"},
    ]
    for k in range(8):
        msgs.append({"role": "assistant", "content": f"a{k} " * 50})
        msgs.append({"role": "user", "content": f"u{k} " * 50})
    raw = json.dumps({"model": "gpt-4o", "messages": msgs}, indent=2).encode()
    r = two_turns(make(config(keep_first=2), store, "openai"), raw)
    i, _, _ = restorable(r, raw, store)
    assert i == 2
    assert sources(r.body or b"", OPENAI)[:2] == sources(raw, OPENAI)[:2]


def test_a_span_over_the_stash_bound_is_not_summarized(db: Path) -> None:
    """docs/behaviour.md#bounded-work-and-shared-use: a stash holds at most a quarter of the
    stashes' share of `store.max_mb`; a span over it commissions nothing (in `full` mode: its stash
    could not be kept), said in the record; the same span under a larger store is summarized (the
    guard of the path)."""
    turns = grow(fixture_body(CC16), 2, output_words=30)
    small = SqliteStore(db, max_mb=0.05)  # a stash bound of ~6.5 KB: under the fixture's span
    d = make(config(), small)
    r = d.send(turns[0])
    rec = record(r)
    assert r.outcome == "passed_through" and not d.pending, rec
    assert rec["bound"] == "stash" and "over the stash bound" in rec["commission"]
    small.close()
    big = SqliteStore(db.with_name("big.sqlite3"))
    two_turns(make(config(), big), turns[0], turns[1])
    big.close()
