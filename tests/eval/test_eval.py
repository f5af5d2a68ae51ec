"""`context-guru eval` (docs/eval.md) against a fake model that answers a probe only from what its
own request holds (tests/support/prober.py): the original scores everything, a rewrite scores
lower on exactly the facts its summary dropped, expand allowed recovers them; errors, the call
bound, the report's JSON, the key kept out of every output, the CLI as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cg import cli
from cg.eval.ask import CONDITIONS
from cg.eval.checkpoints import Checkpoint
from cg.eval.probes import normalise
from cg.eval.run import Result, evaluate
from cg.retention.facts import is_human
from cg.summarize.component import Commission
from tests.eval.sessions import CONFIG, synthetic
from tests.support.fakeprovider import FakeProvider, Reply
from tests.support.prober import Prober

KEY = "sk-ant-eval-SECRET-0123456789"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic(tmp_path_factory.mktemp("eval") / "synthetic.jsonl")


@pytest.fixture(scope="module")
def window(tmp_path_factory: pytest.TempPathFactory) -> str:
    cfg = tmp_path_factory.mktemp("eval") / "eval.yaml"
    cfg.write_text(CONFIG)
    return str(cfg)


@pytest.fixture
def provider() -> Iterator[tuple[FakeProvider, Prober]]:
    prober = Prober()
    with FakeProvider() as p:
        p.responder = prober
        yield p, prober


class Carrier:
    """A summarizer whose summary carries every other human user text of its span verbatim
    (and says nothing else): which ones it carried is kept, to be checked against the scores."""

    def __init__(self) -> None:
        self.carried: list[str] = []
        self.dropped: list[str] = []

    def __call__(self, cfg: object, level: str) -> Any:
        async def write(prompt: str, job: Commission) -> str:
            texts = []
            for src in job.sources:
                m = json.loads(src)
                content = m.get("content") if m.get("role") == "user" else None
                for b in content if isinstance(content, list) else [content]:
                    t = b.get("text") if isinstance(b, dict) else b
                    if isinstance(t, str) and is_human(t):
                        texts.append(t)
            self.carried += texts[::2]
            self.dropped += texts[1::2]
            return "<summary>The user said:\n" + "\n\n".join(texts[::2]) + "</summary>"

        return write


def _summary(cp: Checkpoint) -> str:
    """The normalised text of the summary message a checkpoint's rewritten request sent."""
    texts = [
        m["content"]
        for m in json.loads(cp.rewritten)["messages"]
        if isinstance(m["content"], str) and m["content"].startswith("=== History Summary ===")
    ]
    assert len(texts) == 1
    return normalise(texts[0])


def run(trace: Path, window: str, url: str, **kw: Any) -> Result:
    result = evaluate(
        [trace],
        "summarize",
        config_file=window,
        base_url=url,
        env={"ANTHROPIC_API_KEY": KEY, "OPENAI_API_KEY": KEY},
        **kw,
    )
    assert result is not None
    return result


def test_original_is_right_the_summary_loses_what_it_dropped_expand_recovers_it(
    trace: Path, window: str, provider: tuple[FakeProvider, Prober]
) -> None:
    p, prober = provider
    carrier = Carrier()
    result = run(trace, window, p.url, summarizers=carrier, probes=40, concurrency=3)
    asked = [(r.checkpoint, a) for r in result.checkpoints for a in r.asked]
    kinds = {a.probe.kind for _, a in asked}
    assert kinds == {"user", "file", "command", "error"}  # vacuity: every kind is probed
    user = [a.probe.expected for _, a in asked if a.probe.kind == "user"]
    assert set(user) & set(carrier.carried) and set(user) & set(carrier.dropped)
    for cp, a in asked:
        assert a.score("original") is True, a.probe
        # A user message is right exactly when the summary message carries it verbatim (the
        # summary's text, or whatever else the message holds); a call's detail never (the
        # calls it replaced are not there to count).
        carried = a.probe.kind == "user" and normalise(a.probe.expected) in _summary(cp)
        assert a.score("rewritten") is carried, a.probe
        assert a.score("rewritten+expand") is True, a.probe
    assert any(a.score("rewritten") for _, a in asked if a.probe.expected in carrier.carried)
    asked_ = [a for _, a in asked]
    expanded = {k for a in asked_ for k in a.answers["rewritten+expand"].expanded}
    assert expanded and expanded <= {k for r in result.checkpoints for k in r.checkpoint.keys}
    assert prober.expand_calls > 0
    t = result.totals.to_json()
    assert t["original"]["score"] == 1.0
    assert t["rewritten"]["correct"] < t["original"]["correct"]
    assert t["rewritten+expand"]["score"] == 1.0
    # Every call went out with the key, and was counted; its usage summed.
    assert result.calls == len(p.requests) == len(prober.keys_seen)
    assert set(prober.keys_seen) == {KEY}
    [usage] = result.usage.values()
    assert usage.requests == result.calls and usage.input_tokens > 0
    assert result.cost_usd is not None and result.cost_usd > 0


@pytest.mark.parametrize("dialect", ["openai", "responses"])
def test_the_openai_dialects_score_the_same_way(
    tmp_path: Path, window: str, provider: tuple[FakeProvider, Prober], dialect: str
) -> None:
    p, prober = provider
    trace = synthetic(tmp_path / f"{dialect}.jsonl", dialect)
    result = run(trace, window, p.url, probes=8, concurrency=2)
    [r] = result.checkpoints
    assert r.checkpoint.dialect == dialect and len(r.asked) == 8
    assert {a.probe.kind for a in r.asked} == {"user", "file", "command", "error"}
    t = result.totals.to_json()
    assert t["original"]["score"] == 1.0 and t["rewritten+expand"]["score"] == 1.0
    assert t["rewritten"]["correct"] < t["rewritten"]["asked"] == 8  # the stand-in's filler
    assert prober.expand_calls > 0
    assert all(r.header("authorization") == f"Bearer {KEY}" for r in p.requests)
    path = "/v1/responses" if dialect == "responses" else "/v1/chat/completions"
    assert {r.path for r in p.requests} == {path}


def test_the_probe_requests_are_the_conditions_requests(
    trace: Path, window: str, provider: tuple[FakeProvider, Prober]
) -> None:
    p, _ = provider
    result = run(trace, window, p.url, probes=1, concurrency=1)
    [cp] = [r.checkpoint for r in result.checkpoints]
    first = [r.json() for r in p.requests[:3]]
    client = json.loads(cp.original)
    assert len(first[0]["messages"]) == len(client["messages"]) + 1  # the question, last
    assert first[0]["messages"][:-1] == client["messages"]
    assert first[0]["messages"][-1]["content"].startswith("[context-guru eval]")
    assert first[0]["tool_choice"] == {"type": "none"} and first[0]["stream"] is False
    sent = json.loads(cp.rewritten)
    assert first[1]["messages"][:-1] == sent["messages"]
    assert first[1]["messages"][1]["content"].startswith("=== History Summary ===")
    assert first[2]["tool_choice"] == {"type": "auto"}
    names = [t["name"] for t in first[2]["tools"]]
    assert names.count("context_guru_expand") == 1
    assert all(r.header("x-api-key") == KEY for r in p.requests)


def test_a_failed_call_is_an_error_not_a_wrong_answer(
    trace: Path, window: str, provider: tuple[FakeProvider, Prober]
) -> None:
    p, _ = provider
    p.script(*[Reply.json(500, {"error": {"message": f"overloaded for {KEY}"}}) for _ in range(4)])
    result = run(trace, window, p.url, probes=4, concurrency=1)
    t = result.totals.to_json()
    errors = sum(t[c]["errors"] for c in CONDITIONS)
    assert errors == 4
    assert sum(t[c]["asked"] for c in CONDITIONS) == 3 * 4 - 4
    assert t["original"]["score"] == 1.0  # what was answered is still all right
    reported = json.dumps(result.to_json())
    assert "HTTP 500" in reported and KEY not in reported and "[key]" in reported


def test_max_calls_is_never_exceeded(
    trace: Path, window: str, provider: tuple[FakeProvider, Prober]
) -> None:
    p, _ = provider
    result = run(trace, window, p.url, probes=12, max_calls=10, concurrency=2)
    assert result.plan.probes == 3 and result.plan.left_out == 9 - 3
    assert len(p.requests) == result.calls == 10  # the 9 first calls and one expand round
    out = result.to_json()
    assert out["plan"]["calls"] == 9 and out["calls"] == 10
    # The expand rounds the bound refused are errors, not wrong answers.
    expand = out["totals"]["rewritten+expand"]
    assert expand["errors"] >= 1 and expand["asked"] + expand["errors"] == 3


def test_the_json_report(
    trace: Path,
    window: str,
    provider: tuple[FakeProvider, Prober],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    p, _ = provider
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    argv = ["eval", str(trace), "--config", window, "--base-url", p.url, "--probes", "4"]
    assert cli.main([*argv, "--yes", "--json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert set(doc) >= {"preset", "plan", "totals", "checkpoints", "calls", "usage", "cost_usd"}
    assert doc["plan"] == {
        "checkpoints": 1,
        "probes": 4,
        "left_out": 0,
        "calls": 12,
        "most_calls": 24,
    }
    [cp] = doc["checkpoints"]
    assert cp["session"] == "synthetic" and cp["span"] == [1, 11] and len(cp["ids"]) == 1
    assert [f["kind"] for f in cp["facts"]] == ["user", "file", "command", "error"]
    assert set(cp["scores"]) == set(CONDITIONS)
    assert cp["scores"]["original"]["by_kind"]["file"] == {"correct": 1, "asked": 1, "errors": 0}
    probe = cp["probes"][0]
    assert set(probe["answers"]) == set(CONDITIONS)
    assert probe["answers"]["original"]["correct"] is True
    assert doc["totals"]["original"]["score"] == 1.0
    assert doc["usage"]["claude-sonnet-4-5"]["requests"] == doc["calls"]
    assert "12 calls" in captured.err  # the plan, said up front
    assert KEY not in captured.out + captured.err


def _cli(
    *args: str, env: dict[str, str], stdin: int | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cg", "eval", *args],
        cwd=ROOT,
        env=env,
        stdin=stdin if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_cli_end_to_end(
    trace: Path, window: str, provider: tuple[FakeProvider, Prober]
) -> None:
    p, prober = provider
    env = {**os.environ, "ANTHROPIC_API_KEY": KEY, "PYTHONPATH": str(ROOT)}
    base = [str(trace), "--config", window, "--base-url", p.url, "--probes", "4"]
    # Not confirmed (stdin is no terminal, no --yes): nothing is sent.
    refused = _cli(*base, env=env)
    assert refused.returncode == 2 and "--yes" in refused.stderr
    assert "12 calls" in refused.stderr and not p.requests
    done = _cli(*base, "--yes", env=env)
    assert done.returncode == 0, done.stderr
    assert len(p.requests) == 12 + prober.expand_calls and prober.expand_calls > 0
    out = done.stdout
    assert "synthetic turn 6" in out and "rewritten+expand" in out and "calls made:" in out
    assert "4/4 100%" in out  # the original condition
    assert KEY not in out + done.stderr + refused.stdout + refused.stderr
    # No key: refused before anything is asked.
    bare = {k: v for k, v in env.items() if k != "ANTHROPIC_API_KEY"}
    nokey = _cli(*base, "--yes", env=bare)
    assert nokey.returncode == 2 and "ANTHROPIC_API_KEY" in nokey.stderr
    assert len(p.requests) == 12 + prober.expand_calls


@pytest.mark.parametrize(("typed", "asked"), [("n\n", False), ("yes\n", True)])
def test_on_a_terminal_it_asks_before_spending(
    trace: Path, window: str, provider: tuple[FakeProvider, Prober], typed: str, asked: bool
) -> None:
    import pty

    p, _ = provider
    env = {**os.environ, "ANTHROPIC_API_KEY": KEY, "PYTHONPATH": str(ROOT)}
    leader, follower = pty.openpty()
    try:
        os.write(leader, typed.encode())  # held by the terminal until the question reads it
        done = _cli(
            str(trace),
            "--config",
            window,
            "--base-url",
            p.url,
            "--probes",
            "1",
            "--json",
            env=env,
            stdin=follower,
        )
    finally:
        os.close(leader)
        os.close(follower)
    assert "Proceed? [y/N]" in done.stderr and "3 calls" in done.stderr
    assert done.returncode == (0 if asked else 2)
    if asked:
        doc = json.loads(done.stdout)
        assert doc["totals"]["original"]["score"] == 1.0
        assert len(p.requests) == doc["calls"] >= 3  # (and an expand round, if one was needed)
    else:
        assert not p.requests and not done.stdout


def test_sessions_of_two_dialects_in_one_file_each_go_to_their_own_endpoint(
    tmp_path: Path, window: str, provider: tuple[FakeProvider, Prober]
) -> None:
    p, _ = provider
    mixed = tmp_path / "mixed.jsonl"
    a = synthetic(tmp_path / "a.jsonl").read_text()
    mixed.write_text(a + synthetic(tmp_path / "b.jsonl", "responses").read_text())
    result = run(mixed, window, p.url, probes=2, concurrency=2)
    labels = [r.checkpoint.label for r in result.checkpoints]
    assert len(labels) == len(set(labels)) == 2 and all(x.startswith("mixed:") for x in labels)
    assert set(result.plan.endpoints) == {"anthropic", "responses"}
    assert {r.path for r in p.requests} == {"/v1/messages", "/v1/responses"}
    assert set(result.usage) == {"claude-sonnet-4-5", "gpt-5"}
    assert result.totals.to_json()["original"]["score"] == 1.0


@pytest.mark.parametrize(
    "bad",
    [["--probes", "0"], ["--max-calls", "0"], ["--concurrency", "0"], ["--summary-ratio", "2"]],
)
def test_bad_options_are_refused_before_anything_is_read(
    bad: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["eval", "/nonexistent.jsonl", *bad, "--yes"]) == 2
    assert bad[0] in capsys.readouterr().err
