"""The meter's hooks (`cg.proxy.meter`): a streamed answer gets a usage tap as its headers
arrive; the answer's usage is booked once the answer is done (after any expand continuation or
re-send, whose rounds the answer's hook left in the flow's state); a cut stream books what it
reported before the cut. Both measure a rewritten turn's retention (`cg.proxy.retained`: why
there) from the same turn the ledger books.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable
from typing import cast

from mitmproxy import http

from cg.pipeline.rewrite import Record
from cg.proxy import offload, retained
from cg.proxy.message import content_type
from cg.proxy.meter import late_index
from cg.proxy.runtime import Runtime
from cg.proxy.view import META


class Metering:
    name = "contextguru_metering"  # (unique among every script's addons)

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        """Stream provider SSE straight through: the agent sees tokens as they arrive, and a
        `UsageTap` reads the usage off the passing bytes (changing none, holding none back).

        When the expand tool was injected the answer may call it, and the client must never see
        that call: a streamed one comes through the relay, which holds it only from such a
        call on; one that could not be relayed is buffered and read whole.
        """
        if not flow.live:
            return
        record = flow.metadata.get(META)
        if record is None or flow.response is None:
            return
        # A rewritten turn's retention, measured while the answer streams.
        retained.begin(self.rt, flow, cast(Record, record))
        expand = record.get("expand")
        if expand is not None and expand.get("injected"):
            st = self.rt.flows.get(flow.id)
            if st is None or st.job is None:  # not relayed: buffered
                return
        if content_type(flow.response).startswith("text/event-stream"):
            flow.response.stream = self.rt.meter.stream(flow)

    async def response(self, flow: http.HTTPFlow) -> None:
        """Book the usage the provider reported (every round, each once); then the new
        messages' token counts go to the store."""
        if not flow.live:
            return  # read from a file, or our own call shown: booked when it happened
        rt = self.rt
        try:
            late = rt.meter.late(flow)
            if late is not None and len(flow.request.raw_content or b"") > offload.ENCODED_INLINE:
                # A bypassed turn's body, read for its session: a long read, off the loop.
                turn, dialect = late
                with contextlib.suppress(Exception):
                    turn.index = await rt.offload.run(
                        late_index, flow, dialect, rt.max_body, rt.max_messages
                    )
                rt.meter.tried_late(flow)
            record = flow.metadata.get(META)
            if isinstance(record, dict):
                st = rt.flows.get(flow.id)
                # Before the meter takes the flow's turn (what is measured), whatever the status.
                measuring = retained.measure(rt, flow, cast(Record, record))
                rt.meter.answered(
                    flow, cast(Record, record), st.replies if st is not None else None
                )
                if measuring is not None:
                    await measuring
        finally:
            rt.flush_facts()

    def error(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        """A cut stream's usage booked; a rewritten turn's retention measured (an awaitable
        when that is read in the worker thread)."""
        if not flow.live and flow.id not in self.rt.flows:
            return None
        record = flow.metadata.get(META)
        if not isinstance(record, dict):
            return None
        measuring = retained.measure(self.rt, flow, cast(Record, record))
        self.rt.meter.failed(flow, cast(Record, record))
        return measuring
