"""mitmproxy entry point: `mitmdump -s cg_addon.py`."""

from cg.addon import ContextGuru

addons = [ContextGuru()]
