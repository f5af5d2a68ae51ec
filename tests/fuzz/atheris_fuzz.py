"""atheris entry point: `python -m tests.fuzz.atheris_fuzz TARGET [libFuzzer flags] [CORPUS_DIR]`.

Feeds one target of tests/fuzz/targets.py raw bytes, coverage-guided over cg/ (every module of
the package is imported instrumented before the targets). Run through
`python -m tests.fuzz.run --atheris SECONDS`, which seeds it with valid inputs from the
hypothesis strategies, counts the inputs and collects crashes.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import atheris

with atheris.instrument_imports(include=["cg"]):
    import cg

    for _mod in pkgutil.walk_packages(cg.__path__, "cg."):
        if not _mod.name.endswith("__main__"):  # cg.__main__ runs the CLI
            importlib.import_module(_mod.name)

from tests.fuzz.targets import TARGETS


def main() -> None:
    name = sys.argv.pop(1)
    atheris.Setup(sys.argv, TARGETS[name].run)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
