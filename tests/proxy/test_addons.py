"""cg.proxy.addon: the entry script gives mitmproxy context-guru's addons, on one runtime, in
the order their hooks must run, each under a name of its own."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path
from typing import Any

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from mitmproxy.proxy.layers.http._hooks import HttpRequestHook, HttpResponseHook
    from mitmproxy.test import taddons, tflow, tutils

from cg.proxy.addon import META
from cg.proxy.runtime import Runtime

ENTRY = Path(__file__).resolve().parents[2] / "cg_addon.py"


def entry_addons() -> list[Any]:
    spec = importlib.util.spec_from_file_location("cg_addon_under_test", ENTRY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.addons)


def test_the_entry_lists_the_addons_in_hook_order_on_one_runtime() -> None:
    addons = entry_addons()
    assert [type(a).__name__ for a in addons] == [
        "Runtime",
        "Control",
        "Rewriter",
        "Answers",
        "Metering",
        "Redactor",
        "Views",
    ]
    rt = addons[0]
    assert isinstance(rt, Runtime)
    assert all(a.rt is rt for a in addons[1:-1])
    names = [getattr(a, "name", type(a).__name__.lower()) for a in addons]
    assert len(set(names)) == len(names) and all(n.startswith("contextguru") for n in names)


async def test_mitmproxy_runs_a_turn_through_the_list_as_one_addon_did() -> None:
    """Registered in mitmproxy's addon manager (which refuses a repeated name or option), a
    provider turn's hooks run through every addon: decided, metered, its key redacted."""
    addons = entry_addons()
    with taddons.context(*addons) as tctx:
        tctx.configure(addons[0], cg_preset="off")
        req = tutils.treq(method=b"POST", path=b"/v1/messages", host="api.anthropic.com")
        req.content = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
        req.headers["x-api-key"] = "sk-entry-test"
        f = tflow.tflow(req=req)
        master = tctx.master
        await master.addons.handle_lifecycle(HttpRequestHook(f))
        assert f.metadata[META]["outcome"] == "passed_through"
        assert f.id in addons[0].flows  # held until done
        f.response = tutils.tresp(status_code=200)
        await master.addons.handle_lifecycle(HttpResponseHook(f))
        assert f.id not in addons[0].flows
        assert f.request.headers["x-api-key"] == "[redacted by context-guru]"
