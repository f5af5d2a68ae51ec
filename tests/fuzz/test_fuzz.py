"""The fuzz targets (tests/fuzz/targets.py) in the default suite: a bounded hypothesis run of each,
and every input the fuzzers ever found (tests/fuzz/corpus/<target>/*.bin) replayed.

The high-volume runs are `python -m tests.fuzz.run` (docs/reliability.md has their figures).
`CG_FUZZ_EXAMPLES` raises this file's per-target count for a longer local run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from tests.fuzz.targets import SEEN, TARGETS, close_hooks

CORPUS = Path(__file__).with_name("corpus")
EXAMPLES = int(os.environ.get("CG_FUZZ_EXAMPLES", "150"))
# What each bounded run must have seen at least once: inputs that got past the door.
MUST_SEE = {
    "rewrite": ["rewrite:rewritten", "rewrite:passed_through"],
    "answer_json": ["answer_json:parsed", "answer_json:refused"],
    "answer_sse": ["answer_sse:parsed", "answer_sse:refused"],
    "tap": ["tap:usage"],
    "hooks": ["hooks:rewritten", "hooks:spliced", "hooks:passed_through"],
}


@pytest.fixture(scope="module", autouse=True)
def _hooks_addon() -> Iterator[None]:
    """The hooks target keeps one addon (and a fake provider) for the module; stopped here."""
    yield
    close_hooks()


def corpus() -> list[Path]:
    return sorted(CORPUS.glob("*/*.bin"))


def test_the_corpus_holds_what_was_found():
    assert {p.parent.name for p in corpus()} >= {"answer_json", "answer_sse", "hooks"}
    assert all(p.parent.name in TARGETS for p in corpus())


@pytest.mark.parametrize("path", corpus(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_found_input_stays_fixed(path: Path):
    TARGETS[path.parent.name].run(path.read_bytes())


@pytest.mark.parametrize("name", list(TARGETS))
def test_fuzz_target(name: str):
    target = TARGETS[name]
    before = SEEN.copy()
    ran = 0
    examples = EXAMPLES if name != "hooks" else max(EXAMPLES // 3, 1)

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(target.inputs())
    def run(data: bytes) -> None:
        nonlocal ran
        ran += 1
        target.run(data)

    run()
    assert ran >= examples
    for key in MUST_SEE.get(name, []):
        assert SEEN[key] > before[key], f"{name}: no input reached {key} in {ran} runs"
