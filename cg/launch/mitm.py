"""mitmdump (or mitmweb) with the addon that ships in the package, run from this interpreter: an
installed wheel may have no `mitmdump` script on PATH beside it (its dependencies in another
environment). `context-guru proxy` runs it as given; the launcher starts it in reverse mode."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence

_MITM = "import sys; from mitmproxy.tools.main import {0}; sys.argv[0] = {0!r}; sys.exit({0}())"


def addon_path() -> str:
    """The addon entry that ships in the package (found without importing it: importing it
    makes the addons)."""
    spec = importlib.util.find_spec("cg.proxy.entry")
    if spec is None or spec.origin is None:
        raise OSError("the package has no cg/proxy/entry.py: a broken install")
    return spec.origin


def proxy_command(args: Sequence[str]) -> list[str]:
    """The command `context-guru proxy ARGS` runs: mitmdump (mitmweb for `--web`) with the
    packaged addon, then ARGS."""
    rest = list(args)
    tool = "mitmweb" if "--web" in rest else "mitmdump"
    rest = [a for a in rest if a != "--web"]
    return [sys.executable, "-c", _MITM.format(tool), "-s", addon_path(), *rest]
