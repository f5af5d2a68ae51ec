"""The `mask` block: its defaults, strict keys, and its place among the components."""

from __future__ import annotations

from pathlib import Path

import pytest

from cg.components import COMPONENTS, Services, build_pipeline
from cg.mask.component import Mask
from cg.mask.config import MaskConfig, parse_mask
from cg.settings import StoreConfig
from cg.state import open_store
from cg.summarize.component import Summarize
from tests.support.transcripts import TOKENS


def test_the_defaults() -> None:
    cfg = parse_mask({})
    assert (cfg.keep_last_rounds, cfg.min_output_tokens, cfg.remask_tokens) == (10, 200, 20_000)
    assert cfg.trigger.min_request_tokens == 60_000  # summarize's trigger, its defaults
    assert cfg.min_messages == 0 and cfg.cache_state == "any"


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ({"keep_last_round": 3}, "components.mask: keep_last_round: Extra inputs"),
        ({"min_output_tokens": -1}, "components.mask: min_output_tokens:"),
        ({"remask_tokens": "lots"}, "components.mask: remask_tokens:"),
        ({"trigger": {"min_tokens": 5}}, "components.mask: trigger.min_tokens: Extra inputs"),
        ({"keep_last_rounds": 2.5}, "components.mask: keep_last_rounds:"),
    ],
)
def test_a_bad_key_or_value_is_refused_by_name(raw: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_mask(raw)
    assert str(e.value).startswith(named), str(e.value)


def test_the_pipeline_builds_mask_then_summarize(tmp_path: Path) -> None:
    store = open_store(StoreConfig(), str(tmp_path / "cg.sqlite3"))
    try:
        services = Services(store, TOKENS)
        comps = build_pipeline(["mask", "summarize"], {"mask": {"keep_last_rounds": 4}}, services)
        assert [type(c) for c in comps] == [Mask, Summarize]
        assert isinstance(comps[0], Mask) and comps[0].cfg == MaskConfig(keep_last_rounds=4)
        assert "mask" in COMPONENTS
        with pytest.raises(ValueError, match=r"components\.mask: remask"):
            build_pipeline(["summarize"], {"mask": {"remask": 1}}, services)
    finally:
        store.close()
