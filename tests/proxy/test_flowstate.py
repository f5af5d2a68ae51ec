"""cg.proxy.flowstate: one state per flow in flight, one cap, one cleanup for every way a flow
ends."""

from __future__ import annotations

import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from mitmproxy.test import tflow

from cg.proxy.flowstate import Flows, FlowState


def test_past_the_cap_the_oldest_flow_is_ended_through_the_one_cleanup() -> None:
    ended: list[FlowState] = []
    flows = Flows(ended.append, cap=3)
    made = [tflow.tflow() for _ in range(5)]
    for f in made:
        flows.begin(f).readable = True
    assert len(flows) == 3
    assert [st.flow for st in ended] == made[:2]
    assert made[0].id not in flows and made[4].id in flows


def test_a_flow_is_ended_once_and_begin_keeps_its_state() -> None:
    ended: list[FlowState] = []
    flows = Flows(ended.append)
    f = tflow.tflow()
    st = flows.begin(f)
    st.original = b"client bytes"
    assert flows.begin(f) is st
    assert flows.end(f.id) is st
    assert flows.end(f.id) is None
    assert ended == [st]


def test_end_all_ends_every_flow_in_flight() -> None:
    ended: list[FlowState] = []
    flows = Flows(ended.append)
    for _ in range(4):
        flows.begin(tflow.tflow())
    flows.end_all()
    assert len(flows) == 0 and len(ended) == 4
