"""The addon's hooks as mitmproxy runs them, for in-process tests."""

from __future__ import annotations

import inspect
from typing import Any


async def request(addon: Any, flow: Any) -> None:
    """`addon.request(flow)`, and the awaitable it returns awaited (mitmproxy does so): a body
    too long to read on the event loop is read in the addon's worker thread."""
    out = addon.request(flow)
    if inspect.isawaitable(out):
        await out
