"""A real `mitmweb -s cg_addon.py` over a summarized session, for the browser tests (and for a
person: `python -m tests.e2e.web` starts one and prints its addresses until Enter).

`summarized_mitmweb(provider, workdir)` starts mitmweb in reverse mode in front of the fake
provider, with the summarize preset's triggers lowered, prices for the fake model (so the
dashboard has dollars) and a flow file (`save_stream_file`), then drives a 14-turn Anthropic
session with a tool exchange through it: the first qualifying turn commissions a summary (the
fake model answers a long one), and the later turns are rewritten.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.e2e.harness import Proxy, low
from tests.support.fakeprovider import FakeProvider, Reply

MITMWEB = Path(sys.executable).parent / "mitmweb"
CHROMIUM = Path("/usr/bin/chromium")
REQUIRE_ENV = "CG_REQUIRE_BROWSER"  # set by .ci/run: a missing browser fails, never skips
SCREENSHOTS_ENV = "CG_SCREENSHOTS"  # a folder for the screenshots (docs/img: docs/mitmweb.md)
INSTALL_HINT = (
    "the browser tests drive Debian's chromium headless: install it with "
    "`sudo apt-get update && sudo apt-get install -y chromium` (playwright never downloads one)"
)
SECRET = "sk-ant-WEB-E2E-SECRET-0001"
SESSION = "web-demo-session"
TURNS = 14
SUMMARY = (
    "The user asked for the parser tests to pass. The assistant ran pytest with the Bash tool "
    "and test_nested failed; it then read parser.py step by step, from line 30 onwards, "
    "noting where nested brackets are handled, and kept going as the user asked, carefully. "
    "Decisions so far: keep the public API of parse() unchanged; fix the nesting counter "
    "rather than rewrite the tokenizer; add a regression test for three levels of nesting. "
    "Open questions: whether empty groups are legal input. LAST-WORD-OF-THE-SUMMARY."
)
PRICES = {
    "claude-test": {
        "input": 3.0,
        "cache_write_5m": 3.75,
        "cache_write_1h": 6.0,
        "cache_read": 0.3,
        "output": 15.0,
    }
}
# The columns a person wants: the mark (icon), the path, the status and the comment.
COLUMNS = ("icon", "index", "method", "path", "status", "size", "time", "comment")


def free_port() -> int:
    """A port nobody listens on now (mitmweb's web port cannot be 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not CHROMIUM.exists() or shutil.which(str(CHROMIUM)) is None:
        return f"{CHROMIUM} is missing: {INSTALL_HINT}"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed: pip install -e '.[test]'"
    return None


@dataclass
class Web:
    proxy: Proxy
    web_port: int
    flows: Path  # the flow file mitmweb writes as flows finish
    db: Path
    workdir: Path
    records: list[dict[str, Any]] = field(default_factory=list)  # the session's decisions

    @property
    def web_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    def stop(self) -> None:
        self.proxy.stop()


def start_mitmweb(provider: FakeProvider, workdir: Path) -> Web:
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "cg.yaml"
    summarize = low(min_messages=6, resummarize_tokens=3000, model={"share_cache": "never"})
    config.write_text(yaml.safe_dump({"components": {"summarize": summarize}, "prices": PRICES}))
    db, flows, port = workdir / "cg.sqlite3", workdir / "flows.mitm", free_port()
    proxy = Proxy.start(
        provider.url,
        workdir,
        preset="summarize",
        program=MITMWEB,
        args=["--web-host", "127.0.0.1", "--web-port", str(port)],
        options=[
            f"cg_db={db}",
            f"cg_config={config}",
            "web_open_browser=false",
            f"save_stream_file={flows}",
            *(f"web_columns={c}" for c in COLUMNS),
        ],
    )
    return Web(proxy, port, flows, db, workdir)


def transcript(steps: int) -> list[dict[str, Any]]:
    """The task, then `steps` tool rounds: the assistant runs Bash, the tool answers."""
    out: list[dict[str, Any]] = [
        {"role": "user", "content": "Task: make the parser tests pass. Ünïcödé ✓"}
    ]
    for i in range(1, steps + 1):
        call = {
            "type": "tool_use",
            "id": f"toolu_{i:03d}",
            "name": "Bash",
            "input": {"command": f"pytest tests/test_parser.py -k step{i}"},
        }
        out.append({"role": "assistant", "content": [{"type": "text", "text": f"Step {i}."}, call]})
        passed = "\n".join(
            f"tests/test_parser.py::test_case_{j:02d} PASSED  [{j * 2:3d}%]" for j in range(40)
        )
        result = (
            f"step {i}: 40 passed, 1 failed\n{passed}\n"
            "FAILED tests/test_parser.py::test_nested\n"
            "E   assert parse('((a))') == [['a']]\nE   IndexError: pop from empty list"
        )
        out.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": f"toolu_{i:03d}", "content": result}
                ],
            }
        )
    return out


def drive(web: Web, provider: FakeProvider, turns: int = TURNS) -> list[dict[str, Any]]:
    """The session's turns through the proxy: each sends the whole transcript so far; the
    decision record of each, in order. Waits (on conditions) for the summary after the turn
    that commissioned it."""
    provider.script_summarizer(*[Reply(text=f"<summary>{SUMMARY}</summary>")] * turns)
    records: list[dict[str, Any]] = []
    headers = {
        "x-api-key": SECRET,
        "anthropic-version": "2023-06-01",
        "x-context-guru-session": SESSION,
        "content-type": "application/json",
    }
    with httpx.Client(base_url=web.proxy.url, trust_env=False, timeout=30) as c:
        for t in range(turns):
            body = {
                "model": "claude-test",
                "max_tokens": 64,
                "system": "You are a careful engineer.",
                "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
                "messages": transcript(2 + t),  # one tool round more every turn
            }
            eid = f"web-turn-{t:02d}"
            r = c.post("/v1/messages", json=body, headers={**headers, "x-e2e-id": eid})
            assert r.status_code == 200, r.text
            rec = web.proxy.records.cg(eid)
            records.append(rec)
            if any("commission" in comp for comp in rec.get("components", ())):
                # The summary lands before the next turn, as it would in a slower session.
                want: int = web.proxy.stats()["summaries"]["commissioned"]

                def landed(s: dict[str, Any], want: int = want) -> bool:
                    return bool(s["summaries"]["completed"] + s["summaries"]["failed"] >= want)

                web.proxy.wait_stats(landed, 30)
    return records


def main() -> None:  # pragma: no cover - a person's demo
    workdir = Path(os.environ.get("CG_WEB_DIR", "/tmp/cg-web-demo"))
    with FakeProvider() as provider:
        web = start_mitmweb(provider, workdir)
        try:
            records = drive(web, provider)
            print("outcomes:", [r["outcome"] for r in records])
            print("mitmweb:", web.web_url, " dashboard:", web.proxy.url + "/_cg/")
            input("Enter stops it. ")
        finally:
            web.stop()


if __name__ == "__main__":  # pragma: no cover
    main()
