"""The cost simulator (docs/behaviour.md#usage-cost-and-savings): known answers, the baseline's
threshold, output shapes, bad input. Traces are small (the 16-turn real capture, generated sessions
of 30-40 short rounds); the big corpus is only for docs/savings.md."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from bench.sessions import Spec, fixture_headers, generated, requests
from cg import cli
from cg.billing.prices import PriceTable, price_table
from cg.simulate import compaction
from cg.simulate.proxy import INSTRUCTION_TOKENS, Options
from cg.simulate.run import BASELINE, DEFAULT_PRESETS, simulate
from cg.simulate.trace import dumps_line, load
from cg.simulate.turns import Preparer, fill_outputs
from cg.state.facts import FactsCache
from cg.state.tokens import TokenCounter
from cg.summarize.triggers import shipped_windows

PNG = b"\x89PNG\r\n\x1a\n"


def write_trace(path: Path, spec: Spec | None = None) -> Path:
    """A JSONL trace: the real capture cut into its 16 turns, or a generated session."""
    if spec is None:
        from bench.sessions import capture_messages

        msgs, model, headers, seed, cold = capture_messages(), None, fixture_headers(), 0, 0.0
    else:
        msgs, model = generated(spec), spec.model
        headers = {**fixture_headers(spec.context_1m), "x-claude-code-session-id": spec.name}
        seed, cold = spec.seed, spec.cold_gap_p
    with path.open("w", encoding="utf-8") as f:
        for t, body in requests(msgs, model, seed, cold):
            f.write(dumps_line(t, headers, body) + "\n")
    return path


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_trace(tmp_path_factory.mktemp("sim") / "capture.jsonl")


# A 200k-window model, tool rounds of ~1k tokens, many gaps past the 5-minute TTL.
COLD = Spec("cold", "claude-sonnet-4-5", False, 40, 1000, 11, cold_gap_p=0.3)


@pytest.fixture(scope="module")
def cold(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_trace(tmp_path_factory.mktemp("sim") / "cold.jsonl", COLD)


def small_window(tmp_path: Path, window: int) -> str:
    cfg = tmp_path / "window.yaml"
    cfg.write_text(f"model_windows: {{claude-sonnet-4-5: {window}}}\n")
    return str(cfg)


def test_nothing_triggers_every_ratio_is_exactly_one(capture: Path) -> None:
    result = simulate([capture])
    out = result.to_json()
    assert list(out["presets"]) == list(DEFAULT_PRESETS)
    for name, p in out["presets"].items():
        assert p["ratio"] == 1.0, name
        assert p["summaries"] == 0 and p["rewritten"] == 0, name
        assert p["turns"] == 16, name
    off = result.totals["off"]
    assert off.cost_usd is not None and off.cost_usd > 0  # vacuity: there is a bill
    assert off.agent.output_tokens > 0 and off.agent.cache_read_tokens > 0
    assert len(out["sessions"]) == 1


def test_a_long_session_with_cold_gaps_costs_less_summarized(cold: Path, tmp_path: Path) -> None:
    result = simulate([cold], ["off", "summarize"], config_file=small_window(tmp_path, 40_000))
    off, summ = result.totals["off"], result.totals["summarize"]
    assert summ.summaries > 0 and summ.rewritten > 0  # vacuity: it did act
    assert summ.summarizer.requests > 0 and summ.summarizer_usd > 0  # and its calls were billed
    assert off.cost_usd is not None and summ.cost_usd is not None
    assert summ.cost_usd < off.cost_usd
    assert summ.peak_tokens < off.peak_tokens


def test_the_summary_is_spliced_from_the_turn_after_it_is_commissioned(
    cold: Path, tmp_path: Path
) -> None:
    result = simulate([cold], ["summarize"], config_file=small_window(tmp_path, 40_000))
    [s] = result.sessions
    t, off = s.tallies["summarize"], s.tallies["off"]
    first = t.marks[0]
    assert t.sizes[: first + 1] == off.sizes[: first + 1]  # forwarded untouched until then
    assert t.sizes[first + 1] < off.sizes[first + 1]  # spliced on the next turn


def test_summary_latency_delays_the_splice(cold: Path, tmp_path: Path) -> None:
    cfg = small_window(tmp_path, 40_000)
    now = simulate([cold], ["summarize"], config_file=cfg).sessions[0].tallies["summarize"]
    late = (
        simulate([cold], ["summarize"], config_file=cfg, options=Options(summary_latency=3600))
        .sessions[0]
        .tallies["summarize"]
    )
    first = now.marks[0]
    assert late.marks[0] == first
    assert late.sizes[first + 1] > now.sizes[first + 1]  # not ready an hour early


def test_the_shared_cache_call_reads_the_transcript_from_the_cache(
    cold: Path, tmp_path: Path
) -> None:
    shared = tmp_path / "shared.yaml"
    shared.write_text("model_windows: {claude-sonnet-4-5: 40000}\n")
    never = tmp_path / "never.yaml"
    never.write_text(
        "model_windows: {claude-sonnet-4-5: 40000}\n"
        "components: {summarize: {model: {share_cache: never}}}\n"
    )
    a = simulate([cold], ["summarize"], config_file=str(shared)).totals["summarize"]
    b = simulate([cold], ["summarize"], config_file=str(never)).totals["summarize"]
    assert a.summaries == b.summaries > 0
    # Shared: the forwarded request is read from the session's cache, only the appended
    # instruction is billed at the full price; standalone: the whole prompt is.
    assert a.summarizer.cache_read_tokens > a.summaries * INSTRUCTION_TOKENS
    assert a.summarizer.input_tokens == a.summaries * INSTRUCTION_TOKENS
    assert a.summarizer.cache_write_tokens == 0
    assert b.summarizer.cache_read_tokens == 0 and b.summarizer.input_tokens > 0
    # Same summaries, same splices: the agent's side of the bill is the same.
    assert a.agent == b.agent


def test_agent_compaction_fires_at_its_threshold(cold: Path, tmp_path: Path) -> None:
    window = 60_000
    facts = FactsCache(TokenCounter())
    [session] = load(
        [cold], Preparer(facts, {"claude-sonnet-4-5": window}, shipped_windows()), print
    )
    turns = session.turns
    fill_outputs(turns)
    threshold = compaction.agent_threshold(window)
    assert threshold == window - 33_000
    tally = compaction.run(turns, price_table(), 0.05)
    assert tally.summaries >= 1
    first = tally.marks[0]
    # The previous answer's context (its input + output) first reaches the threshold there...
    context = [t.tokens + t.output for t in turns]
    assert context[first - 1] >= threshold
    assert all(c < threshold for c in context[: first - 1])
    # ...the agent then restarts from a summary, far below it.
    assert tally.sizes[first] < 0.7 * turns[first].tokens
    assert tally.sizes[first - 1] == turns[first - 1].tokens  # unchanged before
    # A 200k window (83.5%): never reached by this short session.
    assert compaction.agent_threshold(200_000) == 167_000
    assert compaction.agent_threshold(1_000_000) == 967_000
    assert compaction.agent_threshold(None) is None


def test_json_shape_through_the_cli(capture: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["simulate", str(capture), "--json", "--preset", "summarize"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["presets"]) == {"off", "summarize"}  # off always: the reference
    for p in out["presets"].values():
        assert {"cost_usd", "ratio", "summaries", "rewritten", "tokens_sent"} <= set(p)
        assert set(p["usage"]) == {"agent", "summarizer"}
    [s] = out["sessions"]
    assert s["id"] == "f8e1c462-b91a-42bd-a7aa-b16df1f9a2c3" and s["turns"] == 16
    assert s["window"] == 1_000_000  # the context-1m header
    assert "estimate" in out["estimate"].lower()


def test_the_table_names_every_preset(capture: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["simulate", str(capture), "--no-progress"]) == 0
    out = capsys.readouterr().out
    for name in DEFAULT_PRESETS:
        assert f"\n{name} " in out
    assert "estimate" in out.lower() and "total" in out


def test_a_line_that_is_not_json_is_skipped_with_its_number(
    capture: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = capture.read_text(encoding="utf-8").splitlines()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([*lines[:3], "{not json", '{"t": "x"}', *lines[3:]]) + "\n")
    assert cli.main(["simulate", str(bad), "--json", "--preset", "off"]) == 0
    cap = capsys.readouterr()
    assert f"{bad}:4: not JSON, skipped" in cap.err
    assert f"{bad}:5: no number 't'" in cap.err
    out = json.loads(cap.out)
    assert out["sessions"][0]["turns"] == 16  # nothing else lost
    assert len(out["warnings"]) == 2


def test_an_empty_flow_file_gets_a_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.flow"
    empty.write_bytes(b"")
    assert cli.main(["simulate", str(empty)]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"{empty}: empty file, no requests" in err
    assert "no provider requests to simulate" in err


def test_an_empty_file_beside_a_good_one_loses_nothing(capture: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty.flow"
    empty.write_bytes(b"")
    result = simulate([empty, capture], ["off"])
    assert result.sessions[0].turns == 16
    assert any("empty file" in w for w in result.warnings)


def test_a_model_with_no_price_costs_unknown_not_zero(capture: Path) -> None:
    prices = PriceTable({})  # no model priced
    result = simulate([capture], ["off", "summarize"], prices=prices)
    out = result.to_json()
    for p in out["presets"].values():
        assert p["cost_usd"] is None and p["ratio"] is None
        assert p["unpriced_models"] == ["claude-opus-4-8"]
        assert p["tokens_sent"] > 0  # every other figure is kept
    assert result.totals["off"].cost_usd is None


def test_flow_files_replay_like_their_jsonl(capture: Path, tmp_path: Path) -> None:
    from mitmproxy import io
    from mitmproxy.test import tflow

    flows = tmp_path / "capture.flow"
    with flows.open("wb") as f:
        w = io.FlowWriter(f)
        for line in capture.read_text(encoding="utf-8").splitlines():
            doc = json.loads(line)
            flow = tflow.tflow()
            flow.request.method = "POST"
            flow.request.path = "/v1/messages?beta=true"
            flow.request.headers.clear()
            for k, v in doc["headers"].items():
                flow.request.headers[k] = v
            flow.request.content = line[line.index(', "body": ') + 10 : -1].encode()
            flow.request.timestamp_start = doc["t"]
            w.add(flow)
    a = simulate([flows], ["off"]).to_json()["presets"]["off"]
    b = simulate([capture], ["off"]).to_json()["presets"]["off"]
    assert a["turns"] == b["turns"] == 16
    assert a["cost_usd"] == b["cost_usd"]


def test_the_plot_is_a_png(capture: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "cost.png"
    assert cli.main(["simulate", str(capture), "--plot", str(out), "--no-progress"]) == 0
    assert out.read_bytes()[:8] == PNG


def test_bad_options_are_refused(capture: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["simulate", str(capture), "--summary-ratio", "0"]) == cli.EXIT_USAGE
    assert cli.main(["simulate", str(capture), "--preset", "nope"]) == cli.EXIT_USAGE
    assert "unknown preset 'nope'" in capsys.readouterr().err


def test_model_has_a_real_client_write_the_summaries(cold: Path, tmp_path: Path) -> None:
    from cg.summarize.client import HttpPool, SummarizerClient

    seen: list[dict[str, object]] = []
    text = "<summary>" + " the state" * 150 + "</summary>"

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"content": [{"type": "text", "text": text}]})

    pool = HttpPool()
    pool._client = httpx.AsyncClient(transport=httpx.MockTransport(answer))

    def make(cfg: object, level: str) -> SummarizerClient:
        return SummarizerClient(cfg, pool, level=level, timeout=10)  # type: ignore[arg-type]

    t = simulate(
        [cold],
        ["summarize"],
        config_file=small_window(tmp_path, 40_000),
        model="claude-haiku-4-5",
        summarizers=make,
    ).totals["summarize"]
    assert seen and all(body["model"] == "claude-haiku-4-5" for body in seen)
    assert t.summaries == len(seen)
    summary = TokenCounter().count(text.removeprefix("<summary>").removesuffix("</summary>"))
    assert t.summarizer.output_tokens == len(seen) * summary  # the answer's own tokens
    assert t.summarizer.cache_read_tokens == 0  # a dedicated model: standalone prompts
    assert not t.unpriced


def test_baseline_alone_still_reports_against_off(capture: Path) -> None:
    out = simulate([capture], [BASELINE]).to_json()
    assert list(out["presets"]) == ["off", BASELINE]
