"""The fuzz targets (tests/fuzz/targets.py) in the default suite: a bounded hypothesis run of each,
and every input the fuzzers ever found (tests/fuzz/corpus/<target>/*.bin) replayed.

The high-volume runs are `python -m tests.fuzz.run` (docs/reliability.md has their figures).
`CG_FUZZ_EXAMPLES` raises this file's per-target count for a longer local run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from tests.fuzz.targets import DIALECT_NAMES, SEEN, TARGETS, close_hooks

CORPUS = Path(__file__).with_name("corpus")
EXAMPLES = int(os.environ.get("CG_FUZZ_EXAMPLES", "150"))
# What each bounded run must have seen at least once: inputs that got past the door.
MUST_SEE = {
    "rewrite": ["rewrite:rewritten", "rewrite:passed_through"],
    "answer_json": ["answer_json:refused", *(f"answer_json:parsed:{d}" for d in DIALECT_NAMES)],
    "answer_sse": ["answer_sse:refused", *(f"answer_sse:parsed:{d}" for d in DIALECT_NAMES)],
    "tap": ["tap:usage"],
    "hooks": [
        "hooks:spliced",
        "hooks:passed_through",
        *(f"hooks:{d}:rewritten" for d in DIALECT_NAMES),
    ],
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
    # The decompression bombs of docs/behaviour.md#bounded-work-and-shared-use: 1 GiB of br, zstd
    # and gzip-in-br; 64 MiB of gzip.
    bombs = {p.stem.rsplit("-", 1)[0] for p in corpus() if p.stem.startswith("bomb-")}
    assert bombs == {"bomb-br", "bomb-zstd", "bomb-gzip", "bomb-gzip-br"}


def test_the_bombs_pass_through_untouched_at_the_cap():
    """Vacuity guard of the bombs' replay below: each got to the decoder and stopped at the
    cap (the hooks target asserts their bytes went on untouched)."""
    before = SEEN["hooks:over_the_cap"]
    for p in corpus():
        if p.stem.startswith("bomb-"):
            TARGETS["hooks"].run(p.read_bytes())
    assert SEEN["hooks:over_the_cap"] - before == 4


@pytest.mark.parametrize("path", corpus(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_found_input_stays_fixed(path: Path):
    TARGETS[path.parent.name].run(path.read_bytes())


@pytest.mark.parametrize("name", list(TARGETS))
def test_fuzz_target(name: str):
    target = TARGETS[name]
    before = SEEN.copy()
    ran = 0
    examples = EXAMPLES if name != "hooks" else max(EXAMPLES * 4 // 5, 1)

    # Derandomized: the bounded run sees the same inputs every time, so its vacuity guards
    # (an input of every dialect got past the door) cannot flake; `python -m tests.fuzz.run`
    # is the random one, at volume.
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
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


@pytest.mark.parametrize("name", ["rewrite", "answer_sse", "tap"])
def test_atheris_runs_a_target_from_the_corpus(name: str, tmp_path: Path):
    """The coverage-guided harness works (a short run; `python -m tests.fuzz.run --atheris S`
    is the long one): seeded from this target's corpus or a valid input, it runs its inputs
    and finds nothing."""
    pytest.importorskip("atheris", reason="atheris has no wheel for this platform or Python")
    seeds = tmp_path / "corpus"
    seeds.mkdir()
    found = sorted((CORPUS / name).glob("*.bin"))
    for p in found:
        (seeds / p.name).write_bytes(p.read_bytes())
    (seeds / "valid").write_bytes(
        b"\x00" + b'{"model":"m","messages":[{"role":"user","content":"x"}]}'
    )
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "tests.fuzz.atheris_fuzz", name, "-runs=3000",
         "-print_final_stats=1", f"-artifact_prefix={tmp_path}/", str(seeds)],
        capture_output=True, text=True, timeout=120, cwd=root, check=False,
        env={**os.environ, "PYTHONPATH": str(root)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [x for x in proc.stderr.splitlines() if x.startswith("stat::number_of_executed_units")]
    assert runs and int(runs[0].split(":")[-1]) >= 3000, proc.stderr[-2000:]
    assert not list(tmp_path.glob("crash-*"))
