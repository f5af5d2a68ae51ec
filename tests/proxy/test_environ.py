"""`cg.proxy.environ`: a variable under our prefixes that context-guru does not read is named (with
the one meant), and a cheap model set where no summarizer reads it is named too."""

from __future__ import annotations

from cg.proxy.environ import KNOWN, unknown_variables, unused_cheap_model


def test_every_variable_context_guru_reads_is_known() -> None:
    assert {
        "CONTEXT_GURU_SUMMARIZE_TIMEOUT",
        "CONTEXT_GURU_CONTROL_TOKEN",
        "CHEAP_MODEL",
        "CHEAP_MODEL_PROVIDER",
        "CHEAP_MODEL_BASE_URL",
        "CHEAP_MODEL_API_KEY",
        "CHEAP_MODEL_AUTH",
    } == KNOWN
    assert unknown_variables(dict.fromkeys(KNOWN, "x")) == []


def test_a_misspelt_variable_under_our_prefixes_is_named_with_the_one_meant() -> None:
    env = {
        "CHEAP_MODEL_KEY": "k",
        "CONTEXT_GURU_SUMARIZE_TIMEOUT": "30",
        "CONTEXT_GURU_COLOUR": "blue",
        "CHEAP_MODEL": "claude-haiku",  # known: not named
        "HOME": "/root",  # not ours: not named
        "CONTEXT_GURUX": "1",  # no underscore after the name: not our prefix
    }
    assert unknown_variables(env) == [
        ("CHEAP_MODEL_KEY", "CHEAP_MODEL_API_KEY"),
        ("CONTEXT_GURU_COLOUR", None),
        ("CONTEXT_GURU_SUMARIZE_TIMEOUT", "CONTEXT_GURU_SUMMARIZE_TIMEOUT"),
    ]


def test_a_cheap_model_is_unused_only_where_no_summarizer_takes_a_config_model() -> None:
    env = {"CHEAP_MODEL": "m", "CHEAP_MODEL_API_KEY": "k", "CHEAP_MODEL_AUTH": ""}
    assert unused_cheap_model(env, ["incoming", "incoming"]) == [
        "CHEAP_MODEL",
        "CHEAP_MODEL_API_KEY",
    ]  # an empty one is not set
    assert unused_cheap_model(env, ["incoming", "config"]) == []
    assert unused_cheap_model(env, []) == []  # nothing summarizes: no model is used
    assert unused_cheap_model({}, ["incoming"]) == []
