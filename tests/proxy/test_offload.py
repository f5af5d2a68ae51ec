"""cg.proxy.offload and the request hook's bounds (docs/behaviour.md#bounded-work-and-shared-use),
in-process: a large body is read in the worker thread while the event loop serves other turns; a
body over a bound passes through byte-identical, the bound named in its record."""

from __future__ import annotations

import asyncio
import gzip
import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from mitmproxy import exceptions
from mitmproxy.test import taddons

from cg.proxy import offload
from cg.proxy.addon import BYPASS_HEADER, META, ContextGuru
from tests.proxy.test_addon import BODY, Toy, _home, make_flow, setup, toy_config
from tests.support import bombs, hooks

__all__ = ["_home", "toy_config"]  # (fixtures, used by name)


def tiny(n: int) -> bytes:
    """A transcript of `n` tiny messages: a few hundred KB that took ~0.8 s on the event loop
    at 20,000 messages (each one parsed, viewed, digested and counted)."""
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(n)]
    return json.dumps({"model": "claude", "max_tokens": 9, "messages": msgs}).encode()


async def test_a_large_body_is_read_aside_while_the_loop_serves_small_turns(
    toy_config: str,
) -> None:
    """The hook returns an awaitable for 19,000 tiny messages, and the event loop answers
    small turns (synchronously, each whole) until the large one is done; the large one is
    then rewritten as if read on the loop, and its index remembered for its next turn."""
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg, cg_config=toy_config)
        big = make_flow(content=tiny(19_000))
        pending = cg.request(big)
        assert pending is not None, "the large body was read on the event loop"
        heavy = asyncio.ensure_future(pending)
        served = 0
        while not heavy.done():
            small = make_flow()
            assert cg.request(small) is None  # read where it came: a few messages
            assert small.metadata[META]["outcome"] == "rewritten"
            served += 1
            await asyncio.sleep(0)  # the loop runs (the worker is reading meanwhile)
        await heavy
        assert served >= 3, f"only {served} small turns were served while it was read"
        rec = big.metadata[META]
        assert rec["outcome"] == "rewritten" and rec["messages_in"] == 19_000
        assert rec["read_aside"] == f"{len(tiny(19_000))} new bytes"
        assert "aside" in rec["timings_ms"]
        # Its next turn repeats it: read warm, on the loop.
        first = json.loads(tiny(19_000))
        first["messages"].append({"role": "user", "content": "next"})
        again = make_flow(content=json.dumps(first).encode())
        assert cg.request(again) is None
        assert again.metadata[META]["outcome"] == "rewritten"


async def test_bodies_past_what_may_wait_pass_through_unread(
    toy_config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(offload, "WAITING_MAX", 1)
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg, cg_config=toy_config)
        first = make_flow(content=tiny(5000))
        pending = cg.request(first)
        assert pending is not None
        task = asyncio.ensure_future(pending)
        await asyncio.sleep(0)  # it is in the worker now
        second = make_flow(content=tiny(5000))
        raw = second.request.raw_content
        assert cg.request(second) is None
        rec = second.metadata[META]
        assert rec["outcome"] == "passed_through" and rec["bound"] == "large bodies in flight"
        assert second.request.raw_content is raw
        await task
        assert first.metadata[META]["outcome"] == "rewritten"
        assert cg.offload.busy == 1


async def test_a_body_that_decodes_past_the_cap_passes_through_byte_identical(
    toy_config: str,
) -> None:
    """cg_max_body_mb bounds what the body decodes to, not its compressed length: 256 MiB in
    260 KB of gzip passes through untouched, read no further than the cap."""
    bomb = bombs.gzip(16)
    assert len(bomb) < 300_000
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg, cg_config=toy_config, cg_max_body_mb=8)
        f = make_flow(content=None, headers={"content-encoding": "gzip"})
        f.request.raw_content = bomb
        await hooks.request(cg, f)
        rec = f.metadata[META]
        assert rec["outcome"] == "passed_through" and rec["bound"] == "cg_max_body_mb"
        assert "more than 8388608 bytes" in rec["reason"]
        assert f.request.raw_content is bomb and Toy.calls == 0


async def test_a_small_encoded_body_is_decoded_and_rewritten_on_the_loop(toy_config: str) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg, cg_config=toy_config)
        f = make_flow(content=None, headers={"content-encoding": "gzip"})
        f.request.raw_content = gzip.compress(BODY)
        assert cg.request(f) is None
        assert f.metadata[META]["outcome"] == "rewritten"
        assert json.loads(gzip.decompress(f.request.raw_content or b""))["messages"][1]["content"]


async def test_a_bypassed_bomb_is_not_decoded_whole_for_its_session(toy_config: str) -> None:
    """A bypassed body is indexed after its answer to find its session: within the same bound
    (mitmproxy's decoder would have made 1 GiB of it)."""
    bomb = bombs.gzip(64)
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg, cg_config=toy_config, cg_max_body_mb=8)
        f = make_flow(content=None, headers={"content-encoding": "gzip", BYPASS_HEADER: "1"})
        f.request.raw_content = bomb
        await hooks.request(cg, f)
        assert f.metadata[META]["outcome"] == "bypassed"
        f.response = make_response()
        tracemalloc.start()
        try:
            await cg.response(f)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert f.metadata[META]["ledger"]["session"] == "unidentified"
        assert peak < 32 << 20, f"{peak} bytes allocated to read it"


def make_response() -> Any:
    from mitmproxy.test import tutils

    usage = {"input_tokens": 3, "output_tokens": 1}
    body = {"type": "message", "role": "assistant", "content": [], "usage": usage}
    return tutils.tresp(
        content=json.dumps(body).encode(), headers=[(b"content-type", b"application/json")]
    )


async def test_a_transcript_over_cg_max_messages_passes_through(toy_config: str) -> None:
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg, cg_config=toy_config, cg_max_messages=4)
        f = make_flow()  # five messages
        raw = f.request.raw_content
        cg.request(f)
        rec = f.metadata[META]
        assert rec["outcome"] == "passed_through" and rec["bound"] == "cg_max_messages"
        assert f.request.raw_content is raw and Toy.calls == 0
        with pytest.raises(exceptions.OptionsError, match="cg_max_messages: must be >= 1"):
            tctx.configure(cg, cg_max_messages=0)


def test_the_hook_reads_small_bodies_where_they_come(tmp_path: Path) -> None:
    """Vacuity guard for the tests above: outside a large body, nothing is deferred."""
    assert offload.INLINE[0] > len(BODY) and len(gzip.compress(BODY)) < offload.ENCODED_INLINE


async def test_a_small_body_that_decodes_to_much_is_decoded_in_the_worker(toy_config: str) -> None:
    """809 bytes of brotli are 1 GiB: decoded on the loop only as far as a turn is read there
    (256 KiB), then in the worker up to the cap (~0.2 s of decoding, not on the loop)."""
    bomb = bombs.br(64)
    assert len(bomb) < 2000
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        setup(tctx, cg, cg_config=toy_config)
        f = make_flow(content=None, headers={"content-encoding": "br"})
        f.request.raw_content = bomb
        pending = cg.request(f)
        assert pending is not None, "the bomb was decoded on the event loop"
        await pending
        rec = f.metadata[META]
        assert (rec["outcome"], rec["bound"]) == ("passed_through", "cg_max_body_mb")
        assert rec["read_aside"] == "a content-encoded body to decode"
        assert f.request.raw_content is bomb
