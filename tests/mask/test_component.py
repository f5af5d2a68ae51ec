"""The `mask` component through `rewrite_body`, on real SQLite files, in each dialect: the stub
bytes, every other byte the client's, the shape rules, reuse and roll-forward, the gates, a
restart, divergence, the stash before the id, what it will not mask, and composition with
`summarize`."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from cg.mask.component import Mask
from cg.mask.config import parse_mask
from cg.pipeline.contract import RequestContext
from cg.pipeline.rewrite import ExpandPolicy, Rewrite, rewrite_body
from cg.retention.measure import of_plan
from cg.settings import StoreConfig
from cg.state import Store, StoreError, open_store, stash_key
from cg.state.facts import FactsCache
from cg.summarize.component import Summarize
from cg.wire.body import index_body
from cg.wire.dialects import DIALECTS
from cg.wire.shape import validate_shape
from tests.support.masking import (
    BODIES,
    STUB_OPEN,
    array_sources,
    dumps,
    mask_config,
    output_at,
    replaced,
    words,
)
from tests.support.transcripts import TOKENS, FakeSummarizer, config

DIALECT_NAMES = ["anthropic", "openai", "responses"]
KEY = {"anthropic": "messages", "openai": "messages", "responses": "input"}
SESSION = {"x-context-guru-session": "sess-mask"}
BIG = [words(300, f"o{n}") for n in range(5)]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "cg.sqlite3"


@pytest.fixture
def store(db: Path) -> Iterator[Store]:
    s = open_store(StoreConfig(), str(db))
    yield s
    s.close()


def mask(store: Store, **over: Any) -> Mask:
    return Mask(parse_mask(mask_config(**over)), store, TOKENS)


def send(comps: list[Any], body: dict[str, Any] | bytes, dialect: str, store: Store) -> Rewrite:
    raw = body if isinstance(body, bytes) else dumps(body)
    return rewrite_body(
        raw, DIALECTS[dialect], comps, headers=SESSION, expand=ExpandPolicy("auto", store)
    )


def rec(r: Rewrite, name: str = "mask") -> dict[str, Any]:
    (found,) = [c for c in r.record["components"] if c["component"] == name]
    return found


def sources(raw: bytes, dialect: str) -> list[str]:
    index = index_body(raw, DIALECTS[dialect])
    return [index.source(i) for i in range(len(index.messages))]


def expected_stub(dialect: str, n: int, text: str, key: str, pos: int) -> str:
    tool = {
        "anthropic": f'Bash {{"command":"make step{n}"}}',
        "openai": f'shell {{"cmd":"make {n}"}}',
        "responses": f'exec "run {n}"' if n % 2 else f'exec_command {{"cmd":"make {n}"}}',
    }[dialect]
    lines = text.count("\n") + 1
    out = (
        f"[context-guru masked this tool output] {tool} → {len(text):,} characters, "
        f"{lines} line{'s' if lines != 1 else ''}"
    )
    if text.startswith("Error:"):
        out += f"; first error line: {text.splitlines()[0]}"
    return f'{out}; call context_guru_expand with id "{key}#{pos}" to read it <<cg:{key}>>'


def output_text(value: Any) -> str:
    return value if isinstance(value, str) else "\n".join(p["text"] for p in value)


# -- one turn ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
def test_old_outputs_become_stubs_and_every_other_byte_is_the_clients(
    store: Store, dialect: str
) -> None:
    body = BODIES[dialect](BIG, error_at=1)
    raw = dumps(body)
    r = send([mask(store)], raw, dialect, store)
    assert r.outcome == "rewritten", r.record
    assert r.body is not None
    d = rec(r)
    assert d["checkpoint"] == "first mask" and d["masked"] == 3 and d["tokens_saved"] > 0

    # Every byte outside the three replaced values is the client's; each replaced value is the
    # output it stands for, and each stub is the exact line for it.
    pairs = replaced(raw, r.body)
    assert len(pairs) == 3
    srcs = sources(raw, dialect)
    at = [output_at(dialect, n) for n in range(3)]
    key = stash_key([srcs[i] for i in at])
    assert d["keys"] == [key]
    for n, (value, stub) in enumerate(pairs):
        text = output_text(value)
        assert text == (f"Error: step 1 failed with exit code 2\n{BIG[1]}" if n == 1 else BIG[n])
        assert stub == expected_stub(dialect, n, text, key, n + 1)
    # KEY#N is the N-th message of the stash: the message that held the output, as sent.
    stash = store.get_stash(key, "sess-mask", "")
    assert stash is not None and stash.sources() == [srcs[i] for i in at]
    # The shape rules hold, the expand tool is offered for the stubs' marker.
    sent = json.loads(r.body)[KEY[dialect]]
    assert validate_shape(sent, dialect) == []
    assert r.record["expand"] == {"injected": True, "reason": f"marker {key} resolves"}


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
def test_the_last_rounds_and_small_outputs_are_never_masked(store: Store, dialect: str) -> None:
    outs = [BIG[0], words(30, "small"), BIG[2], BIG[3], BIG[4], BIG[0] + " again"]
    raw = dumps(BODIES[dialect](outs))
    r = send([mask(store, keep_last_rounds=3, min_output_tokens=50)], raw, dialect, store)
    assert r.body is not None, r.record
    masked = [output_text(v) for v, _ in replaced(raw, r.body)]
    # Rounds 3, 4 and 5 are the last three; output 1 is under min_output_tokens.
    assert masked == [BIG[0], BIG[2]]
    sent = array_sources(r.body, KEY[dialect])
    client = array_sources(raw, KEY[dialect])
    for n in (1, 3, 4, 5):
        assert sent[output_at(dialect, n)] == client[output_at(dialect, n)]

    # keep_last_rounds: 0 masks every round; a floor of 0 still skips an empty output.
    r0 = send([mask(store, keep_last_rounds=0, min_output_tokens=0)], raw, dialect, store)
    assert r0.body is not None
    assert len(replaced(raw, r0.body)) == 6


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
def test_too_few_rounds_or_too_little_to_mask_passes(store: Store, dialect: str) -> None:
    raw = dumps(BODIES[dialect](BIG[:2]))
    r = send([mask(store)], raw, dialect, store)
    assert r.outcome == "passed_through" and r.body is None
    assert rec(r)["reason"] == "nothing to mask before the last 2 tool rounds"
    raw = dumps(BODIES[dialect](BIG))
    r = send([mask(store, remask_tokens=5000)], raw, dialect, store)
    assert r.body is None
    assert re.fullmatch(
        r"nothing masked: 9\d\d tokens of old tool outputs <= remask_tokens", rec(r)["reason"]
    )
    # The trigger gates the first mask as it gates a first summary.
    r = send([mask(store, trigger={"min_request_tokens": 10**6})], raw, dialect, store)
    assert r.body is None and rec(r)["reason"] == "trigger did not fire"
    assert rec(r)["trigger"]["blocked"]


# -- across turns ------------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
def test_the_masked_prefix_is_reused_byte_for_byte_then_rolled_forward_in_one_step(
    db: Path, dialect: str
) -> None:
    make = BODIES[dialect]
    key = KEY[dialect]
    store = open_store(StoreConfig(), str(db))
    comp = mask(store, remask_tokens=500)
    r1 = send([comp], make(BIG), dialect, store)
    assert r1.body is not None and rec(r1)["checkpoint"] == "first mask"
    # Turn 2: one more (small) exchange: 300 unmasked tokens wait, under remask_tokens.
    body2 = make([*BIG, words(10, "tiny")])
    r2 = send([comp], body2, dialect, store)
    assert r2.body is not None and rec(r2)["checkpoint"] == "reused"
    s1, s2 = array_sources(r1.body, key), array_sources(r2.body, key)
    last = output_at(dialect, 4)
    assert s2[: last + 1] == s1[: last + 1]  # the whole shared history, stubs included
    assert any(STUB_OPEN.encode() in m for m in s1[: last + 1])  # vacuity: stubs in it

    # A restart: a new component on the same SQLite file sends the same bytes.
    store.close()
    store = open_store(StoreConfig(), str(db))
    again = send([mask(store, remask_tokens=500)], body2, dialect, store)
    assert again.body == r2.body and rec(again)["checkpoint"] == "reused"

    # Turn 3: outputs 3 and 4 are now older than the last two rounds: 600 tokens > 500, masked
    # together under a new stash; the old stubs keep their bytes.
    comp = mask(store, remask_tokens=500)
    body3 = make([*BIG, words(10, "tiny"), BIG[0] + " x", BIG[1] + " y"])
    r3 = send([comp], body3, dialect, store)
    assert r3.body is not None
    d3 = rec(r3)
    assert d3["checkpoint"] == "rolled forward" and d3["masked"] == 5
    (old_key,) = rec(r1)["keys"]
    assert len(d3["keys"]) == 2 and old_key in d3["keys"]
    s3 = array_sources(r3.body, key)
    first_new = output_at(dialect, 3)
    assert s3[:first_new] == s2[:first_new]
    stubs = [stub for _, stub in replaced(dumps(body3), r3.body)]
    new_key = next(k for k in d3["keys"] if k != old_key)
    assert [s.split('id "')[1].split('"')[0] for s in stubs] == [
        f"{old_key}#1",
        f"{old_key}#2",
        f"{old_key}#3",
        f"{new_key}#1",
        f"{new_key}#2",
    ]
    store.close()


def test_reuse_survives_the_breakpoint_moving_claude_code_style(store: Store) -> None:
    """Claude Code moves `cache_control` to the last message every turn: the masked messages'
    bytes are re-read each turn, the stubs are the checkpoint's."""
    from tests.support.transcripts import CC16, fixture_body, grow

    bodies = grow(fixture_body(CC16), 8, output_words=200)
    comp = mask(store, remask_tokens=2500)  # each grown output is 800 tokens
    out = [send([comp], b, "anthropic", store) for b in bodies[-3:]]
    assert [rec(r)["checkpoint"] for r in out] == ["first mask", "reused", "reused"]
    for b, r in zip(bodies[-3:], out, strict=True):
        assert r.body is not None
        assert len(replaced(dumps(b), r.body)) == rec(r)["masked"]
        assert validate_shape(json.loads(r.body)["messages"], "anthropic") == []
    s = [array_sources(r.body or b"", "messages") for r in out]
    assert s[1][: len(s[0]) - 1] == s[0][:-1]


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
def test_a_diverged_prefix_invalidates_the_checkpoint(store: Store, dialect: str) -> None:
    body = BODIES[dialect](BIG)
    comp = mask(store)
    r1 = send([comp], body, dialect, store)
    assert r1.body is not None
    (k1,) = rec(r1)["keys"]
    edited = BODIES[dialect]([BIG[0] + " edited", *BIG[1:]])
    r2 = send([comp], edited, dialect, store)
    d = rec(r2)
    assert d["diverged"] == "the covered prefix changed: checkpoint invalidated"
    assert d["checkpoint"] == "first mask" and d["keys"] != [k1]  # masked afresh
    assert r2.body is not None
    values = [output_text(v) for v, _ in replaced(dumps(edited), r2.body)]
    assert values[0] == BIG[0] + " edited"


def test_the_agents_own_compaction_forgets_the_masked_prefix(store: Store) -> None:
    comp = mask(store)
    raw = dumps(BODIES["anthropic"](BIG))
    assert send([comp], raw, "anthropic", store).body is not None
    r = rewrite_body(
        raw, DIALECTS["anthropic"], [comp], headers=SESSION, agent_compaction="compacting"
    )
    (forgot,) = r.record["invalidated"]
    assert forgot.endswith("~mask")
    assert store.get_checkpoint(forgot.removeprefix("checkpoint of ")) is None


# -- the stash before the id, and failing open ---------------------------------------------------


class Refusing:
    """A real store that refuses one kind of write (`put_stash` or `put_checkpoint`), and
    records the order of the writes it takes."""

    def __init__(self, inner: Store, refuse: str | None) -> None:
        self.inner = inner
        self.refuse = refuse
        self.writes: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def put_stash(self, *a: Any, **kw: Any) -> None:
        if self.refuse == "put_stash":
            raise StoreError("disk I/O error")
        self.inner.put_stash(*a, **kw)
        self.writes.append("stash")

    def put_checkpoint(self, cp: Any) -> Any:
        if self.refuse == "put_checkpoint":
            raise StoreError("database is locked")
        self.writes.append("checkpoint")
        return self.inner.put_checkpoint(cp)


@pytest.mark.parametrize("refuse", ["put_stash", "put_checkpoint"])
@pytest.mark.parametrize("dialect", DIALECT_NAMES)
def test_no_stub_goes_out_when_its_stash_or_checkpoint_cannot_be_written(
    store: Store, dialect: str, refuse: str
) -> None:
    failing = Refusing(store, refuse)
    raw = dumps(BODIES[dialect](BIG))
    r = send([mask(cast(Store, failing))], raw, dialect, store)
    assert r.body is None or STUB_OPEN.encode() not in r.body
    d = rec(r)
    assert d["acted"] is False and d["stash"].startswith("not written (StoreError")


def test_the_stash_is_written_before_the_checkpoint_and_the_plan(store: Store) -> None:
    recording = Refusing(store, None)
    raw = dumps(BODIES["anthropic"](BIG))
    r = send([mask(cast(Store, recording))], raw, "anthropic", store)
    assert r.body is not None and recording.writes == ["stash", "checkpoint"]
    (key,) = rec(r)["keys"]
    assert store.has_stash(key, "sess-mask", "")


def test_a_lost_stash_is_written_again_from_the_request(store: Store) -> None:
    comp = mask(store)
    raw = dumps(BODIES["openai"](BIG))
    r1 = send([comp], raw, "openai", store)
    (key,) = rec(r1)["keys"]
    assert store.delete_stash(key) == 1
    r2 = send([comp], raw, "openai", store)
    assert r2.body == r1.body and rec(r2)["stash"] == f"written again: {key}"
    assert store.has_stash(key, "sess-mask", "")


def test_outputs_that_are_not_text_are_left_as_they_came(store: Store) -> None:
    """A Responses output object (a shell's `{stdout}`), an Anthropic result holding an image:
    no stub could describe them, so their bytes stay; the rest is masked."""
    body = BODIES["responses"](BIG)
    body["input"][4]["output"] = {"stdout": BIG[0]}
    raw = dumps(body)
    r = send([mask(store)], raw, "responses", store)
    assert r.body is not None
    assert len(replaced(raw, r.body)) == 2  # outputs 1 and 2
    assert array_sources(r.body, "input")[4] == array_sources(raw, "input")[4]

    body = BODIES["anthropic"](BIG)
    img = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}
    body["messages"][2]["content"][0]["content"] = [{"type": "text", "text": BIG[0]}, img]
    raw = dumps(body)
    r = send([mask(store)], raw, "anthropic", store)
    assert r.body is not None and len(replaced(raw, r.body)) == 2
    assert array_sources(r.body, "messages")[2] == array_sources(raw, "messages")[2]


def test_a_checkpoint_of_another_shape_is_invalidated_not_trusted(store: Store) -> None:
    comp = mask(store)
    raw = dumps(BODIES["anthropic"](BIG))
    r1 = send([comp], raw, "anthropic", store)
    conv = rec(r1)["conversation"]
    cp = store.get_checkpoint(conv)
    assert cp is not None
    from dataclasses import replace as with_

    store.put_checkpoint(with_(cp, meta={"v": 1, "masked": [[99, 0, "x", 1, "stub"]]}))
    r2 = send([comp], raw, "anthropic", store)
    assert "diverged" in rec(r2) and r2.body == r1.body  # masked afresh, the same bytes


def test_a_store_that_does_not_persist_masks_nothing(tmp_path: Path) -> None:
    from cg.state import memory

    mem = memory()
    r = send([mask(mem)], dumps(BODIES["anthropic"](BIG)), "anthropic", mem)
    assert r.body is None and "does not persist" in rec(r)["reason"]


# -- retention ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
def test_retention_of_a_masked_request_counts_the_stubs_text(store: Store, dialect: str) -> None:
    raw = dumps(BODIES[dialect](BIG, error_at=1))
    index = index_body(raw, DIALECTS[dialect])
    step = mask(store).apply(RequestContext(index, "sess-mask"), [])
    # (an empty plan is not the identity: the component refuses it, as any changed plan)
    assert step.plan is None and step.reason.startswith("mask runs first")
    from cg.wire.splice import identity

    step = mask(store).apply(RequestContext(index, "sess-mask"), identity(len(index.messages)))
    assert step.plan is not None
    ret = of_plan(index, step.plan)
    assert ret.total["error"] == 1  # vacuity guard: the masked output held an error line
    assert ret.visible["error"] == 1 and ret.ratio == 1.0


# -- with summarize ----------------------------------------------------------------------------


def test_mask_then_summarize_summarizes_the_originals_and_keeps_the_tail_masked(
    store: Store,
) -> None:
    outs = [words(200, f"c{n}") for n in range(8)]
    raw = dumps(BODIES["anthropic"](outs))
    facts = FactsCache(TOKENS)
    m = Mask(parse_mask(mask_config(remask_tokens=100)), store, TOKENS, facts=facts)
    s = Summarize(config(keep_first=1, keep_last=8), store, TOKENS, facts=facts)
    fake = FakeSummarizer()
    r1 = send([m, s], raw, "anthropic", store)
    assert r1.outcome == "rewritten" and rec(r1)["masked"] == 6
    assert len(r1.commissions) == 1, rec(r1, "summarize")  # summarize saw the masked plan
    ((comp, job),) = r1.commissions
    assert comp is s
    assert asyncio.run(s.complete(job, fake)) == "completed"
    prompt = fake.calls[0][0]
    assert STUB_OPEN[1:] not in prompt  # the summarizer read the client's outputs

    r2 = send([m, s], raw, "anthropic", store)
    assert r2.body is not None and rec(r2, "summarize")["reused"] is True
    sent = array_sources(r2.body, "messages")
    client = array_sources(raw, "messages")
    assert sent[0] == client[0]
    summary = json.loads(sent[1])["content"]
    assert summary.startswith("=== History Summary ===")
    # The tail (from client message 11): output 5 still masked, its stub the mask's own.
    assert sent[2:] == array_sources(r1.body or b"", "messages")[11:]
    assert STUB_OPEN.encode() in sent[3]
    # The summary's stash holds the client's messages 1..10 as the client sent them.
    key = summary.split("<<cg:")[1][:24]
    stash = store.get_stash(key, "sess-mask", "")
    assert stash is not None
    assert [x.encode() for x in stash.sources()] == client[1:11]
    assert validate_shape(json.loads(r2.body)["messages"], "anthropic") == []


def test_summarize_still_refuses_a_plan_that_moved_messages(store: Store) -> None:
    raw = dumps(BODIES["anthropic"](BIG))
    index = index_body(raw, DIALECTS["anthropic"])
    s = Summarize(config(), store, TOKENS)
    from cg.wire.splice import Keep

    step = s.apply(
        RequestContext(index, "x"), [Keep(i) for i in reversed(range(len(index.messages)))]
    )
    assert step.plan is None and "beyond editing messages in place" in step.reason


def test_a_mask_masking_nothing_leaves_summarize_as_it_was(store: Store) -> None:
    raw = dumps(BODIES["anthropic"](BIG[:1]))
    r = send([mask(store), Summarize(config(), store, TOKENS)], raw, "anthropic", store)
    assert rec(r)["acted"] is False
    assert len(r.commissions) == 1  # summarize decided on the client's plan


class Unreadable(Refusing):
    """A store whose reads fail (a corrupt or vanished file, say)."""

    def get_checkpoint(self, *a: Any, **kw: Any) -> Any:
        raise StoreError("file is not a database")


def test_a_failing_store_fails_open_with_the_reason(store: Store) -> None:
    raw = dumps(BODIES["openai"](BIG))
    r = send([mask(cast(Store, Unreadable(store, None)))], raw, "openai", store)
    assert r.body is None and r.outcome == "passed_through"
    (d,) = r.record["components"]
    assert d == {"component": "mask", "acted": False, "error": "StoreError: file is not a database"}


def test_a_tenants_masked_prefix_is_its_own(store: Store) -> None:
    """Two credentials in one session with the same first message: each tenant's checkpoint and
    stash are its own; the other tenant's request never gets its stubs."""
    raw = dumps(BODIES["anthropic"](BIG))

    def as_tenant(tenant: str, **over: Any) -> Rewrite:
        return rewrite_body(
            raw, DIALECTS["anthropic"], [mask(store, **over)], headers=SESSION,
            expand=ExpandPolicy("auto", store), tenant=tenant,
        )  # fmt: skip

    a = as_tenant("a" * 32)
    assert a.body is not None and rec(a)["conversation"].endswith("~mask")
    (key,) = rec(a)["keys"]
    assert store.has_stash(key, "sess-mask", "a" * 32)
    assert not store.has_stash(key, "sess-mask", "b" * 32)
    # Tenant b, whose trigger does not fire: nothing of a's reaches it.
    b = as_tenant("b" * 32, trigger={"min_request_tokens": 10**6})
    assert b.body is None and rec(b)["reason"] == "trigger did not fire"
    assert rec(b)["conversation"] != rec(a)["conversation"]


def test_an_output_carrying_a_breakpoint_is_not_replaced(store: Store) -> None:
    """A `cache_control` inside an output's value is the client's cache mark: the output goes
    whole while it carries one (a stub would drop the breakpoint), masked or not."""
    body = BODIES["anthropic"](BIG)
    marked = {"type": "text", "text": BIG[0], "cache_control": {"type": "ephemeral"}}
    body["messages"][2]["content"][0]["content"] = [marked]
    raw = dumps(body)
    r = send([mask(store)], raw, "anthropic", store)
    assert r.body is not None
    assert [output_text(v) for v, _ in replaced(raw, r.body)] == [BIG[1], BIG[2]]

    # Masked first, marked later (a client marking an old turn): sent whole that turn.
    comp = mask(store, remask_tokens=100)
    first = BODIES["openai"](BIG)
    first["messages"][3]["content"] = [{"type": "text", "text": BIG[0]}]
    assert rec(send([comp], first, "openai", store))["masked"] == 3
    later = BODIES["openai"](BIG)
    later["messages"][3]["content"] = [dict(marked)]
    r2 = send([comp], later, "openai", store)
    d = rec(r2)
    assert d["checkpoint"] == "reused" and d["masked"] == 2
    assert d["breakpoint"] == "1 masked outputs sent whole"
