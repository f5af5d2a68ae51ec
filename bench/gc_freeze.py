"""An experiment, not part of the addon: `gc.freeze()` once mitmproxy is running.

`python -m bench.proxy_latency --extra-script bench/gc_freeze.py` loads it next to
`cg_addon.py`. Once mitmproxy is running, it moves every object alive (modules, classes,
mitmproxy's own state) into the permanent generation, so a full collection no longer walks
them. See "Proposals" in docs/benchmarks.md.
"""

from __future__ import annotations

import gc


class GcFreeze:
    def running(self) -> None:
        gc.freeze()


addons = [GcFreeze()]
