"""atheris entry point: `python -m tests.fuzz.atheris_fuzz TARGET [libFuzzer flags]`.

Feeds one target of tests/fuzz/targets.py raw bytes, coverage-guided over cg/. Run through
`python -m tests.fuzz.run --atheris SECONDS`, which counts the inputs and collects crashes.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports(include=["cg"]):
    from tests.fuzz.targets import TARGETS


def main() -> None:
    name = sys.argv.pop(1)
    run = TARGETS[name].run
    atheris.Setup(sys.argv, run)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
