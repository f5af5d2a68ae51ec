"""Retention: how many of a request's facts the request as sent still shows
(docs/behaviour.md#retention).

A fact of the client's request is **visible** in the request sent when the sent transcript holds
it as a fact of its own (every message kept byte for byte keeps its facts), or holds its text
anywhere in the JSON-decoded text of a message that is new or changed (the summary message, a
masked one) or of a kept one. Retention per kind and in all is visible / facts; a request sent
unchanged has retention 1 by construction.

The facts of each message are memoised on the body's index (`Memo.retained`), so a next turn
reads only its new messages; a kept message's text is searched only for the facts that neither
the kept messages' own facts nor the new messages' text account for (with the floor, usually
none), in the two spellings a JSON encoder gives a string.
"""

from __future__ import annotations

import contextlib
import json
import operator
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from cg.retention.facts import KINDS, Fact, Found, Kind, distinct, link, message_facts
from cg.wire.body import BodyIndex
from cg.wire.splice import Cut, Keep, Piece, cut_source

_OWNER = object()  # the memo slot's owner: this module


@dataclass(slots=True)
class Retention:
    """Visible and total facts per kind, of one request (or summed over many)."""

    visible: dict[Kind, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    total: dict[Kind, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    lost: list[Fact] = field(default_factory=list)

    @property
    def facts(self) -> int:
        return sum(self.total.values())

    @property
    def ratio(self) -> float:
        """Visible / facts; 1.0 for a request with no facts (nothing was there to lose)."""
        total = self.facts
        return sum(self.visible.values()) / total if total else 1.0

    def kind_ratio(self, kind: Kind) -> float | None:
        total = self.total[kind]
        return self.visible[kind] / total if total else None

    def to_json(self, lost_shown: int = 5) -> dict[str, Any]:
        return {
            "ratio": round(self.ratio, 4),
            "facts": self.facts,
            "visible": sum(self.visible.values()),
            "by_kind": {
                k: {"visible": self.visible[k], "facts": self.total[k]}
                for k in KINDS
                if self.total[k]
            },
            "lost": [{"kind": f.kind, "text": f.text[:120]} for f in self.lost[:lost_shown]],
        }


def strings(value: Any) -> Iterator[str]:
    """Every string of a JSON value, keys excepted (a tool call's `arguments`, itself JSON,
    decoded once more: a path in it is a string of its own)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            yield v
            if v[:1] in "{[":
                with contextlib.suppress(ValueError):
                    stack.append(json.loads(v))
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def spellings(text: str) -> tuple[str, ...]:
    """`text` as a JSON string's inside, as encoders write it (with and without ASCII escapes)."""
    plain = json.dumps(text, ensure_ascii=False)[1:-1]
    ascii_ = json.dumps(text)[1:-1]
    return (plain,) if plain == ascii_ else (plain, ascii_)


def message_found(index: BodyIndex) -> list[tuple[Found, ...]]:
    """Each message's facts (unlinked), memoised on the index: a next turn that repeats the
    first k messages inherits their entries and reads only the new ones."""
    owner, known = index.memo.retained
    have: list[tuple[Found, ...]] = list(known) if owner is _OWNER and known is not None else []
    name = index.dialect.name
    msgs = index.messages
    for i in range(len(have), len(msgs)):
        try:
            value = msgs[i].value
        except Exception:  # noqa: BLE001 - a message that does not parse holds no facts
            value = None
        have.append(message_facts(name, value, i))
    index.memo.retained = (_OWNER, have)
    return have


def unread(index: BodyIndex) -> tuple[int, int]:
    """The messages whose facts are not memoised on `index` yet, and their characters: what a
    measurement of it has to read (a reader deciding where to run it asks this first)."""
    owner, known = index.memo.retained
    have = len(known) if owner is _OWNER and known is not None else 0
    msgs = index.messages
    if have >= len(msgs):
        return 0, 0
    return len(msgs) - have, msgs[-1].end - msgs[have].start


def request_facts(index: BodyIndex) -> dict[Fact, Found]:
    """Every fact of the client's request, each once, where first found (linked)."""
    return distinct(link(f for found in message_found(index) for f in found))


def _piece_source(index: BodyIndex, p: Piece) -> str:
    if isinstance(p, Cut):
        return cut_source(index, p.index, p.drop)
    if isinstance(p, Keep):
        return index.source(p.index)
    return p.json


_FACT = operator.itemgetter(0, 1)  # a Found's (kind, text): equal to, and hashed as, its Fact
_BARE = ("error", "")  # an exit status found without an error line: not a fact
NEW_MAX = 64  # new or changed messages' texts remembered (the same summary every turn)


@dataclass(slots=True)
class _Search:
    """What the kept messages' text was searched for, as of the first `upto` messages: the
    kept positions below `upto`, the lost facts found in them and those not."""

    kept: frozenset[int]
    found: set[tuple[str, str]]
    absent: set[tuple[str, str]]


_new_texts: dict[str, tuple[frozenset[tuple[str, str]], str]] = {}


def _new_message(dialect: str, src: str) -> tuple[frozenset[tuple[str, str]], str]:
    """A new or changed message's facts and JSON-decoded text, remembered: a reuse turn
    re-sends the same summary message."""
    known = _new_texts.get(src)
    if known is None:
        try:
            value = json.loads(src)
        except ValueError:
            value = None
        facts = frozenset(map(_FACT, message_facts(dialect, value)))
        known = (facts, "\n".join(strings(value)))
        if len(_new_texts) >= NEW_MAX:
            _new_texts.clear()
        _new_texts[src] = known
    return known


def _in_kept(
    index: BodyIndex, kept: Sequence[int], missing: set[tuple[str, str]]
) -> set[tuple[str, str]]:
    """The `missing` facts whose text a kept message holds (in either JSON spelling).

    Memoised on the index as of every message but the last (an agent rewrites its last message
    on the next turn: Claude Code moves its breakpoint), so a next turn that keeps the same
    messages below that searches only its own new messages for the facts looked for before,
    and the whole kept text only for a fact never looked for."""
    n = len(index.messages)
    stable = n - 1
    owner, known = index.memo.searched
    prev: _Search | None = known[-1] if owner is _OWNER and known else None
    upto = len(known) if prev is not None and known is not None else 0
    if prev is None or upto > stable or frozenset(i for i in kept if i < upto) != prev.kept:
        prev, upto = _Search(frozenset(), set(), set()), 0

    def search(facts: set[tuple[str, str]], positions: list[int]) -> set[tuple[str, str]]:
        if not facts or not positions:
            return set()
        raw = "\n".join(index.source(i) for i in positions)
        return {f for f in facts if any(s in raw for s in spellings(f[1]))}

    below = [i for i in kept if i < stable]
    found = missing & prev.found
    found |= search(missing - prev.found - prev.absent, below)  # never looked for
    found |= search(missing & prev.absent, [i for i in below if i >= upto])
    if stable > 0:
        state = _Search(frozenset(below), prev.found | found, missing - found)
        index.memo.searched = (_OWNER, [None] * (stable - 1) + [state])
    return found | search(missing - found, [i for i in kept if i >= stable])


_found_in: dict[str, dict[tuple[str, str], bool]] = {}
FOUND_MAX = 100_000  # facts remembered for one text, at most


def _not_in(missing: set[tuple[str, str]], joined: str) -> set[tuple[str, str]]:
    """The `missing` facts whose text `joined` (the new messages' text) does not hold, each
    fact searched for once per text: a reuse turn re-sends the same summary for the same lost
    facts every turn."""
    known = _found_in.get(joined)
    if known is None or len(known) > FOUND_MAX:
        if len(_found_in) >= NEW_MAX:
            _found_in.clear()
        known = _found_in[joined] = {}
    out = set()
    for f in missing:
        hit = known.get(f)
        if hit is None:
            hit = known[f] = f[1] in joined
        if not hit:
            out.add(f)
    return out


def of_plan(index: BodyIndex, plan: Sequence[Piece]) -> Retention:
    """Retention of the request `plan` makes of `index` (the client's body)."""
    per = message_found(index)
    original = set(map(_FACT, chain.from_iterable(per)))
    original.discard(_BARE)
    kept = [p.index for p in plan if isinstance(p, Keep)]
    sent = set(map(_FACT, chain.from_iterable([per[i] for i in kept])))
    texts: list[str] = []
    name = index.dialect.name
    for p in plan:
        if not isinstance(p, Keep):
            facts, text = _new_message(name, _piece_source(index, p))
            sent |= facts
            texts.append(text)
    missing = original - sent
    if missing and texts:
        missing = _not_in(missing, "\n".join(texts))
    if missing and kept:
        missing -= _in_kept(index, kept, missing)
    return _tally(original, missing, per)


_KIND = operator.itemgetter(0)


def _tally(
    original: set[tuple[str, str]],
    missing: set[tuple[str, str]],
    per: Sequence[tuple[Found, ...]],
) -> Retention:
    """Counts per kind at C speed; the lost facts named in the order they first occur (the
    messages walked only as far as the last of them)."""
    out = Retention()
    out.total.update(Counter(map(_KIND, original)))
    lost = Counter(map(_KIND, missing))
    for kind in KINDS:
        out.visible[kind] = out.total[kind] - lost.get(kind, 0)
    if missing:
        left = set(missing)
        for found in per:
            for f in found:
                key = (f.kind, f.text)
                if key in left:
                    left.discard(key)
                    out.lost.append(Fact(f.kind, f.text))
            if not left:
                break
    return out
