"""mitmproxy's entry point inside the package: `mitmdump -s "$(context-guru addon-path)"`, or
`context-guru proxy`, which runs mitmdump with it. The same addons as the repository's
`cg_addon.py`, so an installed wheel needs no checkout beside it."""

from cg.proxy.addon import addons as _addons

addons = _addons()
