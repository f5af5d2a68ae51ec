"""mitmproxy entry point: `mitmdump -s cg_addon.py`. context-guru's addons, in the order
mitmproxy calls them (`cg.proxy.addon`)."""

from cg.proxy.addon import addons as _addons

addons = _addons()
