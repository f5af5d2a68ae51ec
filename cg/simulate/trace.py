"""Reading what the simulator replays: mitmproxy flow files and JSONL traces, grouped into sessions.

A JSONL trace holds one request per line, `{"t": seconds, "headers": {…}, "body": {…}}`, with an
optional `"path"` (default: `/v1/messages` when the request looks like Anthropic's, else
`/v1/chat/completions`). The body is taken as the exact text of its line, so what is replayed is
byte for byte what was recorded. A flow file gives each provider request with its own
`timestamp_start`.

Bad input never stops a run and never loses anything else: a line that is not JSON, or not a
request, is skipped and reported with its line number; a file with no requests is reported by
name; a body the pipeline cannot read is reported and left out. Each report goes to `warn`.

Sessions are told apart exactly as the addon does (`cg.state.session.session_of`): the same headers
and body give the same session id here as on the wire.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from cg.state.session import session_of
from cg.wire.body import BodyIndex, BodyRejected, MessageCache, index_body
from cg.wire.dialects import ANTHROPIC, OPENAI, RESPONSES, Dialect, route
from cg.wire.jsonspan import JsonSpanError, walk_document

Warn = Callable[[str], None]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Request:
    """One recorded provider request: when it was sent, its headers, its exact body."""

    t: float
    headers: Mapping[str, str]
    body: bytes
    dialect: Dialect
    where: str  # "FILE:LINE" or "FILE#N", for messages


@dataclass(slots=True)
class Session(Generic[T]):
    """A session's requests in the order they were sent, each as `prepare` made it."""

    id: str
    turns: list[T]


class TraceError(ValueError):
    """No input at all could be read; the message names the files and why."""


def _dialect_of(path: object, headers: Mapping[str, str], body: Mapping[str, Any]) -> Dialect:
    if isinstance(path, str):
        d = route("POST", path)
        if d is not None:
            return d
    if "input" in body and "messages" not in body:
        return RESPONSES
    anthropic = any(k.lower().startswith("anthropic-") for k in headers) or "system" in body
    return ANTHROPIC if anthropic else OPENAI


def read_jsonl(path: Path, warn: Warn) -> list[Request]:
    out: list[Request] = []
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            where = f"{path}:{n}"
            if not raw.strip():
                continue
            try:
                line = raw.decode("utf-8")
                members = {m.key: m for m in walk_document(line)}
            except (UnicodeDecodeError, JsonSpanError, RecursionError):
                warn(f"{where}: not JSON, skipped")
                continue
            why = _invalid(members)
            if why:
                warn(f"{where}: {why}, skipped")
                continue
            body = members["body"]
            headers = {str(k): str(v) for k, v in (members["headers"].value or {}).items()}
            path_value = members["path"].value if "path" in members else None
            dialect = _dialect_of(path_value, headers, body.value)
            text = line[body.start : body.end].encode("utf-8")
            out.append(Request(float(members["t"].value), headers, text, dialect, where))
    return out


def _invalid(members: Mapping[str, Any]) -> str | None:
    t = members.get("t")
    if t is None or isinstance(t.value, bool) or not isinstance(t.value, int | float):
        return "no number 't' (seconds)"
    h = members.get("headers")
    if h is not None and not isinstance(h.value, dict | None):
        return "'headers' is not an object"
    b = members.get("body")
    if b is None or not isinstance(b.value, dict):
        return "'body' is not an object"
    if "headers" not in members:
        return "no 'headers' object"
    return None


def read_flows(path: Path, warn: Warn) -> list[Request]:
    from cg.proxy.flows import provider_requests

    found, fault = provider_requests(path)
    out = [Request(r.at, r.headers, r.body, r.dialect, f"{path}#{r.n}") for r in found]
    if fault is not None:
        warn(f"{path}: not a flow file or cut short ({fault}); read {len(out)} requests")
    return out


def read_file(path: Path, warn: Warn) -> list[Request]:
    """The provider requests in one file (JSONL or flows); a file with none is reported."""
    try:
        with path.open("rb") as f:
            head = f.read(4096)
    except OSError as e:
        warn(f"{path}: cannot read ({e.strerror})")
        return []
    if not head.strip():
        warn(f"{path}: empty file, no requests")
        return []
    reqs = read_jsonl(path, warn) if head.lstrip()[:1] == b"{" else read_flows(path, warn)
    if not reqs:
        warn(f"{path}: no provider requests found")
    return reqs


def sessions_of(
    requests: Iterable[Request], prepare: Callable[[Request, BodyIndex], T], warn: Warn
) -> list[Session[T]]:
    """Requests grouped into sessions (first seen first), each sorted by time (stable), each
    turned into what the simulator keeps by `prepare` while its index is at hand."""
    cache = MessageCache()
    by_id: dict[str, list[tuple[float, T]]] = {}
    for r in requests:
        try:
            index = index_body(r.body, r.dialect, cache)
        except BodyRejected as e:
            warn(f"{r.where}: {e}; left out")
            continue
        sid = session_of(r.headers, index).id
        by_id.setdefault(sid, []).append((r.t, prepare(r, index)))
    return [
        Session(sid, [turn for _, turn in sorted(ts, key=lambda x: x[0])])
        for sid, ts in by_id.items()
    ]


def load(
    paths: Sequence[str | Path], prepare: Callable[[Request, BodyIndex], T], warn: Warn
) -> list[Session[T]]:
    """Every session in `paths`. Raises TraceError when no request could be read at all."""
    requests: list[Request] = []
    for p in paths:
        requests.extend(read_file(Path(p), warn))
    sessions = sessions_of(requests, prepare, warn)
    if not sessions:
        names = ", ".join(str(p) for p in paths)
        raise TraceError(f"no provider requests to simulate in {names}")
    return sessions


def dumps_line(t: float, headers: Mapping[str, str], body: Any) -> str:
    """One JSONL trace line (for writers of traces: the corpus, tests)."""
    body_text = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)
    head = json.dumps({"t": t, "headers": dict(headers)}, ensure_ascii=False)
    return head[:-1] + ', "body": ' + body_text + "}"
