"""The presets chosen on cost and retention (docs/savings.md#choosing-the-presets-on-cost-and-retention).

    python -m bench.presets CORPUS_DIR [--preset NAME]…

Reads the corpus once (`python -m bench.sessions CORPUS_DIR` writes it) and replays `off`, the
`agent-compaction` baseline and, for each preset named (default: `claude-code`, `codex`,
`summarize`), the variants below: the preset as it was before retention was measured, the floor
a step at a time, the trigger at a few thresholds, `mask` alone and `[mask, summarize]`. Each
variant is the preset with one config block merged over it (what `context-guru simulate --preset
P --config BLOCK.yaml` runs). Prints the simulator's report: cost beside the retention floor.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from cg.components import COMPONENTS
from cg.settings import Config, load_config
from cg.simulate.report import text
from cg.simulate.run import BASELINE, load_corpus, replay

# Each variant: a `cg_config` block merged over the preset.
BEFORE = "components: {summarize: {keep_user_tokens: 0, keep_artifact_tokens: 0, "
BEFORE += "summary_level: regular, trigger: {min_request_tokens: 60000}}}"
VARIANTS: dict[str, str] = {
    "today: 60k, regular, no floor": BEFORE,
    "floor at its defaults (60k, regular)": "components: {summarize: {keep_artifact_tokens: 4000, "
    "summary_level: regular, trigger: {min_request_tokens: 60000}}}",
    "trail 16k (60k, regular)": "components: {summarize: {summary_level: regular, "
    "trigger: {min_request_tokens: 60000}}}",
    "trail 16k, concise (60k)": "components: {summarize: {trigger: {min_request_tokens: 60000}}}",
    "30k": "components: {summarize: {trigger: {min_request_tokens: 30000}}}",
    "40k": "",
    "50k": "components: {summarize: {trigger: {min_request_tokens: 50000}}}",
    "100k": "components: {summarize: {trigger: {min_request_tokens: 100000}}}",
    "40k regular": "components: {summarize: {summary_level: regular}}",
    "mask (its defaults)": "pipeline: [mask]",
    "mask, 5 rounds": "pipeline: [mask]\ncomponents: {mask: {keep_last_rounds: 5}}",
    "mask, remask 40k": "pipeline: [mask]\ncomponents: {mask: {remask_tokens: 40000}}",
    "mask + summarize (60k)": "pipeline: [mask, summarize]\n"
    "components: {summarize: {trigger: {min_request_tokens: 60000}}}",
    "mask 5 rounds + summarize 100k": "pipeline: [mask, summarize]\ncomponents: {mask: "
    "{keep_last_rounds: 5}, summarize: {trigger: {min_request_tokens: 100000}}}",
}


def config(preset: str, block: str) -> Config:
    if not block:
        return load_config(preset, None, list(COMPONENTS))
    fd, path = tempfile.mkstemp(suffix=".yaml")
    try:
        os.write(fd, block.encode())
        os.close(fd)
        return load_config(preset, path, list(COMPONENTS))
    finally:
        os.unlink(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.presets", description=__doc__)
    ap.add_argument("corpus", type=Path)
    ap.add_argument("--preset", action="append", default=None)
    args = ap.parse_args(argv)
    files = sorted(str(p) for p in args.corpus.glob("*.jsonl"))
    if not files:
        print(f"no *.jsonl in {args.corpus}: run python -m bench.sessions first", file=sys.stderr)
        return 2
    corpus = load_corpus(files)
    configs: dict[str, Config | None] = {"off": config("off", ""), BASELINE: None}
    for preset in args.preset or ["claude-code", "codex", "summarize"]:
        for name, block in VARIANTS.items():
            configs[f"{preset} | {name}"] = config(preset, block)
    print(text(replay(corpus, configs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
