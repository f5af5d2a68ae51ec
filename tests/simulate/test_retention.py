"""The simulator's retention (docs/savings.md#retention): per preset beside the cost, measured on
what each rewritten turn sent, counted here again from the contract's own definition (a fact is
visible when its text is in the JSON-decoded text of the sent transcript) on a small session
whose facts are known; the stand-in summarizer writes none; the report labels the floor."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import codex
from bench.sessions import Spec, codex_requests, generated
from cg import cli
from cg.billing.prices import price_table
from cg.components import COMPONENTS
from cg.expand.tool import SUMMARY_HEADER
from cg.pipeline.rewrite import Rewrite
from cg.retention.facts import KINDS, Fact, transcript_facts
from cg.retention.measure import strings
from cg.settings import load_config
from cg.simulate import compaction
from cg.simulate.proxy import Options, ProxyRun
from cg.simulate.report import text
from cg.simulate.retained import FLOOR_LABEL, LABEL
from cg.simulate.run import load_corpus, simulate
from cg.simulate.standin import StandIn
from cg.simulate.tally import Tally
from cg.simulate.trace import dumps_line
from cg.summarize.component import Commission

PAD = "\n".join(f"    {n:>4}\tvalue_{n} = compute(value_{n - 1}) + {n}" for n in range(1, 160))
CONSTRAINTS = (
    "Do not touch the migrations directory; keep the public API of parser.py unchanged.",
    "Keep every change inside src/app/store and never rename a public function.",
)


def _round(i: int) -> list[dict[str, Any]]:
    """One tool round with a file, a command and (every other round) an error of its own."""
    out = f"FAILED tests/test_mod{i}.py::test_case{i} - AssertionError: {i} != 0\n{PAD}"
    if i % 2:
        out = f"{i} passed in 0.{i}s\n{PAD}"
    return [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": f"Round {i}: editing and running the tests."},
                {
                    "type": "tool_use",
                    "id": f"toolu_e{i}",
                    "name": "Edit",
                    "input": {
                        "file_path": f"/repo/src/app/mod{i}.py",
                        "old_string": "a",
                        "new_string": "b",
                    },
                },
                {
                    "type": "tool_use",
                    "id": f"toolu_b{i}",
                    "name": "Bash",
                    "input": {"command": f"python -m pytest -q tests/test_mod{i}.py"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": f"toolu_e{i}", "content": "updated"},
                {"type": "tool_result", "tool_use_id": f"toolu_b{i}", "content": out},
            ],
        },
    ]


def transcript(rounds: int = 16) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "Fix the failing tests of the app."}]}
    ]
    for i in range(rounds):
        if i in (3, 9):  # a human constraint mid-session, after the agent ended its turn
            msgs.append({"role": "assistant", "content": [{"type": "text", "text": "Done."}]})
            text = CONSTRAINTS[i // 9]
            msgs.append({"role": "user", "content": [{"type": "text", "text": text}]})
        msgs += _round(i)
    return msgs


def bodies(msgs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every request of the session: each ends where an assistant message begins."""
    for n in range(1, len(msgs) + 1):
        if n == len(msgs) or msgs[n]["role"] == "assistant":
            yield {"model": "claude-sonnet-4-5", "max_tokens": 4096, "messages": msgs[:n]}


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ret") / "facts.jsonl"
    headers = {"anthropic-version": "2023-06-01", "x-claude-code-session-id": "ret-1"}
    with path.open("w", encoding="utf-8") as f:
        for n, body in enumerate(bodies(transcript())):
            f.write(dumps_line(1_764_500_000.0 + 20 * n, headers, body) + "\n")
    return path


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Summaries early and rolled forward often, so several spans with facts are replaced."""
    cfg = tmp_path_factory.mktemp("ret") / "early.yaml"
    cfg.write_text(
        "components: {summarize: {keep_last: 2, start_from_message: 2, min_tokens: 100,"
        " resummarize_tokens: 4000, trigger: {min_request_tokens: 6000}}}\n"
    )
    return str(cfg)


def facts_of(messages: list[Any]) -> set[Fact]:
    return {f.fact for f in transcript_facts("anthropic", messages) if f.text}


def visible(fact: Fact, sent: list[Any]) -> bool:
    """The contract's definition, from scratch: the fact's text in the sent transcript's
    JSON-decoded text (the summary message included)."""
    return any(fact.text in s for m in sent for s in strings(m))


def replay(session: Path, config: str) -> tuple[Tally, dict[int, tuple[bytes, bytes]]]:
    corpus = load_corpus([session], config)
    [s] = corpus.sessions
    loop = asyncio.new_event_loop()
    run = ProxyRun(
        load_config("summarize", config, list(COMPONENTS)),
        corpus.facts,
        price_table(),
        Options(),
        loop,
    )
    sent: dict[int, tuple[bytes, bytes]] = {}

    def keep(i: int, rw: Rewrite) -> None:
        client = s.turns[i].request.body
        sent[i] = (client, client if rw.body is None else rw.body)

    try:
        tally = run.session(s.turns, observe=keep)
    finally:
        run.close()
        loop.close()
    return tally, sent


def test_retention_per_turn_is_what_the_sent_request_shows(session: Path, config: str) -> None:
    tally, sent = replay(session, config)
    r = tally.retained
    rewritten = {i for i, (a, b) in sent.items() if a != b}
    assert tally.rewritten == len(rewritten) >= 4  # vacuity: several turns were summarized
    assert r.measured == len(rewritten) and r.unchanged == tally.turns - len(rewritten)
    ratios: list[float] = []
    kinds = {k: [0, 0] for k in KINDS}
    replaced = 0  # facts the kept messages alone do not show: only the summary could
    for i in sorted(rewritten):
        client = json.loads(sent[i][0])["messages"]
        out = json.loads(sent[i][1])["messages"]
        facts = facts_of(client)
        shown = {f for f in facts if visible(f, out)}
        kept = [m for m in out if not any(SUMMARY_HEADER in x for x in strings(m))]
        assert len(kept) < len(out)  # the summary message is there
        replaced += sum(not visible(f, kept) for f in facts)
        ratios.append(len(shown) / len(facts))
        for f in facts:
            kinds[f.kind][1] += 1
            kinds[f.kind][0] += f in shown
    assert len(r.series) == tally.turns
    assert [x for i, x in enumerate(r.series) if i not in rewritten] == [1.0] * r.unchanged
    assert [r.series[i] for i in sorted(rewritten)] == pytest.approx(ratios)
    assert r.low == pytest.approx(min(ratios)) and r.mean == pytest.approx(
        sum(ratios) / len(ratios)
    )
    assert {k: [r.visible[k], r.total[k]] for k in KINDS} == kinds
    assert all(kinds[k][1] > 0 for k in KINDS)  # every kind was there to count
    assert replaced > 0  # and some only the summary could show: the count is not vacuous


class Recording(StandIn):
    """The stand-in, its every summary kept with the span it covers."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[tuple[list[str], str]] = []

    async def __call__(self, prompt: str, job: Commission) -> str | None:
        out = await super().__call__(prompt, job)
        self.written.append((list(job.sources), out or ""))
        return out


def test_the_stand_in_writes_none_of_the_replaced_facts(session: Path, config: str) -> None:
    corpus = load_corpus([session], config)
    loop = asyncio.new_event_loop()
    cfg = load_config("summarize", config, list(COMPONENTS))
    run = ProxyRun(cfg, corpus.facts, price_table(), Options(), loop)
    run.standin = standin = Recording()
    try:
        run.session(corpus.sessions[0].turns)
    finally:
        run.close()
        loop.close()
    assert len(standin.written) >= 2
    kinds: set[str] = set()
    for sources, summary in standin.written:
        facts = facts_of([json.loads(src) for src in sources])
        kinds |= {f.kind for f in facts}
        assert [f for f in facts if f.text in summary] == []
    assert kinds == set(KINDS)  # vacuity: the replaced spans hold facts of every kind


def test_retention_appears_per_preset_in_the_json(session: Path, config: str) -> None:
    out = simulate([session], ["summarize", "agent-compaction"], config_file=config).to_json()
    for name, p in out["presets"].items():
        ret = p["retention"]
        assert ret["measured_turns"] == p["rewritten"], name
        assert ret["measured_turns"] + ret["unchanged_turns"] == p["turns"], name
        assert set(ret["by_kind"]) == set(KINDS)
    off, summ = out["presets"]["off"]["retention"], out["presets"]["summarize"]["retention"]
    assert off["measured_turns"] == 0 and off["min"] is None  # nothing rewritten, nothing lost
    assert summ["measured_turns"] > 0 and 0 < summ["min"] <= summ["mean"] <= 1
    assert summ["label"] == FLOOR_LABEL and summ["floor"] is True
    per = out["sessions"][0]["presets"]["summarize"]["retention"]
    assert len(per["series"]) == out["sessions"][0]["turns"]
    worst = per["worst"]
    assert worst["ratio"] == summ["min"]
    assert len(worst["lost"]) == min(5, worst["facts"] - worst["visible"])


def test_agent_compaction_keeps_only_what_follows_its_summary(tmp_path: Path) -> None:
    path = tmp_path / "long.jsonl"
    headers = {"anthropic-version": "2023-06-01", "x-claude-code-session-id": "ret-2"}
    with path.open("w", encoding="utf-8") as f:
        for n, body in enumerate(bodies(transcript(40))):
            f.write(dumps_line(1_764_500_000.0 + 20 * n, headers, body) + "\n")
    cfg = tmp_path / "w.yaml"
    cfg.write_text("model_windows: {claude-sonnet-4-5: 45000}\n")
    out = simulate([path], ["agent-compaction"], config_file=str(cfg)).to_json()
    base = out["presets"]["agent-compaction"]
    ret = base["retention"]
    assert base["summaries"] >= 1 and ret["measured_turns"] == base["rewritten"] > 0
    assert ret["floor"] is True
    # The first prompt is compacted away with everything before the kept round.
    assert ret["by_kind"]["user"]["visible"] < ret["by_kind"]["user"]["facts"]
    assert 0 < ret["min"] < 1


def test_the_report_labels_the_floor(
    session: Path, config: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["simulate", str(session), "--config", config, "--preset", "summarize"]
    assert cli.main([*args, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "retained min/mean" in out and FLOOR_LABEL in out
    row = next(line for line in out.splitlines() if line.startswith("summarize "))
    assert row.split()[4].endswith("*")  # the figure is starred as a floor
    result = simulate([session], ["summarize"], config_file=config)
    assert FLOOR_LABEL in text(result)


def test_summaries_by_a_real_model_are_retention_not_its_floor(session: Path, config: str) -> None:
    async def summarize(prompt: str, job: Any) -> str:
        return "<summary>the state of the work</summary>"

    result = simulate(
        [session],
        ["summarize"],
        config_file=config,
        model="claude-haiku-4-5",
        summarizers=lambda cfg, level: summarize,
    )
    ret = result.to_json()["presets"]["summarize"]["retention"]
    assert ret["measured_turns"] > 0 and ret["floor"] is False and ret["label"] == LABEL
    assert FLOOR_LABEL not in text(result).split("retention per fact kind")[0]


def test_codex_compacting_itself_keeps_the_users_prompts(tmp_path: Path) -> None:
    """Codex restarts from its system items, every user message and the summary
    (docs/codex.md): its user facts survive, its tool rounds do not."""
    spec = Spec("codex", "gpt-6.1-sol", False, 60, 900, 7, dialect="responses")
    path = tmp_path / "codex.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for t, body in codex_requests(generated(spec), spec):
            f.write(
                dumps_line(t, codex.headers(spec.seed), body)[:-1] + ', "path": "/v1/responses"}\n'
            )
    cfg = tmp_path / "w.yaml"
    cfg.write_text("model_windows: {gpt-6.1-sol: 40000}\n")  # Codex's limit: 36,000
    base = simulate([path], ["agent-compaction"], config_file=str(cfg)).to_json()["presets"][
        "agent-compaction"
    ]
    ret = base["retention"]
    assert base["summaries"] >= 1 and ret["measured_turns"] == base["rewritten"] > 0
    user = ret["by_kind"]["user"]
    assert user["facts"] > ret["measured_turns"]  # vacuity: prompts past the first one
    assert user["visible"] == user["facts"] and user["min"] == 1.0
    assert ret["by_kind"]["command"]["min"] < 1.0  # the tool rounds went into the summary
    assert compaction.agent_threshold(1_050_000, codex=True) == 244_800
    assert compaction.agent_threshold(40_000, codex=True) == 36_000
