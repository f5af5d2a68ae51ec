"""mitmweb with the addon, over a summarized 14-turn session, in a real browser (Debian's
chromium, headless, driven by playwright; never a downloaded browser): what a person sees.

- the `context-guru` view is chosen by default for a rewritten request, and shows the summary
  whole; the `context-guru original` view is one click away and rebuilt byte-for-byte;
- Revert is enabled on a rewritten flow (and not on one the addon left alone);
- the summarizer's own call is a flow, marked and commented, its key redacted, and the
  commissioning flow's comment names it;
- the dashboard at `/_cg/` shows the figures `/_cg/stats` and `/_cg/sessions` serve;
- the flow file mitmweb saved, read back with `mitmdump -n -r … --flow-detail 3`, shows the
  same view.

Without chromium these tests are skipped saying how to install it — unless `CG_REQUIRE_BROWSER`
is set (`.ci/run` sets it), when they fail. `CG_SCREENSHOTS=docs/img` writes the
screenshots of docs/mitmweb.md.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.harness import MITMDUMP, REPO
from tests.e2e.web import (
    CHROMIUM,
    REQUIRE_ENV,
    SCREENSHOTS_ENV,
    SECRET,
    SUMMARY,
    Web,
    browser_missing,
    drive,
    start_mitmweb,
)
from tests.support.fakeprovider import FakeProvider

pytestmark = pytest.mark.e2e


def _require_browser() -> None:
    why = browser_missing()
    if why is None:
        return
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(f"{REQUIRE_ENV} is set and {why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="module")
def web(provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Web]:
    _require_browser()
    w = start_mitmweb(provider, tmp_path_factory.mktemp("mitmweb"))
    try:
        w.records = drive(w, provider)
        yield w
    finally:
        w.stop()
    assert not w.proxy.addon_errors(), w.proxy.log_text()


@pytest.fixture(scope="module")
def browser(web: Web) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A page in a context of its own, closed after the test with its connections (an open
    keep-alive connection to the proxy would be cut mid-read when mitmweb stops)."""
    context = browser.new_context(viewport={"width": 1500, "height": 950})
    try:
        yield context.new_page()
    finally:
        context.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where screenshots go: CG_SCREENSHOTS (docs/img, for docs/mitmweb.md), else a temp folder."""
    out = os.environ.get(SCREENSHOTS_ENV)
    path = (REPO / out) if out else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def flows_json(web: Web) -> list[dict[str, Any]]:
    """mitmweb's own list of flows (its REST API, what its UI renders)."""
    r = httpx.get(f"{web.web_url}/flows", trust_env=False, timeout=10)
    assert r.status_code == 200
    flows: list[dict[str, Any]] = r.json()
    return flows


def open_flow(page: Any, web: Web, comment_prefix: str, last: bool = True) -> None:
    page.goto(web.web_url)
    rows = page.locator("tr", has_text=comment_prefix)
    rows.first.wait_for()
    (rows.last if last else rows.first).click()
    page.locator(".flow-detail, .flowview, pre").first.wait_for()


def content(page: Any) -> str:
    """The text of the content view's lines as the page shows them."""
    pre = page.locator("pre").last
    pre.wait_for()
    text: str = pre.inner_text()
    return text


def test_the_view_is_chosen_and_shows_the_summary_whole(web: Web, page: Any, shots: Path) -> None:
    outcomes = [r["outcome"] for r in web.records]
    assert outcomes.count("rewritten") >= 10, outcomes  # vacuity: a summarized session
    open_flow(page, web, "cg: rewritten")
    page.get_by_text("context-guru: rewritten").first.wait_for()  # the view auto picked
    text = content(page)
    assert text.startswith("cg: rewritten ")
    assert "session web-demo-session" in text and "preset summarize" in text
    assert re.search(r"stash [0-9a-f]{16,}", text)
    assert "── the summary" in text and "── tail" in text
    flat = " ".join(text.split())
    assert all(word in flat for word in SUMMARY.split()), "the summary is not shown whole"
    assert "→ Bash" in text and "← Bash" in text  # a tool call and its result, by name
    assert "[tool_result]" not in text
    page.screenshot(path=str(shots / "mitmweb-view.png"))


def test_the_original_is_one_click_away_and_revert_works(web: Web, page: Any, shots: Path) -> None:
    open_flow(page, web, "cg: rewritten")
    revert = page.get_by_role("button", name="Revert")
    assert revert.is_enabled()
    page.get_by_text("View:").click()
    page.get_by_role("link", name="context-guru original").click()
    page.locator("pre", has_text="context-guru original: the request").wait_for()
    text = content(page)
    head = " ".join(text.splitlines()[:3])
    assert "as the client sent" in head and "bytes" in head, head
    assert '"messages"' in text
    page.screenshot(path=str(shots / "mitmweb-original.png"))
    # A flow the addon passed through untouched has nothing to revert (vacuity).
    open_flow(page, web, "/v1/messages", last=False)
    assert not page.get_by_role("button", name="Revert").is_enabled()


def test_the_summarizer_call_is_a_flow_linked_from_its_commission(
    web: Web, page: Any, shots: Path
) -> None:
    flows = flows_json(web)
    summaries = [f for f in flows if f.get("comment", "").startswith("cg: summary of messages")]
    commissions = [f for f in flows if f.get("comment", "").startswith("cg: commissioned")]
    assert summaries and len(commissions) == 1, [f.get("comment") for f in flows]
    stats = web.proxy.stats()["summaries"]
    assert len(summaries) == stats["commissioned"]  # one flow per summary (no retry here)
    for summary in summaries:
        (by,) = [f for f in flows if summary["id"][:8] in f.get("comment", "") and f is not summary]
        assert by["id"][:8] in summary["comment"]  # the commissioning flow links to it, and back
        assert summary["marked"] and by["marked"]
        headers = dict(summary["request"]["headers"])
        assert headers.get("x-api-key") == "[redacted by context-guru]"
    assert commissions[0]["id"][:8] in summaries[0]["comment"]
    assert SECRET not in httpx.get(f"{web.web_url}/flows", trust_env=False).text
    open_flow(page, web, "cg: summary of messages")
    page.get_by_text("context-guru: summary").first.wait_for()
    page.screenshot(path=str(shots / "mitmweb-summarizer-flow.png"))
    page.goto(web.web_url)
    page.locator("tr", has_text="cg: rewritten").first.wait_for()
    page.screenshot(path=str(shots / "mitmweb-list.png"))


def test_the_dashboard_shows_the_stats(web: Web, page: Any, shots: Path) -> None:
    page.goto(f"{web.proxy.url}/_cg/")
    page.locator("[data-figure=saved_usd]").first.wait_for()
    stats = web.proxy.stats()
    seen = {
        el.get_attribute("data-figure"): el.get_attribute("data-value")
        for el in page.locator("[data-figure]").all()
        if not (el.get_attribute("data-figure") or "").startswith("session:")
    }
    flat: dict[str, Any] = {**stats, **stats["savings"]}
    flat["summaries.completed"] = stats["summaries"]["completed"]
    retention = stats["retention"]
    flat.update({f"retention.{k}": retention[k] for k in ("turns", "mean", "min")})
    flat.update({f"retention.by_kind.{k}": v for k, v in retention["by_kind"].items()})
    flat.update({f"ledger.{k}": v for k, v in stats["ledger"]["savings"].items()})  # all time
    assert retention["turns"] > 0  # vacuity: the session's rewritten turns were measured
    assert seen, "no figure on the page"
    for name, value in seen.items():
        want = flat[str(name)]
        assert value == ("" if want is None else str(want)), (name, value, want)
    assert isinstance(stats["savings"]["saved_usd"], float)  # vacuity: dollars were priced
    body = page.locator("body").inner_text()
    assert "ESTIMATE" in body and "web-demo-session" in body and SECRET not in body
    row = page.locator("tr[data-session='web-demo-session'] [data-figure='session:saved_usd']")
    mine = web.proxy.sessions()["web-demo-session"]
    assert row.get_attribute("data-value") == str(mine["savings"]["saved_usd"])
    assert page.locator("svg polyline").count() == 2
    page.screenshot(path=str(shots / "dashboard.png"), full_page=True)


def test_the_saved_flow_file_reads_back_with_the_view(web: Web, browser: Any) -> None:
    """Last: stops mitmweb, so its flow file is complete (the browser first: a keep-alive
    connection it holds to the proxy would be cut mid-read, and mitmproxy logs that)."""
    browser.close()
    web.stop()
    raw = web.flows.read_bytes()
    assert b"cg: rewritten" in raw and SECRET.encode() not in raw
    out = subprocess.run(
        [
            str(MITMDUMP),
            "-n",
            "-r",
            str(web.flows),
            "-s",
            str(REPO / "cg_addon.py"),
            "--set",
            f"cg_db={web.db}",
            "--set",
            "cg_preset=summarize",
            "--flow-detail",
            "3",
        ],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HOME": str(web.workdir)},
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "cg: rewritten" in text and "── the summary" in text
    assert "LAST-WORD-OF-THE-SUMMARY" in text
    assert "cg: summary of messages" in text and "cg: commissioned" in text
    assert SECRET not in text and "Traceback" not in text


def test_a_missing_browser_skips_locally_and_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    import tests.e2e.web as web_mod

    monkeypatch.setattr(web_mod, "CHROMIUM", Path("/nonexistent/chromium"))
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install -y chromium"):
        _require_browser()
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=REQUIRE_ENV):
        _require_browser()
