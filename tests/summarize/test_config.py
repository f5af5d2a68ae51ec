"""cg.summarize.config: the defaults of docs/behaviour.md#summarize-configuration, strict refusal
naming key and value, the legacy `start_from_message` fold, `CHEAP_MODEL*` env, and a write-only
`api_key`."""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

import pytest

from cg.summarize.config import SummarizeConfig, parse_summarize

SECRET = "sk-ant-SECRET-0123456789"


def refused(raw: dict[str, Any], env: dict[str, str] | None = None) -> str:
    with pytest.raises(ValueError) as e:
        parse_summarize(raw, env={} if env is None else env)
    return str(e.value)


def test_defaults_are_the_spec_table_but_the_triggers_the_simulator_chose() -> None:
    """The table of docs/behaviour.md#summarize-configuration, whose four trigger values
    docs/savings.md chose with the cost simulator (the first design's: resummarize_tokens 6000,
    cache_state cold, min_request_frac 0.9, no token gate)."""
    cfg = parse_summarize({}, env={})
    assert cfg.summary_level == "regular"
    assert (cfg.keep_first, cfg.keep_last) == (1, 3)
    assert cfg.min_tokens == 500
    assert cfg.include_tool_calls is False
    assert cfg.resummarize_tokens == 40_000
    assert cfg.start_from_message == 6
    assert cfg.custom_prompt is None
    assert cfg.marker_mode == "full"
    assert cfg.cache_state == "any"
    m = cfg.model
    assert m.source == "incoming"
    assert (m.model, m.provider, m.base_url, m.api_key, m.auth) == (None, None, None, None, None)
    t = cfg.trigger
    assert t.min_request_frac == 0.0
    assert (t.min_request_tokens, t.min_output_tokens) == (60_000, 0)
    assert t.ceiling_frac == 0.95
    assert (t.min_output_frac, t.huge_output_frac) == (0.0, 0.0)
    # start_from_message (6) is folded into the unset trigger.min_messages
    assert t.min_messages == 6 and cfg.min_messages == 6


@pytest.mark.parametrize(
    ("raw", "key", "meant"),
    [
        ({"keep_frist": 2}, "keep_frist", "keep_first"),
        (
            {"trigger": {"min_reqest_frac": 0.5}},
            "trigger.min_reqest_frac",
            "trigger.min_request_frac",
        ),
        ({"model": {"endpoint": "http://x"}}, "model.endpoint", None),
        ({"summarise_level": "concise"}, "summarise_level", "summary_level"),
        ({"keep_artifact_token": 10}, "keep_artifact_token", "keep_artifact_tokens"),
    ],
)
def test_unknown_keys_are_refused_by_name(raw: dict[str, Any], key: str, meant: str | None) -> None:
    """Named with the known key they are close to, at the same depth, as a misspelt `--set`
    option is; a key close to none gets no guess."""
    msg = refused(raw)
    assert f"components.summarize: {key}:" in msg
    assert "Extra inputs are not permitted" in msg
    if meant is None:
        assert "did you mean" not in msg
    else:
        assert msg.endswith(f"(did you mean {meant}?)")


def test_an_unknown_key_of_the_config_file_or_the_mask_block_gets_a_guess_too(
    tmp_path: Path,
) -> None:
    from cg.components import COMPONENTS
    from cg.mask.config import parse_mask
    from cg.settings import load_config

    bad = tmp_path / "cg.yaml"
    bad.write_text("store: {max_bm: 3}\npipelin: [summarize]\n")
    with pytest.raises(ValueError) as e:
        load_config("summarize", str(bad), list(COMPONENTS))
    assert "config: store.max_bm: " in str(e.value) and "(did you mean store.max_mb?)" in str(
        e.value
    )
    assert "(did you mean pipeline?)" in str(e.value)
    with pytest.raises(ValueError) as e:
        parse_mask({"keep_last_round": 3})
    assert str(e.value).endswith("(did you mean keep_last_rounds?)")


@pytest.mark.parametrize(
    ("raw", "key", "value"),
    [
        ({"summary_level": "verbose"}, "summary_level", "'verbose'"),
        ({"keep_last": "three"}, "keep_last", "'three'"),
        ({"keep_last": -2}, "keep_last", "-2"),
        ({"min_tokens": -1}, "min_tokens", "-1"),
        ({"resummarize_tokens": -5}, "resummarize_tokens", "-5"),
        ({"marker_mode": "loud"}, "marker_mode", "'loud'"),
        ({"cache_state": "hot"}, "cache_state", "'hot'"),
        ({"include_tool_calls": "sometimes"}, "include_tool_calls", "'sometimes'"),
        ({"trigger": {"min_request_frac": 1.5}}, "trigger.min_request_frac", "1.5"),
        ({"trigger": {"huge_output_frac": -0.1}}, "trigger.huge_output_frac", "-0.1"),
        ({"trigger": {"min_messages": -3}}, "trigger.min_messages", "-3"),
        ({"model": {"source": "cloud"}}, "model.source", "'cloud'"),
        ({"model": {"provider": "gemini"}}, "model.provider", "'gemini'"),
        ({"model": {"auth": "basic"}}, "model.auth", "'basic'"),
        ({"trigger": "often"}, "trigger", "'often'"),
    ],
)
def test_bad_values_are_refused_naming_key_and_value(
    raw: dict[str, Any], key: str, value: str
) -> None:
    msg = refused(raw)
    assert f"components.summarize: {key}:" in msg
    assert f"(got {value})" in msg


def test_negative_keep_first_is_refused_never_clamped() -> None:
    msg = refused({"keep_first": -1})
    assert "components.summarize: keep_first:" in msg and "(got -1)" in msg
    assert "greater than or equal to 0" in msg


@pytest.mark.parametrize("n", [0, 1, 2, 7])
def test_keep_first_is_honoured_as_given(n: int) -> None:
    assert parse_summarize({"keep_first": n}, env={}).keep_first == n


def test_start_from_message_folds_into_an_unset_min_messages() -> None:
    cfg = parse_summarize({"start_from_message": 10}, env={})
    assert cfg.trigger.min_messages == 10 and cfg.min_messages == 10


def test_an_explicit_min_messages_wins_over_start_from_message() -> None:
    cfg = parse_summarize({"start_from_message": 10, "trigger": {"min_messages": 3}}, env={})
    assert cfg.trigger.min_messages == 3 and cfg.min_messages == 3


def test_an_explicit_zero_min_messages_is_not_replaced_by_the_legacy_default() -> None:
    cfg = parse_summarize({"trigger": {"min_messages": 0}}, env={})
    assert cfg.trigger.min_messages == 0 and cfg.min_messages == 0


def test_parsing_twice_does_not_leak_the_fold_between_configs() -> None:
    a = parse_summarize({"start_from_message": 9}, env={})
    b = parse_summarize({}, env={})
    assert (a.min_messages, b.min_messages) == (9, 6)


CHEAP_ENV = {
    "CHEAP_MODEL": "small-model",
    "CHEAP_MODEL_PROVIDER": "openai",
    "CHEAP_MODEL_BASE_URL": "http://127.0.0.1:8000",
    "CHEAP_MODEL_API_KEY": SECRET,
    "CHEAP_MODEL_AUTH": "bearer",
}


def test_cheap_model_env_fills_the_model_block() -> None:
    cfg = parse_summarize({"model": {"source": "config"}}, env=CHEAP_ENV)
    m = cfg.model
    assert (m.source, m.model, m.provider, m.base_url, m.auth) == (
        "config",
        "small-model",
        "openai",
        "http://127.0.0.1:8000",
        "bearer",
    )
    assert m.api_key is not None and m.api_key.get_secret_value() == SECRET


def test_the_config_block_wins_over_cheap_model_env() -> None:
    cfg = parse_summarize(
        {"model": {"source": "config", "model": "mine", "provider": "anthropic"}}, env=CHEAP_ENV
    )
    assert (cfg.model.model, cfg.model.provider) == ("mine", "anthropic")
    assert cfg.model.base_url == "http://127.0.0.1:8000"  # unset keys still come from env


def test_only_the_env_passed_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in CHEAP_ENV.items():
        monkeypatch.setenv(k, v)
    cfg = parse_summarize({"model": {"source": "config"}}, env={})
    assert cfg.model.model is None and cfg.model.api_key is None
    # ... and with no env argument at all, the process environment is the source
    assert parse_summarize({"model": {"source": "config"}}).model.model == "small-model"


@pytest.mark.parametrize("raw", [{}, {"model": {}}, {"model": {"source": "incoming"}}])
def test_cheap_model_env_does_not_retarget_an_incoming_summarizer(raw: dict[str, Any]) -> None:
    # `incoming` reuses the proxied request's own model: a CHEAP_MODEL the user exported for
    # a `config` deployment must not change it, whether or not a `model:` block is present.
    cfg = parse_summarize(raw, env=CHEAP_ENV)
    assert cfg.model.source == "incoming"
    assert (cfg.model.model, cfg.model.provider, cfg.model.api_key) == (None, None, None)


def test_a_bad_env_value_is_refused_naming_the_key_it_fills() -> None:
    msg = refused({"model": {"source": "config"}}, env={"CHEAP_MODEL_PROVIDER": "gemini"})
    assert "model.provider" in msg and "'gemini'" in msg


def test_the_raw_mapping_is_not_mutated_by_env_filling() -> None:
    raw: dict[str, Any] = {"model": {"source": "config"}}
    parse_summarize(raw, env=CHEAP_ENV)
    assert raw == {"model": {"source": "config"}}


@pytest.mark.parametrize(
    ("raw", "env"),
    [
        ({"model": {"api_key": SECRET, "provider": "gemini"}}, {}),
        ({"model": {"api_key": [SECRET]}}, {}),
        ({"model": {"api_key": {"value": SECRET}}}, {}),
        ({"api_key": SECRET}, {}),  # in the wrong place: refused by name, value withheld
        ({"model": {"source": "config"}}, {"CHEAP_MODEL_API_KEY": SECRET, "CHEAP_MODEL_AUTH": "x"}),
        ({"model": {"source": "config", "api_key": SECRET, "bogus": 1}}, {}),
    ],
)
def test_api_key_never_appears_in_an_error(raw: dict[str, Any], env: dict[str, str]) -> None:
    with pytest.raises(ValueError) as e:
        parse_summarize(raw, env=env)
    assert SECRET not in str(e.value)
    assert SECRET not in "".join(traceback.format_exception(e.value))
    assert e.value.__cause__ is None and e.value.__suppress_context__


def test_a_bad_api_key_is_named_with_its_value_redacted() -> None:
    msg = refused({"model": {"api_key": [SECRET]}})
    assert "components.summarize: model.api_key:" in msg and "<redacted>" in msg


def test_api_key_never_appears_in_repr_or_dumps() -> None:
    cfg = parse_summarize({"model": {"source": "config", "api_key": SECRET}}, env={})
    assert cfg.model.api_key is not None and cfg.model.api_key.get_secret_value() == SECRET
    for shown in (
        repr(cfg),
        str(cfg),
        repr(cfg.model),
        cfg.model_dump_json(),
        str(cfg.model_dump()),
    ):
        assert SECRET not in shown


def test_a_config_is_a_plain_pydantic_model() -> None:
    assert isinstance(parse_summarize({"summary_level": "concise"}, env={}), SummarizeConfig)
