"""A deterministic stand-in for the model that writes summaries.

The simulator needs summaries of a realistic *size*, not realistic content: a summary's bytes
decide what the next turns send and what the prompt cache can reuse. `filler(n, seed)` is text
of exactly n tokens under the project's tokenizer (every word is one cl100k token), different
for every seed, the same for the same seed.

It writes none of the facts retention counts (`cg.retention.facts`), so the simulator's retention
is a floor: no word says error, exception, traceback, failed or fatal (so no error line is in
it), none is a path or a shell command, and a user text of 20 characters would have to be made
of these words alone, one space apart (tests/simulate/test_retention.py checks a session's).
"""

from __future__ import annotations

import hashlib
import random

from cg.summarize.component import Commission

# Each of these, with its leading space, is one cl100k token.
WORDS = [
    "the",
    "a",
    "file",
    "test",
    "code",
    "run",
    "check",
    "read",
    "fix",
    "build",
    "state",
    "goal",
    "next",
    "step",
    "done",
    "value",
    "path",
    "line",
    "call",
    "data",
    "list",
    "item",
    "name",
    "type",
    "case",
    "module",
    "config",
    "parser",
    "store",
    "cache",
    "result",
    "output",
    "input",
    "change",
    "patch",
    "guard",
    "update",
    "commit",
    "review",
    "plan",
    "note",
    "task",
    "edit",
    "search",
    "branch",
]


def filler(n: int, seed: str) -> str:
    """Text of `n` tokens (one per word), deterministic in `seed`."""
    rng = random.Random(hashlib.blake2b(seed.encode(), digest_size=8).digest())
    return "".join(" " + rng.choice(WORDS) for _ in range(max(n, 1)))


class StandIn:
    """The summarizer protocol of `cg.summarize.component`: answers each job with a summary of
    the size the simulator asked for (`expect`), in the `<summary>` format a model is asked for.
    """

    def __init__(self) -> None:
        self.sizes: dict[int, int] = {}

    def expect(self, job: Commission, tokens: int) -> None:
        self.sizes[id(job)] = tokens

    async def __call__(self, prompt: str, job: Commission) -> str | None:
        n = self.sizes.pop(id(job), 1)
        return f"<summary>{filler(n, job.covered_hash)}</summary>"
