"""Measure where the real Codex compacts its own history (the figures in docs/codex.md).

    python -m tests.e2e.measure_codex_compaction                       # the default limit
    python -m tests.e2e.measure_codex_compaction --model gpt-5.5
    python -m tests.e2e.measure_codex_compaction --set model_context_window=100000
    python -m tests.e2e.measure_codex_compaction --set model_auto_compact_token_limit=20000

Codex (installed as the suite installs it, tests/e2e/codex.py) runs a two-step session against the
fake provider and the scripted model (tests/support/codex_script.py), which reports usage as the bytes
would bill it plus `X` extra output tokens on every answer. After the first step's command ran,
Codex either sends its next turn or compacts first; bisecting on `X` finds the smallest first
answer's `total_tokens` that makes it compact. Adding Codex's own estimate of the step's output
(calibrate it with a known `model_auto_compact_token_limit`) gives its limit. Each trial is one
`codex exec` of a second or two.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from tests.e2e.codex import install, run_codex
from tests.support.codex_script import CodexScript, request_kind, session
from tests.support.fakeprovider import FakeProvider


def trial(binary: Path, work: Path, config: dict[str, object], extra: int) -> tuple[bool, int]:
    """(did Codex compact before its second turn, the first answer's total_tokens)."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    script = CodexScript("CG-measure", session(2, command=lambda k: f"seq 1 1500 # {k}"))
    script.output_tokens = extra
    with FakeProvider() as fake:
        fake.responder = script
        run = run_codex(binary, "CG-measure: go", work, fake.url + "/v1", config=config)
        requests = fake.requests
    assert run.returncode == 0 and script.refusals == [] and len(requests) > 1, run.describe()
    total: int = script.usages[0]["total_tokens"]
    return request_kind(requests[1]) == "compaction", total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="the model Codex is told to use")
    ap.add_argument("--set", action="append", default=[], help="KEY=INT for config.toml")
    ap.add_argument("--high", type=int, default=1_000_000, help="extra tokens that must compact")
    a = ap.parse_args()
    config: dict[str, object] = {k: int(v) for k, v in (s.split("=", 1) for s in a.set)}
    if a.model:
        config["model"] = a.model
    binary = install()
    work = Path(tempfile.mkdtemp(prefix="codex-measure-"))
    try:
        lo, hi = 0, a.high
        compacts, _ = trial(binary, work, config, hi)
        assert compacts, f"no compaction even with {hi} extra tokens"
        compacts, _ = trial(binary, work, config, lo)
        assert not compacts, "Codex compacted after the first step with no extra tokens"
        while hi - lo > 32:
            mid = (lo + hi) // 2
            compacts, total = trial(binary, work, config, mid)
            print(f"first answer total_tokens {total:>9,}: {'compacts' if compacts else 'goes on'}")
            lo, hi = (lo, mid) if compacts else (mid, hi)
        _, below = trial(binary, work, config, lo)
        _, at = trial(binary, work, config, hi)
        print(f"Codex compacts once the first answer reports {below + 1:,}..{at:,} tokens")
        print("(add its estimate of one `seq 1 1500` output, ~1,640: calibrate with a known limit)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
