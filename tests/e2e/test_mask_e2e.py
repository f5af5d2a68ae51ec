"""The `mask` component through a real `mitmdump -s cg_addon.py`, driven by the official SDKs,
in front of the fake provider: old tool outputs reach the provider as stubs, every other byte as
the client sent it; the masked prefix is re-sent byte for byte on the next turn; and a model that
calls `context_guru_expand` with a stub's `KEY#N` gets a continuation, the stash holding the
original message at position N.

(The expand tool's resolving of `KEY#N` is another change: until it is on this branch, the
continuation's answer is not asserted here beyond its existence; the stash is.)
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from cg.expand.tool import TOOL_NAME
from tests.e2e.harness import Proxy, by_id
from tests.e2e.sdk_sessions import SdkClient, answer, provider_message
from tests.support.fakeprovider import FakeProvider, Recorded, Reply
from tests.support.masking import BODIES, array_sources, mask_config, replaced, words

pytestmark = pytest.mark.e2e

ID = re.compile(r'with id "([0-9a-f]{24})#(\d+)"')
FINAL = "Final answer: the build is green."
OUTPUTS = [words(300, f"e2e output {n}") for n in range(5)]


def strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


@dataclass
class Model:
    """Calls `context_guru_expand` with the first stub's id when the tool is offered (once),
    then answers FINAL."""

    dialect: str
    asked: str | None = None

    def __call__(self, rec: Recorded) -> Reply | None:
        body = rec.json()
        names = [t.get("name") or t.get("function", {}).get("name") for t in body.get("tools", [])]
        if TOOL_NAME not in names:
            return None
        if self.asked is not None:
            return answer(rec, provider_message(self.dialect, 2, FINAL, [], (900, 9)), self.dialect)
        found = next(m for s in strings(body["messages"]) if (m := ID.search(s)))
        self.asked = f"{found.group(1)}#{found.group(2)}"
        calls = [("toolu_cg1", TOOL_NAME, {"id": self.asked})]
        msg = provider_message(self.dialect, 1, "Let me read that output.", calls, (800, 7))
        return answer(rec, msg, self.dialect)


@pytest.fixture(scope="module")
def mproxy(provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    work = tmp_path_factory.mktemp("proxy-mask")
    config = work / "cg.yaml"
    config.write_text(
        yaml.safe_dump(
            {"pipeline": ["mask"], "components": {"mask": mask_config(remask_tokens=600)}}
        )
    )
    opts = [f"cg_db={work / 'cg.sqlite3'}", f"cg_config={config}"]
    with Proxy.start(provider.url, work, preset="summarize", options=opts) as p:
        yield p


def db_of(proxy: Proxy) -> Path:
    return proxy.records.path.parent / "cg.sqlite3"


def stashed(proxy: Proxy, key: str) -> list[Any]:
    with closing(sqlite3.connect(db_of(proxy))) as conn:
        (span,) = conn.execute("SELECT span FROM stashes WHERE key = ?", (key,)).fetchone()
    value: list[Any] = json.loads(span)
    return value


@pytest.mark.parametrize("dialect", ["anthropic", "openai"])
def test_old_outputs_go_as_stubs_and_the_model_expands_one(
    mproxy: Proxy, provider: FakeProvider, dialect: str
) -> None:
    model = Model(dialect)
    provider.responder = model
    body = BODIES[dialect](OUTPUTS)
    try:
        with SdkClient(mproxy, dialect) as agent:
            t1 = agent.turn(body["messages"], tools=body["tools"])
            first, cont = provider.wait_for(2, where=by_id(t1.eid))
            asked = model.asked
            # Turn 2: one more exchange; under remask_tokens, the masked prefix is reused.
            body2 = BODIES[dialect]([*OUTPUTS, words(10, "tiny")])
            model.asked = "done"  # the tool is offered again; the model answers at once
            t2 = agent.turn(body2["messages"], tools=body2["tools"])
            (second,) = provider.wait_for(1, where=by_id(t2.eid))
    finally:
        provider.responder = None

    # What the provider got: the client's bytes but three output values, each now a stub.
    sent = t1.request.content
    pairs = replaced(sent, first.body)
    assert [v for v, _ in pairs] == OUTPUTS[:3]
    assert t1.text == FINAL

    # The model asked for the first stub's KEY#N; the stash holds that message at position N,
    # as the client sent it.
    assert asked is not None
    key, n = asked.split("#")
    client = array_sources(sent, "messages")
    first_output = 2 if dialect == "anthropic" else 3
    assert json.loads(client[first_output]) == stashed(mproxy, key)[int(n) - 1]
    assert n == "1"
    cg = mproxy.records.cg(t1.eid)
    assert cg["outcome"] == "rewritten" and cg["expand"]["injected"] is True
    assert cg["expand"]["rounds"] == 1
    (mask,) = cg["components"]
    assert mask["checkpoint"] == "first mask" and mask["masked"] == 3
    # The continuation re-sent the masked request, then our call and its result.
    assert array_sources(cont.body, "messages")[: len(client)] == array_sources(
        first.body, "messages"
    )

    last = json.loads(array_sources(cont.body, "messages")[-1])
    if dialect == "anthropic":
        assert last["content"][0]["tool_use_id"] == "toolu_cg1"
    else:
        assert last["role"] == "tool" and last["tool_call_id"] == "toolu_cg1"

    # Turn 2: every message the two turns share, the stubs included, byte for byte.
    s1, s2 = array_sources(first.body, "messages"), array_sources(second.body, "messages")
    shared = len(client) - 2  # the two closing messages moved after the new exchange
    assert s2[:shared] == s1[:shared]
    assert mproxy.records.cg(t2.eid)["components"][0]["checkpoint"] == "reused"
