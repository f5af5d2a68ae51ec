"""A script with the addon's three hooks doing nothing: the floor any mitmproxy script pays.

`python -m bench.trees bench/floor TREE --size 3000 --dialect anthropic --set cg_preset=off`
runs it beside a tree and plain mitmdump. It declares the options `bench.trees` sets and answers
`/_cg/health` as the addon would (a version and a preset), so the harness takes it for a tree;
every other request passes through untouched. Its cost over plain mitmdump on the small turn is
in docs/benchmarks.md ("The small turn"): the floor any script pays.
"""

from __future__ import annotations

import json
from typing import Any

from mitmproxy import http


class Floor:
    version = "floor"  # what `/_cg/health` says this script is (`bench/spin` builds on it)

    def load(self, loader: Any) -> None:
        loader.add_option("cg_preset", str, "off", "(bench.trees sets it; unused)")
        loader.add_option("cg_db", str, "", "(bench.trees sets it; unused)")

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.request.path.startswith("/_cg/"):
            health = {"ok": True, "version": self.version, "preset": "off", "summaries": {}}
            flow.response = http.Response.make(
                200, json.dumps(health).encode(), {"content-type": "application/json"}
            )

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        pass

    async def response(self, flow: http.HTTPFlow) -> None:
        pass


addons = [Floor()]
