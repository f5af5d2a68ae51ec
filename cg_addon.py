"""mitmproxy entry point: `mitmdump -s cg_addon.py`."""

from cg.proxy.addon import ContextGuru

addons = [ContextGuru()]
