"""Every model a user of the shipped agents and presets will send has a price and a window.

A model missing from `cg/presets/tables/prices.yaml` makes its session's `savings` null, and one
missing from `model_windows.yaml` leaves the fraction gates and the ceiling unresolvable: the
preset then acts on token counts alone. The models are gathered from where they are named:

- the presets' own `model_windows` keys;
- the request bodies in tests/fixtures (what the real agents sent);
- each pinned agent's defaults and catalogue, read from its binary and listed below with the
  version they were read from (`strings` of the binary: Codex's `"slug": "…"` entries, Claude
  Code's `"claude-…"` model ids still served);
- the models the opencode tests run;
- the OpenAI and Anthropic families people run through SDK apps (gpt-4o to gpt-5.6, o-series).

A name that is not a provider's model (a fixture's `my-local-model`) is listed in `NOT_MODELS`
with why.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cg.billing.prices import shipped_prices
from cg.settings import PRESETS_DIR
from cg.summarize.triggers import resolve_window, shipped_windows

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

# Codex 0.169.0's catalogue (its default: gpt-6.1-sol) and 0.171.0's (`codex debug models`: its
# first entry gpt-6.2-sol); internal slugs (`codex-auto-review`, `gpt-daybreak-blue-latest`,
# `gpt-daybreak-red-latest`: hidden, no public price or model page) are left out.
CODEX_CATALOGUE = (
    "gpt-6.2-sol",
    "gpt-6.2-astra",
    "gpt-5.5",
    "gpt-5.6-sol",
    "gpt-5.6-terra",
    "gpt-5.6-luna",
    "gpt-6-sol",
    "gpt-6-luna",
    "gpt-6-astra",
    "gpt-6.1-sol",
    "gpt-6.1-terra",
)
# Claude Code 2.1.197's model ids (its default on an API key: claude-opus-4-8) and 2.1.328's
# (its default: claude-opus-5-5), dated ones by their family name (a prefix match prices a
# snapshot).
CLAUDE_CODE_MODELS = (
    "claude-opus-5-5",
    "claude-opus-5",
    "claude-sonnet-5-5",
    "claude-haiku-5-5",
    "claude-fable-5-1",
    "claude-fable-5-2",
    "claude-mythos-5-1",
    "claude-mythos-5-2",
    "claude-opus-4-5-20251101",
    "claude-opus-4-8",
    "claude-opus-4-7",
    "claude-opus-4-6",
    "claude-opus-4-5",
    "claude-opus-4-1-20250805",
    "claude-opus-4-20250514",
    "claude-sonnet-5",
    "claude-sonnet-4-6",
    "claude-sonnet-4-5-20250929",
    "claude-sonnet-4-20250514",
    "claude-haiku-4-5-20251001",
    "claude-mythos-5",
    "claude-fable-5",
    "claude-3-7-sonnet-20250219",
    "claude-3-5-sonnet-20241022",
    "claude-3-5-haiku-20241022",
    "claude-3-opus-20240229",
    "claude-3-haiku-20240307",
)
# The models the opencode 1.18.33 tests run (tests/e2e/opencode.py: MODEL), named without its
# `anthropic/` provider prefix, as it sends them.
OPENCODE_MODELS = ("claude-haiku-4-5",)
# Gemini CLI 0.61.0's models (its bundle's DEFAULT_GEMINI_*_MODEL and PREVIEW_GEMINI_*_MODEL
# constants), and Claude on Vertex AI as it names a model (`@` and its date).
GEMINI_MODELS = (
    "gemini-2.5-pro",
    "gemini-2.5-flash",
    "gemini-2.5-flash-lite",
    "gemini-3-pro-preview",
    "gemini-3-flash-preview",
    "gemini-3.1-pro-preview",
    "gemini-3.1-pro-preview-customtools",
    "claude-sonnet-4-5@20250929",
)
SDK_MODELS = (
    "gpt-4o",
    "gpt-4o-2024-08-06",
    "gpt-4o-mini",
    "gpt-4.1",
    "gpt-4.1-mini",
    "gpt-4.1-nano",
    "gpt-4-turbo",
    "o1",
    "o1-mini",
    "o3",
    "o3-mini",
    "o4-mini",
    "gpt-5",
    "gpt-5-mini",
    "gpt-5-nano",
    "gpt-5-codex",
    "gpt-5.1",
    "gpt-5.1-codex",
    "gpt-5.2",
    "gpt-5.4",
    "gpt-5.5",
    "gpt-5.6",
    "claude-opus-5-5",
    "claude-sonnet-5-5",
    "claude-haiku-5-5",
    "claude-opus-5",
    "claude-fable-5-2",
    "claude-mythos-5-2",
)
NOT_MODELS = {
    # Codex's recordings name a model outside its catalogue on purpose (tests/fixtures/README.md):
    # a local model's price is the user's to give (`prices:` in a cg_config).
    "my-local-model",
}


def _fixture_models() -> set[str]:
    found: set[str] = set()
    for path in FIXTURES.rglob("*.json"):
        if path.name.endswith(".headers.json"):
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        body = data.get("body", data)
        if isinstance(body, str):
            body = json.loads(body)
        if isinstance(body, dict) and isinstance(body.get("model"), str):
            found.add(body["model"])
    return found


def _preset_models() -> set[str]:
    found: set[str] = set()
    for path in PRESETS_DIR.glob("*.yaml"):
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        found |= {str(k) for k in (data.get("model_windows") or {}) if k}
    return found


def test_the_sources_are_read() -> None:
    """Vacuity guard: the fixtures and presets still name the models this file checks."""
    fixtures = _fixture_models()
    assert {"claude-opus-4-8", "gpt-6.1-sol", "my-local-model"} <= fixtures
    assert "gpt-6.1-terra" in _preset_models()


MODELS = sorted(
    (
        {
            *_fixture_models(),
            *_preset_models(),
            *CODEX_CATALOGUE,
            *CLAUDE_CODE_MODELS,
            *OPENCODE_MODELS,
            *GEMINI_MODELS,
            *SDK_MODELS,
        }
    )
    - NOT_MODELS
)


@pytest.mark.parametrize("model", MODELS)
def test_every_named_model_has_a_price_and_a_window(model: str) -> None:
    assert shipped_prices().lookup(model) is not None, f"{model}: no price in prices.yaml"
    window = resolve_window(model, "", {}, shipped_windows())
    assert window is not None and window >= 100_000, f"{model}: window {window}"


def test_a_gateway_prefix_is_dropped_only_when_the_whole_name_misses() -> None:
    prices = shipped_prices()
    assert prices.lookup("openai/gpt-4o-mini") == prices.lookup("gpt-4o-mini")
    assert prices.lookup("aws/claude-sonnet-5") == prices.lookup("claude-sonnet-5")
    assert resolve_window("openai/gpt-4.1-mini", "", {}, shipped_windows()) == 1_047_576
    assert prices.lookup("nobody/unknown-model") is None
    assert resolve_window("nobody/unknown-model", "", {}, shipped_windows()) is None


def test_each_family_member_takes_its_own_price_not_its_prefix() -> None:
    """`gpt-4o-mini` starts with `gpt-4o`, `o3-mini` with `o3`: each has its own entry."""
    prices = shipped_prices()
    for small, big in [
        ("gpt-4o-mini", "gpt-4o"),
        ("gpt-4.1-nano", "gpt-4.1"),
        ("o3-mini", "o3"),
        ("o1-mini", "o1"),
        ("gpt-5-nano", "gpt-5"),
        ("gpt-5.6-luna", "gpt-5.6"),
        ("gpt-5.1-codex-mini", "gpt-5.1"),
        ("gemini-2.5-flash-lite", "gemini-2.5-flash"),
    ]:
        a, b = prices.lookup(small), prices.lookup(big)
        assert a is not None and b is not None and a.input < b.input, (small, big)


def test_the_table_is_dated_and_every_openai_write_price_follows_its_rule() -> None:
    """Before GPT-5.6 a cache write costs the input price; from GPT-5.6 on, 1.25x."""
    table = shipped_prices()
    assert table.date >= "2026-12-02"
    for name, p in table.prices.items():
        if not name.startswith(("gpt-", "o1", "o3", "o4")):
            continue
        newer = name.startswith(("gpt-5.6", "gpt-6"))
        assert p.cache_write_5m == pytest.approx(p.input * (1.25 if newer else 1.0)), name
