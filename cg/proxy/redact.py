"""Provider credentials out of every provider flow once its answer is done (option
`cg_redact_credentials`), so a saved flow, a viewer or a later addon never has them: a turn the
addon routed, and any other flow to a provider host (`cg.proxy.providers`).

Our `response` and `error` hooks run before mitmproxy's Save (`-w`) and Dumper (the printout)
see the finished flow: a script's hooks run at the script loader's place, ahead of both. This
addon is the last of ours, so the others have done with the flow (and its state) when it ends
it (`Runtime.release`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mitmproxy import http

from cg.proxy import control
from cg.wire.urlkey import redact_key

if TYPE_CHECKING:
    from cg.proxy.runtime import Runtime

CREDENTIAL_HEADERS = ("authorization", "x-api-key", "api-key", "x-goog-api-key")
REDACTED = "[redacted by context-guru]"
_CREDENTIAL_NAMES = frozenset(n.encode() for n in CREDENTIAL_HEADERS)
_REDACTED_BYTES = REDACTED.encode()


def _redacted(fields: tuple[tuple[bytes, bytes], ...]) -> tuple[tuple[bytes, bytes], ...]:
    """Raw header fields with every credential's value replaced (the names stay)."""
    return tuple([(k, _REDACTED_BYTES if k.lower() in _CREDENTIAL_NAMES else v) for k, v in fields])


def redact(headers: http.Headers) -> None:
    """Every credential header's value replaced by REDACTED (the names stay: what was sent).
    One pass over the raw fields, assigned once, and only when one is there."""
    fields = headers.fields
    for k, _ in fields:
        if k.lower() in _CREDENTIAL_NAMES:
            headers.fields = _redacted(fields)
            return


def redact_backup(flow: http.HTTPFlow) -> None:
    """The credential out of the flow's backup too (`flow.backup()`, taken before a rewrite for
    mitmweb's Revert): a saved flow file carries the backup, headers and path included."""
    backup = getattr(flow, "_backup", None)
    req = backup.get("request") if isinstance(backup, dict) else None
    if not isinstance(req, dict) or "headers" not in req:
        return
    req["headers"] = _redacted(req["headers"])
    path = req.get("path")
    if isinstance(path, bytes) and b"key=" in path:
        req["path"] = redact_key(path.decode("utf-8", "surrogateescape")).encode(
            "utf-8", "surrogateescape"
        )


def redact_flow(flow: http.HTTPFlow) -> None:
    """The flow's credentials replaced: its headers', its query's `key` (the Gemini API's), and
    its backup's."""
    redact(flow.request.headers)
    path = flow.request.path
    if "key=" in path:
        flow.request.path = redact_key(path)
    redact_backup(flow)


class Redactor:
    name = "contextguru_redactor"  # (unique among every script's addons)

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def request(self, flow: http.HTTPFlow) -> None:
        """A provider flow the rewrite hook did not route (count_tokens, /v1/models, a host
        outside cg_hosts) is held too: its key is redacted once it is done."""
        rt = self.rt
        if (
            not flow.live
            or not rt.redact
            or flow.id in rt.flows
            or control.is_control(flow.request.path)
        ):
            return
        if rt.providers(flow):
            rt.flows.begin(flow)

    def response(self, flow: http.HTTPFlow) -> None:
        if flow.live:
            self.rt.release(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        if flow.live or flow.id in self.rt.flows:
            self.rt.release(flow)
