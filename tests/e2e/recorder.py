"""A test-only mitmproxy script: one JSON line per finished flow, with its decision record.

    mitmdump -s cg_addon.py -s tests/e2e/recorder.py --set cg_record=FILE

Load it after cg_addon.py. Each line: phase (response|error), method, url, path, the `x-e2e-id`
request header tests use to find their flow, a SHA-256 of the request body as the flow holds it,
whether it holds a relay header, status, error, and `cg` — `flow.metadata["context_guru"]`, or
null for a flow the addon did not decide on. Lines are flushed as written. The addon's own calls
(a summary, an expand round), which it shows as flows, get no line.
"""

from __future__ import annotations

import hashlib
import json
from typing import IO, Any

from mitmproxy import ctx, http


class Recorder:
    def __init__(self) -> None:
        self.out: IO[str] | None = None

    def load(self, loader: Any) -> None:
        loader.add_option("cg_record", str, "", "Append a JSON line per finished flow here.")

    def configure(self, updated: set[str]) -> None:
        if "cg_record" in updated:
            self.done()
            if ctx.options.cg_record:
                self.out = open(ctx.options.cg_record, "a", encoding="utf-8")  # noqa: SIM115

    def done(self) -> None:
        if self.out is not None:
            self.out.close()
            self.out = None

    def response(self, flow: http.HTTPFlow) -> None:
        self._write("response", flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._write("error", flow)

    def _write(self, phase: str, flow: http.HTTPFlow) -> None:
        if self.out is None:
            return
        if not flow.live and flow.metadata.get("context_guru_view", {}).get("action") in (
            "summary",
            "expand",
        ):
            # The addon's own calls, shown as flows: an expand round carries the agent's
            # headers (its x-e2e-id too), and is not the agent's flow.
            return
        line = {
            "phase": phase,
            "method": flow.request.method,
            "url": flow.request.url,
            "path": flow.request.path,
            "request_sha256": hashlib.sha256(flow.request.raw_content or b"").hexdigest(),
            "relay_header": any(
                k.lower().startswith(b"x-context-guru-relay")
                for k, _ in flow.request.headers.fields
            ),
            "id": flow.request.headers.get("x-e2e-id"),
            "status": flow.response.status_code if flow.response else None,
            "error": flow.error.msg if flow.error else None,
            "cg": flow.metadata.get("context_guru"),
        }
        self.out.write(json.dumps(line) + "\n")
        self.out.flush()


addons = [Recorder()]
