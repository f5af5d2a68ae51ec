"""Codex-shaped sessions for the simulator's corpus (`bench.sessions`): the same generated
transcript as the Claude Code sessions, rendered as Codex CLI 0.169.0 sends it to the Responses
API (docs/codex.md), so the `codex` preset is compared on the traffic it is for.

The frame is a real request of Codex (`tests/fixtures/codex-0.169.0/middle.json`): every byte
outside `input` (tools, `reasoning`, `include`, `client_metadata`, …), its headers and its first
four items (the two developer messages, `<environment_context>`, the task) are Codex's, with the
session id and the model swapped. What the transcript adds is rendered the way Codex writes it:

- an assistant turn: a `reasoning` item (summary and `encrypted_content`), now and then an
  assistant preamble, then one `function_call` of `exec_command` per call; a Read is `sed -n`,
  a Grep `rg -n`, an Edit or Write an `apply_patch` heredoc with its `*** Update|Add File:`
  header;
- each result: a `function_call_output` in Codex's format (`Chunk ID`, `Wall time`, `Process
  exited with code N`, `Original token count`, `Output:`);
- a human prompt: a `user` message. The transcript's system reminders have no Codex equivalent
  and are left out.

A request ends where the model's next output begins (its `reasoning` item), so each request is a
prefix of the next, as Codex re-sends its whole history (`store: false`).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from bench.corpus import Call, Event, Result, _dumps
from cg.wire.jsonspan import walk_document

FIXTURE = (
    Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "codex-0.169.0" / "middle.json"
)
SESSION = "01a22c54-411d-7d33-a708-9561f201632e"
HEAD_ITEMS = 4  # developer, developer (skills), <environment_context>, the task
DROPPED_HEADERS = {"content-length", "host", "authorization"}


def _fixture() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(FIXTURE.read_text(encoding="utf-8"))
    return doc


def session_id(seed: int) -> str:
    return str(uuid.UUID(int=seed, version=4))


def headers(seed: int) -> dict[str, str]:
    """The fixture's headers less length, host and credential, for the session of `seed`."""
    sid = session_id(seed)
    return {
        k: v.replace(SESSION, sid)
        for k, v in _fixture()["headers"]
        if k.lower() not in DROPPED_HEADERS
    }


def frame(model: str, seed: int) -> tuple[str, str, list[dict[str, Any]]]:
    """The body text before and after its `input` array, and the head items."""
    text: str = _fixture()["body"]
    span = next(m for m in walk_document(text, arrays=("input",)) if m.key == "input")
    sid = session_id(seed)
    before = text[: span.start].replace(SESSION, sid)
    after = text[span.end :].replace(SESSION, sid)
    before = before.replace('"model":"my-local-model"', f'"model":"{model}"', 1)
    after = after.replace('"model":"my-local-model"', f'"model":"{model}"')
    head: list[dict[str, Any]] = json.loads(text[span.start : span.end])[:HEAD_ITEMS]
    return before, after, head


def _cmd(c: Call) -> str:
    args = c.input
    if c.name == "Bash":
        return str(args["command"])
    if c.name == "Read":
        return f"sed -n '1,200p' {args['file_path']}"
    if c.name == "Grep":
        return f"rg -n '{args['pattern']}' {args['path']}"
    if c.name == "Write":
        lines = "".join(f"+{line}\n" for line in str(args.get("content", "")).splitlines())
        patch = f"*** Add File: {args['file_path']}\n{lines}"
    else:
        patch = (
            f"*** Update File: {args['file_path']}\n@@\n"
            + "".join(f"-{x}\n" for x in str(args.get("old_string", "")).splitlines())
            + "".join(f"+{x}\n" for x in str(args.get("new_string", "")).splitlines())
        )
    return f"apply_patch <<'PATCH'\n*** Begin Patch\n{patch}*** End Patch\nPATCH"


def _hex(seed: str, n: int) -> str:
    return uuid.uuid5(uuid.NAMESPACE_OID, seed).hex[:n].ljust(n, "0")


def _output(r: Result, n: int) -> str:
    text = r.content if isinstance(r.content, str) else "\n".join(p["text"] for p in r.content)
    return (
        f"Chunk ID: {_hex(r.call_id, 6)}\nWall time: {(n % 97) / 31:.4f} seconds\n"
        f"Process exited with code {1 if r.is_error else 0}\n"
        f"Original token count: {len(text) // 4}\nOutput:\n{text}"
    )


def render(events: list[Event]) -> list[dict[str, Any]]:
    """The transcript's items after the head, as Codex sends them."""
    out: list[dict[str, Any]] = []
    for n, e in enumerate(events):
        if e.kind == "user":
            out += [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": t}]}
                for t in e.texts
            ]
        elif e.kind == "assistant":
            thinking, sig = e.thinking or ("", "")
            title = " ".join(thinking.split()[:4]).rstrip(".,;")
            out.append(
                {
                    "type": "reasoning",
                    "id": "rs_" + _hex(f"rs{n}{sig[:16]}", 48),
                    "summary": [{"type": "summary_text", "text": f"**{title}**\n\n{thinking}"}],
                    "content": None,
                    "encrypted_content": "gAAAAA" + sig,
                }
            )
            for t in e.texts:
                out.append(
                    {
                        "type": "message",
                        "status": "completed",
                        "id": "msg_" + _hex(f"msg{n}{t}", 48),
                        "role": "assistant",
                        "content": [
                            {"type": "output_text", "text": t, "annotations": [], "logprobs": []}
                        ],
                    }
                )
            out += [
                {
                    "type": "function_call",
                    "status": "completed",
                    "id": "fc_" + _hex(c.id, 48),
                    "name": "exec_command",
                    "arguments": _dumps({"cmd": _cmd(c)}),
                    "call_id": c.id,
                }
                for c in e.calls
            ]
        elif e.kind == "results":
            out += [
                {
                    "type": "function_call_output",
                    "id": "fco_" + _hex("o" + r.call_id, 32),
                    "call_id": r.call_id,
                    "output": _output(r, n),
                }
                for r in e.results
            ]
    return out


def turn_bounds(items: list[dict[str, Any]]) -> list[int]:
    """The item count of each request: a request ends where the model's output begins."""
    ends = [i for i in range(HEAD_ITEMS + 1, len(items)) if items[i]["type"] == "reasoning"]
    return [*ends, len(items)]
