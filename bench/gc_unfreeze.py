"""An experiment, not part of the addon: undo the addon's `gc.freeze()`, to measure without it.

`python -m bench.proxy_latency --extra-script bench/gc_unfreeze.py` loads it after
`cg_addon.py`, so its `running` hook runs after the addon's: `gc.unfreeze()` puts the start-up
heap back into the oldest generation, as if it had never been frozen, and every full collection
walks it again. The probe's "frozen objects" count (0) confirms it. See docs/benchmarks.md.
"""

from __future__ import annotations

import gc


class GcUnfreeze:
    def running(self) -> None:
        gc.unfreeze()


addons = [GcUnfreeze()]
