"""Provider requests read back from a mitmproxy flow file (`mitmdump -w FILE`, mitmweb's save).

The flow format is mitmproxy's, so reading it lives with the mitmproxy face; the CLI's `replay`
and the cost simulator take their requests from here. Only provider requests (a path a dialect
routes, with a body) are returned, each with its own timestamp.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mitmproxy import exceptions, http, io

from cg.wire.dialects import Dialect, route


@dataclass(frozen=True, slots=True)
class FlowRequest:
    """One provider request of a flow file; `n` is the flow's 1-based position in the file."""

    n: int
    at: float
    dialect: Dialect
    headers: dict[str, str]
    body: bytes


def provider_requests(path: Path) -> tuple[list[FlowRequest], str | None]:
    """The provider requests of a flow file, and why reading stopped early (None: it did not).

    A file that is not a flow file, or is cut short, keeps what was read before the fault."""
    out: list[FlowRequest] = []
    with path.open("rb") as f:
        try:
            for n, flow in enumerate(io.FlowReader(f).stream(), 1):
                if not isinstance(flow, http.HTTPFlow):
                    continue
                req = flow.request
                dialect = route(req.method, req.path)
                content = req.get_content(strict=False)
                if dialect is not None and content:
                    out.append(
                        FlowRequest(n, req.timestamp_start, dialect, dict(req.headers), content)
                    )
        except exceptions.FlowReadException as e:
            return out, str(e)
    return out, None
