"""What mitmweb (and `mitmdump --flow-detail 3`, and a saved flow reopened) shows of a flow the
addon touched: two contentviews and the record they read.

The record. Everything a view needs lives in `flow.metadata["context_guru_view"]`: a small,
versioned, JSON-serialisable dict (`VERSION`), so it survives `mitmdump -w` / `-r` and mitmweb's
save and open; the views never need the live addon state, only the store (for a stash) when the
addon is loaded. The full decision record stays in `flow.metadata["context_guru"]`. Made in the
request hook, the view record is added to once more when a rewritten turn's answer is done (its
retention, `retained`); the lost facts' text is read from the decision record, its one copy.

    context-guru            what happened in plain words (session, preset, action, messages and
                            tokens before→after, the facts retained per kind and the first lost
                            ones, which messages the summary replaced, its stash id, the time
                            spent), then the transcript as a person reads it —
                            head, the summary wrapped and whole, tail — tool calls and results
                            by name and first lines; a masked turn's stubs listed whole (the
                            tool, its input, the size of what each replaced, the id that
                            expands it), with the mask's count and savings. Chosen by default for every request the
                            addon touched (rewritten, commissioned, failed open, retried) and for
                            the summarizer's and the expand rounds' own flows.
    context-guru original   the request as the client sent it, rebuilt from the bytes kept
                            (the body sent) and the stashes (what the summary replaced, what
                            each mask stub stands for); no second copy of the body is held
                            for it.

Bad input never raises into mitmproxy: a flow with no record, a record of another version, a
stash that expired, a body that is not JSON — the view says so in one line and shows the plain
(auto) view below it. Responses are not the views' business: they never pick one by default,
and chosen by hand say so in one line above the plain view.

mitmproxy 12 changed the contentview API; this module is the one place that knows it (mitmproxy
11: `View.__call__` and `render_priority`).
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from mitmproxy import contentviews, http
from mitmproxy import flow as mflow
from mitmproxy.net.http.headers import parse_content_type

from cg.expand.tool import SUMMARY_HEADER, TOOL_JSON, markers
from cg.mask.stub import PREFIX as STUB_PREFIX
from cg.mask.stub import stub_id
from cg.state import Stash
from cg.wire.dialects import DIALECTS
from cg.wire.jsonspan import JsonSpanError, walk_document

META = "context_guru"  # the decision record (cg.pipeline.rewrite), whole
RECORD = "context_guru_view"  # what the views read: small, versioned
VERSION = 1
WIDTH = 88  # wrapped, never cut: mitmweb shows one line per line, scrolling sideways
FIRST_LINES = 3  # of a message's text, a tool call's input or a tool result
Line = list[tuple[str, str | bytes]]

# What the addon did, its mark in mitmweb's list (an emoji name mitmweb shows), and the words.
ACTIONS: dict[str, tuple[str, str]] = {
    "rewritten": (":scissors:", "rewritten"),
    "commissioned": (":hourglass_flowing_sand:", "commissioned a summary"),
    "failed_open": (":warning:", "failed open"),
    "retried_original": (":repeat:", "retried with the original"),
    "passed_through": ("", "passed through"),
    "bypassed": ("", "bypassed"),
    "summary": (":memo:", "the summarizer's call"),
    "expand": (":mag:", "an expand round"),
}
# Actions whose request view is chosen by default.
TOUCHED = frozenset(ACTIONS) - {"passed_through", "bypassed"}


# -- the record -----------------------------------------------------------------------------


def human_tokens(n: Any) -> str:
    if not isinstance(n, int):
        return "?"
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


def _span(x: Any) -> tuple[int, int] | None:
    if isinstance(x, list | tuple) and len(x) == 2 and all(isinstance(i, int) for i in x):
        return int(x[0]), int(x[1])
    return None


def messages_range(span: Any) -> str:
    """`[h, e)` as people count messages in the view: `2–31` (the view's own indices)."""
    s = _span(span)
    if s is None:
        return "?"
    return f"{s[0]}–{s[1] - 1}" if s[1] - s[0] > 1 else str(s[0])


def view_record(
    decision: Mapping[str, Any],
    *,
    commissioned: bool = False,
    summary_flow: str | None = None,
    client_bytes: int | None = None,
) -> dict[str, Any]:
    """The view's record of one provider flow, from the decision record `rewrite_body` made.

    `commissioned`: this turn started a summary job (`summary_flow`: the id its first call's
    flow will have). Small on purpose: no message text, no header, nothing secret."""
    outcome = decision.get("outcome")
    action = "commissioned" if commissioned and outcome == "passed_through" else outcome
    rec: dict[str, Any] = {
        "v": VERSION,
        "action": action if action in ACTIONS else "passed_through",
        "dialect": decision.get("dialect"),
        "preset": decision.get("preset"),
        "reason": decision.get("reason"),
        "ms": (decision.get("timings_ms") or {}).get("hook"),
    }
    if isinstance(decision.get("messages_in"), int):
        rec["messages"] = [decision.get("messages_in"), decision.get("messages_out")]
    if isinstance(decision.get("session"), str):  # every component's, and the ledger's
        rec["session"] = decision["session"]
    for comp in decision.get("components", ()):
        if not isinstance(comp, dict):
            continue
        # The tokens of the last component that acted (or of the first, if none did).
        if isinstance(comp.get("tokens"), int) and (comp.get("acted") or "tokens" not in rec):
            rec["tokens"] = [comp["tokens"], comp.get("tokens_after", comp["tokens"])]
        if comp.get("component") == "mask" and comp.get("acted"):
            rec["masked"] = {k: comp.get(k) for k in ("masked", "tokens_saved", "checkpoint")}
        cp = comp.get("checkpoint")
        if comp.get("reused") and isinstance(cp, dict):
            rec["replaced"] = cp.get("covered")
            rec["stash"] = cp.get("key")
        if commissioned and _span(comp.get("span")) is not None and "commission" in comp:
            rec["summarizing"] = comp["span"]
    if commissioned:
        rec["rolling"] = outcome == "rewritten"
        if summary_flow is not None:
            rec["summary_flow"] = summary_flow
    if (decision.get("expand") or {}).get("injected"):
        rec["expand_tool"] = True
    if client_bytes is not None:
        rec["client_bytes"] = client_bytes
    skipped = decision.get("session_skipped")
    if isinstance(skipped, list) and skipped:
        rec["session_skipped"] = [str(s) for s in skipped]
    return rec


def comment(rec: dict[str, Any]) -> str:
    """The one line mitmweb's list shows: what happened, so `~comment cg:` finds them all."""
    action = rec.get("action")
    msgs = rec.get("messages")
    text = "cg: " + ACTIONS.get(str(action), ("", str(action)))[1]
    counts, toks = _span(msgs), _span(rec.get("tokens"))
    if action == "rewritten" and counts is not None:
        text = f"cg: rewritten {counts[0]}→{counts[1]} messages"
        if toks is not None:
            text += f", {human_tokens(toks[0])}→{human_tokens(toks[1])} tokens"
        kept = rec.get("retention")
        if isinstance(kept, dict) and "ratio" in kept:
            text += f", {percent(kept['ratio'])} of {kept.get('facts')} facts retained"
        if rec.get("summary_flow"):
            text += (
                f"; rolling forward: summary of messages "
                f"{messages_range(rec.get('summarizing'))} in flow {rec['summary_flow'][:8]}"
            )
    elif action == "commissioned":
        text = f"cg: commissioned a summary of messages {messages_range(rec.get('summarizing'))}"
        if rec.get("summary_flow"):
            text += f" → flow {rec['summary_flow'][:8]}"
    elif action in ("failed_open", "retried_original"):
        text += f": {rec.get('reason')}"
    elif action == "summary":
        text = (
            f"cg: summary of messages {messages_range(rec.get('summarizing'))} for session "
            f"{rec.get('session')} ({rec.get('call')}; for flow {str(rec.get('for_flow'))[:8]})"
        )
    elif action == "expand":
        text = f"cg: expand round {rec.get('round')} for flow {str(rec.get('for_flow'))[:8]}"
    return text


def mark(flow: mflow.Flow, rec: dict[str, Any]) -> None:
    """Put the record on the flow, with its mark and comment (actions that pass nothing
    through unmarked: a plain pass-through keeps mitmweb's list quiet)."""
    flow.metadata[RECORD] = rec
    sign = ACTIONS.get(str(rec.get("action")), ("", ""))[0]
    if sign:
        flow.marked = sign
        flow.comment = comment(rec)


def retained(flow: mflow.Flow, retention: Mapping[str, Any]) -> None:
    """A rewritten turn's retention, measured once its answer is done (`cg.proxy.retained`),
    added to the view record made at the request, and to the comment. Counts only: the lost
    facts' text stays in the decision record alone, where the view reads it."""
    rec = flow.metadata.get(RECORD)
    if not isinstance(rec, dict):
        return
    rec["retention"] = {k: retention[k] for k in _RETENTION_KEYS if k in retention}
    mark(flow, rec)


_RETENTION_KEYS = ("ratio", "facts", "visible", "by_kind", "error")


def percent(ratio: Any) -> str:
    return f"{ratio * 100:.0f}%" if isinstance(ratio, int | float) else "?"


def record_of(flow: mflow.Flow | None) -> dict[str, Any] | str:
    """The flow's view record, or one line saying why there is none usable."""
    if flow is None:
        return "context-guru: no flow to read a record from"
    rec = flow.metadata.get(RECORD)
    if rec is None:
        if META in flow.metadata:
            return "context-guru: this flow was saved by an older context-guru (no view record)"
        return "context-guru: the addon did not touch this flow"
    if not isinstance(rec, dict) or rec.get("v") != VERSION:
        v = rec.get("v") if isinstance(rec, dict) else type(rec).__name__
        return f"context-guru: a view record of version {v!r}; this build reads version {VERSION}"
    return rec


# -- the transcript, as a person reads it ---------------------------------------------------


def wrap(text: str, indent: str = "    ", limit: int | None = None) -> list[str]:
    """`text` wrapped at WIDTH, its own line breaks kept; at most `limit` source lines (then
    a line saying how many more)."""
    src = text.splitlines() or [""]
    out: list[str] = []
    shown = src if limit is None else [ln for ln in src if ln.strip()][:limit]
    for ln in shown:
        out += textwrap.wrap(
            ln,
            WIDTH,
            initial_indent=indent,
            subsequent_indent=indent + "  ",
            break_long_words=True,
            replace_whitespace=False,
            drop_whitespace=True,
        ) or [indent]
    if limit is not None:
        more = len([ln for ln in src if ln.strip()]) - len(shown)
        if more > 0:
            out.append(f"{indent}… {more} more line{'s' if more != 1 else ''}")
    return out


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text_of(c) for c in content)
    if isinstance(content, dict):
        for k in ("text", "output", "content", "thinking"):
            if k in content:
                return _text_of(content[k])
        return f"[{content.get('type', 'part')}]"
    return "" if content is None else json.dumps(content, ensure_ascii=False)


def _args(x: Any) -> str:
    return x if isinstance(x, str) else json.dumps(x, ensure_ascii=False)


def summary_text(m: Any) -> str | None:
    """The text of a summary message (string content, or one text/`input_text` part)."""
    if not isinstance(m, dict):
        return None
    content = m.get("content")
    if isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict):
        content = content[0].get("text")
    if isinstance(content, str) and content.startswith(SUMMARY_HEADER):
        return content
    return None


def message_lines(m: Any, names: dict[str, str], limit: int | None = FIRST_LINES) -> Iterator[Line]:
    """One message (or Responses item) as lines: its text, each tool call by name with the
    first lines of its input, each tool result by its call's name with its first lines."""
    if not isinstance(m, dict):
        yield [("text", f"    {str(m)[:WIDTH]}")]
        return
    kind = m.get("type")
    if kind in ("function_call", "custom_tool_call"):
        cid = str(m.get("call_id") or "")
        names[cid] = str(m.get("name"))
        yield [("highlight", f"    → {m.get('name')}")]
        for ln in wrap(_args(m.get("arguments", m.get("input", ""))), "      ", limit):
            yield [("text", ln)]
        return
    if isinstance(kind, str) and kind.endswith("_output"):
        cid = str(m.get("call_id") or "")
        yield [("highlight", f"    ← {names.get(cid, cid or 'result')}")]
        for ln in wrap(_text_of(m.get("output")), "      ", limit):
            yield [("text", ln)]
        return
    if kind == "reasoning":
        text = _text_of(m.get("summary") or "")
        yield [("text", "    (reasoning) " + (text.splitlines()[0][:WIDTH] if text else ""))]
        return
    if kind not in (None, "message"):
        yield [("text", f"    [{kind}]")]
        return
    content = m.get("content")
    if m.get("role") == "tool":  # Chat Completions: a tool result, paired by tool_call_id
        cid = str(m.get("tool_call_id") or "")
        yield [("highlight", f"    ← {names.get(cid, cid or 'tool')}")]
        for ln in wrap(_text_of(content), "      ", limit):
            yield [("text", ln)]
        return
    blocks = content if isinstance(content, list) else [content]
    for b in blocks:
        if b is None:
            continue
        if isinstance(b, str):
            for ln in wrap(b, "    ", limit):
                yield [("text", ln)]
            continue
        if not isinstance(b, dict):
            continue
        t = b.get("type")
        if t in ("text", "input_text", "output_text"):
            for ln in wrap(str(b.get("text", "")), "    ", limit):
                yield [("text", ln)]
        elif t == "tool_use" or t == "server_tool_use" or t == "mcp_tool_use":
            names[str(b.get("id"))] = str(b.get("name"))
            yield [("highlight", f"    → {b.get('name')}")]
            for ln in wrap(_args(b.get("input", "")), "      ", limit):
                yield [("text", ln)]
        elif t == "tool_result" or (isinstance(t, str) and t.endswith("_tool_result")):
            tid = str(b.get("tool_use_id") or "")
            err = " (error)" if b.get("is_error") else ""
            yield [("highlight", f"    ← {names.get(tid, tid or 'tool_result')}{err}")]
            for ln in wrap(_text_of(b.get("content", "")), "      ", limit):
                yield [("text", ln)]
        elif t == "thinking":
            first = str(b.get("thinking", "")).strip().splitlines()
            yield [("text", "    (thinking) " + (first[0][:WIDTH] if first else ""))]
        else:
            yield [("text", f"    [{t}]")]
    for call in m.get("tool_calls") or ():
        if isinstance(call, dict):
            fn = call.get("function") or {}
            names[str(call.get("id"))] = str(fn.get("name"))
            yield [("highlight", f"    → {fn.get('name')}")]
            for ln in wrap(_args(fn.get("arguments", "")), "      ", limit):
                yield [("text", ln)]


def transcript_lines(
    messages: list[Any], first: int = 0, whole_last: bool = False
) -> Iterator[Line]:
    """Each message as `[i] role` and its lines; a summary message whole, wrapped (and the
    last message whole with `whole_last`: the summarizer's instruction)."""
    names: dict[str, str] = {}
    for i, m in enumerate(messages, first):
        role = m.get("role") or m.get("type") if isinstance(m, dict) else "?"
        summary = summary_text(m)
        if summary is not None:
            yield [("header", f"[{i}] {role}: SUMMARY")]
            for ln in wrap(summary, "    "):
                yield [("text", ln)]
            continue
        yield [("header", f"[{i}] {role}")]
        whole = whole_last and i == first + len(messages) - 1
        yield from message_lines(m, names, None if whole else FIRST_LINES)


def stubs(value: Any) -> Iterator[str]:
    """Every mask stub in a message's value (`cg.mask.stub`), in order."""
    if isinstance(value, str):
        if value.startswith(STUB_PREFIX):
            yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from stubs(v)
    elif isinstance(value, list):
        for v in value:
            yield from stubs(v)


def stub_lines(messages: list[Any]) -> Iterator[Line]:
    """The masked tool outputs of the messages sent, each its stub whole: the tool, its
    input, the size of what it replaced, the first error line and its id."""
    found = [(i, st) for i, m in enumerate(messages) for st in stubs(m)]
    if not found:
        return
    yield [("header", f"── {len(found)} masked tool outputs (message: stub) ──")]
    for i, st in found:
        for ln in wrap(f"[{i}] {st}", "  "):
            yield [("highlight", ln)]
    yield [("text", "")]


# -- rebuilding the original ----------------------------------------------------------------


def rebuild_original(
    sent: bytes,
    rec: dict[str, Any],
    stash: Stash | None,
    lookup: Callable[[str], Stash | None] | None = None,
) -> bytes:
    """The body as the client sent it: the summary message of `sent` replaced by the stashed
    messages it stands for (`stash`; None: no summary), each message holding a mask stub by
    the message its `KEY#N` names (read with `lookup`), and the appended expand tool taken out;
    every other byte as sent. Raises ValueError when `sent` is not the body the record
    describes, or a masked output's stash is gone."""
    dialect = DIALECTS.get(str(rec.get("dialect")))
    if dialect is None:
        raise ValueError(f"unknown dialect {rec.get('dialect')!r}")
    text = sent.decode("utf-8")
    try:
        members = walk_document(text, (dialect.array_key,))
    except JsonSpanError as e:
        raise ValueError(f"the body is not the JSON sent: {e}") from None
    arr = next((m.array for m in members if m.key == dialect.array_key), None)
    if arr is None:
        raise ValueError(f"no {dialect.array_key!r} array")
    els = arr.elements
    pieces = [text[e.start : e.end] for e in els]
    if stash is not None:
        at = next(
            (
                i
                for i, src in enumerate(pieces)
                if stash.key in set(markers(summary_text(json.loads(src)) or ""))
            ),
            None,
        )
        if at is None:
            raise ValueError(f"no summary marked {stash.key} in the body sent")
        sep = text[els[0].end : els[1].start] if len(els) >= 2 else ","
        pieces[at] = sep.join(stash.sources())
    if rec.get("masked"):
        pieces = [_unmasked(src, lookup) for src in pieces]
    # Each piece where its message lay: the separators between them as sent.
    parts = [text[: els[0].start] if els else text[: arr.end]]
    for n, piece in enumerate(pieces):
        parts += (piece, text[els[n].end : els[n + 1].start] if n + 1 < len(els) else "")
    parts.append(text[els[-1].end :] if els else text[arr.end :])
    out = "".join(parts)
    if rec.get("expand_tool"):
        tool = TOOL_JSON[dialect.name]
        member = f',"tools":[{tool}]'
        if member in out:
            out = out.replace(member, "", 1)
        else:
            cut = out.rfind("," + tool)
            out = out[:cut] + out[cut + 1 + len(tool) :] if cut >= 0 else out.replace(tool, "", 1)
    return out.encode("utf-8")


def _unmasked(src: str, lookup: Callable[[str], Stash | None] | None) -> str:
    """A message as sent, or, when it holds a mask stub, the stashed message its id names."""
    if STUB_PREFIX not in src:
        return src
    try:
        found = next((i for st in stubs(json.loads(src)) if (i := stub_id(st))), None)
    except ValueError:
        return src
    if found is None:
        return src
    key, n = found
    stash = lookup(key) if lookup is not None else None
    if stash is None:
        raise ValueError(f"stash {key} of a masked tool output is no longer in the store")
    sources = stash.sources()
    if not 0 < n <= len(sources):
        raise ValueError(f"stash {key} holds no message {n}")
    return sources[n - 1]


# -- the views ------------------------------------------------------------------------------


def _plain(
    data: bytes, flow: mflow.Flow | None, http_message: http.Message | None
) -> Iterator[Line]:
    """The view mitmproxy would pick without ours (JSON, raw, …): auto's choice among the
    others (auto itself would pick ours again)."""
    meta: dict[str, Any] = {"flow": flow, "http_message": http_message}
    if http_message is not None and (ct := http_message.headers.get("content-type")):
        parsed = parse_content_type(ct)
        meta["content_type"] = f"{parsed[0]}/{parsed[1]}" if parsed else None
    if meta.get("content_type") is None and data.lstrip()[:1] in (b"{", b"["):
        meta["content_type"] = "application/json"  # a body read back without its headers
    others = [v for v in contentviews.views if v.name not in (*names(), "Auto")]
    try:
        _, view = max(((v.render_priority(data, **meta), v) for v in others), key=lambda p: p[0])
        _, lines = view(data, **meta)
        return iter(list(lines))
    except Exception:  # noqa: BLE001 - another view's failure: show the bytes
        raw = contentviews.get("Raw")
        assert raw is not None
        return iter(list(raw(data, **meta)[1]))


def _fallback(
    why: str, data: bytes, flow: mflow.Flow | None, http_message: http.Message | None
) -> contentviews.TViewResult:
    lines: list[Line] = [[("alert", why)]]
    return "context-guru: see the line above", iter([*lines, *_plain(data, flow, http_message)])


def _is_request(flow: mflow.Flow | None, http_message: http.Message | None) -> bool:
    return isinstance(flow, http.HTTPFlow) and http_message is flow.request


def retention_lines(rec: dict[str, Any], decision: Mapping[str, Any] | None) -> Iterator[Line]:
    """A rewritten turn's retention: per kind, and the lost facts (from the decision record,
    `decision`, when the flow has it)."""
    kept = rec.get("retention")
    if not isinstance(kept, dict):
        if rec.get("action") == "rewritten":
            yield [("text", "  retention: measured once the answer is done")]
        return
    if "ratio" not in kept:
        yield [("alert", f"  retention: not measured ({kept.get('error')})")]
        return
    kinds = kept.get("by_kind")
    kinds = kinds if isinstance(kinds, dict) else {}
    per = ", ".join(
        f"{k} {v.get('visible')}/{v.get('facts')}" for k, v in kinds.items() if isinstance(v, dict)
    )
    yield [
        (
            "text",
            f"  retention {percent(kept['ratio'])}: {kept.get('visible')} of the client's "
            f"{kept.get('facts')} facts visible in the request sent" + (f" ({per})" if per else ""),
        )
    ]
    full = decision.get("retention") if decision is not None else None
    lost = full.get("lost") if isinstance(full, dict) else None
    if isinstance(lost, list) and lost:
        yield [("text", f"  lost (the first {len(lost)}):")]
        for f in lost:
            if isinstance(f, dict):
                for ln in wrap(f"{f.get('kind')}: {f.get('text')}", "    ", 1):
                    yield [("text", ln)]


def header_lines(rec: dict[str, Any], decision: Mapping[str, Any] | None = None) -> Iterator[Line]:
    """What happened, in plain words (`decision`: the flow's decision record, for the facts
    a rewrite lost)."""
    action = str(rec.get("action"))
    yield [("header", comment(rec))]
    who = [
        f"session {rec['session']}" if rec.get("session") else "no session",
        f"preset {rec['preset']}" if rec.get("preset") else "",
        f"{rec.get('dialect')} dialect",
    ]
    yield [("text", "  " + ", ".join(w for w in who if w))]
    skipped = rec.get("session_skipped")
    if isinstance(skipped, list) and skipped:
        yield [
            (
                "alert",
                f"  not a usable session id, so not used: {', '.join(map(str, skipped))} "
                "(ASCII letters, digits and ._:-, 1 to 128 characters)",
            )
        ]
    msgs, toks = _span(rec.get("messages")), _span(rec.get("tokens"))
    if msgs is not None:
        line = f"  messages {msgs[0]} → {msgs[1]}"
        if toks is not None:
            line += f"; tokens {toks[0]:,} → {toks[1]:,} (our count)"
        yield [("text", line)]
    yield from retention_lines(rec, decision)
    if _span(rec.get("replaced")) is not None:
        key = rec.get("stash")
        yield [
            (
                "text",
                f"  the summary replaced messages {messages_range(rec['replaced'])} of the client's "
                + (
                    f"request; stash {key}" if key else "request (no stash: markers off or expired)"
                ),
            )
        ]
    masked = rec.get("masked")
    if isinstance(masked, dict) and isinstance(masked.get("masked"), int):
        yield [
            (
                "text",
                f"  masked {masked['masked']} old tool outputs, "
                f"{human_tokens(masked.get('tokens_saved'))} tokens saved (our count); "
                f"checkpoint: {masked.get('checkpoint')}; each stub names its tool, the "
                "output's size and the id that expands it",
            )
        ]
    if rec.get("summarizing") is not None and action in ("commissioned", "rewritten"):
        flow_id = rec.get("summary_flow")
        yield [
            (
                "text",
                f"  commissioned a summary of messages {messages_range(rec['summarizing'])}"
                + (f": the summarizer's call is flow {flow_id}" if flow_id else ""),
            )
        ]
    if rec.get("for_flow"):
        yield [("text", f"  for flow {rec['for_flow']}")]
    if rec.get("reason"):
        for ln in wrap(f"why: {rec['reason']}", "  "):
            yield [("text", ln)]
    if isinstance(rec.get("ms"), int | float):
        yield [("text", f"  {rec['ms']:.2f} ms in the proxy's request hook")]
    if action in ("rewritten", "retried_original"):
        yield [("text", "  the request as the client sent it: view 'context-guru original'")]


class _FlowView(contentviews.View):
    """A view of a provider flow's request, read with its view record; `stash` reads a stash
    from the store (the original view rebuilds from it)."""

    def __init__(self, stash: Callable[[str], Stash | None]) -> None:
        self.stash = stash

    def _record(
        self, data: bytes, flow: mflow.Flow | None, http_message: http.Message | None
    ) -> dict[str, Any] | contentviews.TViewResult:
        """The flow's view record; or, for a response or a flow without a usable record, the
        bytes under one line saying so."""
        if not _is_request(flow, http_message):
            return _fallback(
                f"{self.name}: nothing to add about this response", data, flow, http_message
            )
        rec = record_of(flow)
        if isinstance(rec, str):
            return _fallback(rec, data, flow, http_message)
        return rec


class RewriteView(_FlowView):
    """`context-guru`: what the addon did to this request, and the transcript as sent."""

    name = "context-guru"

    def __call__(
        self,
        data: bytes,
        *,
        content_type: str | None = None,
        flow: mflow.Flow | None = None,
        http_message: http.Message | None = None,
        **unknown_metadata: Any,
    ) -> contentviews.TViewResult:
        rec = self._record(data, flow, http_message)
        if not isinstance(rec, dict):
            return rec
        try:
            doc = json.loads(data)
        except ValueError:
            doc = None
        decision = flow.metadata.get(META) if flow is not None else None
        decision = decision if isinstance(decision, dict) else None
        if not isinstance(doc, dict):
            lines: list[Line] = [*header_lines(rec, decision)]
            lines.append([("alert", "context-guru: the body is not JSON")])
            return "context-guru", iter([*lines, *_plain(data, flow, http_message)])
        return f"context-guru: {rec.get('action')}", iter(list(self.lines(doc, rec, decision)))

    def lines(
        self, doc: dict[str, Any], rec: dict[str, Any], decision: Mapping[str, Any] | None = None
    ) -> Iterator[Line]:
        yield from header_lines(rec, decision)
        if rec.get("action") == "summary" and isinstance(doc.get("input"), str):
            yield [("header", "the standalone prompt:")]
            for ln in wrap(doc["input"]):
                yield [("text", ln)]
            return
        known = DIALECTS.get(str(rec.get("dialect")))
        key = known.array_key if known is not None else "messages"
        messages = doc.get(key)
        if not isinstance(messages, list):
            yield [("alert", f"context-guru: the body has no {key!r} array")]
            return
        at = next((i for i, m in enumerate(messages) if summary_text(m) is not None), None)
        yield [("text", "")]
        yield from stub_lines(messages)
        if at is None or rec.get("action") == "summary":
            yield [("header", f"── the {len(messages)} messages sent ──")]
            yield from transcript_lines(messages, whole_last=rec.get("action") == "summary")
            return
        yield [("header", f"── head: messages 0–{at - 1}, kept byte for byte ──")]
        yield from transcript_lines(messages[:at])
        yield [("header", f"── the summary (message {at}), whole ──")]
        yield from transcript_lines(messages[at : at + 1], at)
        yield [("header", f"── tail: messages {at + 1}–{len(messages) - 1}, kept byte for byte ──")]
        yield from transcript_lines(messages[at + 1 :], at + 1)

    def render_priority(
        self,
        data: bytes,
        *,
        content_type: str | None = None,
        flow: mflow.Flow | None = None,
        http_message: http.Message | None = None,
        **unknown_metadata: Any,
    ) -> float:
        if not _is_request(flow, http_message):
            return 0
        rec = record_of(flow)
        touched = isinstance(rec, dict) and rec.get("action") in TOUCHED
        return 2 if touched else 0


class OriginalView(_FlowView):
    """`context-guru original`: the request as the client sent it. A rewritten flow's is
    rebuilt from the body sent and the stash (a flow saved and reopened too); any other
    touched flow's request is what the client sent (failed open, retried: the original went
    upstream; commissioned: forwarded untouched)."""

    name = "context-guru original"

    def __call__(
        self,
        data: bytes,
        *,
        content_type: str | None = None,
        flow: mflow.Flow | None = None,
        http_message: http.Message | None = None,
        **unknown_metadata: Any,
    ) -> contentviews.TViewResult:
        rec = self._record(data, flow, http_message)
        if not isinstance(rec, dict):
            return rec
        if rec.get("action") != "rewritten":
            why = {
                "retried_original": "the provider refused the rewrite; the original was re-sent "
                "and is the body below",
            }.get(
                str(rec.get("action")),
                "the addon did not rewrite this request: it went upstream as the client sent it",
            )
            return _original("context-guru original: " + why, data, flow, http_message)
        key = rec.get("stash")
        stash = None
        try:
            stash = self.stash(key) if isinstance(key, str) and key else None
        except Exception as e:  # noqa: BLE001 - a broken store is one line, not a crash
            return _fallback(
                f"context-guru original: the store failed ({type(e).__name__})",
                data,
                flow,
                http_message,
            )
        if stash is None and (key or not rec.get("masked")):
            why = (
                f"context-guru original: stash {key} is no longer in the store (expired, or "
                "the addon is not loaded with its store): the original cannot be rebuilt; the "
                "body below is the one sent"
                if key
                else "context-guru original: no stash was kept for this rewrite; the body "
                "below is the one sent"
            )
            return _fallback(why, data, flow, http_message)
        try:
            original = rebuild_original(data, rec, stash, self.stash)
        except Exception as e:  # noqa: BLE001 - a bad body or stash is one line, never a crash
            return _fallback(
                f"context-guru original: cannot rebuild ({e})", data, flow, http_message
            )
        want = rec.get("client_bytes")
        check = (
            f"{len(original):,} bytes, as the client sent"
            if want == len(original)
            else f"{len(original):,} bytes; the client sent {want if want is not None else '?'}"
        )
        stashes = (
            f"stash {key}" + (" and the masked outputs' stashes" if rec.get("masked") else "")
            if key
            else "the masked outputs' stashes"
        )
        return _original(
            f"context-guru original: the request as the client sent it, rebuilt from the body "
            f"sent and {stashes} ({check})",
            original,
            flow,
            http_message,
        )

    def render_priority(self, data: bytes, **unknown_metadata: Any) -> float:
        return 0  # one click away, never the default


def _original(
    title: str, body: bytes, flow: mflow.Flow | None, http_message: http.Message | None
) -> contentviews.TViewResult:
    lines: list[Line] = [[("header", ln.strip())] for ln in wrap(title, "", None)]
    return "context-guru original", iter([*lines, *_plain(body, flow, http_message)])


def all_views(stash: Callable[[str], Stash | None]) -> list[contentviews.View]:
    return [RewriteView(stash), OriginalView(stash)]


def names() -> Iterable[str]:
    return (RewriteView.name, OriginalView.name)


class Views:
    """The addon that shows decisions in mitmweb: its contentviews added at `load` (a reloaded
    script's predecessors taken out first) and removed at `done`."""

    name = "contextguru_views"  # (unique among every script's addons)

    def __init__(self, stash: Callable[[str], Stash | None]) -> None:
        self.views = all_views(stash)

    def load(self, loader: Any) -> None:
        for v in [v for v in contentviews.views if v.name in names()]:
            contentviews.remove(v)  # a reloaded script leaves its predecessor's views behind
        for v in self.views:
            contentviews.add(v)

    def done(self) -> None:
        for v in self.views:
            if v in contentviews.views:
                contentviews.remove(v)
