"""The mitmweb contentview: a rewritten request, side by side with what it replaced.

    context-guru: rewritten — 34 → 5 messages, 18.4k → 2.1k tokens
    [0] kept     user: Run the 15 scripted steps…
    [1] SUMMARY  user: === History Summary === …   (replaces messages 1–30, id 50e0…)
    [2] kept     system: …
    replaced span (from the stash): [1] assistant: …

The view is chosen by default only for flows this addon rewrote; the original request body stays
inspectable in `flow.metadata["context_guru_original"]`. mitmproxy 12 changed the contentview
API: this module is the one place that knows it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from mitmproxy import contentviews, http
from mitmproxy import flow as mflow

from cg.expand.tool import markers
from cg.state.store import Stash

META = "context_guru"
ORIGINAL = "context_guru_original"
PREVIEW = 160
Line = list[tuple[str, str | bytes]]


def human_tokens(n: Any) -> str:
    if not isinstance(n, int):
        return "?"
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


def comment(record: dict[str, Any]) -> str:
    """The mitmweb list's one line for a rewritten flow."""
    text = f"cg: {record.get('messages_in')}→{record.get('messages_out')} messages"
    for rec in record.get("components", ()):
        if rec.get("reused") and "tokens_after" in rec:
            text += (
                f", {human_tokens(rec.get('tokens'))}→{human_tokens(rec['tokens_after'])} tokens"
            )
    return text


def _preview(m: Any) -> str:
    if not isinstance(m, dict):
        return repr(m)[:PREVIEW]
    content = m.get("content")
    if isinstance(content, list):
        text = " ".join(
            str(b.get("text") or b.get("thinking") or f"[{b.get('type')}]")
            for b in content
            if isinstance(b, dict)
        )
    else:
        text = "" if content is None else str(content)
    if m.get("tool_calls"):
        text += " [tool_calls]"
    kind = m.get("type")
    if kind not in (None, "message"):  # a Responses item: a call, an output, reasoning, …
        detail = m.get("name") or m.get("call_id") or ""
        text = f"[{kind}{' ' + str(detail) if detail else ''}] {text}"
    text = " ".join(text.split())
    who = m.get("role") or "item"
    return f"{who}: {text[:PREVIEW]}{'…' if len(text) > PREVIEW else ''}"


def _summary_text(m: Any) -> str | None:
    """The text of a summary message (a string content, or a Responses `input_text` part)."""
    if not isinstance(m, dict):
        return None
    content = m.get("content")
    if isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict):
        content = content[0].get("text")
    if isinstance(content, str) and content.startswith("=== History Summary ==="):
        return content
    return None


class RewriteView(contentviews.View):
    name = "context-guru"

    def __init__(self, stash: Callable[[str], Stash | None]) -> None:
        self.stash = stash

    def __call__(
        self,
        data: bytes,
        *,
        content_type: str | None = None,
        flow: mflow.Flow | None = None,
        http_message: http.Message | None = None,
        **unknown_metadata: Any,
    ) -> contentviews.TViewResult:
        record = flow.metadata.get(META) if flow is not None else None
        if not isinstance(record, dict):
            return "context-guru", iter([[("text", "no context-guru decision for this flow")]])
        return f"context-guru: {record.get('outcome')}", iter(list(self.lines(data, record, flow)))

    def lines(self, data: bytes, record: dict[str, Any], flow: Any) -> Iterator[Line]:
        yield [("header", f"{comment(record)}  [{record.get('outcome')}: {record.get('reason')}]")]
        for rec in record.get("components", ()):
            why = rec.get("reason") or rec.get("error") or ""
            yield [("text", f"  {rec.get('component')}: {why}")]
        for v in record.get("violations", ()):
            yield [("alert", f"  refused: {v.get('rule')}: {v.get('message')}")]
        try:
            doc = json.loads(data)
            key = "input" if record.get("dialect") == "responses" else "messages"
            messages = doc.get(key, [])
        except (ValueError, AttributeError):
            yield [("alert", "the body is not JSON")]
            return
        yield [("header", "messages sent:")]
        keys: list[str] = []
        for i, m in enumerate(messages if isinstance(messages, list) else []):
            summary = _summary_text(m)
            if summary is not None:
                keys += list(markers(summary))
                yield [("highlight", f"[{i}] SUMMARY  "), ("text", _preview(m))]
            else:
                yield [("text", f"[{i}] kept     {_preview(m)}")]
        for key in keys:
            stash = self.stash(key)
            if stash is None:
                yield [("alert", f"replaced span {key}: no longer in the store")]
                continue
            yield [("header", f"replaced span {key} ({stash.count} messages, from the stash):")]
            for i, m in enumerate(stash.messages()):
                yield [("text", f"  [{i}] {_preview(m)}")]
        original = flow.metadata.get(ORIGINAL) if flow is not None else None
        if isinstance(original, str):
            yield [
                ("header", f"original body: {len(original)} characters, in metadata {ORIGINAL!r}")
            ]

    def render_priority(
        self,
        data: bytes,
        *,
        content_type: str | None = None,
        flow: mflow.Flow | None = None,
        http_message: http.Message | None = None,
        **unknown_metadata: Any,
    ) -> float:
        if not isinstance(flow, http.HTTPFlow) or http_message is not flow.request:
            return 0
        record = flow.metadata.get(META)
        rewritten = isinstance(record, dict) and record.get("outcome") in (
            "rewritten",
            "retried_original",
        )
        return 2 if rewritten else 0
