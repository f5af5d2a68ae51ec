"""Probe questions from the facts of a replaced span (docs/eval.md#the-probes).

Each probe asks for one fact (`cg.retention.facts`) with one expected answer, the fact's own
text, and names it without giving it away:

    file      which file the n-th call of tool T touched           (the path)
    command   the first line of the command the n-th call of T ran (the command's first line)
    error     the error line the output of the n-th call of T reported (the line)
    user      the user's message that began with its first words   (the whole message)

The ordinal counts that tool's calls from the start of the conversation (the client's request),
so the question means the same in every condition, however much of the conversation a rewrite
replaced. The words of a user question are fewer than the message's, so the question never
holds the whole answer. Which facts are asked is chosen deterministically (seeded), spread over
the kinds in turn.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from cg.retention.facts import KINDS, Found, Kind, transcript_facts
from cg.wire.dialects import DIALECTS

PREFIX_WORDS = 6
# A user message longer than this is not asked for verbatim: a model quoting pages back
# measures its patience, not what it was shown.
USER_MAX_CHARS = 1000


@dataclass(frozen=True, slots=True)
class Probe:
    kind: Kind
    question: str
    expected: str
    at: int  # the message of the client's request the fact was found in


# Terminal colour codes in a tool's output: a model quoting the line drops them.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def normalise(text: str) -> str:
    return " ".join(_ANSI.sub("", text).split())


def correct(expected: str, answer: str) -> bool:
    """Exact match: the expected text occurs in the answer, whitespace normalised."""
    want = normalise(expected)
    return bool(want) and want in normalise(answer)


def tool_calls(dialect: str, messages: Sequence[Any]) -> Iterator[tuple[str, str, int]]:
    """(tool, call id, message position) of every tool call in the transcript, in order; the
    tool named as `cg.retention.facts` names it (the dialect's `tool_calls`)."""
    d = DIALECTS[dialect]
    for at, m in enumerate(messages):
        if not isinstance(m, dict):
            continue
        for c in d.tool_calls(m):
            if c.name and c.id:
                yield c.name, c.id, at


def ordinal(n: int) -> str:
    tail = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{tail}"


def call_phrase(tool: str, n: int) -> str:
    return (
        f"the {ordinal(n)} call of the `{tool}` tool (counting that tool's calls from the start "
        "of the conversation)"
    )


def user_prefix(text: str) -> str:
    """The first words of a user message: at most six, and never the whole message."""
    words = text.split()
    if len(words) >= 2:
        return " ".join(words[: min(PREFIX_WORDS, len(words) - 1, max(1, len(words) // 2))])
    return text.strip()[: max(1, len(text.strip()) // 2)]


def question(found: Found, tool: str | None, n: int) -> str | None:
    """The question that asks for `found` (None: it cannot be named)."""
    if found.kind == "user":
        if len(found.text) > USER_MAX_CHARS:
            return None
        prefix = user_prefix(found.text)
        return (
            f"Quote verbatim the user's message that began with '{prefix}'. Answer with the "
            "message only."
        )
    if tool is None:
        return None
    what = call_phrase(tool, n)
    if found.kind == "file":
        return f"Which file did {what} touch? Answer with the path only."
    if found.kind == "command":
        return (
            f"What was the first line of the shell command run by {what}? Answer with the "
            "command only."
        )
    return f"What error line did the output of {what} report? Quote it exactly."


def span_probes(
    dialect: str,
    messages: Sequence[Any],
    replaced: Collection[int],
    limit: int,
    seed: str,
) -> list[Probe]:
    """At most `limit` probes of the facts first found in the `replaced` messages of the
    client's transcript `messages` (parsed), spread over the kinds, chosen by `seed`."""
    calls = list(tool_calls(dialect, messages))
    rank: dict[str, tuple[str, int]] = {}
    counts: dict[str, int] = {}
    for tool, call, _ in calls:
        counts[tool] = counts.get(tool, 0) + 1
        rank.setdefault(call, (tool, counts[tool]))
    where = set(replaced)
    by_kind: dict[Kind, list[Probe]] = {k: [] for k in KINDS}
    seen: set[tuple[Kind, str]] = set()
    for f in transcript_facts(dialect, messages):
        first = (f.kind, f.text) not in seen
        seen.add((f.kind, f.text))
        if not first or f.at not in where or not f.text.strip():
            continue
        tool, n = rank.get(f.call or "", ("", 0))
        q = question(f, tool or None, n)
        if q is not None:
            by_kind[f.kind].append(Probe(f.kind, q, f.text, f.at))
    rng = random.Random(hashlib.blake2b(seed.encode(), digest_size=8).digest())
    for kind in KINDS:
        rng.shuffle(by_kind[kind])
    out: list[Probe] = []
    while len(out) < limit and any(by_kind.values()):
        for kind in KINDS:
            if by_kind[kind] and len(out) < limit:
                out.append(by_kind[kind].pop(0))
    return out
