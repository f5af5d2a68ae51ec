"""Over random transcripts of every dialect, in every serialisation style the strategies write:
masking never fails open, every byte outside the replaced output values is the client's, the
shape rules hold as they held before, the last rounds keep their outputs, and every stub's id
names the stashed message that held the output it replaced."""

from __future__ import annotations

import json
import tempfile
import uuid
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from cg.mask.component import Mask, tool_rounds
from cg.mask.config import parse_mask
from cg.pipeline.rewrite import ExpandPolicy, rewrite_body
from cg.settings import StoreConfig
from cg.state import open_store
from cg.wire.body import index_body
from cg.wire.dialects import DIALECTS
from cg.wire.shape import validate_shape
from tests.support.masking import array_sources, replaced
from tests.support.strategies import SETTINGS, Sample, bodies, responses_bodies
from tests.support.transcripts import TOKENS

ID = '"'  # a stub's id is the first quoted text after `id `


def outputs_of(dialect: str, message: Any) -> list[Any]:
    if dialect == "anthropic":
        content = message.get("content")
        blocks = content if isinstance(content, list) else []
        return [b.get("content") for b in blocks if b.get("type") == "tool_result"]
    if dialect == "openai":
        return [message.get("content")]
    return [message.get("output")]


def test_masking_random_transcripts_keeps_every_rule() -> None:
    masked_examples = []
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(StoreConfig(), str(Path(tmp) / "cg.sqlite3"))

        @SETTINGS
        @given(
            st.one_of(bodies(min_turns=1, max_turns=6), responses_bodies(min_turns=1)),
            st.integers(0, 3),
        )
        def check(sample: Sample, keep: int) -> None:
            d = DIALECTS[sample.dialect]
            cfg = {
                "keep_last_rounds": keep,
                "min_output_tokens": 0,
                "remask_tokens": 0,
                "trigger": {"min_request_tokens": 0},
            }
            comp = Mask(parse_mask(cfg), store, TOKENS)
            headers = {"x-context-guru-session": uuid.uuid4().hex}
            r = rewrite_body(
                sample.raw, d, [comp], headers=headers, expand=ExpandPolicy("auto", store)
            )
            assert r.outcome != "failed_open", r.record
            if r.body is None or r.record["reason"] != "rewritten":
                return
            pairs = replaced(sample.raw, r.body)
            if not pairs:
                return
            masked_examples.append(len(pairs))
            sent = json.loads(r.body)[d.array_key]
            before = validate_shape(sample.messages, d)
            assert validate_shape(sent, d) == before  # the same violations, if any
            index = index_body(sample.raw, d)
            rounds = tool_rounds(index.views)
            protected = rounds[-keep] if keep and len(rounds) >= keep else len(sent)
            client = array_sources(sample.raw, d.array_key)
            out = array_sources(r.body, d.array_key)
            assert out[protected:] == client[protected:]  # the last rounds as they came
            for value, stub in pairs:
                ident = stub.split("with id " + ID, 1)[1].split(ID, 1)[0]
                key, _, n = ident.partition("#")
                stash = store.get_stash(key, headers["x-context-guru-session"], "")
                assert stash is not None
                held = json.loads(stash.sources()[int(n) - 1])
                assert value in outputs_of(sample.dialect, held)
                assert stub.endswith(f"<<cg:{key}>>")

        check()
        store.close()
    assert len(masked_examples) > 10  # vacuity guard: many examples masked something
