"""The environment variables context-guru reads, and what is wrong with the ones set.

Why: a variable read by name is silent when misspelt. `CHEAP_MODEL_KEY` (for
`CHEAP_MODEL_API_KEY`) leaves a `config` summarizer on the process's provider key, billing
another account; `CONTEXT_GURU_SUMMARIZE_TIMEOUT_S` leaves the 90 s default. And `CHEAP_MODEL`
set while every preset in force takes its summarizer from the incoming request (`model.source:
incoming`, the default) is not used at all: the summaries are written by the agent's own model,
at its price, while the user believes a cheap one writes them. The addon checks the environment
each time its options are configured: an unknown name under our prefixes refuses the options,
naming it (docs/behaviour.md#errors-and-bad-input: a bad config refuses to load, naming the key); a
cheap model set but unused is a warning, since the config itself is valid.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cg.settings import unknown_names
from cg.summarize.client import TIMEOUT_ENV
from cg.summarize.config import CHEAP_ENV

PREFIXES = ("CONTEXT_GURU_", "CHEAP_MODEL")
# The control token (`cg_control_token`) kept off the command line: the proxy reads it when the
# option is empty, `context-guru stats --proxy` sends it.
CONTROL_TOKEN_ENV = "CONTEXT_GURU_CONTROL_TOKEN"
KNOWN = frozenset({TIMEOUT_ENV, CONTROL_TOKEN_ENV, *CHEAP_ENV})


def unknown_variables(env: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """(name, the known name meant, if any) for each variable set under one of our prefixes
    that context-guru does not read, sorted by name."""
    return unknown_names(env, KNOWN, PREFIXES)


def unused_cheap_model(env: Mapping[str, str], sources: Sequence[str]) -> list[str]:
    """The `CHEAP_MODEL*` variables set (not empty) that no summarizer reads, given the
    `model.source` of each summarizer in force: none if nothing summarizes (`off`: no model of
    any kind is used) or one takes a `config` model. Sorted."""
    if not sources or "config" in sources:
        return []
    return sorted(name for name in CHEAP_ENV if env.get(name))
