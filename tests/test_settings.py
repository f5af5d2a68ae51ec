"""cg.settings: presets + config file -> validated Config; refusals name the key and value."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from cg.settings import (
    Config,
    _merge,
    describe,
    host_allowed,
    host_patterns,
    load_config,
    preset_names,
)


def write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "cg.yaml"
    p.write_text(text, encoding="utf-8")
    return str(p)


def test_off_preset_is_an_empty_pipeline() -> None:
    assert "off" in preset_names()
    cfg = load_config("off", None, [])
    assert cfg.pipeline == [] and cfg.components == {}
    assert cfg.store.ttl_hours == 72


@pytest.mark.parametrize("preset", ["nope", "", "../presets/off", "off/..", "off.yaml"])
def test_unknown_preset_is_refused_naming_it(preset: str) -> None:
    with pytest.raises(ValueError, match="cg_preset: unknown preset") as e:
        load_config(preset, None, [])
    assert repr(preset) in str(e.value)
    assert "off" in str(e.value)  # lists what is known


def test_config_file_merges_over_the_preset(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "pipeline: [toy]\ncomponents:\n  toy: {level: 3}\nstore:\n  ttl_hours: 1.5\n"
        "model_windows:\n  my-model: 1000\n",
    )
    cfg = load_config("off", path, ["toy"])
    assert cfg.pipeline == ["toy"]
    assert cfg.components == {"toy": {"level": 3}}
    assert cfg.store.ttl_hours == 1.5 and cfg.store.max_mb == 512
    assert cfg.model_windows == {"my-model": 1000}


def test_empty_config_file_is_fine(tmp_path: Path) -> None:
    assert load_config("off", write(tmp_path, ""), []) == Config()
    assert load_config("off", write(tmp_path, "# nothing\n"), []) == Config()


def test_tilde_in_the_config_path_is_expanded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    write(tmp_path, "pipeline: []\n")
    assert load_config("off", "~/cg.yaml", []) == Config()


@pytest.mark.parametrize(
    ("yaml_text", "key", "value"),
    [
        ("pipelin: []\n", "pipelin", "[]"),
        ("store:\n  ttl_hourz: 3\n", "store.ttl_hourz", "3"),
        ("pipeline: summarize\n", "pipeline", "'summarize'"),
        ("store:\n  ttl_hours: 0\n", "store.ttl_hours", "0"),
        ("store:\n  max_mb: -5\n", "store.max_mb", "-5"),
        ("store:\n  ttl_hours: soon\n", "store.ttl_hours", "'soon'"),
        ("model_windows:\n  m: lots\n", "model_windows.m", "'lots'"),
        ("components: [a]\n", "components", "['a']"),
    ],
)
def test_bad_keys_and_values_are_refused_naming_both(
    tmp_path: Path, yaml_text: str, key: str, value: str
) -> None:
    with pytest.raises(ValueError) as e:
        load_config("off", write(tmp_path, yaml_text), [])
    msg = str(e.value)
    assert msg.startswith(f"config: {key}: ")
    assert f"(got {value})" in msg


@pytest.mark.parametrize(
    ("yaml_text", "fragment"),
    [
        ("pipeline: [ghost]\n", "config: pipeline: unknown component 'ghost'"),
        ("components:\n  ghost: {}\n", "config: components: unknown component 'ghost'"),
        ("pipeline: [\n", "is not valid YAML"),
        ("- a\n- b\n", "must hold a mapping, not list"),
        ("just a string\n", "must hold a mapping, not str"),
    ],
)
def test_bad_files_are_refused(tmp_path: Path, yaml_text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match="config") as e:
        load_config("off", write(tmp_path, yaml_text), ["toy"])
    assert fragment in str(e.value)


def test_missing_config_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"cg_config: cannot read .*missing\.yaml"):
        load_config("off", str(tmp_path / "missing.yaml"), [])


def test_describe_lists_every_error_and_hides_secrets() -> None:
    with pytest.raises(ValidationError) as e:
        Config.model_validate({"pipeline": 1, "store": {"ttl_hours": -1, "path": 2}})
    msg = describe(e.value, "config")
    assert msg.count("; ") == 2
    for key in ("config: pipeline:", "config: store.ttl_hours:", "config: store.path:"):
        assert key in msg
    hidden = describe(e.value, "config", secret_keys=("path",))
    assert "store.path" in hidden and "(got <redacted>)" in hidden and "(got 2)" not in hidden


def test_merge_is_deep_and_the_override_wins() -> None:
    base = {"a": {"x": 1, "y": {"z": 1}}, "b": [1], "c": 1}
    over = {"a": {"y": {"w": 2}}, "b": [2], "d": {"e": 1}}
    assert _merge(base, over) == {
        "a": {"x": 1, "y": {"z": 1, "w": 2}},
        "b": [2],
        "c": 1,
        "d": {"e": 1},
    }
    assert base == {"a": {"x": 1, "y": {"z": 1}}, "b": [1], "c": 1}  # not mutated


@pytest.mark.parametrize(
    ("host", "patterns", "allowed"),
    [
        ("anything.example", [], True),
        ("api.anthropic.com", ["api.anthropic.com"], True),
        ("API.Anthropic.COM", ["api.anthropic.com"], True),
        ("api.anthropic.com.", ["api.anthropic.com"], True),
        ("api.anthropic.com", ["API.ANTHROPIC.COM"], True),
        ("api.openai.com", ["api.anthropic.com"], False),
        ("evil-api.anthropic.com.attacker.net", ["api.anthropic.com"], False),
        ("xapi.anthropic.com", ["api.anthropic.com"], False),
        ("eu.api.openai.com", ["*.openai.com"], True),
        ("a.b.openai.com", ["*.openai.com"], True),
        ("openai.com", ["*.openai.com"], False),
        ("evilopenai.com", ["*.openai.com"], False),
        ("api.openai.com", ["api.anthropic.com", "*.openai.com"], True),
        ("127.0.0.1", ["127.0.0.1"], True),
    ],
)
def test_host_allowed(host: str, patterns: list[str], allowed: bool) -> None:
    assert host_allowed(host, patterns) is allowed


def test_host_patterns_split_commas_and_refuse_what_no_host_name_equals() -> None:
    """`--set cg_hosts=a,b` is one entry; names, wildcards and IP addresses (v6 too) are kept.
    A scheme, a path or a port never equals a Host header's name: such an entry would pass
    every request through without a word, so it is refused, naming it."""
    assert host_patterns(["api.anthropic.com, *.openai.com", " ", "127.0.0.1", "::1"]) == (
        "api.anthropic.com",
        "*.openai.com",
        "127.0.0.1",
        "::1",
    )
    for bad in ("https://api.anthropic.com", "api.anthropic.com/v1", "api.anthropic.com:443"):
        with pytest.raises(ValueError, match=f"cg_hosts: {re.escape(repr(bad))} is not a host"):
            host_patterns(["a.example", bad])
