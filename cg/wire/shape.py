"""Shape invariants of a message list (docs/behaviour.md#shape-rules) and the role check on the
bytes actually sent.

Rule ids are stable; messages use the provider's own wording, so a refusal in the decision record
reads like the 400 it prevented:

    system-position      a system-role message away from index 0 is followed by an assistant
                         turn, or ends the array
    answered-tool-use    every tool call is answered by the run of tool results right after it
    paired-tool-result   every tool result answers a call in the message that opens its run
    no-blank-content     no message is blank (with each dialect's documented exception)
    wire-role            (bytes) every role in `messages` is one the provider accepts

The Responses API's items pair calls and outputs by id anywhere later in `input`, and bind a
`reasoning` item to the item after it (`_item_rules`, `separated`):

    reasoning-successor  a reasoning item is followed by a model item, and an item that came
                         with a reasoning item still follows it
    unique-ids           no two items share an id, no two calls (or outputs) a call id

Consecutive same-role messages are deliberately not a violation: the summary is a user message
that often follows another user message, and providers accept that.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cg.wire.body import BodyIndex
from cg.wire.dialects import DIALECTS, Dialect, MessageView
from cg.wire.splice import Bytes, Keep, Piece, array_messages, array_punctuation

_DECODER = json.JSONDecoder()


@dataclass(frozen=True, slots=True)
class Violation:
    index: int
    rule: str
    message: str
    ids: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "rule": self.rule, "message": self.message}


def _views(messages: Sequence[MessageView | Any], dialect: Dialect) -> list[MessageView]:
    return [m if isinstance(m, MessageView) else dialect.view(m) for m in messages]


def _dialect(dialect: Dialect | str) -> Dialect:
    return DIALECTS[dialect] if isinstance(dialect, str) else dialect


def validate_shape(
    messages: Sequence[MessageView | Any], dialect: Dialect | str
) -> list[Violation]:
    """Every violation of the list rules; accepts views or parsed message dicts."""
    d = _dialect(dialect)
    views = _views(messages, d)
    if d.pairing == "id":
        return _item_rules(views, d)
    return _list_rules(views, d, 0)


def validate_index(index: BodyIndex) -> list[Violation]:
    """`validate_shape` of a request's own messages, carried over the prefix it shares with
    the previous turn (`BodyIndex.shared`): a violation of the list rules depends on its
    message and its neighbours (a tool run at most), so only the messages from just before the
    shared prefix's trailing tool run on are checked again."""
    d = index.dialect
    views = index.views
    n = len(views)
    owner, memo = index.memo.violations
    k = index.shared
    if memo is not None and owner is d and 0 < k <= memo[0] and d.pairing != "id":
        s = k
        while s > 0 and views[s - 1].role == "tool":
            s -= 1
        start = max(0, min(k - 1, s - 1) - 1)
        out = [v for v in memo[1] if v.index < start] + _list_rules(views, d, start)
    else:
        out = validate_shape(views, d)
    index.memo.violations = (d, (n, tuple(out)))
    return out


def _list_rules(views: list[MessageView], d: Dialect, start: int) -> list[Violation]:
    """The rules of a list whose results follow their calls (`next`, `run`), for the messages
    from `start` on (each still read beside its neighbours)."""
    n = len(views)
    anthropic = d.pairing == "next"
    out: list[Violation] = []
    for i in range(start, n):
        v = views[i]
        if i > 0 and v.is_system and i + 1 < n and views[i + 1].role != "assistant":
            out.append(Violation(i, "system-position", d.msg_system_position(i)))

        if v.calls_tools:
            answered: set[str] = set()
            if anthropic:
                if i + 1 < n and views[i + 1].role == "user":
                    answered.update(views[i + 1].tool_result_ids)
            else:
                j = i + 1
                while j < n and views[j].role == "tool":
                    answered.update(views[j].tool_result_ids)
                    j += 1
            missing = [t for t in v.tool_call_ids if t not in answered]
            if missing:
                out.append(
                    Violation(i, "answered-tool-use", d.msg_unanswered(i, missing), tuple(missing))
                )

        if v.tool_result_ids:
            opener: MessageView | None = None
            if anthropic:
                if i > 0 and views[i - 1].role == "assistant":
                    opener = views[i - 1]
            else:
                j = i - 1
                while j >= 0 and views[j].role == "tool":
                    j -= 1
                if j >= 0 and views[j].role == "assistant":
                    opener = views[j]
            calls = set(opener.tool_call_ids) if opener else set()
            unpaired = [t for t in v.tool_result_ids if t not in calls]
            if unpaired:
                out.append(
                    Violation(i, "paired-tool-result", d.msg_unpaired(i, unpaired), tuple(unpaired))
                )

        if v.blank and not d.blank_allowed(v, i == n - 1):
            out.append(Violation(i, "no-blank-content", d.msg_blank(i)))
    return out


def _item_rules(views: list[MessageView], d: Dialect) -> list[Violation]:
    """The rules of an item list whose calls and outputs pair by id (the Responses API):

    answered-tool-use     every call is answered by an output with its id, later in the list
    paired-tool-result    every output answers a call earlier in the list
    reasoning-successor   a reasoning item is followed by a model item (the one it came with)
    no-blank-content      no message item is blank
    unique-ids            no two items share an `id`, no two calls (or outputs) a call id
    """
    n = len(views)
    out: list[Violation] = []
    answered_at: dict[str, int] = {}
    for i, v in enumerate(views):
        for t in v.tool_result_ids:
            answered_at.setdefault(t, i)
    seen_ids: set[str] = set()
    called: set[str] = set()
    outputs: set[str] = set()
    for i, v in enumerate(views):
        if v.item_id is not None:
            if v.item_id in seen_ids:
                out.append(Violation(i, "unique-ids", d.msg_duplicate(i, v.item_id), (v.item_id,)))
            seen_ids.add(v.item_id)
        for t in v.tool_call_ids:
            if t in called:
                out.append(Violation(i, "unique-ids", d.msg_duplicate_call(i, t), (t,)))
            called.add(t)
            if answered_at.get(t, -1) <= i:
                out.append(Violation(i, "answered-tool-use", d.msg_unanswered(i, [t], v), (t,)))
        for t in v.tool_result_ids:
            if t in outputs:
                out.append(Violation(i, "unique-ids", d.msg_duplicate_call(i, t), (t,)))
            outputs.add(t)
            if t not in called:
                out.append(Violation(i, "paired-tool-result", d.msg_unpaired(i, [t], v), (t,)))
        if v.binds_next and not (i + 1 < n and views[i + 1].role == "assistant"):
            out.append(Violation(i, "reasoning-successor", d.msg_reasoning(i, v)))
        if v.blank:
            out.append(Violation(i, "no-blank-content", d.msg_blank(i)))
    return out


def separated(
    before: Sequence[MessageView], after_sources: Sequence[str], dialect: Dialect | str
) -> list[Violation]:
    """Items the plan moved away from the reasoning item they came with.

    `before` are the input's views; `after_sources` names each output item's source (`m{i}`,
    or `new#k` for an inserted one, see `cg.wire.splice.plan_sources`). An input item that
    followed a `binds_next` item must still follow it in the output: the provider refuses it
    alone ("… was provided without its required 'reasoning' item").
    """
    d = _dialect(dialect)
    out: list[Violation] = []
    for k, src in enumerate(after_sources):
        if not src.startswith("m"):
            continue
        i = int(src[1:])
        if i > 0 and before[i - 1].binds_next and (k == 0 or after_sources[k - 1] != f"m{i - 1}"):
            out.append(Violation(k, "reasoning-successor", d.msg_separated(k, before[i])))
    return out


def check_wire_roles(body: bytes, dialect: Dialect | str) -> list[Violation]:
    """Read the final bytes and report every role in the transcript array (`messages`, or
    `input`) that the provider would refuse."""
    d = _dialect(dialect)
    key = d.array_key
    try:
        doc = json.loads(body)
        messages = doc[key]
        if not isinstance(messages, list):
            raise TypeError(f"{key!r} is not an array")
    except (ValueError, KeyError, TypeError) as e:
        return [Violation(-1, "wire-json", f"the body sent is not readable JSON: {e}")]
    return _role_violations(d, messages)


def _role_violations(d: Dialect, messages: list[Any]) -> list[Violation]:
    """A `wire-role` violation per message of the sent transcript array the API would refuse."""
    key = d.array_key
    out: list[Violation] = []
    for i, m in enumerate(messages):
        problem = d.role_error(m)
        if problem is not None:
            role = m.get("role") if isinstance(m, dict) else None
            out.append(Violation(i, "wire-role", f"{key}.{i}.{problem}", (str(role),)))
    return out


_JSON_SPACE = b" \t\n\r"


def check_wire_array(
    index: BodyIndex, plan: Sequence[Piece], parts: Sequence[Bytes]
) -> list[Violation]:
    """`check_wire_roles` on the rebuilt transcript array alone, in the parts it is sent as
    (`splice_array_bytes`): the rest of the body is the client's own bytes (plus the fixed
    expand tool). Each message is read from its own bytes, and the punctuation between them
    must be JSON's, so the whole is one JSON array exactly when every message reads as one
    value ending at its last byte.

    A kept message read clean is remembered on the index (`memo.wire_ok`, one flag per
    input message) and not read again by a later turn whose index inherits it: that turn
    shares the message's bytes and their place in the body (`MessageCache.extend`), so the
    same bytes are sliced out. Every turn re-read the ~70 KB system message of an OpenAI
    transcript; a message the rewrite made is read every time.

    A kept message not yet read clean is compared, byte for byte, with the source its index
    read it from: equal, its parsed value is what reading it gives (the role is checked on it
    all the same); not equal (a slice off by a byte, say), it is read as any other part is."""
    d = index.dialect
    key = d.array_key
    punct = array_punctuation(parts)
    messages = array_messages(parts)
    if (
        len(messages) != len(plan)
        or (not plan and b"".join(parts) != b"[]")
        or (plan and (punct[0] != b"[" or punct[-1] != b"]"))
        or any(bytes(p).strip(_JSON_SPACE) for p in punct[1:2] + punct[-2:-1])
        or any(bytes(p).strip(_JSON_SPACE) != b"," for p in punct[2:-2])
    ):
        return [Violation(-1, "wire-json", f"the rebuilt {key!r} array is not laid out as JSON")]
    owner, known = index.memo.wire_ok
    ok: list[bool] = known if owner is d and known is not None else []
    if len(ok) < len(index.messages):
        ok += [False] * (len(index.messages) - len(ok))
    out: list[Violation] = []
    for n, (p, el) in enumerate(zip(plan, messages, strict=True)):
        i = p.index if isinstance(p, Keep) else None
        if i is not None and ok[i]:
            continue
        if i is not None and bytes(el) == index.source(i).encode("utf-8"):
            # The very bytes `index_body` read message i from, as one JSON value: reading them
            # again gives its value. Compared, not decoded: a turn's new messages (a tool's
            # output, tens of KB) were decoded twice, here at JSON's speed. (Copied first: a
            # memoryview compares with bytes element by element.)
            value: Any = index.messages[i].value
        else:
            try:
                text = str(el, "utf-8")
                value, stop = _DECODER.raw_decode(text)
                if stop != len(text):
                    raise ValueError(f"{key}.{n} has bytes after its value, at {stop}")
            except ValueError as e:  # a UnicodeDecodeError or a JSONDecodeError
                return [Violation(-1, "wire-json", f"the body sent is not readable JSON: {e}")]
        problem = d.role_error(value)
        if problem is not None:
            role = value.get("role") if isinstance(value, dict) else None
            out.append(Violation(n, "wire-role", f"{key}.{n}.{problem}", (str(role),)))
        elif i is not None:
            ok[i] = True
    index.memo.wire_ok = (d, ok)
    return out


def introduced(
    before: Iterable[Violation], after: Iterable[Violation], after_sources: Sequence[str]
) -> list[Violation]:
    """The violations in `after` that the rewrite caused, not ones the client already sent.

    A violation is matched by rule, the input message it sits on, and the ids it names; input
    message i is source `m{i}` and `after_sources` names each output message's source.
    """
    seen = {(v.rule, f"m{v.index}", v.ids) for v in before}
    return [v for v in after if v.index < 0 or (v.rule, after_sources[v.index], v.ids) not in seen]
