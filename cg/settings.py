"""Options + YAML presets -> validated settings. Pure functions that raise ValueError.

Sources, later wins: `cg/presets/NAME.yaml` < the `cg_config` file < mitmproxy options. Unknown keys
and bad values are refused with a message naming the key and the value.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

# Package data: the presets and the tables ship inside `cg` (a wheel needs no checkout).
PRESETS_DIR = Path(__file__).resolve().parent / "presets"


def model_entry(model: str, names: Collection[str]) -> str | None:
    """The entry of a model table (`names`: prices, windows) that `model` takes: its own name,
    else the longest name it starts with (a dated snapshot takes its family's), else the same
    for the name after a gateway's provider prefix (`openai/gpt-4o-mini`); None when none."""
    if model in names:
        return model
    best = max((p for p in names if model.startswith(p)), key=len, default=None)
    if best is None and "/" in model:
        return model_entry(model.rsplit("/", 1)[1], names)
    return best


class StoreConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    path: str = "~/.context-guru/cg.sqlite3"
    # `postgresql://user:password@host:port/db`: the store several proxies share (it takes
    # precedence over `path`); the password is never shown (docs/postgres.md).
    url: str | None = None
    ttl_hours: float = Field(72, gt=0)
    max_mb: float = Field(512, gt=0)
    # PostgreSQL: how long a summary claim lives without being renewed (its holder died).
    lease_seconds: float = Field(30, gt=0)

    @field_validator("url")
    @classmethod
    def _postgres_url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("postgresql://", "postgres://")):
            raise ValueError("must be a postgresql:// URL (the SQLite file is `path`)")
        return v


class Rates(BaseModel):
    """List prices of one model, USD per million tokens (`cg/presets/tables/prices.yaml`)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    input: float = Field(ge=0)
    cache_write_5m: float = Field(ge=0)
    cache_write_1h: float = Field(ge=0)
    cache_read: float = Field(ge=0)
    output: float = Field(ge=0)


class LongPrompt(Rates):
    threshold_tokens: int = Field(gt=0)


class Price(Rates):
    long_prompt: LongPrompt | None = None


def parse_prices(raw: Mapping[str, Any], source: str) -> dict[str, Price]:
    """A `{model: {input, cache_write_5m, cache_write_1h, cache_read, output}}` map, validated.

    Raises ValueError naming the model and the key."""
    out: dict[str, Price] = {}
    for model, rates in raw.items():
        try:
            out[str(model)] = Price.model_validate(rates)
        except ValidationError as e:
            raise ValueError(describe(e, f"{source}.{model}")) from None
    return out


class Config(BaseModel):
    """The config-file shape of docs/behaviour.md#summarize-configuration."""

    model_config = ConfigDict(extra="forbid", strict=True)
    pipeline: list[str] = Field(default_factory=list)
    components: dict[str, dict[str, Any]] = Field(default_factory=dict)
    store: StoreConfig = Field(default_factory=StoreConfig)
    model_windows: dict[str, int] = Field(default_factory=dict)
    # {model: {input, cache_write_5m, cache_write_1h, cache_read, output[, long_prompt]}} in
    # USD per million tokens, over cg/presets/tables/prices.yaml (validated by load_config)
    prices: dict[str, Any] = Field(default_factory=dict)


def describe(
    e: ValidationError,
    source: str,
    secret_keys: Collection[str] = (),
    model: type[BaseModel] | None = None,
) -> str:
    """One line per error, naming the key path and the value that was refused; an unknown key
    of `model` (the validated model) with the known key it is close to, as a misspelt `--set`
    option gets.

    The value under a key in `secret_keys` is never echoed.
    """
    lines = []
    for err in e.errors():
        loc = err["loc"]
        key = ".".join(str(p) for p in loc) or "(top level)"
        secret = any(str(p) in secret_keys for p in loc)
        value = "<redacted>" if secret else repr(err.get("input"))
        hint = ""
        if err["type"] == "extra_forbidden" and model is not None and loc:
            known = _keys_at(model, loc[:-1])
            close = difflib.get_close_matches(str(loc[-1]), sorted(known), n=1)
            hint = f" (did you mean {'.'.join([*map(str, loc[:-1]), close[0]])}?)" if close else ""
        lines.append(f"{source}: {key}: {err['msg']} (got {value}){hint}")
    return "; ".join(lines)


def _keys_at(model: type[BaseModel], path: Sequence[int | str]) -> Collection[str]:
    """The keys of the model nested at `path` in `model` (none where the path leaves models)."""
    here: type[BaseModel] = model
    for part in path:
        field = here.model_fields.get(str(part))
        nested = field.annotation if field is not None else None
        if not (isinstance(nested, type) and issubclass(nested, BaseModel)):
            return ()
        here = nested
    return here.model_fields.keys()


def _read_yaml(path: Path, source: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"{source}: cannot read {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{source}: {path} is not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{source}: {path} must hold a mapping, not {type(data).__name__}")
    return data


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# `cg_preset: auto` (the default): Claude Code's requests get `claude-code`, Codex CLI's `codex`,
# opencode's `opencode`, every other request the last one, `summarize`
# (docs/behaviour.md#summarize-presets).
AUTO = "auto"
AUTO_PRESETS = ("claude-code", "codex", "opencode", "gemini-cli", "summarize")


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml") if not p.stem.startswith("_"))


def load_presets(
    preset: str, config_file: str | None, known_components: Sequence[str]
) -> dict[str, Config]:
    """The config of each preset a `cg_preset` value names: all of `AUTO_PRESETS` for `auto`,
    else the one; the `cg_config` file is merged over each."""
    names = AUTO_PRESETS if preset == AUTO else (preset,)
    return {name: load_config(name, config_file, known_components) for name in names}


def load_config(preset: str, config_file: str | None, known_components: Sequence[str]) -> Config:
    path = PRESETS_DIR / f"{preset}.yaml"
    if not preset or "/" in preset or not path.is_file():
        raise ValueError(
            f"cg_preset: unknown preset {preset!r} (known: {', '.join([AUTO, *preset_names()])})"
        )
    data = _read_yaml(path, f"preset {preset}")
    if config_file:
        data = _merge(data, _read_yaml(Path(config_file).expanduser(), "cg_config"))
    try:
        cfg = Config.model_validate(data)
    except ValidationError as e:
        raise ValueError(describe(e, "config", secret_keys=("url",), model=Config)) from None
    parse_prices(cfg.prices, "config: prices")
    for name in cfg.pipeline:
        if name not in known_components:
            raise ValueError(f"config: pipeline: unknown component {name!r}")
    for name in cfg.components:
        if name not in known_components:
            raise ValueError(f"config: components: unknown component {name!r}")
    return cfg


def unknown_names(
    given: Iterable[str], known: Collection[str], prefixes: tuple[str, ...]
) -> list[tuple[str, str | None]]:
    """(name, the known name meant, if one is close) for each name given under one of our
    `prefixes` that is not `known`, sorted: a misspelt `cg_` option or environment variable,
    which mitmproxy or `os.environ` would keep unread without a word. Closeness is judged on
    the rest after the prefix, which every candidate shares and which would make any name
    look close."""
    out = []
    for name in sorted(set(given)):
        prefix = next((p for p in prefixes if name.startswith(p)), None)
        if prefix is None or name in known:
            continue
        rests = {k[len(prefix) :]: k for k in sorted(known) if k.startswith(prefix)}
        close = difflib.get_close_matches(name[len(prefix) :], list(rests), n=1)
        out.append((name, rests[close[0]] if close else None))
    return out


def no_such(name: str, close: str | None, what: str) -> str:
    """The message for one of `unknown_names`."""
    return f"{name}: no such {what}" + (f" (did you mean {close}?)" if close else "")


_PORT = re.compile(r"[^:]*:\d*")  # one colon, then digits: a port (an IPv6 address has more)


def host_patterns(entries: Sequence[str], option: str = "cg_hosts") -> tuple[str, ...]:
    """`cg_hosts` (or `option`, validated the same) as given (`--set cg_hosts=a,b` arrives as one entry "a,b": a comma list is
    what people write) made into patterns. A URL, a path or a port never equals a Host
    header's name, so such an entry would pass every request through without a word: it is
    refused, naming it. Raises ValueError."""
    out = tuple(h.strip() for item in entries for h in item.split(",") if h.strip())
    for h in out:
        if "://" in h or "/" in h or _PORT.fullmatch(h):
            raise ValueError(
                f"{option}: {h!r} is not a host name; give names or *.example.com, no scheme, "
                "path or port"
            )
    return out


def host_allowed(host: str, patterns: Sequence[str]) -> bool:
    """`cg_hosts` matching: empty means any host; otherwise exact names or `*.example.com`."""
    if not patterns:
        return True
    h = host.lower().rstrip(".")
    return any(fnmatch.fnmatchcase(h, p.lower()) for p in patterns)
