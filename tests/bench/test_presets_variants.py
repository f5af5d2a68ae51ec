"""bench.presets: every variant it replays is a config the presets accept, and each says what its
name says (a renamed key would otherwise replay the preset itself under another name)."""

from __future__ import annotations

import pytest

from bench.presets import VARIANTS, config
from cg.summarize.config import parse_summarize


@pytest.mark.parametrize("preset", ["claude-code", "codex", "summarize"])
def test_every_variant_loads_and_differs_from_the_preset(preset: str) -> None:
    shipped = config(preset, "")
    seen = set()
    for name, block in VARIANTS.items():
        cfg = config(preset, block)
        key = (tuple(cfg.pipeline), repr(sorted(cfg.components.items())))
        assert key not in seen, f"{name}: the same as another variant"
        seen.add(key)
        if "mask" in name:
            assert cfg.pipeline[0] == "mask"
        else:
            assert cfg.pipeline == shipped.pipeline == ["summarize"]
    today = parse_summarize(
        config(preset, VARIANTS["today: 60k, regular, no floor"]).components["summarize"], env={}
    )
    assert (today.keep_user_tokens, today.keep_artifact_tokens, today.summary_level) == (
        0,
        0,
        "regular",
    )
    assert today.trigger.min_request_tokens == 60_000
